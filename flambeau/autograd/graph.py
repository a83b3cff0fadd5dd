"""The autograd graph: nodes recorded by the dispatcher, saved tensors, leaves' accumulators, hooks.

Each differentiable op call with an input that requires grad records an `OpNode` whose
`next_functions` point at the nodes that produced its inputs (or at `AccumulateGrad` for leaves).
The op's derivative (written in flambeau operators) runs in backward, so the backward pass is
itself dispatched: modes see it, and with `create_graph=True` it is recorded for higher orders.
"""
from __future__ import annotations

import functools
import itertools
import re
import threading
import traceback
import weakref
from collections.abc import Iterator

import numpy as np

from .._dtype import FLOATING
from .. import _state
from .._tensor import Tensor
from .._ops.creation import tensor as _tensor, zeros, ones
from .._ops.views import storage_positions
from .._dispatch import WRAPPER_DEVICE, type_name, device_array_types

_seq = itertools.count()


class RemovableHandle:
    _ids = itertools.count()

    def __init__(self, store, key=None):
        self.id = next(RemovableHandle._ids)
        self._store = weakref.ref(store) if not isinstance(store, list) else (lambda s=store: s)
        self._key = key

    def remove(self):
        st = self._store()
        if st is None:
            return
        if isinstance(st, dict):
            st.pop(self.id, None)
        else:
            st[:] = [h for h in st if h[0] != self.id]

    def __enter__(self):
        return self

    def __exit__(self, *a):
        self.remove()


class Node:
    """A backward function. `apply(grads_wrt_outputs) -> grads_wrt_inputs` (one per next edge).

    One is made per recorded op and lives until the step's backward, so a node holds few objects that
    the garbage collector tracks: its edges as a tuple of nodes and a tuple of output numbers (ints, which
    the collector does not track) rather than a tuple of pairs, `next_functions` building the pairs when
    asked; its hooks and `metadata` are class-level empties until first registered or read."""
    _tensor_hooks = None          # {output_nr: [(id, fn)]}, tensor.register_hook
    _retain_hooks = None          # {output_nr: weakref(tensor)}
    _pre_hooks = ()               # [(id, fn)], node.register_prehook
    _post_hooks = ()              # [(id, fn)], node.register_hook

    _next_nodes = _next_nrs = _in_meta = ()        # no edges (a leaf's AccumulateGrad)

    def __init__(self, next_functions=(), in_meta=()):
        self._sequence_nr = next(_seq)
        if next_functions:
            self._next_nodes = tuple([n for n, _ in next_functions])
            self._next_nrs = tuple([nr for _, nr in next_functions])
        self._in_meta = tuple(in_meta)     # (shape, dtype, device) of each forward input, per edge
        if _state.anomaly:
            self.metadata["traceback_"] = traceback.format_stack()[:-3]

    @property
    def next_functions(self) -> tuple:
        """((node, output number), ...) per forward input: where its gradient goes (None: nowhere)."""
        return tuple(zip(self._next_nodes, self._next_nrs))

    @property
    def metadata(self) -> dict:
        """A dict for the user's annotations (and anomaly mode's forward traceback)."""
        d = self.__dict__.get("_metadata")
        if d is None:
            d = self.__dict__["_metadata"] = {}
        return d

    def name(self) -> str:
        return type(self).__name__

    def apply(self, grads):
        raise NotImplementedError

    def release(self):
        pass

    def __call__(self, *grads):
        return self.apply(list(grads))

    def register_hook(self, fn):
        if "_post_hooks" not in self.__dict__:
            self._post_hooks = []
        h = RemovableHandle(self._post_hooks)
        self._post_hooks.append((h.id, fn))
        return h

    def register_prehook(self, fn):
        if "_pre_hooks" not in self.__dict__:
            self._pre_hooks = []
        h = RemovableHandle(self._pre_hooks)
        self._pre_hooks.append((h.id, fn))
        return h

    def __repr__(self):
        return f"<{self.name()} object at {hex(id(self))}>"


@functools.cache                 # one name per op: record() asks on every recorded call
def _camel(name: str) -> str:
    parts = re.split(r"_+", name.strip("_"))
    return "".join(p[:1].upper() + p[1:] for p in parts if p)


_FREED = ("Trying to backward through the graph a second time (or directly access saved tensors after "
          "they have already been freed). Saved intermediate values of the graph are freed when you "
          "call .backward() or autograd.grad(). Specify retain_graph=True if you need to backward "
          "through the graph a second time or if you need to access saved tensors after calling backward.")


class _ThreadSavedHooks(threading.local):
    """The (pack_hook, unpack_hook) pairs of the `saved_tensors_hooks` contexts one thread has entered,
    innermost last (per thread, as PyTorch's: a tensor saved in another thread is not packed)."""

    def __init__(self) -> None:
        self.stack: list[tuple] = []


_saved_hooks = _ThreadSavedHooks()


class saved_tensors_hooks:
    """`with saved_tensors_hooks(pack, unpack)`: each tensor saved for backward inside the block is
    stored as `pack(t)` and given back to the derivative as `unpack(packed)` (no version check:
    the hook owns what it stored)."""

    def __init__(self, pack_hook, unpack_hook) -> None:
        self.pack_hook, self.unpack_hook = pack_hook, unpack_hook

    def __enter__(self) -> saved_tensors_hooks:
        _saved_hooks.stack.append((self.pack_hook, self.unpack_hook))
        return self

    def __exit__(self, *exc) -> None:
        _saved_hooks.stack.pop()


class save_on_cpu(saved_tensors_hooks):
    """Saved tensors wait for backward on the cpu (pinned if asked) and return to their device."""

    def __init__(self, pin_memory: bool = False, device_type: str = "cuda") -> None:
        def pack_to_cpu(t: Tensor):
            return t.device, (t.cpu().pin_memory() if pin_memory and t.device.type != "cpu" else t.cpu())

        def unpack_from_cpu(packed) -> Tensor:
            device, t = packed
            return t.to(device, non_blocking=pin_memory)

        super().__init__(pack_to_cpu, unpack_from_cpu)


class SavedTensor:
    """A tensor saved for backward, with the version it had when saved (or, under
    saved_tensors_hooks, what the pack hook made of it and the unpack hook to call).

    A saved input keeps the Tensor itself (`t`). A saved output of a device array keeps its array, device,
    dtype and version counter (`data`, `device`, `dtype`, `vref`; `t` None) rather than a detached Tensor,
    which would be one more object per saved output for the garbage collector to track while the graph
    lives; a wrapper subclass's output (DTensor) keeps `t.detach()`."""
    __slots__ = ("t", "version", "is_output", "node_name", "out_nr", "packed", "data", "device", "dtype", "vref")

    def __init__(self, t: Tensor, is_output: bool, node_name: str = "", out_nr: int = 0):
        self.version = t._version[0]
        self.is_output = is_output
        self.node_name = node_name
        self.out_nr = out_nr
        self.packed = None
        self.vref = None
        hooks = _saved_hooks.stack
        if hooks:
            self.t = t.detach() if is_output else t
            pack, unpack = hooks.pop()    # what the pack hook itself saves is not packed
            try:
                self.packed = (unpack, pack(self.t))
            finally:
                hooks.append((pack, unpack))
            self.t = None
        elif is_output and t._device is not WRAPPER_DEVICE:
            self.t = None
            self.data, self.device, self.dtype, self.vref = t._data, t._device, t._dtype, t._version
        else:
            self.t = t.detach() if is_output else t

    def unpack(self, node):
        vref = self.vref
        if vref is not None:                 # a saved output of a device array
            if vref[0] != self.version:
                self._raise_modified(self.dtype, self.data.shape, vref[0])
            o = Tensor._make(self.data, self.device, self.dtype)
            o._version = vref
            o._grad_fn = node
            o._output_nr = self.out_nr
            o._requires_grad = True
            return o
        if self.packed is not None:
            unpack, packed = self.packed
            t = unpack(packed)
            if not self.is_output:
                return t
        else:
            t = self.t
        if self.packed is None and t._version[0] != self.version:
            self._raise_modified(t._dtype, t.shape, t._version[0])
        if self.is_output:
            o = Tensor._make(t._data, t._device, t._dtype) if t._device is not WRAPPER_DEVICE else t.detach()
            o._version = t._version
            o._grad_fn = node
            o._output_nr = self.out_nr
            o._requires_grad = True
            return o
        return t

    def _raise_modified(self, dtype, shape, version: int):
        raise RuntimeError(
            "one of the variables needed for gradient computation has been modified by an inplace "
            f"operation: [torch.{type_name(dtype)}Tensor {list(shape)}], which is output "
            f"{self.out_nr} of {self.node_name}, is at version {version}; expected version "
            f"{self.version} instead. Hint: enable anomaly detection to find the operation that "
            "failed to compute its gradient, with torch.autograd.set_detect_anomaly(True, check_nan=False).")


class TensorMeta:
    """What a derivative sees for an argument it names `<arg>_meta`: metadata, no data kept alive."""
    __slots__ = ("shape", "dtype", "device", "ndim", "_t")

    def __init__(self, t: Tensor):
        self.shape = t.shape
        self.dtype = t._dtype
        device = t._device
        self.device = t.device if device is WRAPPER_DEVICE else device   # a wrapper's (DTensor's) local device
        self.ndim = len(self.shape)
        self._t = None

    def stride(self):
        """Only for `<arg>_geometry` metas (PyTorch's TensorGeometry): strides and storage offset."""
        return self._t[0]

    def storage_offset(self):
        return self._t[1]

    @staticmethod
    def geometry(t: Tensor) -> "TensorMeta":
        m = TensorMeta(t)
        m._t = (t.stride(), t.storage_offset())
        return m

    def numel(self) -> int:
        return self.shape.numel()

    def dim(self) -> int:
        return self.ndim

    def size(self, d=None):
        return self.shape if d is None else self.shape[d]


def _meta_of(t):
    if t._device is WRAPPER_DEVICE:
        return t._wrapper_meta()       # (global shape, dtype, layout): the engine hands the layout back
    return (t._data.shape, t._dtype, t._device)


# Interned metadata. A training step records a few hundred nodes over a few dozen distinct (shape, dtype,
# device) triples; a node of one output kept its own `((shape, dtype, device),)` (three tuples the garbage
# collector counts, alive until backward), a cast node its own TensorMeta of the input (two objects), every
# node a tuple of output numbers, nearly always all zeros. These tables hand out one shared object per
# value instead, for tensors of NumPy or device arrays (shapes of ints: a fake or meta tensor's may hold
# SymInts, which a comparison would guard). No key hashes the device (its `__hash__` is Python code): output
# metadata is keyed by (shape, dtype) and checked for its device object, replaced when another device comes
# (one device per process is the common case); a TensorMeta key holds the device's id, its value keeps the
# device alive, so the id stays its own. Bounded: cleared when full (shapes that vary without end).
_OUT_METAS: dict = {}          # (shape, dtype) -> ((shape, dtype, device),) of the device last seen with them
_TENSOR_METAS: dict = {}       # (shape, dtype, id(device)) -> TensorMeta
_INTERNED_MAX = 4096
_ZERO_NRS = tuple((0,) * n for n in range(17))     # output numbers of edges that all start at output 0


def _single_out_meta(t) -> tuple:
    """`(_meta_of(t),)` for a tensor on a device of arrays, one shared tuple per (shape, dtype) on its device."""
    data = t._data
    if t._device is WRAPPER_DEVICE:
        return (_meta_of(t),)
    shape, dt, dev = data.shape, t._dtype, t._device
    if type(data) is not np.ndarray and type(data) not in device_array_types:
        return ((shape, dt, dev),)
    key = (shape, dt)
    m = _OUT_METAS.get(key)
    if m is None or m[0][2] is not dev:
        if len(_OUT_METAS) >= _INTERNED_MAX:
            _OUT_METAS.clear()
        m = _OUT_METAS[key] = ((shape, dt, dev),)
    return m


def _tensor_meta(t) -> TensorMeta:
    """`TensorMeta(t)`, one shared (never modified) instance per (shape, dtype, device) of an array tensor."""
    dev, data = t._device, t._data
    if dev is WRAPPER_DEVICE or (type(data) is not np.ndarray and type(data) not in device_array_types):
        return TensorMeta(t)
    key = (data.shape, t._dtype, id(dev))
    m = _TENSOR_METAS.get(key)
    if m is None:
        if len(_TENSOR_METAS) >= _INTERNED_MAX:
            _TENSOR_METAS.clear()
        m = _TENSOR_METAS[key] = TensorMeta(t)
    return m


_NO_GRAD_VIEW_HINT = ("Given that this use case is ambiguous and error-prone, it is forbidden. You can clarify "
                      "your code by moving both the view and the inplace either both inside the no_grad block "
                      "(if you don't want the inplace to be tracked) or both outside (if you want the inplace "
                      "to be tracked).")


def node_title(op) -> str:
    """The name PyTorch's messages give a view op's node (`View` for view)."""
    return _camel(op._schema.name)


def no_grad_view_error(t: Tensor, what: str) -> str:
    """PyTorch's message for a view made under no_grad (or a view of one) meeting an in-place op."""
    who = ("A view was" if t._no_grad_view == "" else
           f"Output 0 of {t._no_grad_view} is a view of a view which was")
    return f"{who} created in no_grad mode and {what}. {_NO_GRAD_VIEW_HINT}"


def refresh_view(t: Tensor, strict: bool | None = None) -> bool:
    """PyTorch's view grad_fn regeneration: a view whose base was modified in place since the view's
    node was recorded (their shared version counter moved on) and now requires grad takes a new node
    reading its elements out of the base's current value (AsStridedBackward0 on the base), and
    requires grad itself, even if it did not before (`a[:2]` after `a.add_(w)`); a view made by
    detach() is left alone. A view made under no_grad of a base that requires grad raises instead
    (PyTorch's CreationMeta.NO_GRAD_MODE): when `strict` (its grad_fn read), or (None) in grad mode,
    that is, when an op would record it. Returns whether `t` requires grad."""
    base = t._base
    if t._version[0] == t._view_version:
        return t._requires_grad
    if t._no_grad_view is not None and base._requires_grad:
        if strict or (strict is None and _state.tls.grad_enabled):
            raise RuntimeError(no_grad_view_error(
                t, "its base or another view of its base has been modified inplace with grad mode enabled"))
        return t._requires_grad
    if not base._requires_grad or (not t._requires_grad and t._view_untracked):
        t._view_version = t._version[0]
        return t._requires_grad
    t._grad_fn = ViewOfBase(_edge(base), _meta_of(base), _ViewIndex(base, t))
    t._output_nr = 0
    t._requires_grad = True
    t._view_version = t._version[0]
    return True


def _edge(t: Tensor):
    if t._base is not None:
        refresh_view(t)
    if t._grad_fn is not None:
        return (t._grad_fn, t._output_nr)
    if t._requires_grad:
        return (accumulator(t), 0)
    return (None, 0)


class OpNode(Node):
    """The backward of one dispatched op: calls the op's derivative with what it saved."""

    def __init__(self, op, saved, next_nodes, next_nrs, in_meta, out_meta, tensor_layout):
        # Node.__init__ inlined (one is made per recorded op)
        self._sequence_nr = next(_seq)
        self._next_nodes = tuple(next_nodes)
        self._next_nrs = tuple(next_nrs)
        self._in_meta = tuple(in_meta)
        if _state.anomaly:
            self.metadata["traceback_"] = traceback.format_stack()[:-2]
        self._op = op
        self._saved = saved
        self._out_meta = out_meta          # (shape, dtype, device) per output, for zero grads
        self._layout = tensor_layout       # per Tensor arg: None (single) or list length; None: all single

    def name(self):
        s = self._op._schema.name
        return _camel(s) + "Backward0"

    def release(self):
        self._saved = None

    def _undefined(self, i: int) -> Tensor:
        """Zeros for output `i`, which received no gradient (PyTorch's undefined tensor)."""
        shape, dt, dev = self._out_meta[i]
        z = zeros(shape, dtype=dt, device=dev) if dev is not None and not hasattr(dev, "zeros") \
            else dev.zeros(dt)                    # a DTensor's layout makes its own zeros
        z._undefined_grad = True                  # see flambeau._ops._helpers.undefined_grad
        return z

    def apply(self, grads):
        saved = self._saved
        if saved is None:
            raise RuntimeError(_FREED)
        op = self._op
        if len(grads) == 1:
            g = grads[0]
            if g is None:
                g = grads[0] = self._undefined(0)
        else:
            optional = None
            for i, g in enumerate(grads):
                if g is None:
                    if optional is None:           # decided before any zeros are filled in
                        optional = op.optional_output_grads and all(x is None for x in grads[1:])
                    if not (optional and i):
                        grads[i] = self._undefined(i)
            g = tuple(grads)
        kw = {}
        for k, v in saved.items():
            if type(v) is SavedTensor:
                t = v.t
                if v.is_output or v.packed is not None or t._version[0] != v.version:
                    v = v.unpack(self)
                else:
                    v = t                  # `SavedTensor.unpack` of a saved input, inlined
            elif type(v) is list and any(type(x) is SavedTensor for x in v):
                v = [x.unpack(self) if type(x) is SavedTensor else x for x in v]
            elif type(v) is tuple and v and type(v[0]) is SavedTensor:
                v = tuple(x.unpack(self) if type(x) is SavedTensor else x for x in v)
            kw[k] = v
        res = op.derivative(g, **kw)
        if self._layout is None:           # every Tensor argument a single tensor: one gradient each
            if not isinstance(res, (tuple, list)):
                return [res]
            return list(res[:len(self._next_nodes)])
        if not isinstance(res, (tuple, list)) or (len(self._layout) == 1 and self._layout[0] is not None
                                                   and isinstance(res, list)):
            res = (res,)
        flat = []
        for lay, r in zip(self._layout, res):
            if lay is None:
                flat.append(r)
            else:
                flat.extend(r if r is not None else [None] * lay)
        return flat


# The engine runs ready nodes highest sequence number first. A leaf's AccumulateGrad is reused while a graph
# holding it is alive (a training loop's previous loss), so by its creation number it would wait behind every
# later op's backward: the last layer's gradient hooks, where DDP starts its bucket all-reduces, ran after
# the whole backward.
ACCUMULATE_FIRST = 1 << 62


class AccumulateGrad(Node):
    """Sink for a leaf tensor: accumulates into `.grad` and runs its hooks."""

    def __init__(self, variable: Tensor):
        # Node.__init__ inlined (one is made per leaf per step); run as soon as ready, as PyTorch's
        # (UINT64_MAX priority)
        self._sequence_nr = next(_seq) + ACCUMULATE_FIRST
        if _state.anomaly:
            self.metadata["traceback_"] = traceback.format_stack()[:-2]
        self.variable = variable
        self._meta = _leaf_meta(variable)          # the leaf's metadata, which every edge into this node shares

    def meta(self):
        """The leaf's (shape, dtype, device), one tuple shared by the nodes that use it (`record`),
        renewed when the leaf's data changed shape, dtype or device (`p.data = p.data.half()`)."""
        m, v = self._meta, self.variable
        if v._device is WRAPPER_DEVICE or m[1] is not v._dtype or m[2] is not v._device or m[0] != v._data.shape:
            m = self._meta = _leaf_meta(v)
        return m

    def name(self):
        return "torch::autograd::AccumulateGrad"

    def apply(self, grads):
        return []


def _leaf_meta(v: Tensor) -> tuple:
    """A leaf's metadata tuple, kept on the leaf (`Tensor._leaf_meta`) while it describes it: each step's new
    AccumulateGrad of a parameter reuses it instead of making one more tracked tuple."""
    if v._device is WRAPPER_DEVICE:
        return _meta_of(v)
    m = v._leaf_meta
    if m is None or m[1] is not v._dtype or m[2] is not v._device or m[0] != v._data.shape:
        m = v._leaf_meta = (v._data.shape, v._dtype, v._device)
    return m


def accumulator(t: Tensor) -> AccumulateGrad:
    ref = t.__dict__.get("_accumulator")
    acc = ref() if ref is not None else None
    if acc is None:
        acc = AccumulateGrad(t)
        t.__dict__["_accumulator"] = weakref.ref(acc)
    return acc


def reachable_leaves(roots) -> Iterator[AccumulateGrad]:
    """The leaf nodes (AccumulateGrad) that the graph nodes `roots` reach, each once (a depth-first
    walk over `next_functions`; None entries are skipped)."""
    seen, stack = set(), list(roots)
    while stack:
        node = stack.pop()
        if node is None or id(node) in seen:
            continue
        seen.add(id(node))
        if isinstance(node, AccumulateGrad):
            yield node
        else:
            stack.extend(node._next_nodes)


def _differentiable(t) -> bool:
    return isinstance(t, Tensor) and t._dtype.category >= FLOATING


def result_index(name: str):
    """k for a derivative parameter named `result<k>` (the op's k-th output alone), else None."""
    if name.startswith("result") and name[6:].isdigit():
        return int(name[6:])
    return None


# What `record` saves for each derivative parameter (`_RecordPlan.saved`): kinds of entries
_SAVE_ARG, _SAVE_RESULT, _SAVE_RESULT_K, _SAVE_GEOMETRY, _SAVE_META, _SAVE_OUTPUT_MASK = range(6)
OUTPUT_MASK = "output_mask"
"""A derivative parameter of this name receives, per Tensor argument of the op (schema order), whether
its gradient goes anywhere (PyTorch's `output_mask` / `grad_input_mask` of derivatives.yaml): False for
an input that does not require grad, so the derivative may skip that gradient (the first convolution's
input gradient, an MLP's data input) and return None for it."""


class _RecordPlan:
    """What `record` derives from an op's schema and derivative signature, computed once per op (on
    its first recorded call, again if `saved_names` is replaced): the node's name, and for each
    derivative parameter what to save and from which bound argument."""
    __slots__ = ("saved_names", "node_name", "nargs", "saved", "result_needed_idx")

    def __init__(self, op):
        names = [a.name for a in op._schema.args]
        self.saved_names = op.saved_names
        self.node_name = _camel(op._schema.name) + "Backward0"
        self.nargs = len(names)
        self.result_needed_idx = tuple(names.index(a) for a in op.result_needed_for)
        saved = []
        for n in op.saved_names:
            k = result_index(n)
            if n == "result":
                saved.append((n, _SAVE_RESULT, 0))
            elif n == OUTPUT_MASK:
                saved.append((n, _SAVE_OUTPUT_MASK, 0))
            elif k is not None:            # one output alone (`result1`): the others are not kept alive
                saved.append((n, _SAVE_RESULT_K, k))
            elif n.endswith("_geometry") and n not in names:
                saved.append((n, _SAVE_GEOMETRY, names.index(n[:-9])))
            elif n.endswith("_meta") and n not in names:
                saved.append((n, _SAVE_META, names.index(n[:-5])))
            else:
                saved.append((n, _SAVE_ARG, names.index(n)))
        self.saved = tuple(saved)


def _plan(op) -> _RecordPlan:
    plan = op.__dict__.get("_record_plan")
    if plan is None or plan.saved_names is not op.saved_names:
        plan = op._record_plan = _RecordPlan(op)
    return plan


def record(op, args, kwargs, out, node_cls=None):
    """Attach a backward node for `op(*args, **kwargs) -> out` to the outputs."""
    plan = op.__dict__.get("_record_plan")                 # `_plan`, inlined (this runs per recorded op)
    if plan is None or plan.saved_names is not op.saved_names:
        plan = _plan(op)
    # all arguments given positionally: they are the bound arguments (the binder only fills defaults)
    bound = args if not kwargs and len(args) == plan.nargs else op.bind(*args, **(kwargs or {}))
    # Edges and input metadata. An input's metadata is the tuple its producer recorded for it, or its
    # leaf's (`AccumulateGrad.meta`): shared, not one new tuple per use; an input that needs no gradient
    # has none (the engine reads the metadata of an edge only).
    nodes, nrs, in_meta = [], [], []
    nonzero_nr = False  # an edge into an output other than 0: `nrs` becomes its own tuple, else a shared one
    layout = None       # per Tensor argument, None (one tensor) or a list's length; None throughout: no list
    for k, i in enumerate(op.tensor_args):
        v = bound[i]
        if isinstance(v, Tensor):
            # `_edge` and `_meta_of`, inlined: a plain tensor, or a view whose base was not modified in place
            # since its node was recorded (`refresh_view` would return at once)
            if (v._base is None or v._version[0] == v._view_version) and v._device is not WRAPPER_DEVICE:
                fn = v._grad_fn
                if fn is not None:
                    nr = v._output_nr
                    if nr:
                        nonzero_nr = True
                    nodes.append(fn)
                    nrs.append(nr)
                    in_meta.append(fn._out_meta[nr] if type(fn) is OpNode else
                                   (v._data.shape, v._dtype, v._device))
                elif v._requires_grad:
                    fn = accumulator(v)
                    nodes.append(fn)
                    nrs.append(0)
                    in_meta.append(fn.meta())
                else:
                    nodes.append(None)
                    nrs.append(0)
                    in_meta.append(None)
            else:
                fn, nr = _edge(v)
                if nr:
                    nonzero_nr = True
                nodes.append(fn)
                nrs.append(nr)
                in_meta.append(_input_meta(v, fn, nr))
            if layout is not None:
                layout.append(None)
        elif isinstance(v, (list, tuple)):
            if layout is None:
                layout = [None] * k
            layout.append(len(v))
            for x in v:
                if isinstance(x, Tensor):
                    fn, nr = _edge(x)
                    if nr:
                        nonzero_nr = True
                    nodes.append(fn)
                    nrs.append(nr)
                    in_meta.append(_input_meta(x, fn, nr))
                else:
                    nodes.append(None)
                    nrs.append(0)
                    in_meta.append(None)
        else:
            nodes.append(None)
            nrs.append(0)
            in_meta.append(None)
            if layout is not None:
                layout.append(None)
    if not nonzero_nr and len(nrs) < 17:                  # len(_ZERO_NRS)
        nrs = _ZERO_NRS[len(nrs)]
    single = isinstance(out, Tensor)
    outs = (out,) if single else out
    node_name = plan.node_name
    saved = {}
    for n, kind, i in plan.saved:
        if kind == _SAVE_ARG:
            v = bound[i]
            if isinstance(v, Tensor):
                v = SavedTensor(v, False, node_name)
            elif isinstance(v, (list, tuple)) and v and any(isinstance(x, Tensor) for x in v):
                v = [SavedTensor(x, False, node_name) if isinstance(x, Tensor) else x for x in v]
            saved[n] = v
        elif kind == _SAVE_RESULT:
            if plan.result_needed_idx and not any(isinstance(bound[j], Tensor) for j in plan.result_needed_idx):
                saved[n] = None
            else:
                saved[n] = (SavedTensor(out, True, node_name, 0) if single else
                            tuple(SavedTensor(o, True, node_name, k) if isinstance(o, Tensor) else o
                                  for k, o in enumerate(outs)))
        elif kind == _SAVE_RESULT_K:
            o = outs[i]
            saved[n] = SavedTensor(o, True, node_name, i) if isinstance(o, Tensor) else o
        elif kind == _SAVE_GEOMETRY:
            saved[n] = TensorMeta.geometry(bound[i])
        elif kind == _SAVE_OUTPUT_MASK:
            saved[n] = _output_mask(nodes, layout)
        else:
            v = bound[i]
            saved[n] = _tensor_meta(v) if isinstance(v, Tensor) else \
                [_tensor_meta(x) if isinstance(x, Tensor) else None for x in v] if isinstance(v, (list, tuple)) else v
    if single:                                      # `_single_out_meta` and `_differentiable`, inlined
        data = out._data
        if out._device is not WRAPPER_DEVICE and (type(data) is np.ndarray or type(data) in device_array_types):
            out_meta = _OUT_METAS.get((data.shape, out._dtype))
            if out_meta is None or out_meta[0][2] is not out._device:
                out_meta = _single_out_meta(out)
        else:
            out_meta = (_meta_of(out),)
        node = (node_cls or OpNode)(op, saved, nodes, nrs, in_meta, out_meta, layout)
        if out._dtype.category >= FLOATING:
            out._grad_fn = node
            out._output_nr = 0
            out._requires_grad = True
        return node
    out_meta = tuple([(_single_out_meta(o)[0] if o._device is not WRAPPER_DEVICE else _meta_of(o))
                      if isinstance(o, Tensor) else None for o in outs])
    node = (node_cls or OpNode)(op, saved, nodes, nrs, in_meta, out_meta, layout)
    for k, o in enumerate(outs):
        if _differentiable(o):
            o._grad_fn = node
            o._output_nr = k
            o._requires_grad = True
    return node


_META_OF_FIRST = (("self_meta", _SAVE_META, 0),)


def record_cast(op, args: tuple, out: Tensor):
    """`record(op, args, None, out)` for a cast (`_to_copy` with all its arguments positional: `Tensor.to(dtype)`,
    autocast's ~120 casts a GPT-2 step): one Tensor argument, args[0], whose metadata alone the derivative
    saves, one floating output. The edge of a tensor that needs no view refresh and the node are made here;
    anything else (a view to refresh, a wrapper subclass, another saved set) goes to `record`."""
    plan = op.__dict__.get("_record_plan")
    if plan is None or plan.saved_names is not op.saved_names:
        plan = _plan(op)
    t = args[0]
    if (plan.saved != _META_OF_FIRST
            or len(args) != plan.nargs or t._device is WRAPPER_DEVICE or out._device is WRAPPER_DEVICE
            or (t._base is not None and t._version[0] != t._view_version) or out._dtype.category < FLOATING):
        return record(op, args, None, out)
    fn = t._grad_fn
    if fn is not None:
        nr = t._output_nr
        meta = fn._out_meta[nr] if type(fn) is OpNode else (t._data.shape, t._dtype, t._device)
        nrs = (nr,) if nr else _ZERO_NRS[1]
    elif t._requires_grad:
        fn = accumulator(t)
        meta, nrs = fn.meta(), _ZERO_NRS[1]
    else:
        fn, meta, nrs = None, None, _ZERO_NRS[1]
    node = OpNode(op, {"self_meta": _tensor_meta(t)}, (fn,), nrs, (meta,), _single_out_meta(out), None)
    out._grad_fn = node
    out._output_nr = 0
    out._requires_grad = True
    return node


def _input_meta(t: Tensor, fn, nr: int):
    """The metadata `record` keeps for input `t` reaching node `fn` at output `nr` (see there)."""
    if fn is None:
        return None
    if type(fn) is OpNode:
        return fn._out_meta[nr]
    if type(fn) is AccumulateGrad:
        return fn.meta()
    return _meta_of(t)


def _output_mask(nodes, layout) -> tuple:
    """Per Tensor argument (a list argument: any of its tensors): whether its gradient has an edge."""
    if layout is None:
        return tuple([fn is not None for fn in nodes])
    mask, k = [], 0
    for lay in layout:
        n = 1 if lay is None else lay
        mask.append(any(fn is not None for fn in nodes[k:k + n]))
        k += n
    return tuple(mask)


def record_not_implemented(op, args, kwargs, out):
    """Outputs of an op without a derivative get a node that raises when backward reaches it."""
    record(op, args, kwargs, out, node_cls=NotImplementedNode)


class NotImplementedNode(OpNode):
    def apply(self, grads):
        raise NotImplementedError(f"the derivative for '{self._op.name}' is not implemented.")


def record_inplace(f, args, kwargs, self: Tensor):
    """Autograd for `self.op_(...)`: self takes the functional op's node; a view rebases its base.
    A self of integer or bool dtype records nothing (a float written into it carries no grad)."""
    if not _differentiable(self):
        return
    base = self._base
    if base is None:
        record(f, args, kwargs, self)
        return
    record(f, args, kwargs, self)
    _rebase_view(base, self)


def _geometry(t: Tensor) -> tuple:
    return tuple(t.shape), t.stride(), t.storage_offset()


class _ViewIndex:
    """Flat (logical, C-order) indices into a base of each element of its view, shaped like the view;
    computed at first use in backward (recording stays free of data work, and of symbolic sizes
    under fake tracing, where backward never runs)."""

    __slots__ = ("base_geom", "view_geom", "device", "value")

    def __init__(self, base: Tensor, view: Tensor):
        self.base_geom, self.view_geom, self.device, self.value = _geometry(base), _geometry(view), base.device, None

    def get(self) -> Tensor:
        if self.value is None:
            pb = storage_positions(*self.base_geom)
            pv = storage_positions(*self.view_geom)
            store = np.zeros(int(max(pb.max(initial=0), pv.max(initial=0))) + 1, dtype=np.int64)
            store[pb.ravel()] = np.arange(pb.size, dtype=np.int64)
            self.value = _tensor(store[pv], device=self.device)
        return self.value


class CopySlices(Node):
    """New value of a base whose view was modified in place: old base outside, new view inside."""

    def __init__(self, base_edge, base_meta, view_edge, view_meta, index: _ViewIndex):
        super().__init__([base_edge, view_edge], [base_meta, view_meta])
        self._index = index
        self._base_shape = base_meta[0]

    def name(self):
        return "torch::autograd::CopySlices"

    def apply(self, grads):
        g = grads[0]
        flat = g.reshape(-1)
        index = self._index.get()
        mask = ones(flat.shape, dtype=g.dtype, device=g.device).index_fill(0, index.reshape(-1), 0)
        return [(flat * mask).reshape(self._base_shape), flat.take(index)]


class ViewOfBase(Node):
    """A view re-derived from its (rebased) base: scatters the view's grad into the base's shape."""

    def __init__(self, base_edge, base_meta, index: _ViewIndex):
        super().__init__([base_edge], [base_meta])
        self._index = index
        self._base_shape = base_meta[0]

    def name(self):
        return "AsStridedBackward0"

    def apply(self, grads):
        g = grads[0]
        n = 1
        for s in self._base_shape:
            n *= s
        z = zeros((n,), dtype=g.dtype, device=g.device)
        return [z.index_add(0, self._index.get().reshape(-1), g.reshape(-1)).reshape(self._base_shape)]


def _rebase_view(base: Tensor, view: Tensor):
    idx = _ViewIndex(base, view)
    bmeta = _meta_of(base)
    cs = CopySlices(_edge(base), bmeta, (view._grad_fn, view._output_nr), _meta_of(view), idx)
    base._grad_fn, base._output_nr, base._requires_grad = cs, 0, True
    view._grad_fn = ViewOfBase((cs, 0), bmeta, idx)
    view._output_nr = 0
    view._view_version = view._version[0]


# ---- hooks ---------------------------------------------------------------------------------
def register_tensor_hook(t: Tensor, fn):
    if not t.requires_grad:
        raise RuntimeError("cannot register a hook on a tensor that doesn't require gradient")
    if t.grad_fn is None:
        if t._hooks is None:
            t._hooks = []
        h = RemovableHandle(t._hooks)
        t._hooks.append((h.id, fn))
        return h
    node = t.grad_fn
    if node._tensor_hooks is None:
        node._tensor_hooks = {}
    lst = node._tensor_hooks.setdefault(t._output_nr, [])
    h = RemovableHandle(lst)
    lst.append((h.id, fn))
    return h


def register_post_accumulate_hook(t: Tensor, fn):
    if t.grad_fn is not None:
        raise RuntimeError("post accumulate grad hooks cannot be registered on non-leaf tensors")
    lst = t.__dict__.setdefault("_post_acc_hooks", [])
    h = RemovableHandle(lst)
    lst.append((h.id, fn))
    return h


def retain_grad(t: Tensor):
    if not t.requires_grad:
        raise RuntimeError("can't retain_grad on Tensor that has requires_grad=False")
    if t.grad_fn is None:
        return
    node = t.grad_fn
    if node._retain_hooks is None:
        node._retain_hooks = {}
    node._retain_hooks[t._output_nr] = weakref.ref(t)
    t.__dict__["_retains_grad"] = True
