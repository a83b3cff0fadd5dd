"""Complex numbers as pairs of reals, against PyTorch: `view_as_real` / `view_as_complex` (views sharing
memory, their gradients), `complex`, `polar`, the `.real` / `.imag` attributes, and llama's rotary embedding
(`precompute_freqs_cis` + `apply_rotary_emb`, pytorch/examples distributed/tensor_parallelism/llama2_model.py
in shape), forward and backward; the errors of tensors that cannot be viewed carry PyTorch's messages."""
from __future__ import annotations

import numpy as np
import pytest
import torch

import flambeau as fl


def _pair(shape, seed=0, dtype=np.float32):
    x = np.random.default_rng(seed).standard_normal(shape).astype(dtype)
    return fl.tensor(x, requires_grad=True), torch.tensor(x, requires_grad=True)


def _close(a, b, tol=1e-6):
    np.testing.assert_allclose(np.asarray(a.detach().numpy()), b.detach().numpy(), rtol=tol, atol=tol)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_views_match_pytorch_and_share_memory(dtype):
    a, b = _pair((3, 4, 2), dtype=dtype)
    ca, cb = fl.view_as_complex(a), torch.view_as_complex(b)
    assert str(ca.dtype) == str(cb.dtype)
    _close(ca, cb)
    _close(fl.view_as_real(ca), torch.view_as_real(cb))
    with fl.no_grad():
        ca[1, 2] = 7 - 3j
    assert float(a[1, 2, 0]) == 7.0 and float(a[1, 2, 1]) == -3.0
    r = fl.view_as_real(ca)
    with fl.no_grad():
        r[0, 0, 1] = 9.0
    assert complex(ca[0, 0].item()) == complex(float(a[0, 0, 0]), 9.0)


def test_complex_polar_and_parts_match_pytorch():
    re_, ret = _pair((4, 1), 1)
    im_, imt = _pair((3,), 2)
    c, ct = fl.complex(re_, im_), torch.complex(ret, imt)
    _close(c, ct)
    _close(c.real, ct.real)
    _close(c.imag, ct.imag)
    w = np.random.default_rng(3).standard_normal((4, 3, 2)).astype(np.float32)
    (fl.view_as_real(c) * fl.tensor(w)).sum().backward()
    (torch.view_as_real(ct) * torch.tensor(w)).sum().backward()
    _close(re_.grad, ret.grad, 1e-5)
    _close(im_.grad, imt.grad, 1e-5)
    mag, ang = fl.rand(5) + 0.5, fl.arange(5.0)
    _close(fl.polar(mag, ang), torch.polar(torch.tensor(mag.numpy()), torch.tensor(ang.numpy())))
    x = fl.ones(2)
    assert x.real is x
    c2 = fl.complex(fl.ones(2), fl.zeros(2))
    c2.imag = fl.tensor([3.0, 4.0])
    assert [complex(v) for v in c2.tolist()] == [1 + 3j, 1 + 4j]


def _rotary(lib, xq, xk, dim=8, end=6, theta=10000.0):
    freqs = 1.0 / (theta ** (lib.arange(0, dim, 2)[: (dim // 2)].float() / dim))
    t = lib.arange(end, device=freqs.device)
    freqs = lib.outer(t, freqs).float()
    freqs_cis = lib.polar(lib.ones_like(freqs), freqs)
    xq_ = lib.view_as_complex(xq.float().reshape(*xq.shape[:-1], -1, 2))
    xk_ = lib.view_as_complex(xk.float().reshape(*xk.shape[:-1], -1, 2))
    fc = freqs_cis.view(1, xq_.shape[1], 1, xq_.shape[-1])
    xq_out = lib.view_as_real(xq_ * fc).flatten(3)
    xk_out = lib.view_as_real(xk_ * fc).flatten(3)
    return xq_out.type_as(xq), xk_out.type_as(xk)


def test_llama_rotary_embedding_forward_and_backward_match_pytorch():
    qa, qb = _pair((2, 6, 3, 8), 4)
    ka, kb = _pair((2, 6, 3, 8), 5)
    oa, pa = _rotary(fl, qa, ka)
    ob, pb = _rotary(torch, qb, kb)
    _close(oa, ob, 1e-5)
    _close(pa, pb, 1e-5)
    w = np.random.default_rng(6).standard_normal((2, 6, 3, 8)).astype(np.float32)
    ((oa * fl.tensor(w)).sum() + (pa ** 2).sum()).backward()
    ((ob * torch.tensor(w)).sum() + (pb ** 2).sum()).backward()
    _close(qa.grad, qb.grad, 1e-5)
    _close(ka.grad, kb.grad, 1e-5)


@pytest.mark.parametrize("make, message", [
    (lambda m: m.view_as_real(m.ones(2)), "view_as_real is only supported for complex tensors"),
    (lambda m: m.view_as_complex(m.ones(2, 3)), "Tensor must have a last dimension of size 2"),
    (lambda m: m.view_as_complex(m.ones(4, 2)[:, :1].expand(4, 2)), "Tensor must have a last dimension with stride 1"),
    (lambda m: m.view_as_complex(m.ones(9)[1:].reshape(4, 2)), "Tensor must have a storage_offset divisible by 2"),
    (lambda m: m.view_as_complex(m.ones(4, 4)[:, 1:3]), "Tensor must have a storage_offset divisible by 2"),
])
def test_tensors_that_cannot_be_viewed_raise_pytorchs_errors(make, message):
    for lib in (fl, torch):
        with pytest.raises(RuntimeError, match=message):
            make(lib)
    with pytest.raises(RuntimeError, match="only supported for float and double tensors, but got a tensor of scalar "
                                           "type: BFloat16"):
        fl.view_as_complex(fl.ones(2, 2, dtype=fl.bfloat16))
    with pytest.raises(RuntimeError, match="complex: expected both inputs to be float or double"):
        fl.complex(fl.ones(2), fl.ones(2, dtype=fl.float64))
