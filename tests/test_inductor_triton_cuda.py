"""The Triton backend on the GPU (marked `cuda`: the GPU machine runs these, CI skips them).

Every op-database entry compiled on cuda tensors (flambeau.compile's default backend there is
Triton), called and compared with flambeau's eager result on cpu at the op database's compile
tolerances, with nothing running eagerly inside the compiled code beyond what the entry declares;
the kernels are built by `triton.compile` for the device and launched through CuPy. Then a
dynamic graph serving several sizes and a bfloat16 chain.
"""
from __future__ import annotations

import numpy as np
import pytest

import flambeau as fl
from flambeau._dynamo.testing import no_unexpected_fallbacks
from tests.opdb import (all_opinfos, assert_outputs_match, compile_dtype, eager_samples, expected_fallbacks,
                        flat_tensors, materialize)

pytestmark = pytest.mark.cuda
OPINFOS = all_opinfos()
F = fl.nn.functional


def _cuda(x):
    if isinstance(x, fl.Tensor):
        return x.to("cuda")
    if isinstance(x, (list, tuple)):
        return type(x)(_cuda(y) for y in x)
    return x


def _cpu(x):
    if isinstance(x, fl.Tensor):
        return x.cpu()
    if isinstance(x, (list, tuple)):
        return type(x)(_cpu(y) for y in x)
    return x


@pytest.mark.parametrize("info", OPINFOS, ids=[i.name for i in OPINFOS])
def test_opdb_compiled_with_triton_on_cuda(info):
    if "compile" in info.skip:
        pytest.skip(info.skip["compile"])
    if not any(info.samples(d) for d in info.dtypes):
        pytest.skip("an entry of error samples only")
    dt = compile_dtype(fl, info, 2)
    assert dt is not None
    fn = info.resolve(fl)
    ran = 0
    with no_unexpected_fallbacks(expected_fallbacks(info, None)):
        for i, s, ref in eager_samples(fl, info, dt, 2):
            args, kwargs, _ = materialize(fl, s, dt, 100 + i, False)
            gargs, gkw = _cuda(args), {k: _cuda(v) for k, v in kwargs.items()}
            if not flat_tensors(fl, (gargs, list(gkw.values()))):
                gkw["device"] = "cuda"
            fl._dynamo.reset()
            res = fl.compile(lambda *a, **k: fn(*a, **k))(*gargs, **gkw)
            for t in flat_tensors(fl, res):
                assert t.device.type == "cuda", f"{info.name}: an output on {t.device}"
            assert_outputs_match(fl, info, ref, _cpu(res), f"sample {i} ({dt}) on cuda")
            ran += 1
    assert ran


def test_dynamic_graph_serves_every_size_on_cuda():
    def f(x, w, b):
        return F.gelu(F.layer_norm(x, (x.shape[-1],), w, b)).sum(-1)
    cf = fl.compile(f, dynamic=True)
    with no_unexpected_fallbacks({}):
        for n, m in ((5, 8), (64, 768), (3, 5000)):
            x, w, b = fl.randn(n, m), fl.randn(m), fl.randn(m)
            got = cf(x.cuda(), w.cuda(), b.cuda()).cpu().numpy()
            np.testing.assert_allclose(got, f(x, w, b).numpy(), rtol=1e-4, atol=1e-3)


def test_bfloat16_chain_on_cuda():
    def f(x):
        h = F.silu(x) * 2
        return F.softmax(h, -1), h.sum(0)
    x = fl.randn(64, 1000)
    with no_unexpected_fallbacks({}):
        got = fl.compile(f)(x.cuda().to(fl.bfloat16))
    want = f(x.to(fl.bfloat16))
    for g, w in zip(got, want):
        assert g.dtype == fl.bfloat16
        np.testing.assert_allclose(g.cpu().float().numpy(), w.float().numpy(), rtol=2e-2, atol=2e-2)
