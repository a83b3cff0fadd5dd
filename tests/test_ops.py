"""Op database tests: every registered operator against PyTorch (see tests/opdb/__init__.py)."""
from __future__ import annotations

import numpy as np
import pytest
import torch

import flambeau
from flambeau._ops import OPS
from tests.opdb import all_opinfos, materialize, FLOATS

OPINFOS = all_opinfos()
DEFAULT_TOL = {"float32": (1.3e-6, 1e-5), "float64": (1e-7, 1e-7), "float16": (1e-3, 1e-5),
               "bfloat16": (1.6e-2, 1e-5), "complex64": (1.3e-6, 1e-5), "complex128": (1e-7, 1e-7)}
# Ops that are reachable only through others' tests, with the entry that covers them.
EXEMPT = {
    "_sdpa_fused": "cuda-only fused attention kernels: tests/test_sdpa_cuda.py compares them with PyTorch on the GPU",
    "_sdpa_fused_backward": "cuda-only fused attention kernels: tests/test_sdpa_cuda.py compares them with PyTorch",
}


def cases(kind):
    out = []
    for info in OPINFOS:
        if kind in info.skip:
            continue
        dts = info.dtypes
        if kind in ("grad", "gradcheck"):
            if not info.grad or (kind == "gradcheck" and not info.gradcheck):
                continue
            dts = ["float64"]
        elif kind in ("meta", "cuda"):
            dts = [d for d in ("float32", "int64", "bool") if d in info.dtypes][:1] or info.dtypes[:1]
        for dt in dts:
            out.append(pytest.param(info, dt, id=f"{info.name}-{dt}"))
    return out


def to_np(x):
    if isinstance(x, flambeau.Tensor):
        x = x.detach()
        if x.dtype in (flambeau.bfloat16, flambeau.float16):
            return x.float()._host().copy(), x.dtype.name
        return np.array(x._host()), x.dtype.name
    if isinstance(x, torch.Tensor):
        x = x.detach()
        name = str(x.dtype).replace("torch.", "")
        if x.dtype in (torch.bfloat16, torch.float16):
            x = x.float()
        return x.cpu().numpy(), name
    return x, type(x).__name__


def _upcast(x):
    """torch arguments with low-precision floats widened to float64 (the exact reference's inputs)."""
    if isinstance(x, torch.Tensor):
        return x.detach().double() if x.dtype in (torch.float16, torch.bfloat16) else x
    if isinstance(x, (tuple, list)):
        return type(x)(_upcast(v) for v in x)
    if isinstance(x, dict):
        return {k: _upcast(v) for k, v in x.items()}
    return x


def _closer_to_exact(a, b, exact, rtol, atol):
    """PyTorch's `same()` rule for low precision: ours may differ from torch's rounding when it is no
    farther from the float64 result of the same inputs than torch's own result is."""
    exact = exact.detach().double().cpu().numpy()
    ours_err = np.abs(np.asarray(a, dtype=np.float64) - exact)
    torch_err = np.abs(np.asarray(b, dtype=np.float64) - exact)
    bound = torch_err + atol + rtol * np.abs(exact)
    return bool(np.all((ours_err <= bound) | np.isnan(exact)))


def compare(ours, ref, dtype, info, where="", exact=None):
    """Recursive comparison of results (tensors, tuples, lists, scalars). `exact`: torch's result on
    the same inputs in float64, consulted when a low-precision result differs from torch's."""
    if isinstance(ref, torch.Tensor):
        assert isinstance(ours, flambeau.Tensor), f"{where}: expected a Tensor, got {type(ours).__name__}"
        a, adt = to_np(ours)
        b, bdt = to_np(ref)
        assert adt == bdt, f"{where}: dtype {adt} != torch's {bdt}"
        assert tuple(ours.shape) == tuple(ref.shape), f"{where}: shape {tuple(ours.shape)} != torch's {tuple(ref.shape)}"
        if info.random:
            return
        rtol, atol = info.tol.get(dtype, DEFAULT_TOL.get(bdt, DEFAULT_TOL.get(dtype, (0, 0))))
        if bdt in ("float16", "bfloat16") and dtype not in info.tol:
            rtol, atol = DEFAULT_TOL[bdt]
        try:
            torch.testing.assert_close(torch.from_numpy(np.asarray(a)), torch.from_numpy(np.asarray(b)),
                                       rtol=rtol, atol=atol, equal_nan=True, check_dtype=False,
                                       msg=lambda m: f"{where}: {m}")
        except AssertionError:
            if not (bdt in ("float16", "bfloat16") and isinstance(exact, torch.Tensor)
                    and _closer_to_exact(a, b, exact, rtol, atol)):
                raise
        if info.check_strides:
            assert ours.stride() == ref.stride(), f"{where}: strides {ours.stride()} != {ref.stride()}"
    elif isinstance(ref, (tuple, list)):
        assert isinstance(ours, (tuple, list)), f"{where}: expected a sequence, got {type(ours).__name__}"
        assert len(ours) == len(ref), f"{where}: {len(ours)} results != torch's {len(ref)}"
        exacts = exact if isinstance(exact, (tuple, list)) and len(exact) == len(ref) else [None] * len(ref)
        for i, (o, r, e) in enumerate(zip(ours, ref, exacts)):
            compare(o, r, dtype, info, f"{where}[{i}]", e)
    elif isinstance(ref, float) and not info.random:
        assert ours == pytest.approx(ref, rel=1e-5, abs=1e-6, nan_ok=True), f"{where}: {ours} != {ref}"
    elif not info.random:
        assert ours == ref, f"{where}: {ours!r} != {ref!r}"


def _run(info, mod, s, dtype, seed, grad=False, variant=None):
    args, kwargs, leaves = materialize(mod, s, dtype, seed, grad)
    if variant is None:
        out = info.resolve(mod)(*args, **kwargs)
    elif variant == "method":
        out = getattr(args[0], info.method)(*args[1:], **kwargs)
    elif variant == "inplace":
        x = args[0].clone() if not grad else args[0]
        out = getattr(x, info.inplace)(*args[1:], **kwargs)
        assert out is x
    return out, args, leaves


def _both(info, s, dtype, seed, **kw):
    """Run torch first; if torch raises, we must raise the same exception type."""
    try:
        ref = _run(info, torch, s, dtype, seed, **kw)
    except Exception as e:
        with pytest.raises(type(e)):
            _run(info, flambeau, s, dtype, seed, **kw)
        return None, None
    return _run(info, flambeau, s, dtype, seed, **kw), ref


@pytest.mark.parametrize("info,dtype", cases("forward"))
def test_forward(info, dtype):
    for i, s in enumerate(info.samples(dtype)):
        ours, ref = _both(info, s, dtype, 1000 + i)
        if ours is None:
            continue
        exact = None
        if dtype in ("float16", "bfloat16") and not info.random:
            _, kwargs, _ = materialize(torch, s, dtype, 1000 + i, False)
            try:
                exact = info.resolve(torch)(*_upcast(ref[1]), **_upcast(kwargs))
            except (RuntimeError, TypeError):   # an op whose float64 form torch refuses: no exact result
                exact = None
        compare(ours[0], ref[0], dtype, info, f"{info.name} sample {i} {s.name}", exact)


@pytest.mark.parametrize("info,dtype", [c for c in cases("forward") if c.values[0].method or c.values[0].inplace])
def test_variants(info, dtype):
    for i, s in enumerate(info.samples(dtype)):
        for variant in ("method", "inplace"):
            if not getattr(info, variant):
                continue
            ours, ref = _both(info, s, dtype, 1000 + i, variant=variant)
            if ours is None:
                continue
            compare(ours[0], ref[0], dtype, info, f"{info.name}.{variant} sample {i}")


@pytest.mark.parametrize("info,dtype", [c for c in cases("forward") if c.values[0].out])
def test_out(info, dtype):
    for i, s in enumerate(info.samples(dtype)):
        try:
            ref, _, _ = _run(info, torch, s, dtype, 1000 + i)
        except Exception:
            continue
        if not isinstance(ref, torch.Tensor):
            continue
        args, kwargs, _ = materialize(flambeau, s, dtype, 1000 + i, False)
        out = flambeau.empty(0, dtype=getattr(flambeau, str(ref.dtype).replace("torch.", "")))
        r = info.resolve(flambeau)(*args, **kwargs, out=out)
        assert r is out
        compare(out, ref, dtype, info, f"{info.name} out= sample {i}")


def _flat_tensors(out, torchmod):
    T = torchmod.Tensor
    if isinstance(out, T):
        return [out]
    if isinstance(out, (tuple, list)):
        return [t for o in out for t in _flat_tensors(o, torchmod)]
    if isinstance(out, dict):
        return [t for o in out.values() for t in _flat_tensors(o, torchmod)]
    return []


@pytest.mark.parametrize("info,dtype", cases("grad"))
def test_grad(info, dtype):
    ran = 0
    for i, s in enumerate(info.samples(dtype)):
        try:
            ref_out, _, ref_leaves = _run(info, torch, s, dtype, 2000 + i, grad=True)
        except Exception:
            continue
        outs_t = [o for o in _flat_tensors(ref_out, torch) if o.requires_grad]
        if not ref_leaves or not outs_t:
            continue
        our_out, _, our_leaves = _run(info, flambeau, s, dtype, 2000 + i, grad=True)
        outs_f = [o for o in _flat_tensors(our_out, flambeau) if o.requires_grad]
        assert len(outs_f) == len(outs_t), f"{len(outs_f)} differentiable outputs != torch's {len(outs_t)}"
        rng = np.random.default_rng(7 + i)
        gos = [rng.standard_normal(tuple(o.shape)) for o in outs_t]
        gt = torch.autograd.grad(outs_t, ref_leaves, [torch.tensor(g, dtype=o.dtype) for g, o in zip(gos, outs_t)],
                                 allow_unused=True)
        gf = flambeau.autograd.grad(outs_f, our_leaves, [flambeau.tensor(g, dtype=o.dtype) for g, o in zip(gos, outs_f)],
                                    allow_unused=True)
        for k, (a, b) in enumerate(zip(gf, gt)):
            if b is None:
                assert a is None or float(a.abs().sum()) == 0, f"grad {k}: torch has none"
                continue
            assert a is not None, f"{info.name} sample {i}: grad of input {k} is None, torch has one"
            compare(a, b, dtype, info, f"{info.name} grad sample {i} input {k}")
        ran += 1
    assert ran or not info.samples(dtype), f"{info.name}: no gradient sample ran"


SAMPLED_ELEMENTS = 48   # finite differences per large leaf: a seeded sample instead of every element


def _numeric_check(fn, leaves, eps=1e-6, atol=1e-5, rtol=1e-3):
    """Finite differences (float64) against the analytic vector-Jacobian product: every element of a
    small leaf, a seeded sample of SAMPLED_ELEMENTS elements of a large one. Returns how many
    elements were checked."""
    out = fn()
    outs = [o for o in _flat_tensors(out, flambeau) if o.requires_grad]
    if not outs:
        return
    rng = np.random.default_rng(3)
    vs = [flambeau.tensor(rng.standard_normal(tuple(o.shape))) for o in outs]
    analytic = flambeau.autograd.grad(outs, leaves, vs, allow_unused=True)
    checked = 0
    for leaf, an in zip(leaves, analytic):
        data = leaf._data
        assert data.flags["C_CONTIGUOUS"], "finite differences perturb a contiguous leaf in place"
        flat = data.reshape(-1)
        n = leaf.numel()
        picks = np.arange(n) if n <= 2 * SAMPLED_ELEMENTS else np.sort(rng.choice(n, SAMPLED_ELEMENTS, replace=False))
        num = np.zeros(len(picks))
        for idx, j in enumerate(picks):
            old = flat[j]
            flat[j] = old + eps
            with flambeau.no_grad():
                fp = [o.detach()._host().astype(np.float64).copy() for o in _flat_tensors(fn(), flambeau) if o.dtype.is_floating_point]
            flat[j] = old - eps
            with flambeau.no_grad():
                fm = [o.detach()._host().astype(np.float64).copy() for o in _flat_tensors(fn(), flambeau) if o.dtype.is_floating_point]
            flat[j] = old
            num[idx] = sum(float(((p - m) / (2 * eps) * v._host()).sum()) for p, m, v in zip(fp, fm, vs))
        a = np.zeros(n) if an is None else an._host().reshape(-1)
        np.testing.assert_allclose(a[picks], num, atol=atol, rtol=rtol)
        checked += len(picks)
    return checked


@pytest.mark.parametrize("info,dtype", cases("gradcheck"))
def test_gradcheck(info, dtype):
    checked = 0
    for i, s in enumerate(info.samples(dtype)[:2]):
        args, kwargs, leaves = materialize(flambeau, s, dtype, 3000 + i, True)
        leaves = [l for l in leaves if l.is_contiguous()]
        if not leaves:
            continue
        try:
            info.resolve(flambeau)(*args, **kwargs)
        except Exception:
            continue
        checked += _numeric_check(lambda: info.resolve(flambeau)(*args, **kwargs), leaves) or 0
    assert checked, f"{info.name}: no sample gave a differentiable output to check (set gradcheck=False with a reason)"


@pytest.mark.parametrize("info,dtype", cases("meta"))
def test_meta(info, dtype):
    if not info.meta:
        pytest.skip("data-dependent output shape")
    for i, s in enumerate(info.samples(dtype)):
        args, kwargs, _ = materialize(flambeau, s, dtype, 4000 + i, False)
        try:
            real = info.resolve(flambeau)(*args, **kwargs)
        except Exception as e:
            margs = tuple(_to_meta(a) for a in args)
            with pytest.raises(type(e)):
                info.resolve(flambeau)(*margs, **{k: _to_meta(v) for k, v in kwargs.items()})
            continue
        margs = tuple(_to_meta(a) for a in args)
        mk = {k: _to_meta(v) for k, v in kwargs.items()}
        meta = info.resolve(flambeau)(*margs, **mk)
        reals, metas = _flat_tensors(real, flambeau), _flat_tensors(meta, flambeau)
        assert len(metas) == len(reals), f"sample {i}: {len(metas)} meta outputs != {len(reals)} real ones"
        for r, m in zip(reals, metas):
            assert m.device.type == "meta"
            assert tuple(m.shape) == tuple(r.shape), f"sample {i}: meta shape {tuple(m.shape)} != real {tuple(r.shape)}"
            assert m.dtype == r.dtype, f"sample {i}: meta dtype {m.dtype} != real {r.dtype}"
            if r.numel() > 1 and info.name not in META_STRIDE_GAPS:   # size-0/1: no layout
                assert _layout(m) == _layout(r), f"sample {i}: meta strides {m.stride()} != real {r.stride()}"


# Entries whose meta strides still differ from the real kernel's, with which side matches PyTorch.
# Each is a known gap to fix in the op (meta function or kernel), not a tolerance.
META_STRIDE_GAPS = {
    "einsum": "torch's layout follows its permute/bmm plan: the kernel differs on samples 6 and 12, meta on 2 and 11",
}


def _layout(t):
    """Strides that matter: a dim of size 1 may have any stride."""
    return tuple(st for sz, st in zip(t.shape, t.stride()) if sz != 1)


def _to_meta(x):
    if isinstance(x, flambeau.Tensor):    # same strides as the real input (`.to` makes non-dense ones dense)
        return flambeau.empty_strided(x.shape, x.stride(), dtype=x.dtype, device="meta")
    if isinstance(x, list):
        return [_to_meta(y) for y in x]
    if isinstance(x, tuple):
        return tuple(_to_meta(y) for y in x)
    return x


# Ops whose index outputs pick among ties in an unspecified order on cuda (values are compared).
TIE_ORDER_OPS = {"sort", "argsort", "msort", "topk", "kthvalue", "median", "nanmedian", "mode", "max", "min",
                 "max_dim", "min_dim", "cummax", "cummin", "unique", "aminmax"}


@pytest.mark.cuda
@pytest.mark.parametrize("info,dtype", cases("cuda"))
def test_cuda(info, dtype):
    """flambeau on cuda against PyTorch on cuda where the reference PyTorch has CUDA (the GPU
    machine), else against flambeau on cpu; error types must match PyTorch's."""
    torch_cuda = torch.cuda.is_available()
    for i, s in enumerate(info.samples(dtype)):
        args, kwargs, _ = materialize(flambeau, s, dtype, 5000 + i, False)
        # move to cuda before the cpu run: ops may update their inputs in place (running stats)
        gargs = tuple(_to_dev(a) for a in args)
        gkw = {k: _to_dev(v) for k, v in kwargs.items()}
        if not _flat_tensors((gargs, gkw), flambeau):
            gkw["device"] = "cuda"          # factories: no tensor input carries the device
        if torch_cuda:
            targs, tkw, _ = materialize(torch, s, dtype, 5000 + i, False)
            try:   # an invalid sample is a device-side assert in torch on cuda, fatal to the context
                info.resolve(torch)(*targs, **tkw)
            except Exception:
                continue
            targs, tkw, _ = materialize(torch, s, dtype, 5000 + i, False)   # fresh: ops update buffers in place
            targs = tuple(_to_dev(a, torch) for a in targs)
            tkw = {k: _to_dev(v, torch) for k, v in tkw.items()}
            if "device" in gkw:
                tkw["device"] = "cuda"
            try:
                refs = _flat_tensors(info.resolve(torch)(*targs, **tkw), torch)
            except Exception as e:    # torch's cuda kernel refuses what its cpu kernel takes: so must ours
                with pytest.raises(type(e)):
                    info.resolve(flambeau)(*gargs, **gkw)
                continue
        else:
            try:
                refs = _flat_tensors(info.resolve(flambeau)(*args, **kwargs), flambeau)
            except Exception:
                continue
        gpu = _flat_tensors(info.resolve(flambeau)(*gargs, **gkw), flambeau)
        assert len(gpu) == len(refs), f"sample {i}: {len(gpu)} outputs != reference's {len(refs)}"
        for c, g in zip(refs, gpu):
            assert g.device.type == "cuda"
            assert tuple(g.shape) == tuple(c.shape), f"sample {i}: shape {tuple(g.shape)} != {tuple(c.shape)}"
            assert str(g.dtype).split(".")[-1] == str(c.dtype).split(".")[-1], f"sample {i}: {g.dtype} != {c.dtype}"
            if info.random or (info.name in TIE_ORDER_OPS and not g.dtype.is_floating_point):
                continue
            gh = g.cpu()
            gh = gh.double() if gh.dtype.is_floating_point else gh
            ch = c.detach().cpu()
            ch = ch.double() if ch.dtype.is_floating_point else ch
            a = gh._host()
            b = ch.numpy() if isinstance(ch, torch.Tensor) else ch._host()
            np.testing.assert_allclose(a, b, rtol=1e-4 if dtype not in ("float16", "bfloat16") else 2e-2,
                                       atol=1e-5 if dtype not in ("float16", "bfloat16") else 1e-2,
                                       err_msg=f"{info.name} sample {i} on cuda")


def _to_dev(x, mod=flambeau):
    if isinstance(x, mod.Tensor):
        return x.to("cuda")
    if isinstance(x, list):
        return [_to_dev(y, mod) for y in x]
    if isinstance(x, tuple):
        return tuple(_to_dev(y, mod) for y in x)
    return x


@pytest.mark.parametrize("info", [i for i in OPINFOS if i.errors], ids=lambda i: i.name)
def test_errors(info):
    for e in info.errors():
        try:
            _run(info, torch, e.sample, "float32", 6000)
            torch_exc = None
        except Exception as ex:
            torch_exc = type(ex)
        assert torch_exc is not None, f"{info.name}: torch did not raise on an error sample"
        with pytest.raises(torch_exc, match=e.match or None):
            _run(info, flambeau, e.sample, "float32", 6000)


def test_every_registered_op_has_an_entry():
    covered = set()
    for info in OPINFOS:
        covered.update(info.ops)
    missing = sorted(n for n in OPS if n not in covered and n not in EXEMPT)
    assert not missing, f"registered ops without an op-database entry: {missing}"
