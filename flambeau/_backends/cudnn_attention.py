"""cuDNN fused attention (flash forward and backward) for the cuda device, through NVIDIA's
maintained `nvidia-cudnn-frontend` Python package (`import cudnn`), as PyTorch's cuDNN SDPA backend.

The frontend builds an operation graph of one SDPA node (causal or not, dropout with Philox seed
and offset read from device memory, the softmax statistics saved for the backward), asks cuDNN's
heuristics for an engine and finalises a plan; graphs are cached per (shapes, strides, dtype,
options). Execution takes raw device pointers (CuPy's `.data.ptr`) and a CuPy workspace and runs on
CuPy's current stream, so neither PyTorch nor DLPack is involved: every pointer we pass is an int,
which keeps the frontend off its torch code paths.

`available()` is False without the package, CuPy or libcudnn; the selection in
flambeau/_ops/attention_fused.py then uses the Triton kernels.
"""
from __future__ import annotations

import threading

import numpy as np

from . import cudnn as _cudnn_lib

_state = {"module": None, "tried": False, "error": None}
_lock = threading.Lock()
_graphs: dict = {}
_handles: dict = {}
_DTYPES = {"float16": "HALF", "bfloat16": "BFLOAT16"}
MAX_HEAD_DIM = 128
HEAD_DIM_MULTIPLE = 8


def _module():
    if not _state["tried"]:
        with _lock:
            if not _state["tried"]:
                try:
                    import cupy  # noqa: F401
                    if _cudnn_lib._lib() is None:      # load libcudnn first: the frontend then finds it by name
                        raise ImportError(f"libcudnn not loaded ({_cudnn_lib.load_error()})")
                    import cudnn
                    _state["module"] = cudnn
                except Exception as e:      # ImportError, or the frontend failing to open libcudnn
                    _state["error"] = f"{type(e).__name__}: {e}"
                _state["tried"] = True
    return _state["module"]


def available() -> bool:
    """Whether the cuDNN frontend package and libcudnn can be used."""
    return _module() is not None


def load_error():
    """Why the frontend could not be used (None when it could, or was not tried)."""
    return _state["error"]


def _handle(cudnn):
    import cupy
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
    import cupy
    st = _el_strides(a)
    if st[-1] == 1 and a.data.ptr % 16 == 0 and all(s * a.itemsize % 16 == 0 for s in st[:-1]):
        return a
    return cupy.ascontiguousarray(a)


def _empty_like(a):
    """An empty array of `a`'s shape and dtype, dense, with `a`'s order of strides (as PyTorch lays
    out the outputs: a (B, S, H, D) projection viewed as (B, H, S, D) gets that layout back)."""
    import cupy
    return cupy.empty_like(a, order="K")


def _tensor(g, cudnn, name, a):
    return g.tensor(name=name, dim=list(a.shape), stride=_el_strides(a),
                    data_type=getattr(cudnn.data_type, _DTYPES[a.dtype.name]))


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


def _graph_key(kind, arrays, is_causal, scale, dropout_p):
    return (kind, tuple((a.shape, tuple(a.strides), a.dtype.name) for a in arrays), bool(is_causal), float(scale),
            float(dropout_p))


def _workspace(g):
    import cupy
    return cupy.empty(max(int(g.get_workspace_size()), 1), dtype=np.uint8)


def forward(q, k, v, dropout_p: float, rng, is_causal: bool, scale: float):
    """q (B, H, L, E), k and v (B, Hk, S, E) CuPy fp16/bf16 arrays -> (out, stats (B, H, L) float32).
    `rng` is a device int64 array [seed, offset] read by cuDNN's Philox dropout."""
    cudnn = _module()
    q, k, v = _ready(q), _ready(k), _ready(v)
    B, H, L, E = q.shape
    out = _empty_like(q)
    key = _graph_key("fwd", (q, k, v, out), is_causal, scale, dropout_p)
    entry = _graphs.get(key)
    handle = _handle(cudnn)
    if entry is None:
        dt = getattr(cudnn.data_type, _DTYPES[q.dtype.name])
        g = cudnn.pygraph(io_data_type=dt, intermediate_data_type=cudnn.data_type.FLOAT,
                          compute_data_type=cudnn.data_type.FLOAT, handle=handle)
        tq, tk, tv = _tensor(g, cudnn, "q", q), _tensor(g, cudnn, "k", k), _tensor(g, cudnn, "v", v)
        seed, offset = _scalar_tensors(g, cudnn) if dropout_p > 0 else (None, None)
        to, ts = g.sdpa(name="sdpa", q=tq, k=tk, v=tv, generate_stats=True, attn_scale=float(scale),
                        use_causal_mask=bool(is_causal),
                        dropout=(float(dropout_p), seed, offset) if dropout_p > 0 else None)
        to.set_output(True).set_dim(list(out.shape)).set_stride(_el_strides(out)).set_data_type(dt)
        ts.set_output(True).set_dim([B, H, L, 1]).set_stride([H * L, L, 1, 1]).set_data_type(cudnn.data_type.FLOAT)
        entry = _graphs[key] = (_build(g, cudnn), tq, tk, tv, to, ts, seed, offset)
    g, tq, tk, tv, to, ts, seed, offset = entry
    import cupy
    st = cupy.empty((B, H, L), dtype=np.float32)
    pack = {tq: q.data.ptr, tk: k.data.ptr, tv: v.data.ptr, to: out.data.ptr, ts: st.data.ptr}
    if seed is not None:
        pack[seed], pack[offset] = rng.data.ptr, rng.data.ptr + rng.itemsize
    g.execute(pack, _workspace(g).data.ptr, handle=handle)
    return out, st


def backward(grad_out, q, k, v, out, stats, dropout_p: float, rng, is_causal: bool, scale: float):
    """(dq, dk, dv) of `forward`'s output, each in its input's shape."""
    import cupy
    cudnn = _module()
    q, k, v, out = _ready(q), _ready(k), _ready(v), _ready(out)
    do = grad_out
    if _el_strides(do) != _el_strides(out) or do.data.ptr % 16:     # cuDNN wants dO laid out as O
        do = _empty_like(out)
        do[...] = grad_out
    dq, dk, dv = (_empty_like(a) for a in (q, k, v))
    key = _graph_key("bwd", (q, k, v, out, do, dq, dk, dv), is_causal, scale, dropout_p)
    entry = _graphs.get(key)
    handle = _handle(cudnn)
    if entry is None:
        B, H, L, _ = q.shape
        dt = getattr(cudnn.data_type, _DTYPES[q.dtype.name])
        g = cudnn.pygraph(io_data_type=dt, intermediate_data_type=cudnn.data_type.FLOAT,
                          compute_data_type=cudnn.data_type.FLOAT, handle=handle)
        tq, tk, tv = _tensor(g, cudnn, "q", q), _tensor(g, cudnn, "k", k), _tensor(g, cudnn, "v", v)
        to, tdo = _tensor(g, cudnn, "o", out), _tensor(g, cudnn, "dO", do)
        ts = g.tensor(name="stats", dim=[B, H, L, 1], stride=[H * L, L, 1, 1], data_type=cudnn.data_type.FLOAT)
        seed, offset = _scalar_tensors(g, cudnn) if dropout_p > 0 else (None, None)
        tdq, tdk, tdv = g.sdpa_backward(name="sdpa_backward", q=tq, k=tk, v=tv, o=to, dO=tdo, stats=ts,
                                        attn_scale=float(scale), use_causal_mask=bool(is_causal),
                                        dropout=(float(dropout_p), seed, offset) if dropout_p > 0 else None)
        for t, a in ((tdq, dq), (tdk, dk), (tdv, dv)):
            t.set_output(True).set_dim(list(a.shape)).set_stride(_el_strides(a)).set_data_type(dt)
        entry = _graphs[key] = (_build(g, cudnn), tq, tk, tv, to, tdo, ts, tdq, tdk, tdv, seed, offset)
    g, tq, tk, tv, to, tdo, ts, tdq, tdk, tdv, seed, offset = entry
    pack = {tq: q.data.ptr, tk: k.data.ptr, tv: v.data.ptr, to: out.data.ptr, tdo: do.data.ptr,
            ts: stats.data.ptr, tdq: dq.data.ptr, tdk: dk.data.ptr, tdv: dv.data.ptr}
    if seed is not None:
        pack[seed], pack[offset] = rng.data.ptr, rng.data.ptr + rng.itemsize
    g.execute(pack, _workspace(g).data.ptr, handle=handle)
    return dq, dk, dv
