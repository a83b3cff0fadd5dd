"""cuDNN fused attention (flash forward and backward) for the cuda device, through NVIDIA's
maintained `nvidia-cudnn-frontend` Python package (`import cudnn`), as PyTorch's cuDNN SDPA backend.

The frontend builds an operation graph of one SDPA node (causal or not, dropout with Philox seed
and offset read from device memory, the softmax statistics saved for the backward), asks cuDNN's
heuristics for an engine and finalises a plan; graphs are cached per (shapes, strides, dtype,
options). `supports` builds them once for dense layouts so that the backend selection skips cuDNN
for a configuration its engines reject. Execution takes raw device pointers (CuPy's `.data.ptr`) and a CuPy workspace and runs on
CuPy's current stream, so neither PyTorch nor DLPack is involved: every pointer we pass is an int,
which keeps the frontend off its torch code paths.

Host cost per call (issue 11; GPT-2 runs 24 a step): a call signature seen before costs one dict lookup
for its graph, the uids of its tensors (taken once) and the frontend's pybind `_execute` with a
{uid: pointer} dict (its Python `execute` wrapper rebuilt that dict from {tensor: pointer} per call);
the stream is set on the handle only when it changed, and one workspace is kept per (device, stream).
When q, k and v are the pieces of one buffer (GPT-2's split qkv projection), the backward writes dq,
dk and dv into one buffer laid out the same way, and `claim_joined` gives the split's backward that
buffer as their concatenation: no cat (CuPy's concatenate cost ~86 us of host a call, and a copy).

`available()` is False without the package, CuPy or libcudnn; the selection in
flambeau/_ops/attention_fused.py then uses the Triton kernels.
"""
from __future__ import annotations

import sys
import threading

import numpy as np

from . import cudnn as _cudnn_lib

_state = {"module": None, "tried": False, "error": None, "unsupported": None}
_lock = threading.Lock()
_graphs: dict = {}
_handles: dict = {}
_support: dict = {}
_DTYPES = {"float16": "HALF", "bfloat16": "BFLOAT16"}
MAX_HEAD_DIM = 128
HEAD_DIM_MULTIPLE = 8


def _module():
    if not _state["tried"]:
        with _lock:
            if not _state["tried"]:
                try:
                    import cupy  # noqa: F401  deferred: optional dependency, present only where cuda is used
                    if _cudnn_lib._lib() is None:      # load libcudnn first: the frontend then finds it by name
                        raise ImportError(f"libcudnn not loaded ({_cudnn_lib.load_error()})")
                    _state["module"] = _import_frontend()
                except Exception as e:      # ImportError, or the frontend failing to open libcudnn
                    _state["error"] = f"{type(e).__name__}: {e}"
                _state["tried"] = True
    return _state["module"]


def _import_frontend():
    """`import cudnn` with PyTorch kept out: frontends from 1.15 import torch at import when it is
    installed (cudnn/wrapper.py, for their torch-tensor conveniences), and flambeau never imports torch.
    While the package loads, `torch` is an absent module to it (`sys.modules["torch"] = None`: its
    `import torch` raises ImportError; 1.16+ catch it, 1.15.0 does not and is reported unusable); where
    the program imported torch itself, nothing is hidden. We pass only ints and cuDNN's own types to
    the frontend, so its later torch checks never run."""
    hide = "torch" not in sys.modules
    if hide:
        sys.modules["torch"] = None
    try:
        import cudnn  # deferred: optional dependency, present only where cuda is used
    finally:
        if hide and sys.modules.get("torch", 0) is None:
            del sys.modules["torch"]
    return cudnn


def available() -> bool:
    """Whether the cuDNN frontend package and libcudnn can be used."""
    return _module() is not None


def load_error():
    """Why the frontend could not be used (None when it could, or was not tried)."""
    return _state["error"]


def unsupported_reason():
    """cuDNN's answer for the last configuration `supports` rejected."""
    return _state["unsupported"]


_streams: dict = {}         # cuDNN handle -> the stream last set on it (cudnnSetStream costs a few us a call)


def _handle(cudnn):
    import cupy  # deferred: optional dependency, present only where cuda is used
    dev = cupy.cuda.runtime.getDevice()
    h = _handles.get(dev)
    if h is None:
        h = _handles[dev] = cudnn.create_handle()
    stream = cupy.cuda.get_current_stream().ptr
    if _streams.get(h) != stream:
        cudnn.set_stream(handle=h, stream=stream)
        _streams[h] = stream
    return h


def _el_strides(a):
    return [s // a.itemsize for s in a.strides]


def _ready(a):
    """`a` when its last dim is contiguous and its pointer and row strides are 16-byte aligned."""
    strides = a.strides
    if strides[-1] == a.itemsize and not a.data.ptr % 16 and not any(s % 16 for s in strides[:-1]):
        return a
    import cupy  # deferred: optional dependency, present only where cuda is used
    return cupy.ascontiguousarray(a)


def _empty_like(a):
    """An empty array of `a`'s shape and dtype, dense, with `a`'s order of strides (as PyTorch lays
    out the outputs: a (B, S, H, D) projection viewed as (B, H, S, D) gets that layout back)."""
    import cupy  # deferred: optional dependency, present only where cuda is used
    if a.flags.c_contiguous:
        return cupy.ndarray(a.shape, a.dtype)
    return cupy.empty_like(a, order="K")


def _build(g, cudnn):
    g.validate()
    g.build_operation_graph()
    g.create_execution_plans([cudnn.heur_mode.A, cudnn.heur_mode.FALLBACK])
    g.check_support()
    g.build_plans()
    return g


def _scalar_tensors(g, cudnn):
    seed = g.tensor(name="seed", dim=[1, 1, 1, 1], stride=[1, 1, 1, 1], data_type=cudnn.data_type.INT64)
    offset = g.tensor(name="offset", dim=[1, 1, 1, 1], stride=[1, 1, 1, 1], data_type=cudnn.data_type.INT64)
    return seed, offset


def _layout(a):
    return tuple(a.shape), tuple(_el_strides(a))


def _new_graph(cudnn, dtype_name, handle):
    dt = getattr(cudnn.data_type, _DTYPES[dtype_name])
    return cudnn.pygraph(io_data_type=dt, intermediate_data_type=cudnn.data_type.FLOAT,
                         compute_data_type=cudnn.data_type.FLOAT, handle=handle), dt


def _declare(g, dt, name, layout):
    return g.tensor(name=name, dim=list(layout[0]), stride=list(layout[1]), data_type=dt)


def _fwd_graph(cudnn, handle, dtype_name, lq, lk, lv, lo, is_causal, scale, dropout_p):
    """(graph, its tensors, workspace bytes) of the forward for these (shape, strides) layouts, cached."""
    key = ("fwd", dtype_name, lq, lk, lv, lo, bool(is_causal), float(scale), float(dropout_p))
    entry = _graphs.get(key)
    if entry is None:
        g, dt = _new_graph(cudnn, dtype_name, handle)
        tq, tk, tv = (_declare(g, dt, n, lay) for n, lay in (("q", lq), ("k", lk), ("v", lv)))
        seed, offset = _scalar_tensors(g, cudnn) if dropout_p > 0 else (None, None)
        to, ts = g.sdpa(name="sdpa", q=tq, k=tk, v=tv, generate_stats=True, attn_scale=float(scale),
                        use_causal_mask=bool(is_causal),
                        dropout=(float(dropout_p), seed, offset) if dropout_p > 0 else None)
        B, H, L, _ = lq[0]
        to.set_output(True).set_dim(list(lo[0])).set_stride(list(lo[1])).set_data_type(dt)
        ts.set_output(True).set_dim([B, H, L, 1]).set_stride([H * L, L, 1, 1]).set_data_type(cudnn.data_type.FLOAT)
        _build(g, cudnn)
        entry = _graphs[key] = (g, (tq, tk, tv, to, ts, seed, offset), int(g.get_workspace_size()))
    return entry


def _bwd_graph(cudnn, handle, dtype_name, lq, lk, lv, lo, ldo, lgq, lgk, lgv, is_causal, scale, dropout_p):
    key = ("bwd", dtype_name, lq, lk, lv, lo, ldo, lgq, lgk, lgv, bool(is_causal), float(scale), float(dropout_p))
    entry = _graphs.get(key)
    if entry is None:
        g, dt = _new_graph(cudnn, dtype_name, handle)
        tq, tk, tv, to, tdo = (_declare(g, dt, n, lay) for n, lay in
                               (("q", lq), ("k", lk), ("v", lv), ("o", lo), ("dO", ldo)))
        B, H, L, _ = lq[0]
        ts = g.tensor(name="stats", dim=[B, H, L, 1], stride=[H * L, L, 1, 1], data_type=cudnn.data_type.FLOAT)
        seed, offset = _scalar_tensors(g, cudnn) if dropout_p > 0 else (None, None)
        tdq, tdk, tdv = g.sdpa_backward(name="sdpa_backward", q=tq, k=tk, v=tv, o=to, dO=tdo, stats=ts,
                                        attn_scale=float(scale), use_causal_mask=bool(is_causal),
                                        dropout=(float(dropout_p), seed, offset) if dropout_p > 0 else None)
        for t, lay in ((tdq, lgq), (tdk, lgk), (tdv, lgv)):
            t.set_output(True).set_dim(list(lay[0])).set_stride(list(lay[1])).set_data_type(dt)
        _build(g, cudnn)
        entry = _graphs[key] = (g, (tq, tk, tv, to, tdo, ts, tdq, tdk, tdv, seed, offset),
                                int(g.get_workspace_size()))
    return entry


def _dense(shape):
    st, acc = [], 1
    for n in reversed(shape):
        st.append(acc)
        acc *= n
    return tuple(shape), tuple(reversed(st))


def supports(q_shape, k_shape, dtype_name: str, is_causal: bool, dropout_p: float) -> bool:
    """Whether cuDNN builds forward and backward plans for these sizes (dense layouts), cached.
    A configuration cuDNN's engines reject makes the selection move on to the next backend."""
    key = (tuple(q_shape), tuple(k_shape), dtype_name, bool(is_causal), dropout_p > 0)
    ok = _support.get(key)
    if ok is None:
        cudnn = _module()
        handle = _handle(cudnn)
        lq, lk = _dense(q_shape), _dense(k_shape)
        scale = 1.0 / float(q_shape[-1]) ** 0.5
        p = 0.5 if dropout_p > 0 else 0.0
        try:
            _fwd_graph(cudnn, handle, dtype_name, lq, lk, lk, lq, is_causal, scale, p)
            _bwd_graph(cudnn, handle, dtype_name, lq, lk, lk, lq, lq, lq, lk, lk, is_causal, scale, p)
            ok = True
        except Exception as e:      # cudnnGraphNotSupportedError, or a RuntimeError from plan building
            _state["unsupported"] = f"{type(e).__name__}: {e}"
            ok = False
        _support[key] = ok
    return ok


_workspaces: dict = {}      # (device, stream) -> the largest workspace asked for there so far (CuPy array)


def _workspace(cupy, nbytes):
    """A device pointer to `nbytes` of workspace: one buffer per (device, stream), grown as needed (calls
    on one stream run in order, so each reuses it; as cuBLASLt's workspace in cublaslt.py)."""
    nbytes = max(nbytes, 1)
    key = (cupy.cuda.runtime.getDevice(), cupy.cuda.get_current_stream().ptr)
    ws = _workspaces.get(key)
    if ws is None or ws.nbytes < nbytes:
        ws = _workspaces[key] = cupy.ndarray((nbytes,), np.uint8)
    return ws.data.ptr


def _runner(cudnn, g, tensors):
    """How one cached graph is executed: (the frontend's pybind `_execute`, the uids of `tensors`) when the
    graph's `execute` is the frontend's own Python wrapper (1.14 to 1.23: it turns the {tensor: pointer}
    dict into {uid: pointer} per call, then calls `_execute`), so a call skips that conversion; else
    (None, tensors) and calls go through `g.execute`."""
    if getattr(cudnn, "_execute", None) is not None and getattr(type(g), "execute", None) is cudnn._execute:
        return g._execute, tuple(t.get_uid() if t is not None else None for t in tensors)
    return None, tensors


def _execute(g, run, keys, ptrs, workspace, handle):
    """Run graph `g` on device pointers `ptrs` (in the order of `keys`: uids for `run`, else the
    frontend's tensors; None entries skipped)."""
    if run is not None:
        run({k: p for k, p in zip(keys, ptrs) if k is not None}, workspace, handle)
    else:
        g.execute({k: p for k, p in zip(keys, ptrs) if k is not None}, workspace, handle=handle)


_runs: dict = {}            # per call signature: (graph, runner, keys, workspace bytes) of `forward`/`backward`


def _fwd_run(cudnn, handle, q, k, v, out, is_causal, scale, dropout_p):
    key = ("fwd", q.dtype, q.shape, q.strides, k.shape, k.strides, v.shape, v.strides, out.strides,
           is_causal, scale, dropout_p)
    r = _runs.get(key)
    if r is None:
        g, (tq, tk, tv, to, ts, seed, offset), ws = _fwd_graph(cudnn, handle, q.dtype.name, _layout(q), _layout(k),
                                                                _layout(v), _layout(out), is_causal, scale, dropout_p)
        run, keys = _runner(cudnn, g, (tq, tk, tv, to, ts, seed, offset))
        r = _runs[key] = (g, run, keys, ws)
    return r


def forward(q, k, v, dropout_p: float, rng, is_causal: bool, scale: float):
    """q (B, H, L, E), k and v (B, Hk, S, E) CuPy fp16/bf16 arrays -> (out, stats (B, H, L) float32).
    `rng` is a device int64 array [seed, offset] read by cuDNN's Philox dropout."""
    import cupy  # deferred: optional dependency, present only where cuda is used
    cudnn = _module()
    q, k, v = _ready(q), _ready(k), _ready(v)
    out = _empty_like(q)
    handle = _handle(cudnn)
    g, run, keys, ws = _fwd_run(cudnn, handle, q, k, v, out, is_causal, scale, dropout_p)
    stats = cupy.ndarray(q.shape[:3], np.float32)
    rp = rng.data.ptr if dropout_p > 0 else 0
    _execute(g, run, keys, (q.data.ptr, k.data.ptr, v.data.ptr, out.data.ptr, stats.data.ptr, rp, rp + 8),
             _workspace(cupy, ws), handle)
    return out, stats


def _joint_layout(q, k, v):
    """When q, k and v are the three pieces of one dense buffer (GPT-2's (B, T, 3 * H * E) projection split
    and viewed (B, H, T, E): same shape and strides, k and v one step further each, the pieces filling
    their span), the dims of that buffer as (sizes, byte strides) with the pieces' axis last; else None."""
    step = k.data.ptr - q.data.ptr
    if step <= 0 or v.data.ptr - k.data.ptr != step or not (q.shape == k.shape == v.shape) or \
            not (q.strides == k.strides == v.strides) or q.dtype != k.dtype or q.dtype != v.dtype:
        return None
    dims = sorted(zip(q.strides, q.shape)) + [(step, 3)]
    dims.sort()
    expect = q.itemsize
    for st, n in dims:
        if n == 1:
            continue
        if st != expect:
            return None
        expect *= n
    return tuple(q.shape) + (3,), tuple(q.strides) + (step,)


_joined: list = [None]      # the last joint gradient buffer of `backward`, until claimed (at most one is held)


def _joint_grads(cupy, q, k, v):
    """(dq, dk, dv) as views into one new buffer laid out as the one q, k and v come from (`_joint_layout`),
    or None. The buffer is kept for `claim_joined` (replacing the one kept before: a buffer not claimed
    by then is let go)."""
    _joined[0] = None
    lay = _joint_layout(q, k, v)
    if lay is None:
        return None
    shape, strides = lay
    order = sorted(range(len(shape)), key=lambda i: -strides[i])        # outermost first
    buf = cupy.ndarray(tuple(shape[i] for i in order), q.dtype)
    full = buf.transpose(tuple(order.index(i) for i in range(len(shape))))
    grads = (full[..., 0], full[..., 1], full[..., 2])
    if any(g.strides != q.strides for g in grads):      # size-1 dims laid out otherwise: take separate buffers
        return None
    _joined[0] = buf
    return grads


def claim_joined(arrays, dim: int):
    """`cat(arrays, dim)` without a copy, or None. When `arrays` lie in the joint gradient buffer that
    `backward` made last (its dq, dk, dv after the views that undo the split: GPT-2's split of the qkv
    projection) in order, tiling it as cat's contiguous result would, that buffer viewed in the result's
    shape. The buffer is new memory that only those gradients see (it is held until claimed, so no other
    array can have its addresses), so the result is what cat would compute, bit for bit; it is handed out
    once (a second claim gets None)."""
    buf = _joined[0]
    if buf is None:
        return None
    first = arrays[0]
    shape = list(first.shape)
    if not 0 <= dim < len(shape):
        return None
    shape[dim] = sum(a.shape[dim] for a in arrays)
    size = 1
    for n in shape:
        size *= n
    ptr = buf.data.ptr
    if size != buf.size or first.data.ptr != ptr or first.dtype != buf.dtype:
        return None
    out = buf.reshape(shape)
    st = out.strides
    for a in arrays:
        if a.dtype != buf.dtype or a.data.ptr != ptr or a.strides != st or \
                a.shape[:dim] != out.shape[:dim] or a.shape[dim + 1:] != out.shape[dim + 1:]:
            return None
        ptr += a.shape[dim] * st[dim]
    _joined[0] = None
    return out


def _bwd_run(cudnn, handle, q, k, v, out, do, dq, dk, dv, is_causal, scale, dropout_p):
    key = ("bwd", q.dtype, q.shape, q.strides, k.shape, k.strides, v.shape, v.strides, out.strides, do.strides,
           dq.strides, dk.strides, dv.strides, is_causal, scale, dropout_p)
    r = _runs.get(key)
    if r is None:
        g, tensors, ws = _bwd_graph(cudnn, handle, q.dtype.name, *(_layout(a) for a in (q, k, v, out, do, dq, dk, dv)),
                                    is_causal, scale, dropout_p)
        run, keys = _runner(cudnn, g, tensors)
        r = _runs[key] = (g, run, keys, ws)
    return r


_joint_failed: set = set()   # joint gradient layouts cuDNN built no plan for (those get separate buffers)


def backward(grad_out, q, k, v, out, stats, dropout_p: float, rng, is_causal: bool, scale: float, joint=False):
    """(dq, dk, dv) of `forward`'s output, each in its input's shape and layout. With `joint`, when q, k
    and v are the pieces of one buffer (`_joint_layout`), the gradients are the pieces of one new buffer
    laid out as that one (`claim_joined` then takes their concatenation without a copy); else each is
    dense in its input's order of strides."""
    import cupy  # deferred: optional dependency, present only where cuda is used
    cudnn = _module()
    q, k, v, out = _ready(q), _ready(k), _ready(v), _ready(out)
    do = grad_out
    if do.strides != out.strides or do.data.ptr % 16:     # cuDNN wants dO laid out as O
        do = _empty_like(out)
        do[...] = grad_out
    handle = _handle(cudnn)
    grads = None
    if joint and (q.shape, q.strides, q.dtype) not in _joint_failed:
        grads = _joint_grads(cupy, q, k, v)
        if grads is not None:
            try:
                r = _bwd_run(cudnn, handle, q, k, v, out, do, *grads, is_causal, scale, dropout_p)
            except Exception:       # cudnnGraphNotSupportedError, or a RuntimeError from plan building
                _joint_failed.add((q.shape, q.strides, q.dtype))
                _joined[0] = grads = None
    if grads is None:
        grads = tuple(_empty_like(a) for a in (q, k, v))
        r = _bwd_run(cudnn, handle, q, k, v, out, do, *grads, is_causal, scale, dropout_p)
    g, run, keys, ws = r
    dq, dk, dv = grads
    rp = rng.data.ptr if dropout_p > 0 else 0
    _execute(g, run, keys, (q.data.ptr, k.data.ptr, v.data.ptr, out.data.ptr, do.data.ptr, stats.data.ptr,
                            dq.data.ptr, dk.data.ptr, dv.data.ptr, rp, rp + 8), _workspace(cupy, ws), handle)
    return dq, dk, dv
