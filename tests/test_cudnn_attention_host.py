"""Host paths of cuDNN fused attention (issue 11), on CPU: a fake `nvidia-cudnn-frontend` (graphs whose
execution computes attention in NumPy from the device pointers it is given: the fake cuda device's
arrays report their real host addresses) on the fake cuda device of `bench/eager_host_calls.py`.

- calls go to the frontend's pybind `_execute` with a {uid: pointer} dict made from cached uids (its
  Python `execute` wrapper skipped where it is the frontend's own), and a frontend whose `execute` is
  something else still gets {tensor: pointer} through `execute`;
- the stream is set on the handle once, not per call; the workspace is kept per stream;
- GPT-2's split qkv projection: cuDNN's backward writes dq, dk, dv into one buffer laid out as the qkv
  projection, and the split's backward takes that buffer as the concatenation (no cat), gradients as
  PyTorch's; a split whose gradients are not that buffer's pieces (the user's own tensors) still copies.
"""
import ctypes
import sys
import types

import ml_dtypes
import numpy as np
import pytest
import torch

import flambeau as fl
from bench import eager_host_calls as E
from flambeau._backends import cudnn_attention as CA
from flambeau._ops import attention_fused as AF
from flambeau._ops.attention import SDPBackend

BF16 = np.dtype(ml_dtypes.bfloat16)
_NP = {"HALF": np.dtype(np.float16), "BFLOAT16": BF16, "FLOAT": np.dtype(np.float32), "INT64": np.dtype(np.int64)}


class _FakeTensor:
    _next = [100]

    def __init__(self, name="", dim=None, stride=None, data_type=None):
        self.name, self.dim, self.stride, self.dtype = name, dim, stride, data_type
        _FakeTensor._next[0] += 1
        self.uid = _FakeTensor._next[0]

    def get_uid(self):
        return self.uid

    def set_output(self, v):
        return self

    def set_dim(self, d):
        self.dim = list(d)
        return self

    def set_stride(self, s):
        self.stride = list(s)
        return self

    def set_data_type(self, t):
        self.dtype = t
        return self

    def array(self, ptr):
        """The tensor's memory at host address `ptr` as a NumPy array of its dims and strides."""
        dt = _NP[self.dtype]
        span = (1 + sum((n - 1) * s for n, s in zip(self.dim, self.stride))) * dt.itemsize
        flat = np.frombuffer((ctypes.c_char * span).from_address(ptr), dtype=dt)
        return np.lib.stride_tricks.as_strided(flat, self.dim, [s * dt.itemsize for s in self.stride])


class _FakeGraph:
    """One SDPA (or SDPA backward) node; `_execute` computes it in float64 from the pointers."""

    def __init__(self, log, **kw):
        self.log, self.kind, self.tensors = log, None, {}

    def tensor(self, name="", dim=None, stride=None, data_type=None):
        return _FakeTensor(name, list(dim), list(stride), data_type)

    def sdpa(self, name, q, k, v, generate_stats, attn_scale, use_causal_mask, dropout):
        self.kind, self.scale, self.causal = "fwd", attn_scale, use_causal_mask
        o, s = _FakeTensor("o"), _FakeTensor("stats")
        self.io = (q, k, v, o, s)
        return o, s

    def sdpa_backward(self, name, q, k, v, o, dO, stats, attn_scale, use_causal_mask, dropout):
        self.kind, self.scale, self.causal = "bwd", attn_scale, use_causal_mask
        dq, dk, dv = _FakeTensor("dq"), _FakeTensor("dk"), _FakeTensor("dv")
        self.io = (q, k, v, o, dO, stats, dq, dk, dv)
        return dq, dk, dv

    def validate(self):
        pass

    build_operation_graph = check_support = build_plans = validate

    def create_execution_plans(self, modes):
        pass

    def get_workspace_size(self):
        return 4096

    def _execute(self, uid_to_ptr, workspace, handle):
        self.log.append(("_execute", dict(uid_to_ptr), workspace, handle))
        assert all(type(k) is int and type(p) is int for k, p in uid_to_ptr.items())
        arr = {t.name: t.array(uid_to_ptr[t.uid]) for t in self.io}
        q, k, v = (arr[n].astype(np.float64) for n in "qkv")
        s = q @ np.swapaxes(k, -1, -2) * self.scale
        if self.causal:
            s = np.where(np.tril(np.ones(s.shape[-2:], bool)), s, -np.inf)
        lse = np.log(np.exp(s - s.max(-1, keepdims=True)).sum(-1, keepdims=True)) + s.max(-1, keepdims=True)
        p = np.exp(s - lse)
        if self.kind == "fwd":
            arr["o"][...] = (p @ v).astype(arr["o"].dtype)
            arr["stats"][...] = lse
            return
        do, o = arr["dO"].astype(np.float64), arr["o"].astype(np.float64)
        dp = do @ np.swapaxes(v, -1, -2)
        ds = p * (dp - (do * o).sum(-1, keepdims=True))
        arr["dq"][...] = (ds @ k * self.scale).astype(arr["dq"].dtype)
        arr["dk"][...] = (np.swapaxes(ds, -1, -2) @ q * self.scale).astype(arr["dk"].dtype)
        arr["dv"][...] = (np.swapaxes(p, -1, -2) @ do).astype(arr["dv"].dtype)


def _frontend(log, own_wrapper=True):
    """A fake `cudnn` module; with `own_wrapper`, graphs' `execute` is its `_execute` wrapper (as the real
    frontend's: {tensor: pointer} -> {uid: pointer}, then the pybind `_execute`)."""
    m = types.ModuleType("cudnn")
    m.data_type = types.SimpleNamespace(**{k: k for k in _NP})
    m.heur_mode = types.SimpleNamespace(A="A", FALLBACK="FALLBACK")
    m.create_handle = lambda: 77
    m.set_stream = lambda handle, stream: log.append(("set_stream", handle, stream))

    def _execute(self, tensor_to_device_buffer, workspace, handle=None):
        log.append(("execute",))
        self._execute({t.get_uid(): p for t, p in tensor_to_device_buffer.items()}, workspace, handle)
    m._execute = _execute

    class Graph(_FakeGraph):
        execute = _execute if own_wrapper else (lambda self, pack, ws, handle=None: _execute(self, pack, ws, handle))
    m.pygraph = lambda **kw: Graph(log, **kw)
    return m


class _RealPointer:
    __slots__ = ("ptr", "device_id")

    def __init__(self, ptr):
        self.ptr, self.device_id = ptr, 0


@pytest.fixture(params=[True, False], ids=["uid_dict", "frontend_execute"])
def fake_cudnn(request, monkeypatch):
    """The fake cuda device whose arrays report their host addresses, with the fake frontend; yields its log."""
    xp, restore = E.install()
    monkeypatch.setattr(E.DevArray, "data", property(lambda a: _RealPointer(a.__array_interface__["data"][0])))
    monkeypatch.setitem(sys.modules, "cupy", xp)
    strided = lambda x, shape, strides: np.lib.stride_tricks.as_strided(x, shape, strides, subok=True)  # noqa: E731
    xp.lib = types.SimpleNamespace(stride_tricks=types.SimpleNamespace(as_strided=strided))   # views stay DevArray
    log = []
    for d in (CA._graphs, CA._handles, CA._support, CA._runs, CA._workspaces, CA._streams):
        monkeypatch.setattr(CA, d is CA._graphs and "_graphs" or next(k for k, v in vars(CA).items() if v is d), {})
    monkeypatch.setattr(CA, "_state", {"module": _frontend(log, request.param), "tried": True, "error": None,
                                       "unsupported": None})
    monkeypatch.setattr(CA, "_joined", [None])
    monkeypatch.setattr(AF, "_cuda_only", lambda *a: None)     # (the fake device's arrays are NumPy's)
    try:
        yield log, request.param
    finally:
        restore()


def _cuda(a, requires_grad=False):
    t = fl.Tensor._make(np.ascontiguousarray(a).view(E.DevArray), fl.device("cuda"))
    return t.requires_grad_(requires_grad) if requires_grad else t


def _values(B=2, T=8, H=2, E_=8, seed=0):
    rng = np.random.default_rng(seed)
    return rng.standard_normal((B, T, 3 * H * E_)).astype(BF16), rng.standard_normal((B, T, H * E_)).astype(BF16)


def _attention(m, qkv, B, T, H, E_, sdpa):
    q, k, v = (z.view(B, T, H, E_).transpose(1, 2) for z in qkv.split(H * E_, 2))
    return sdpa(q, k, v).transpose(1, 2).reshape(B, T, H * E_)


@pytest.mark.parametrize("steps", [2])
def test_gpt_split_qkv_gradient_is_cudnns_joint_buffer_and_matches_pytorch(fake_cudnn, monkeypatch, steps):
    """The qkv projection's gradient through cuDNN attention (fake frontend computing in float64) as
    PyTorch's, with no concatenation: dq, dk, dv are written into one buffer that is the split's
    gradient. Fails when `_sdpa_fused_derivative` dispatches the op (separate dq/dk/dv: a cat), when
    `claim_joined` returns None, or with a wrong uid -> pointer pack (wrong values)."""
    log, uid_path = fake_cudnn
    B, T, H, E_ = 2, 8, 2, 8
    cats = []
    xp = sys.modules["cupy"]
    monkeypatch.setattr(xp, "concatenate", lambda *a, **k: cats.append(1) or np.concatenate(*a, **k), raising=False)
    sdpa = lambda q, k, v: AF._sdpa_fused(q, k, v, None, 0.0, True, None, int(SDPBackend.CUDNN_ATTENTION))[0]  # noqa: E731
    for step in range(steps):
        a, g = _values(B, T, H, E_, seed=step)
        x = _cuda(a, requires_grad=True)
        out = _attention(fl, x, B, T, H, E_, sdpa)
        out.backward(_cuda(g))
        tx = torch.tensor(a.astype(np.float32), requires_grad=True)
        tq, tk, tv = (z.view(B, T, H, E_).transpose(1, 2) for z in tx.split(H * E_, 2))
        tout = torch.nn.functional.scaled_dot_product_attention(tq, tk, tv, is_causal=True)
        tout = tout.transpose(1, 2).reshape(B, T, H * E_)
        tout.backward(torch.tensor(g.astype(np.float32)))
        np.testing.assert_allclose(np.asarray(out._data).astype(np.float32),
                                   tout.detach().numpy(), rtol=2e-2, atol=2e-2)
        np.testing.assert_allclose(np.asarray(x.grad._data).astype(np.float32), tx.grad.numpy(), rtol=3e-2, atol=3e-2)
    assert not cats, "the split's backward concatenated cuDNN's gradients"
    executes = [e for e in log if e[0] == "_execute"]
    assert len(executes) == 2 * steps
    assert sum(e[0] == "execute" for e in log) == (0 if uid_path else 2 * steps)
    assert sum(e[0] == "set_stream" for e in log) == 1, "the stream was set on the handle more than once"
    assert len({e[2] for e in executes}) == 1, "the workspace is not kept"


def test_split_of_a_users_tensor_still_copies(fake_cudnn):
    """A split whose gradients are views of another tensor (cat's backward narrows the caller's gradient)
    gets a new tensor: x.grad must not share memory with g. Fails when `claim_joined` takes any adjacent
    pieces (not only the joint buffer of cuDNN's backward)."""
    x = _cuda(np.arange(24, dtype=np.float32).reshape(2, 12), requires_grad=True)
    g = _cuda(np.ones((2, 12), np.float32))
    fl.cat(x.split(4, 1), 1).backward(g)
    assert not np.shares_memory(np.asarray(x.grad._data), np.asarray(g._data))
    np.testing.assert_array_equal(np.asarray(x.grad._data), np.ones((2, 12), np.float32))


def test_claim_joined_takes_the_buffer_once_and_only_in_order(fake_cudnn):
    """`claim_joined` hands the buffer out for its pieces in order, once; pieces out of order or of another
    buffer get None (the caller copies)."""
    xp = sys.modules["cupy"]
    q = xp.ndarray((2, 4, 3 * 6), BF16)
    pieces = [q[..., i * 6:(i + 1) * 6] for i in range(3)]
    grads = CA._joint_grads(xp, *pieces)
    assert grads is not None and all(gr.strides == pieces[0].strides for gr in grads)
    assert CA.claim_joined([grads[1], grads[0], grads[2]], 2) is None
    assert CA.claim_joined([grads[0], grads[2], grads[1]], 2) is None
    assert CA.claim_joined(list(pieces), 2) is None
    out = CA.claim_joined(list(grads), 2)
    assert out is not None and out.shape == (2, 4, 18) and out.flags.c_contiguous
    assert CA.claim_joined(list(grads), 2) is None
    assert CA._joint_layout(pieces[0], pieces[2], pieces[1]) is None


@pytest.mark.cuda
def test_gpt_split_qkv_on_cuda_takes_the_joint_gradient_as_pytorch(monkeypatch):
    """On the GPU: GPT-2's attention block (qkv split, heads view, causal cuDNN attention, bf16 autocast)
    forward and backward vs PyTorch's, with the split's gradient taken from cuDNN's joint buffer (a claim
    that returned it). Fails when cuDNN's backward writes wrong strides into the joint buffer (values) or
    when the joint path is not taken (no claim)."""
    if not CA.available():
        pytest.skip(f"cuDNN frontend not available: {CA.load_error()}")
    claims = []
    real = CA.claim_joined
    monkeypatch.setattr(CA, "claim_joined", lambda *a: claims.append(r := real(*a)) or r)
    B, T, H, E_ = 2, 128, 4, 64
    rng = np.random.default_rng(0)
    a, g = rng.standard_normal((B, T, 3 * H * E_)).astype(np.float32), rng.standard_normal((B, T, H * E_))
    res = {}
    for m in (fl, torch):
        x = m.tensor(a, device="cuda", requires_grad=True)
        with m.autocast("cuda", dtype=m.bfloat16):
            q, k, v = (z.view(B, T, H, E_).transpose(1, 2) for z in x.to(m.bfloat16).split(H * E_, 2))
            y = m.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
            y = y.transpose(1, 2).contiguous().view(B, T, H * E_)
        y.float().backward(m.tensor(g.astype(np.float32), device="cuda"))
        res[m.__name__] = (y.float().cpu().detach().numpy(), x.grad.float().cpu().numpy())
    assert any(c is not None for c in claims), "the split's backward did not take cuDNN's joint buffer"
    for f, t in zip(res["flambeau"], res["torch"]):
        np.testing.assert_allclose(f, t, rtol=3e-2, atol=3e-2)
