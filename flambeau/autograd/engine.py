"""The reverse-mode engine: runs the recorded graph backwards.

Nodes run in dependency order (a node runs once every node that feeds it a gradient has run),
ties broken by most-recently-created first, as PyTorch does. Gradients arriving at the same
node output are summed; each node's outgoing gradients are checked against the metadata of the
forward inputs (cast to their dtype, summed over broadcast dimensions). `backward` accumulates
into leaves' `.grad`; `grad` returns the gradients of chosen inputs instead.
"""
from __future__ import annotations

import heapq
from heapq import heappop, heappush
import threading
import warnings

from .._dtype import FLOATING
from .. import _state
from .. import _pending_grads
from .._tensor import Tensor, strided, contiguous_format, _ptr
from .._dispatch import WRAPPER_DEVICE
from .graph import AccumulateGrad, OpNode, _edge
from .._ops.creation import empty_strided, ones_like, tensor, zeros_like
from .._ops._helpers import direct_device, direct_call
from .._ops.pointwise import add
from .._ops.reduction import sum as sum_op
from .._ops.views import _to_copy


def _reduce_to(g: Tensor, shape, dtype, device, node, i) -> Tensor:
    if g._device is WRAPPER_DEVICE:
        return g._wrapper_reduce_to(shape, dtype, device)    # device: the input's layout (graph._meta_of)
    if g._data.shape != tuple(shape):
        gs = g._data.shape
        nd = len(gs) - len(shape)
        ok = nd >= 0 and all(s == 1 or s == gs[nd + k] for k, s in enumerate(shape))
        if not ok:
            raise RuntimeError(f"Function {node.name()} returned an invalid gradient at index {i} - got "
                               f"{list(gs)} but expected shape compatible with {list(shape)}")
        dims = tuple(range(nd)) + tuple(nd + k for k, s in enumerate(shape) if s == 1 and gs[nd + k] != 1)
        dev = direct_device(g)
        if dev is not None:                  # no create_graph: the sum kernel and a reshape on the array
            g = direct_call(sum_op, dev, g._data, dims, True) if dims else g
            g = Tensor._make(g._data.reshape(tuple(shape)), dev)
        else:
            if dims:
                g = g.sum(dims, keepdim=True)
            if nd or g._data.shape != tuple(shape):
                g = g.reshape(shape)
    if g._dtype is not dtype:
        if dtype.category < FLOATING:
            return g
        dev = direct_device(g)
        if dev is not None and (dev is device or dev == device):    # the cast kernel on the array
            return direct_call(_to_copy, dev, g._data, dtype=dtype, device=device)
        g = g.to(dtype)
    if g._device != device:
        g = g.to(device)
    return g


def _sum_grads(a: Tensor, b: Tensor) -> Tensor:
    """Two gradients of one tensor summed; a sparse and a dense one give a dense sum (PyTorch's
    engine adds the sparse one to the dense one: `sparse + dense` itself is an error). Without
    create_graph the add kernel runs on the arrays (`direct_device`: a residual stream's gradient)."""
    dev = direct_device(a, b)
    if dev is not None:
        return direct_call(add, dev, a._data, b._data)
    if a._device is WRAPPER_DEVICE and a.layout is not strided and b.layout is strided:
        return b + a
    return a + b


def _run_hooks(hooks, g):
    for _, fn in list(hooks):
        r = fn(g)
        if r is not None:
            g = r
    return g


class _ThreadPasses(threading.local):
    """The backward passes running in one thread (innermost last): each one's final callbacks."""

    def __init__(self) -> None:
        self.final_callbacks: list = []


_passes = _ThreadPasses()
_accumulate_lock = threading.RLock()    # held while a leaf's .grad is set or added to (`_accumulate_locked`)
# How many nodes other than AccumulateGrad backward passes have applied (all threads; DDP's reducer reads it
# to tell which of its buckets completed with the last gradients a backward computed).
nodes_applied = [0]


def execute(roots, *, retain_graph: bool, create_graph: bool, capture=None, accumulate=True,
            only_leaves=None):
    """Run backward from `roots` = [(edge, grad)].

    capture: {(node, nr): slot} collects the gradient flowing into those node outputs (autograd.grad).
    only_leaves: when accumulating, restrict accumulation to these AccumulateGrad nodes.
    Returns the captured gradients as a dict slot -> grad.
    """
    deps: dict = {}             # node -> its number of incoming edges; a node is found when first entered
    stack = list(dict.fromkeys(e[0] for e, _ in roots if e[0] is not None))   # outputs may share a node
    starts = set(stack)
    nodes = [] if capture is not None or only_leaves is not None else None     # (for `_needed` only)
    while stack:
        n = stack.pop()
        if nodes is not None:
            nodes.append(n)
        for nx in n._next_nodes:
            if nx is not None:
                c = deps.get(nx)
                if c is None:
                    deps[nx] = 1
                    if nx not in starts:
                        stack.append(nx)
                else:
                    deps[nx] = c + 1
    needed = None
    if nodes is not None:
        targets = set(k[0] for k in capture) if capture else set()
        if only_leaves is not None:
            targets |= only_leaves
        needed = _needed(nodes, targets)
    buffers: dict = {}
    for (node, nr), g in roots:
        if node is None:
            continue
        buf = buffers.setdefault(node, {})
        buf[nr] = g if nr not in buf else _sum_grads(buf[nr], g)
    ready = []
    for (node, _nr), _ in roots:
        if node is not None and deps.get(node, 0) == 0 and node not in [r[2] for r in ready]:
            heapq.heappush(ready, (-node._sequence_nr, id(node), node))
    captured = {}
    stored: dict = {}           # owner array id -> the gradients of it that leaves took over in this pass
    prev = _state.tls.grad_enabled
    _state.tls.grad_enabled = create_graph
    prev_autocast = _state.set_autocast({})     # backward keeps the forward's casts only
    final_callbacks = _passes.final_callbacks
    final_callbacks.append([])
    try:
        while ready:
            node = heappop(ready)[2]
            buf = buffers.pop(node, None)
            if buf is None:
                buf = {}
            if node._tensor_hooks or node._retain_hooks or capture or node._pre_hooks:
                buf = _before_apply(node, buf, capture, captured)
            if type(node) is AccumulateGrad:
                if accumulate and (only_leaves is None or node in only_leaves) and buf.get(0) is not None:
                    _accumulate(node.variable, buf[0], create_graph, stored)
                continue
            nodes_applied[0] += 1
            next_nodes = node._next_nodes
            if not buf or (needed is not None and node not in needed):
                outs = [None] * len(next_nodes)
            else:
                # an OpNode's gradients arrive at its outputs only (buffer keys < len(_out_meta))
                nout = len(node._out_meta) if type(node) is OpNode else \
                    max(len(getattr(node, "_out_meta", ())), max(buf) + 1)
                if nout == 1:
                    grads = [buf.get(0)]
                else:
                    grads = [buf.get(i) for i in range(nout)]
                if _state.anomaly or node._post_hooks:
                    outs = _apply(node, grads)
                else:                      # `_apply` without anomaly mode and post hooks, inlined
                    outs = node.apply(grads)           # a fresh list, read no more here
                    if type(outs) is not list:
                        outs = list(outs)
                    if len(outs) != len(next_nodes):
                        _wrong_count(node, outs)
                if not retain_graph:
                    node.release()
            in_meta = node._in_meta
            n_meta = len(in_meta)
            leaves = None
            i = -1
            for nx, nr, g in zip(next_nodes, node._next_nrs, outs):
                i += 1
                if nx is None:
                    continue
                left = deps[nx] - 1
                deps[nx] = left
                if g is not None:
                    meta = in_meta[i] if i < n_meta else None
                    # the common case, a gradient already of the input's device, shape and dtype, skips the
                    # call (a wrapper tensor's device is never its input's layout: it always takes the call)
                    if meta is not None and (g._device is not meta[2] or g._data.shape != meta[0]
                                             or g._dtype is not meta[1]):
                        g = _reduce_to(g, meta[0], meta[1], meta[2], node, i)
                    b = buffers.get(nx)
                    if b is None:
                        if left == 0 and type(nx) is AccumulateGrad:    # a leaf's only gradient: no buffer
                            if leaves is None:
                                leaves = [(nx, g)]
                            else:
                                leaves.append((nx, g))
                            continue
                        buffers[nx] = {nr: g}
                    else:
                        b[nr] = g if b.get(nr) is None else _sum_grads(b[nr], g)
                if left == 0:
                    if type(nx) is AccumulateGrad:
                        if leaves is None:
                            leaves = [(nx, None)]
                        else:
                            leaves.append((nx, None))
                    else:
                        heappush(ready, (-nx._sequence_nr, id(nx), nx))
            if leaves is not None:
                _run_leaves(leaves, buffers, capture, captured, accumulate, only_leaves, create_graph, stored)
        callbacks = final_callbacks[-1]
        while callbacks:
            callbacks.pop(0)()
    finally:
        final_callbacks.pop()
        _state.tls.grad_enabled = prev
        _state.set_autocast(prev_autocast)
    return captured


def _before_apply(node, buf: dict, capture, captured: dict) -> dict:
    """What runs on a node's gathered gradients before it is applied: its tensors' hooks, retain_grad,
    autograd.grad's capture, the node's pre-hooks. Returns the (maybe replaced) gradients."""
    if node._tensor_hooks:
        for nr, hooks in node._tensor_hooks.items():
            if buf.get(nr) is not None:
                buf[nr] = _run_hooks(hooks, buf[nr])
    if node._retain_hooks:
        for nr, ref in node._retain_hooks.items():
            t = ref()
            if t is not None and buf.get(nr) is not None:
                g = buf[nr]
                t._grad = g.detach().clone() if t._grad is None else t._grad + g.detach()
    if capture:
        for nr, g in buf.items():
            slot = capture.get((node, nr))
            if slot is not None:
                captured[slot] = g
    for _, fn in node._pre_hooks:
        r = fn(tuple(buf.get(i) for i in range(max(buf, default=-1) + 1)))
        if r is not None:
            buf = {i: x for i, x in enumerate(r)}
    return buf


def _sequence_of(entry) -> int:
    return entry[0]._sequence_nr


def _run_leaves(leaves: list, buffers: dict, capture, captured: dict, accumulate: bool, only_leaves,
                create_graph: bool, stored: dict) -> None:
    """Run the leaves (AccumulateGrad nodes) that one node's gradients made ready: [(node, its gradient,
    or None: in `buffers`)]. Every AccumulateGrad outranks every other node, so the queue would run these
    next, highest sequence number first: they run here in that order, without a queue entry, and a
    leaf's single gradient without a buffer (a compiled backward hands one to each of ~160 parameters).
    Leaves without hooks take their gradients under one hold of the lock."""
    if len(leaves) > 1:
        leaves.sort(key=_sequence_of, reverse=True)
    lock = _accumulate_lock
    held = False
    try:
        for node, g in leaves:
            if g is None or node._tensor_hooks or node._retain_hooks or capture or node._pre_hooks:
                buf = buffers.pop(node, None) if g is None else {0: g}
                buf = _before_apply(node, buf or {}, capture, captured)
                g = buf.get(0)
            if g is None or not accumulate or (only_leaves is not None and node not in only_leaves):
                continue
            t = node.variable               # `_accumulate`, inlined: hooks run without the lock
            if t._hooks:
                if held:
                    lock.release()
                    held = False
                g = _run_hooks(t._hooks, g)
            if not held:
                lock.acquire()
                held = True
            if t._grad is None and not create_graph:
                _first_grad(t, g, stored)
            else:
                _accumulate_locked(t, g, create_graph, stored)
            post = t.__dict__.get("_post_acc_hooks")
            if post:
                lock.release()
                held = False
                for _, fn in post:
                    fn(t)
    finally:
        if held:
            lock.release()


def queue_callback(callback) -> None:
    """Run `callback()` once the backward pass now running has finished (PyTorch's
    `Variable._execution_engine.queue_callback`; DDP and FSDP finish their reductions there)."""
    running = running_callbacks()
    if running is None:
        raise RuntimeError("Final callbacks can only be installed during backward pass.")
    running.append(callback)


def running_callbacks() -> list | None:
    """The final-callback list of the backward pass running in this thread (innermost), or None."""
    passes = _passes.final_callbacks
    return passes[-1] if passes else None


def _needed(nodes, targets):
    needed = set()
    # iterate until fixpoint; graphs are DAGs so a reverse topological sweep would do, but the DFS
    # order above is not topological for shared subgraphs. The sweep goes from the DFS's last nodes
    # (nearest the leaves) to the roots, so a chain is settled in one pass (root first, a pass
    # settled one node: quadratic in the graph's depth)
    changed = True
    order = nodes[::-1]
    while changed:
        changed = False
        for n in order:
            if n in needed:
                continue
            if n in targets or any(nx in needed or nx in targets for nx in n._next_nodes if nx is not None):
                needed.add(n)
                changed = True
    return needed


def _warn_forward_traceback(node):
    tb = node.metadata.get("traceback_")
    if tb:
        warnings.warn(f"Error detected in {node.name()}. Traceback of forward call that caused the error:\n"
                      + "".join(tb), UserWarning, stacklevel=3)


def _apply(node, grads):
    grads_out = grads
    if _state.anomaly:
        try:
            outs = node.apply(list(grads))
        except Exception:
            _warn_forward_traceback(node)
            raise
        if _state.anomaly_check_nan:
            for i, g in enumerate(outs):
                if isinstance(g, Tensor) and g.isnan().any().item():
                    _warn_forward_traceback(node)
                    raise RuntimeError(f"Function '{node.name()}' returned nan values in its {i}th output.")
    else:
        outs = node.apply(list(grads))
    outs = list(outs)
    if len(outs) != len(node._next_nodes):
        _wrong_count(node, outs)
    if node._post_hooks:
        for _, fn in node._post_hooks:
            r = fn(tuple(outs), tuple(grads_out))
            if r is not None:
                outs = list(r)
    return outs


def _wrong_count(node, outs):
    n = len(node._next_nodes)
    raise RuntimeError(f"function {node.name()} returned an incorrect number of gradients (expected {n}, got {len(outs)})")


def _owner(a):
    """The array owning the memory of NumPy/CuPy array `a` (views chain through `.base` to it)."""
    root = a
    while getattr(root, "base", None) is not None:
        root = root.base
    return root


def _extent(a) -> tuple:
    """(first byte, one past the last byte) of the memory NumPy/CuPy array `a` spans."""
    lo = hi = _ptr(a)
    for n, st in zip(a.shape, a.strides):
        if n == 0:
            return lo, lo
        if st < 0:
            lo += (n - 1) * st
        else:
            hi += (n - 1) * st
    return lo, hi + a.itemsize


def _overlaps(a, taken) -> bool:
    """Whether array `a` shares a byte with one of the arrays `taken` (gradients of one owner that leaves
    took over in this pass). Addresses are read only here: the usual gradient is the first of its owner."""
    lo, hi = _extent(a)
    for b in taken:
        l, h = _extent(b)
        if lo < h and l < hi:
            return True
    return False


def _non_overlapping_and_dense(shape, strides) -> bool:
    expected = 1
    for st, n in sorted((st, n) for n, st in zip(shape, strides) if n != 1):
        if st != expected:
            return False
        expected *= n
    return True


def _obeys_layout(grad: Tensor, var: Tensor) -> bool:
    """PyTorch's `obeys_layout_contract`: a dense non-overlapping leaf's gradient has its strides (sizes of
    one aside); any other leaf's gradient is contiguous."""
    if grad._data.strides == var._data.strides:
        return True
    shape, gs = var.shape, grad.stride()
    if 0 in shape:
        return True
    if _non_overlapping_and_dense(shape, var.stride()):
        return all(a == b for a, b, n in zip(gs, var.stride(), shape) if n != 1)
    return grad.is_contiguous()


def _stealable_or_copy(var: Tensor, grad: Tensor, stored: dict) -> Tensor:
    """What AccumulateGrad keeps as a leaf's first gradient, as PyTorch's: the incoming gradient itself when
    no other leaf of this backward holds any of its memory (`x + w` passes one gradient to both) and its layout
    follows the leaf's, else a copy in the leaf's layout (an expanded `sum` gradient, a transposed leaf).
    Later accumulation adds into it in place, so it must own its memory and have no overlapping elements."""
    a = grad._data
    owner = id(_owner(a))
    taken = stored.get(owner)
    if (taken is None or not _overlaps(a, taken)) and (a.strides == var._data.strides or _obeys_layout(grad, var)):
        if taken is None:           # `_keep`, inlined: the common case, a leaf's first gradient
            stored[owner] = [a]
        else:
            taken.append(a)
        return grad
    if _non_overlapping_and_dense(var.shape, var.stride()):
        out = empty_strided(var.shape, var.stride(), dtype=grad.dtype, device=grad.device)
        out.copy_(grad)
    else:
        out = grad.clone(memory_format=contiguous_format)
    _keep(out._data, stored, stored.get(id(_owner(out._data))))
    return out


def _keep(a, stored: dict, taken) -> None:
    """Note array `a` as taken over by a leaf: `stored` maps an owner's id to the arrays of it kept in this
    pass (each keeps its owner alive, so the id stays that owner's while the pass runs)."""
    if taken is None:
        stored[id(_owner(a))] = [a]
    else:
        taken.append(a)


def _accumulate(t: Tensor, g: Tensor, create_graph: bool, stored: dict | None = None):
    if t._hooks:
        g = _run_hooks(t._hooks, g)
    with _accumulate_lock:
        _accumulate_locked(t, g, create_graph, stored)
    for _, fn in t.__dict__.get("_post_acc_hooks", ()):
        fn(t)


def _accumulate_locked(t: Tensor, g: Tensor, create_graph: bool, stored: dict | None) -> None:
    """`t.grad` = g, or += g: one thread at a time (backward passes of several threads may reach one
    leaf at once; PyTorch holds a mutex per AccumulateGrad), so no update is lost. A gradient DDP still
    reduces (`_pending_grads`) is waited for before anything adds into it or replaces it."""
    if _pending_grads.waits:
        _pending_grads.settle(t)
    if t._grad is None:
        if create_graph:
            t._grad = g
        else:
            _first_grad(t, g, stored)
    elif create_graph or t._grad._requires_grad:
        t._grad = t._grad + g
    elif t._grad.layout is not strided or g.layout is not strided:
        t._grad = _sum_grads(t._grad, g.detach())       # a sparse gradient: out of place (its layout may change)
    else:
        prev = _state.tls.grad_enabled
        _state.tls.grad_enabled = False
        try:
            t._grad.add_(g.detach())
        finally:
            _state.tls.grad_enabled = prev


def _first_grad(t: Tensor, g: Tensor, stored: dict | None) -> None:
    """`t.grad` = g, the first gradient of leaf `t` without create_graph (the lock held): a root's given
    gradient is copied; a dense one is kept or copied per `_stealable_or_copy`."""
    if "_is_root_grad" in g.__dict__:
        t._grad = g.detach().clone()
        return
    d = g.detach()
    if stored is not None and t._device is not WRAPPER_DEVICE and g._device is not WRAPPER_DEVICE:
        a = d._data
        if hasattr(a, "strides") and hasattr(t._data, "strides"):     # (not meta)
            d = _stealable_or_copy(t, d, stored)
    t._grad = d


def _make_roots(tensors, grad_tensors, what="backward"):
    roots = []
    for i, (t, g) in enumerate(zip(tensors, grad_tensors)):
        if not t.requires_grad:
            raise RuntimeError(f"element {i} of tensors does not require grad and does not have a grad_fn")
        if g is None:
            if t.numel() != 1:
                raise RuntimeError("grad can be implicitly created only for scalar outputs")
            if t._dtype.category < FLOATING:
                raise RuntimeError(f"grad can be implicitly created only for real scalar outputs but got {t._dtype}")
            g = ones_like(t)
        else:
            if not isinstance(g, Tensor):
                g = tensor(g, dtype=t._dtype, device=t._device)
            if g.shape != t.shape:
                raise RuntimeError(f"Mismatch in shape: grad_output[{i}] has a shape of {g.shape} and "
                                   f"output[{i}] has a shape of {t.shape}.")
            g = g.detach() if not _state.tls.grad_enabled else g
            g.__dict__["_is_root_grad"] = True
        roots.append((_edge(t), g))
    return roots


def _as_tuple(x):
    if x is None:
        return ()
    if isinstance(x, Tensor):
        return (x,)
    return tuple(x)


def backward(tensors, grad_tensors=None, retain_graph=None, create_graph=False, grad_variables=None,
             inputs=None):
    tensors = _as_tuple(tensors)
    grads = _as_tuple(grad_tensors) if grad_tensors is not None else (None,) * len(tensors)
    if len(grads) != len(tensors):
        raise RuntimeError(f"got {len(grads)} tensors and {len(tensors)} gradients")
    if retain_graph is None:
        retain_graph = create_graph
    prev = _state.tls.grad_enabled
    _state.tls.grad_enabled = create_graph
    try:
        roots = _make_roots(tensors, grads)
    finally:
        _state.tls.grad_enabled = prev
    only = None
    if inputs is not None:
        inputs = _as_tuple(inputs)
        if not inputs:
            raise RuntimeError("'inputs' argument to backward() cannot be empty.")
        only = set()
        for t in inputs:
            if t.grad_fn is not None:
                t.retain_grad()
                only.add(t.grad_fn)
            else:
                only.add(_edge(t)[0])
    execute(roots, retain_graph=retain_graph, create_graph=create_graph, only_leaves=only)
    for g in grads:
        if isinstance(g, Tensor):
            g.__dict__.pop("_is_root_grad", None)


def grad(outputs, inputs, grad_outputs=None, retain_graph=None, create_graph=False, only_inputs=True,
         allow_unused=None, is_grads_batched=False, materialize_grads=False):
    outputs = _as_tuple(outputs)
    inputs = _as_tuple(inputs)
    if allow_unused is None:
        allow_unused = materialize_grads
    gouts = _as_tuple(grad_outputs) if grad_outputs is not None else (None,) * len(outputs)
    if retain_graph is None:
        retain_graph = create_graph
    for t in inputs:
        if not t.requires_grad:
            raise RuntimeError("One of the differentiated Tensors does not require grad")
    prev = _state.tls.grad_enabled
    _state.tls.grad_enabled = create_graph
    try:
        roots = _make_roots(outputs, gouts)
    finally:
        _state.tls.grad_enabled = prev
    capture = {}
    for i, t in enumerate(inputs):
        capture[_edge(t)] = i
    got = execute(roots, retain_graph=retain_graph, create_graph=create_graph, capture=capture,
                  accumulate=False)
    res = []
    for i, t in enumerate(inputs):
        g = got.get(i)
        if g is None:
            if materialize_grads:
                g = zeros_like(t)
            elif not allow_unused:
                raise RuntimeError(f"The differentiated Tensor at index {i} appears to not have been used in "
                                   "the graph. Set allow_unused=True if this is the desired behavior.")
        elif not create_graph:
            g = g.detach()
        res.append(g)
    return tuple(res)
