"""cuDNN fused attention (flash forward and backward) for the cuda device, through NVIDIA's
maintained `nvidia-cudnn-frontend` Python package (`import cudnn`), as PyTorch's cuDNN SDPA backend.

The frontend builds an operation graph of one SDPA node (causal or not, dropout with Philox seed
and offset read from device memory, the softmax statistics saved for the backward), asks cuDNN's
heuristics for an engine and finalises a plan; graphs are cached per (shapes, strides, dtype,
options). `supports` builds them once for dense layouts so that the backend selection skips cuDNN
for a configuration its engines reject. Execution takes raw device pointers (CuPy's `.data.ptr`) and a CuPy workspace and runs on
CuPy's current stream, so neither PyTorch nor DLPack is involved: every pointer we pass is an int,
which keeps the frontend off its torch code paths.

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


def _handle(cudnn):
    import cupy  # deferred: optional dependency, present only where cuda is used
    dev = cupy.cuda.runtime.getDevice()
    h = _handles.get(dev)
    if h is None:
        h = _handles[dev] = cudnn.create_handle()
    cudnn.set_stream(handle=h, stream=cupy.cuda.get_current_stream().ptr)
    return h


def _el_strides(a):
    return [s // a.itemsize for s in a.strides]


def _ready(a):
    """`a` when its last dim is contiguous and its pointer and row strides are 16-byte aligned."""
    import cupy  # deferred: optional dependency, present only where cuda is used
    st = _el_strides(a)
    if st[-1] == 1 and a.data.ptr % 16 == 0 and all(s * a.itemsize % 16 == 0 for s in st[:-1]):
        return a
    return cupy.ascontiguousarray(a)


def _empty_like(a):
    """An empty array of `a`'s shape and dtype, dense, with `a`'s order of strides (as PyTorch lays
    out the outputs: a (B, S, H, D) projection viewed as (B, H, S, D) gets that layout back)."""
    import cupy  # deferred: optional dependency, present only where cuda is used
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


def _workspace(nbytes):
    import cupy  # deferred: optional dependency, present only where cuda is used
    return cupy.empty(max(nbytes, 1), dtype=np.uint8)


def forward(q, k, v, dropout_p: float, rng, is_causal: bool, scale: float):
    """q (B, H, L, E), k and v (B, Hk, S, E) CuPy fp16/bf16 arrays -> (out, stats (B, H, L) float32).
    `rng` is a device int64 array [seed, offset] read by cuDNN's Philox dropout."""
    import cupy  # deferred: optional dependency, present only where cuda is used
    cudnn = _module()
    q, k, v = _ready(q), _ready(k), _ready(v)
    out = _empty_like(q)
    handle = _handle(cudnn)
    g, (tq, tk, tv, to, ts, seed, offset), ws = _fwd_graph(cudnn, handle, q.dtype.name, _layout(q), _layout(k),
                                                            _layout(v), _layout(out), is_causal, scale, dropout_p)
    stats = cupy.empty(q.shape[:3], dtype=np.float32)
    pack = {tq: q.data.ptr, tk: k.data.ptr, tv: v.data.ptr, to: out.data.ptr, ts: stats.data.ptr}
    if seed is not None:
        pack[seed], pack[offset] = rng.data.ptr, rng.data.ptr + rng.itemsize
    workspace = _workspace(ws)
    g.execute(pack, workspace.data.ptr, handle=handle)
    return out, stats


def backward(grad_out, q, k, v, out, stats, dropout_p: float, rng, is_causal: bool, scale: float):
    """(dq, dk, dv) of `forward`'s output, each in its input's shape and layout."""
    cudnn = _module()
    q, k, v, out = _ready(q), _ready(k), _ready(v), _ready(out)
    do = grad_out
    if _el_strides(do) != _el_strides(out) or do.data.ptr % 16:     # cuDNN wants dO laid out as O
        do = _empty_like(out)
        do[...] = grad_out
    dq, dk, dv = (_empty_like(a) for a in (q, k, v))
    handle = _handle(cudnn)
    g, tensors, ws = _bwd_graph(cudnn, handle, q.dtype.name, *(_layout(a) for a in (q, k, v, out, do, dq, dk, dv)),
                                is_causal, scale, dropout_p)
    tq, tk, tv, to, tdo, ts, tdq, tdk, tdv, seed, offset = tensors
    pack = {tq: q.data.ptr, tk: k.data.ptr, tv: v.data.ptr, to: out.data.ptr, tdo: do.data.ptr,
            ts: stats.data.ptr, tdq: dq.data.ptr, tdk: dk.data.ptr, tdv: dv.data.ptr}
    if seed is not None:
        pack[seed], pack[offset] = rng.data.ptr, rng.data.ptr + rng.itemsize
    workspace = _workspace(ws)
    g.execute(pack, workspace.data.ptr, handle=handle)
    return dq, dk, dv
