"""The op database: one `OpInfo` per public operator, with sample and error inputs.

Every test in tests/test_ops.py is driven by it: forward vs PyTorch, method/in-place/out=
variants, gradients vs PyTorch, numerical gradcheck in float64, meta vs real shapes/dtypes,
and cuda vs cpu. A sample names its tensors with `T(shape, ...)` specs, materialised with the
same data (and the same strides) in both frameworks, so one `call(module, *args)` runs on
flambeau and on torch alike.
"""
from __future__ import annotations

import dataclasses
import importlib
from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np

FLOATS = ("float32", "float64")
LOWP = ("float16", "bfloat16")
INTS = ("uint8", "int8", "int16", "int32", "int64")
ALL_REAL = ("bool",) + INTS + FLOATS + LOWP
FLOATS_AND_LOWP = FLOATS + LOWP
NUMERIC = INTS + FLOATS + LOWP


@dataclass
class T:
    """A tensor argument: shape, value range, layout and autograd flag."""
    shape: tuple
    dtype: str | None = None            # None: the dtype under test
    low: float | None = None
    high: float | None = None
    noncontig: bool = False             # materialised as a transposed/strided view
    requires_grad: bool | None = None   # None: if floating and the test is a gradient test
    values: Any = None                  # explicit data (list or ndarray)
    expanded_from: tuple | None = None  # materialise with this shape then expand to `shape`


@dataclass
class Sample:
    args: tuple = ()
    kwargs: dict = field(default_factory=dict)
    name: str = ""


def S(*args, **kwargs) -> Sample:
    return Sample(args, kwargs)


@dataclass
class ErrorSample:
    sample: Sample
    exc: type = RuntimeError
    match: str = ""                     # regex our message must match (optional)


@dataclass
class OpInfo:
    name: str                                        # test id, usually the function name
    samples: Callable[[str], list]                   # dtype -> [Sample]
    fn: str | None = None                            # dotted path on the module: 'add', 'nn.functional.relu'
    call: Callable | None = None                     # (module, *args, **kwargs) -> result; overrides fn
    ops: tuple = ()                                  # registered op names this entry covers
    dtypes: tuple = FLOATS
    method: str | None = None                        # Tensor method name (called on the first arg)
    inplace: str | None = None                       # in-place method name
    out: bool = False                                # supports out=
    grad: bool = True                                # differentiable: gradients vs torch + gradcheck
    gradcheck: bool = True
    meta: bool = True                                # run meta vs real
    random: bool = False                             # nondeterministic values: compare shape/dtype only
    tol: dict = field(default_factory=dict)          # dtype -> (rtol, atol)
    errors: Callable[[], list] | None = None         # -> [ErrorSample]
    check_strides: bool = False
    skip: dict = field(default_factory=dict)         # test kind ('forward','grad','gradcheck','meta','cuda',
                                                     # 'decomposition_grad') -> reason
    fallbacks: dict = field(default_factory=dict)    # op expected to run eagerly inside compiled graphs -> reason
    dynamic_fallbacks: dict = field(default_factory=dict)   # the same, only when compiled with dynamic=True

    def resolve(self, module):
        if self.call is not None:
            return lambda *a, **k: self.call(module, *a, **k)
        obj = module
        for part in (self.fn or self.name).split("."):
            obj = getattr(obj, part)
        return obj


FAMILIES = ["pointwise", "reduction", "shape_index", "linalg_creation", "nn_ops", "norm_loss_act", "misc", "quant"]


def all_opinfos() -> list:
    out = []
    for fam in FAMILIES:
        try:
            mod = importlib.import_module(f"tests.opdb.{fam}")
        except ModuleNotFoundError as e:
            if e.name != f"tests.opdb.{fam}":
                raise
            continue
        out.extend(mod.OPS)
    return out


# ---- materialisation ---------------------------------------------------------------------------
def _np_dtype(name):
    import ml_dtypes
    return {"bfloat16": np.dtype(ml_dtypes.bfloat16)}.get(name, np.dtype(name) if name != "bool" else np.dtype(bool))


def make_array(spec: T, dtype: str, rng: np.random.Generator) -> np.ndarray:
    dt = spec.dtype or dtype
    shape = spec.expanded_from or spec.shape
    if spec.values is not None:
        a = np.array(spec.values)
        return a.astype(np.float64 if dt in ("bfloat16", "float16") else _np_dtype(dt))
    if dt == "bool":
        return rng.random(shape) < 0.5
    if dt in INTS or dt in ("uint16", "uint32", "uint64"):
        lo = int(spec.low) if spec.low is not None else (0 if dt.startswith("u") else -9)
        hi = int(spec.high) if spec.high is not None else 10
        return rng.integers(lo, hi, size=shape).astype(dt)
    lo = spec.low if spec.low is not None else -3.0
    hi = spec.high if spec.high is not None else 3.0
    a = rng.uniform(lo, hi, size=shape)
    if dt.startswith("complex"):
        a = a + 1j * rng.uniform(lo, hi, size=shape)
        return a.astype(dt)
    return a  # float64; cast by the framework (so bf16/f16 rounding is each framework's own)


def to_framework(mod, spec: T, arr: np.ndarray, dtype: str, requires_grad: bool):
    """Build the tensor in `mod` (flambeau or torch) with identical data and layout."""
    dt = spec.dtype or dtype
    tdt = getattr(mod, dt)
    if spec.noncontig and arr.ndim >= 1:
        # store transposed, then transpose back: same values, non-contiguous strides
        if arr.ndim >= 2:
            base = mod.tensor(np.ascontiguousarray(np.swapaxes(arr, -1, -2))).to(tdt)
            t = base.transpose(-1, -2)
        else:
            big = np.repeat(arr, 2)
            t = mod.tensor(big).to(tdt)[::2]
    else:
        t = mod.tensor(np.ascontiguousarray(arr) if np.ndim(arr) else np.asarray(arr)).to(tdt)
    if spec.expanded_from is not None:
        t = t.expand(*spec.shape)
    if requires_grad:
        t = t.detach().requires_grad_(True)
        if spec.expanded_from is not None or spec.noncontig:
            pass
    return t


def materialize(mod, sample: Sample, dtype: str, seed: int, grad: bool):
    """Return (args, kwargs, leaves) for module `mod`. Same seed -> same data in both frameworks."""
    rng = np.random.default_rng(seed)
    leaves = []

    def conv(x):
        if isinstance(x, T):
            arr = make_array(x, dtype, rng)
            dt = x.dtype or dtype
            rg = grad and (x.requires_grad if x.requires_grad is not None else
                           (dt in FLOATS_AND_LOWP or dt.startswith("complex")))
            t = to_framework(mod, x, arr, dtype, rg)
            if rg:
                leaves.append(t)
            return t
        if isinstance(x, list):
            return [conv(y) for y in x]
        if isinstance(x, tuple):
            return tuple(conv(y) for y in x)
        if isinstance(x, DType):
            return getattr(mod, x.name)
        if isinstance(x, Module):
            return x.get(mod)
        return x

    args = tuple(conv(a) for a in sample.args)
    kwargs = {k: conv(v) for k, v in sample.kwargs.items()}
    return args, kwargs, leaves


@dataclass
class DType:
    """A dtype argument, resolved per framework: DType('float64')."""
    name: str


@dataclass
class Module:
    """A framework attribute argument, e.g. Module('contiguous_format')."""
    path: str

    def get(self, mod):
        obj = mod
        for p in self.path.split("."):
            obj = getattr(obj, p)
        return obj


# ---- running samples through a compiled function (tests/test_compile.py, tests/test_inductor_dynamic.py) ----
def compile_dtype(mod, info, max_samples: int) -> str | None:
    """The dtype a compile test runs `info` in: float32 if listed, else the first of `info.dtypes`,
    provided one of the first `max_samples` samples runs eagerly in it (None: no such dtype)."""
    order = sorted(info.dtypes, key=lambda d: d != "float32")
    for dt in order:
        if next(eager_samples(mod, info, dt, max_samples), None) is not None:
            return dt
    return None


def declared_eager_fallbacks() -> dict:
    """Op -> reason for each op that declares it may run eagerly inside compiled code
    (`Op.eager_fallback`, set in its `defop`); extern ops are library calls and never counted."""
    from flambeau._ops import OPS
    return {op.name: op.eager_fallback for op in OPS.values() if op.eager_fallback}


def expected_fallbacks(info, dynamic) -> dict:
    """Op -> reason of what may run eagerly when `info` is compiled (with `dynamic`): the entry's
    own `fallbacks` (`dynamic_fallbacks`) and the ops that declare an eager fallback."""
    return {**declared_eager_fallbacks(), **info.fallbacks, **(info.dynamic_fallbacks if dynamic else {})}


def check_compiled_or_expected_failure(mod, info, backend, max_samples: int, **kw) -> int:
    """`check_compiled`, for an entry whose `skip` names "compile" (or "compile_dynamic" with
    dynamic=True): that it still fails (xfail with the reason), else an error saying to remove it."""
    import pytest
    kind = "compile_dynamic" if kw.get("dynamic") and "compile_dynamic" in info.skip else "compile"
    if kind not in info.skip:
        return check_compiled(mod, info, backend, max_samples, **kw)
    try:
        check_compiled(mod, info, backend, max_samples, **kw)
    except Exception:
        pytest.xfail(info.skip[kind])
    raise AssertionError(f"{info.name} now compiles: remove skip[{kind!r}] from its op-database entry")


def check_compiled(mod, info, backend, max_samples: int, *, dynamic=None, compile_per_sample: bool = True) -> int:
    """Compile `info`'s op with `backend`, call it on the samples valid in `compile_dtype` and
    compare with eager. Fails when no sample runs, or when anything runs eagerly inside the
    compiled code that `info.fallbacks` (`dynamic_fallbacks`) does not list. Returns the number of
    graph breaks. `compile_per_sample=False`: one compiled function serves every sample (so a
    dynamic graph is reused across sizes)."""
    import warnings
    from flambeau._dynamo.testing import no_unexpected_fallbacks
    from flambeau._dynamo.utils import counters
    import pytest
    if not any(info.samples(d) for d in info.dtypes):
        pytest.skip("an entry of error samples only")
    dt = compile_dtype(mod, info, max_samples)
    assert dt is not None, f"{info.name}: no sample runs eagerly in any of {info.dtypes}"
    fn = info.resolve(mod)
    breaks = ran = 0
    compiled = None
    with no_unexpected_fallbacks(expected_fallbacks(info, dynamic)):
        for i, s, ref in eager_samples(mod, info, dt, max_samples):
            args, kwargs, _ = materialize(mod, s, dt, 100 + i, False)
            if compile_per_sample or compiled is None:
                mod._dynamo.reset()
                compiled = mod.compile(lambda *a, **k: fn(*a, **k), backend=backend, dynamic=dynamic)
            before = sum(counters["graph_break"].values())
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                res = compiled(*args, **kwargs)
            breaks += sum(counters["graph_break"].values()) - before
            assert_outputs_match(mod, info, ref, res, f"sample {i} ({dt})")
            ran += 1
    assert ran, f"{info.name}: no sample ran in {dt}"
    return breaks


def eager_samples(mod, info, dtype: str, max_samples: int):
    """(index, sample, eager result) for the first `max_samples` samples of `info` that are valid
    in `dtype` (a sample whose eager call raises is skipped)."""
    fn = info.resolve(mod)
    for i, s in enumerate(info.samples(dtype)[:max_samples]):
        args, kwargs, _ = materialize(mod, s, dtype, 100 + i, False)
        try:
            ref = fn(*args, **kwargs)
        except Exception:
            continue
        yield i, s, ref


def flat_tensors(mod, x) -> list:
    if isinstance(x, mod.Tensor):
        return [x]
    if isinstance(x, (list, tuple)):
        return [t for y in x for t in flat_tensors(mod, y)]
    return []


def as_numpy(t):
    t = t.detach()
    return t.double().numpy() if t.dtype.is_floating_point else t.numpy()


def assert_outputs_match(mod, info, ref, res, where: str) -> None:
    """Compiled outputs `res` against eager `ref`: same structure, dtypes and shapes, and (for
    non-random ops) values within float32 tolerance (1e-2 for half precision)."""
    a, b = flat_tensors(mod, ref), flat_tensors(mod, res)
    assert len(a) == len(b), where
    for p, q in zip(a, b):
        assert p.dtype == q.dtype and tuple(p.shape) == tuple(q.shape), where
        if not info.random:
            tol = 1e-2 if p.dtype in (mod.float16, mod.bfloat16) else 1e-4
            np.testing.assert_allclose(as_numpy(q), as_numpy(p), rtol=tol, atol=tol, equal_nan=True, err_msg=where)
