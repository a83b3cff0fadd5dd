"""Decompositions vs the operators they replace, driven by the op database (like PyTorch's
test_decomp): for every OpInfo covering an op with a decomposition, the result under
`DecompositionMode` must match the plain result in float64, gradients taken through the
decomposition (and through decomposed backward ops) must match, meta tensors must give the same
shapes, and a small MLP's forward + backward under the mode reaches the backend with core ops only.
"""
from __future__ import annotations

import numpy as np
import pytest
import torch

import flambeau
from flambeau._ops import OPS
from flambeau._decomp import (DecompositionMode, core_aten_decompositions, get_decompositions, decompose,
                              core_ops, is_core)
from flambeau.utils._python_dispatch import TorchDispatchMode
from tests.opdb import all_opinfos, materialize

DECOMPS = core_aten_decompositions()
CORE_OPS = frozenset(op.name for op in core_ops())       # names, as RecordingMode sees them


def _decomposed_ops(info):
    return {n for n in info.ops if n in OPS and not is_core(OPS[n]) and OPS[n] in DECOMPS}


OPINFOS = [i for i in all_opinfos() if _decomposed_ops(i)]


def _dtype(info):
    return "float64" if "float64" in info.dtypes else info.dtypes[0]


class CountingDecompositionMode(DecompositionMode):
    """DecompositionMode that records which ops it decomposed."""

    def __init__(self):
        super().__init__()
        self.used = set()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func in self.decompositions:
            self.used.add(func.name)
        return super().__torch_dispatch__(func, types, args, kwargs)


class RecordingMode(TorchDispatchMode):
    """Records the name of every op that reaches the backend."""

    def __init__(self):
        super().__init__()
        self.seen = set()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.seen.add(func.name)
        return func(*args, **(kwargs or {}))


def _np(x):
    x = x.detach()
    if x.dtype in (flambeau.float16, flambeau.bfloat16):
        x = x.float()
    return np.array(x._host()) if x.device.type != "meta" else None


def _compare(ours, ref, info, where, tol=(1e-7, 1e-7)):
    if isinstance(ref, flambeau.Tensor):
        assert isinstance(ours, flambeau.Tensor), f"{where}: expected a Tensor, got {type(ours).__name__}"
        assert ours.dtype == ref.dtype, f"{where}: dtype {ours.dtype} != {ref.dtype}"
        assert tuple(ours.shape) == tuple(ref.shape), f"{where}: shape {tuple(ours.shape)} != {tuple(ref.shape)}"
        if info.random or "meta" in (ours.device.type, ref.device.type):
            return
        a, b = _np(ours), _np(ref)
        if ref.dtype in (flambeau.float16, flambeau.bfloat16, flambeau.float32):
            tol = {"float16": (1e-3, 1e-3), "bfloat16": (1.6e-2, 1e-2)}.get(ref.dtype.name, (1.3e-6, 1e-5))
        torch.testing.assert_close(torch.from_numpy(np.asarray(a)), torch.from_numpy(np.asarray(b)), rtol=tol[0],
                                   atol=tol[1], equal_nan=True, check_dtype=False, msg=lambda m: f"{where}: {m}")
    elif isinstance(ref, (tuple, list)):
        assert isinstance(ours, (tuple, list)) and len(ours) == len(ref), f"{where}: {ours!r} vs {ref!r}"
        for k, (o, r) in enumerate(zip(ours, ref)):
            _compare(o, r, info, f"{where}[{k}]", tol)
    elif not info.random:
        assert ours == ref or (ours != ours and ref != ref), f"{where}: {ours!r} != {ref!r}"


def _call(info, args, kwargs, variant):
    if variant == "inplace":
        x = args[0].clone()
        return getattr(x, info.inplace)(*args[1:], **kwargs)
    return info.resolve(flambeau)(*args, **kwargs)


def _variants(info):
    return ["function"] + (["inplace"] if info.inplace else [])


def _forward_dtypes(info):
    return [d for d in ("float64", "int64", "bool") if d in info.dtypes] or list(info.dtypes[:1])


@pytest.mark.parametrize("info", OPINFOS, ids=lambda i: i.name)
def test_decomposition_forward(info):
    mode_used, ran = set(), 0
    for dtype in _forward_dtypes(info):
        for variant in _variants(info):
            for i, s in enumerate(info.samples(dtype)):
                args, kwargs, _ = materialize(flambeau, s, dtype, 1000 + i, False)
                try:
                    ref = _call(info, args, kwargs, variant)
                except Exception:
                    continue
                args, kwargs, _ = materialize(flambeau, s, dtype, 1000 + i, False)
                mode = CountingDecompositionMode()
                with mode:
                    ours = _call(info, args, kwargs, variant)
                mode_used |= mode.used
                ran += 1
                _compare(ours, ref, info, f"{info.name} {dtype} {variant} sample {i}")
    if ran and not mode_used:
        pytest.skip(f"the entry reaches only core ops ({sorted(_decomposed_ops(info))} are not exercised)")


def _to_meta(x):
    if isinstance(x, flambeau.Tensor):
        return x.detach().to("meta")
    if isinstance(x, (list, tuple)):
        return type(x)(_to_meta(y) for y in x)
    return x


@pytest.mark.parametrize("info", [i for i in OPINFOS if i.meta], ids=lambda i: i.name)
def test_decomposition_meta(info):
    """Decompositions are metadata-only computations on meta tensors."""
    dtype = _dtype(info)
    for i, s in enumerate(info.samples(dtype)):
        args, kwargs, _ = materialize(flambeau, s, dtype, 4000 + i, False)
        try:
            ref = info.resolve(flambeau)(*args, **kwargs)
        except Exception:
            continue
        margs, mkw = _to_meta(args), {k: _to_meta(v) for k, v in kwargs.items()}
        try:
            with DecompositionMode():
                ours = info.resolve(flambeau)(*margs, **mkw)
        except NotImplementedError as e:
            if "data" in str(e) or "meta" in str(e).lower():
                continue              # an extern core op with a data-dependent shape
            raise
        _compare(ours, ref, info, f"{info.name} meta sample {i}")


def _flat(out):
    if isinstance(out, flambeau.Tensor):
        return [out]
    if isinstance(out, (tuple, list)):
        return [t for o in out for t in _flat(o)]
    return []


def _grads(info, s, i, forward_mode, backward_mode):
    args, kwargs, leaves = materialize(flambeau, s, "float64", 2000 + i, True)
    with forward_mode or _nullmode():
        out = info.resolve(flambeau)(*args, **kwargs)
    outs = [o for o in _flat(out) if o.requires_grad]
    if not leaves or not outs:
        return None
    rng = np.random.default_rng(7 + i)
    gos = [flambeau.tensor(rng.standard_normal(tuple(o.shape)), dtype=o.dtype) for o in outs]
    with backward_mode or _nullmode():
        return flambeau.autograd.grad(outs, leaves, gos, allow_unused=True)


class _nullmode:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


GRAD_INFOS = [i for i in OPINFOS if i.grad and not i.random and "grad" not in i.skip
              and "decomposition_grad" not in i.skip and "float64" in i.dtypes]


@pytest.mark.parametrize("info", GRAD_INFOS, ids=lambda i: i.name)
def test_decomposition_grad(info):
    """Gradients through the decomposed forward, and through decomposed backward ops, match."""
    for i, s in enumerate(info.samples("float64")):
        try:
            ref = _grads(info, s, i, None, None)
        except Exception:
            continue
        if ref is None:
            continue
        through = _grads(info, s, i, DecompositionMode(), None)
        backward = _grads(info, s, i, None, DecompositionMode())
        for name, got in (("decomposed forward", through), ("decomposed backward", backward)):
            got = [None] * len(ref) if got is None else got
            for k, (a, b) in enumerate(zip(got, ref)):
                if b is None or a is None:
                    assert (a is None or float(a.abs().sum()) == 0) and (b is None or float(b.abs().sum()) == 0), \
                        f"{info.name} {name} sample {i} input {k}: one gradient is None"
                    continue
                _compare(a, b, info, f"{info.name} {name} grad sample {i} input {k}", (1e-6, 1e-7))


# ---- the core set --------------------------------------------------------------------------------
def test_every_noncore_op_decomposes_or_says_why_not():
    missing = sorted(n for n, op in OPS.items() if not is_core(op) and op.decomposition is None
                     and not op.no_decomposition)
    assert not missing, f"ops neither core nor decomposed, and no reason declared: {missing}"
    assert sorted(n for n, op in OPS.items() if op.no_decomposition) == ["einsum"]
    assert not any(op.no_decomposition and op.decomposition for op in OPS.values())
    assert not any(is_core(op) for op in core_aten_decompositions())


def test_api():
    assert get_decompositions(["softmax.int"]) == {OPS["softmax.int"]: OPS["softmax.int"].decomposition}
    assert OPS["add_.Tensor"] in get_decompositions(["add_"])
    assert OPS["native_layer_norm"] in DECOMPS
    x = flambeau.randn(3, 5, dtype=flambeau.float64)
    rec = RecordingMode()
    with rec:
        out = decompose(OPS["log_softmax.int"], (x, 1))
    assert rec.seen <= CORE_OPS, sorted(rec.seen - CORE_OPS)
    torch.testing.assert_close(torch.from_numpy(_np(out)), torch.from_numpy(_np(flambeau.log_softmax(x, 1))))
    y, mean, rstd = decompose(OPS["native_layer_norm"], (x, [5], None, None, 1e-5))
    assert tuple(mean.shape) == (3, 1) and tuple(rstd.shape) == (3, 1)


def test_batch_norm_updates_running_stats_with_copy_():
    x = flambeau.randn(4, 3, 5, dtype=flambeau.float64)
    rm, rv = flambeau.zeros(3, dtype=flambeau.float64), flambeau.ones(3, dtype=flambeau.float64)
    rm2, rv2 = rm.clone(), rv.clone()
    ref = flambeau.nn.functional.batch_norm(x, rm, rv, training=True)
    rec = RecordingMode()
    with rec, DecompositionMode():
        out = flambeau.nn.functional.batch_norm(x, rm2, rv2, training=True)
    assert "copy_" in rec.seen and rec.seen <= CORE_OPS, sorted(rec.seen - CORE_OPS)
    for a, b in ((out, ref), (rm2, rm), (rv2, rv)):
        torch.testing.assert_close(torch.from_numpy(_np(a)), torch.from_numpy(_np(b)))


def test_mlp_forward_backward_reaches_only_core_ops():
    nn, F = flambeau.nn, flambeau.nn.functional
    flambeau.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.LayerNorm(16), nn.GELU(), nn.Linear(16, 4))
    x = flambeau.randn(5, 8)
    target = flambeau.tensor([0, 1, 2, 3, 1])

    def step():
        model.zero_grad()
        logits = model(x)
        probs = F.softmax(logits, dim=-1)
        loss = F.cross_entropy(logits, target) + probs.pow(2).mean()
        loss.backward()
        return loss, [p.grad.clone() for p in model.parameters()]

    ref_loss, ref_grads = step()
    rec = RecordingMode()
    with rec, DecompositionMode():
        loss, grads = step()
    assert rec.seen <= CORE_OPS, f"non-core ops reached the backend: {sorted(rec.seen - CORE_OPS)}"
    torch.testing.assert_close(torch.from_numpy(_np(loss)), torch.from_numpy(_np(ref_loss)))
    for g, r in zip(grads, ref_grads):
        torch.testing.assert_close(torch.from_numpy(_np(g)), torch.from_numpy(_np(r)), rtol=1e-5, atol=1e-6)


def _f64(*shape):
    return flambeau.randn(*shape, dtype=flambeau.float64)


# Decompositions no op-database entry reaches (in-place BLAS variants, random overloads, ...).
DIRECT = {
    "addmm_": lambda: (_f64(2, 3), lambda s: s.addmm_(_f64(2, 4), _f64(4, 3), beta=0.5, alpha=2)),
    "baddbmm_": lambda: (_f64(2, 2, 3), lambda s: s.baddbmm_(_f64(2, 2, 4), _f64(2, 4, 3), alpha=0.5)),
    "addbmm_": lambda: (_f64(2, 3), lambda s: s.addbmm_(_f64(5, 2, 4), _f64(5, 4, 3))),
    "addmv_": lambda: (_f64(2), lambda s: s.addmv_(_f64(2, 4), _f64(4), beta=2)),
    "addr_": lambda: (_f64(2, 3), lambda s: s.addr_(_f64(2), _f64(3))),
    "threshold_": lambda: (_f64(3, 4), lambda s: flambeau.nn.functional.threshold_(s, 0.1, 20.0)),
    "_div_trunc": lambda: (_f64(3, 4), lambda s: OPS["_div_trunc"](s, _f64(4))),
    "conj_physical_": lambda: (_f64(3), lambda s: s.conj_physical_()),
}


@pytest.mark.parametrize("name", sorted(DIRECT))
def test_decomposition_direct(name):
    x, fn = DIRECT[name]()
    flambeau.manual_seed(0)
    ref = fn(x.clone())
    flambeau.manual_seed(0)
    mode = CountingDecompositionMode()
    with mode:
        ours = fn(x.clone())
    assert name in mode.used
    torch.testing.assert_close(torch.from_numpy(_np(ours)), torch.from_numpy(_np(ref)))


@pytest.mark.parametrize("call", [
    lambda: OPS["bernoulli.Tensor"](flambeau.rand(50, 4), flambeau.rand(4)),
    lambda: flambeau.empty(50, 4).bernoulli_(flambeau.rand(4)),
    lambda: flambeau.empty(50, 4).bernoulli_(0.3),
    lambda: OPS["rrelu_with_noise_functional"](_f64(50, 4), 0.1, 0.3)[0],
])
def test_random_decompositions_reach_generators(call):
    ref = call()
    rec = RecordingMode()
    with rec, DecompositionMode():
        ours = call()
    assert rec.seen <= CORE_OPS and "rand" in rec.seen, sorted(rec.seen)
    assert ours.shape == ref.shape and ours.dtype == ref.dtype


def test_flip_with_one_int_dim_through_the_compiler():
    # int[] dims given as a single int (x.flip(0), as PyTorch accepts) must not break the decomposition
    import warnings
    import torch
    f = flambeau.compile(lambda x: x.flip(0) * 2 + x.flip([0, 1]))
    x = flambeau.randn(3, 4)
    with warnings.catch_warnings():
        warnings.simplefilter("error")             # no "could not compile ... running eagerly"
        got = f(x)
    t = torch.from_numpy(x.numpy())
    torch.testing.assert_close(torch.from_numpy(got.numpy()), t.flip(0) * 2 + t.flip([0, 1]))
