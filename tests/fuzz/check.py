"""Running a fuzzer program three ways and comparing: PyTorch eager (the reference, and its float64
twin for judging rounding), flambeau eager, flambeau.compile (inductor; static or dynamic=True).

A compiled run fails when it raises (capture errors are not suppressed), when a graph or frame
falls back to eager (`flambeau._dynamo.utils.counters["inductor_fallbacks"]`; a single op
without a lowering is counted in `op_fallbacks` and fails only with strict=True), or when an
output, a gradient or a mutated input differs from PyTorch's. Comparison is `torch.testing`-like:
dtype and shape equal, NaN positions, infinities and the signs of zeros equal, finite values within
rtol/atol; an element is forgiven where PyTorch's float32 result itself differs from its float64 one
(an ill-conditioned element, such as a rounding boundary, or the sign of a NaN), where ours is within
tolerance of float64, or no further from float64 than 3x PyTorch's own float32 result (the rule of
`torch._dynamo.utils.same`; `_within_pytorchs_own_error`); the signs of zeros are not compared in a
tensor where PyTorch's float32 and float64 results give zeros of different signs (a sign set by
PyTorch's kernel layout, not its semantics), to which end the float64 twin reduces amin/amax/min()/
max() in reverse (from a tie of -0.0 and +0.0 PyTorch returns the zero its kernel meets first:
`_extremes_reduced_in_reverse`). PyTorch's softshrink runs with its zeros made +0.0, and
hardtanh/relu6/hardswish/hard- and softshrink with the incoming gradient at a NaN input, as their
formulas say (`_by_their_formulas`).
`signbit` of a NaN is not compared (`_signbit_of_numbers`): the sign of a NaN an operation makes is the
machine's (x86's default NaN is negative, glibc's log of a negative number positive), not PyTorch's.
"""
from __future__ import annotations

import collections
import contextlib
import dataclasses
import math
import warnings

import numpy as np

from flambeau._counters import FALLBACKS, counters, fallbacks_since
from tests.fuzz.gen import LOSS_SOURCE, Program, generate

MODES = ("eager", "inductor", "dynamic")
TOLERANCES = {"float32": (1.3e-6, 1e-5), "float64": (1e-7, 1e-7)}
GRAD_TOLERANCES = {"float32": (1e-5, 1e-5), "float64": (1e-7, 1e-7)}
MAX_REPORTED_ELEMENTS = 4
OWN_ERROR_MULTIPLIER = 3.0      # ours may be this many times further from float64 than PyTorch's float32


@dataclasses.dataclass
class Failure:
    seed: int
    mode: str
    kind: str                   # 'error', 'mismatch', 'fallback'
    message: str
    program: Program

    def report(self) -> str:
        return (f"seed {self.seed} [{self.mode}] {self.kind}: {self.message}\n" +
                self.program.repro(dynamic=self.mode == "dynamic", note=f"{self.mode} {self.kind}: {self.message}"))


def _namespace(mod) -> dict:
    return {"torch": mod, "math": math, "inf": math.inf, "nan": math.nan}


def _build(prog: Program, mod, float64: bool = False) -> dict:
    ns = _namespace(mod)
    exec(prog.input_source(float64) + "\n" + prog.function_source() + "\n" + LOSS_SOURCE, ns)
    return ns


# ---- PyTorch: generation steps and the reference ------------------------------------------------------
def torch_step(prog: Program, upto):
    """Run `prog` in PyTorch: its first `upto` statements (returning each tensor's shape, dtype and
    whether it shares memory with an input), or (upto=None) forward and backward."""
    import torch
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        if upto is None:
            run(prog, torch, "eager")
            run_float64(prog)
            return None
        ns = _build(prog, torch)
        leaves, inputs = ns["make_inputs"]()
        env = dict(zip([x.name for x in prog.inputs], inputs))
        ptrs = {t.untyped_storage().data_ptr() for t in inputs}
        for stmt in prog.body[:upto]:
            exec(stmt, ns, env)
        info = {}
        for k, v in env.items():
            if not isinstance(v, torch.Tensor):
                raise TypeError(f"{k} is not a tensor")
            info[k] = (tuple(v.shape), str(v.dtype).split(".")[-1], v.untyped_storage().data_ptr() in ptrs)
        return info


NAN_GRADIENT_BY_LAYOUT = ("hardtanh", "relu6", "hardswish", "softshrink", "hardshrink")


def _nan_passes_gradient(torch, original):
    """`original` whose gradient at a NaN input is the incoming one, as ATen's formula (its CUDA kernel and
    CPU scalar loop: `x <= lo ? 0 : g`); its CPU vector blocks give 0 (NaN for hardswish) there, so the
    gradient at a NaN depends on whether the element falls in a vector block (flambeau follows the formula)."""
    def by_formula(input, *args, **kwargs):
        nan = torch.isnan(input)
        if not nan.any():               # PyTorch's own call, saving `input` itself (seed 1447: an in-place
            return original(input, *args, **kwargs)     # write to it later makes backward raise there)
        return torch.where(nan, input, original(torch.where(nan, 0.0, input), *args, **kwargs))
    return by_formula


def _softshrink(torch, original):
    """PyTorch's softshrink, its zeros made +0.0: its formula, CUDA kernel and CPU vector blocks give
    0 on [-lambd, lambd], its CPU scalar loop (a block's tail, strided inputs) x * 0, -0.0 for a
    negative x, so the sign depends on where an element falls (flambeau follows the formula; every
    zero of softshrink lies on that interval, where its gradient is 0 either way)."""
    def softshrink(input, lambd=0.5):
        r = original(input, lambd)
        return torch.where(r == 0, 0.0, r)
    return softshrink


@contextlib.contextmanager
def _by_their_formulas(torch):
    """PyTorch's functions whose CPU results depend on the kernel's layout, as their formulas say:
    softshrink's zeros (`_softshrink`), the gradient at a NaN (`_nan_passes_gradient`)."""
    functional = torch.nn.functional
    originals = {name: getattr(functional, name) for name in NAN_GRADIENT_BY_LAYOUT}
    method = torch.Tensor.hardshrink
    for name, fn in originals.items():
        fn = _nan_passes_gradient(torch, fn)
        setattr(functional, name, _softshrink(torch, fn) if name == "softshrink" else fn)
    torch.Tensor.hardshrink = _nan_passes_gradient(torch, method)
    try:
        yield
    finally:
        for name, fn in originals.items():
            setattr(functional, name, fn)
        torch.Tensor.hardshrink = method


@contextlib.contextmanager
def _signbit_of_numbers(torch):
    """`torch.signbit` False at NaN, in both systems: a NaN's sign comes from the machine and the libm
    that made it (PyTorch's log10(-1) is -nan on x86, NumPy's +nan), so signbit there is not compared."""
    original = torch.signbit

    def signbit(input):
        return original(input) & ~torch.isnan(input)
    torch.signbit = signbit
    try:
        yield
    finally:
        torch.signbit = original


def run(prog: Program, mod, mode: str, ns: dict | None = None):
    """(outputs, gradients or None, inputs after the call) of `prog` on module `mod`."""
    with _signbit_of_numbers(mod), (_by_their_formulas(mod) if mod.__name__ == "torch"
                                    else contextlib.nullcontext()):
        return _run(prog, mod, mode, ns)


def _run(prog: Program, mod, mode: str, ns: dict | None = None):
    ns = ns if ns is not None else _build(prog, mod)
    leaves, inputs = ns["make_inputs"]()
    f = ns["f"]
    if mode != "eager":
        f = mod.compile(f, backend="inductor", dynamic=mode == "dynamic")
    outs = f(*inputs)
    if not isinstance(outs, tuple) or not all(isinstance(o, mod.Tensor) for o in outs):
        raise TypeError(f"f returned {type(outs).__name__}, not a tuple of tensors")
    grads = None
    if prog.grad:
        loss = ns["loss_of"](outs)
        if isinstance(loss, mod.Tensor) and loss.requires_grad:
            grads = mod.autograd.grad(loss, leaves, allow_unused=True)
    return outs, grads, inputs


def run_float64(prog: Program):
    """`run` of PyTorch's float64 twin of `prog`: float32 inputs as float64, and float64 the default
    dtype, so that an integer tensor promoted to a float (`log1p` of an int) is float64 there too:
    where PyTorch's float32 and float64 kernels disagree on such a value (the sign of a NaN, which
    `signbit` shows), the element is forgiven as ill-conditioned."""
    import torch
    old = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    try:
        with _extremes_reduced_in_reverse(torch):
            return run(prog, torch, "eager", _build(prog, torch, float64=True))
    finally:
        torch.set_default_dtype(old)


ORDER_DEPENDENT_ZERO_SIGNS = ("amin", "amax", "min", "max")     # min/max of a whole tensor only


def _reversed_along(x, dim):
    """`x` flipped along `dim` (an int, a sequence, or empty/None for every dim)."""
    if dim is None or (not isinstance(dim, int) and len(dim) == 0):
        return x.flip(tuple(range(x.ndim)))
    return x.flip((dim,) if isinstance(dim, int) else tuple(dim))


@contextlib.contextmanager
def _extremes_reduced_in_reverse(torch):
    """The float64 twin's amin/amax, and min()/max() of a whole tensor, reduce their input reversed
    along the reduced dims. Their result for a tie of -0.0 and +0.0 is whichever zero PyTorch's kernel
    meets first (in 84 of 300 random mixes of zeros, amin of a contiguous and of a strided tensor of the
    same values disagree on the sign; NumPy's and our kernels' choices are their own too): where the
    order decides the sign, the float32 and float64 runs then disagree on it, and it is not compared
    (`_zero_signs_vary`), nor values that depend on it (seed 2627). max(dim)/min(dim) return their
    first extreme's index and value, a semantic, and stay as they are."""
    originals = {name: getattr(torch.Tensor, name) for name in ORDER_DEPENDENT_ZERO_SIGNS}
    functions = {name: getattr(torch, name) for name in ("amin", "amax")}

    def reversed_reduction(original, whole_only):
        def reduce(input, *args, **kwargs):
            if whole_only and (args or kwargs):
                return original(input, *args, **kwargs)
            dim = args[0] if args else kwargs.get("dim")
            return original(_reversed_along(input, dim), *args, **kwargs)
        return reduce
    for name, fn in originals.items():
        setattr(torch.Tensor, name, reversed_reduction(fn, name in ("min", "max")))
    for name, fn in functions.items():
        setattr(torch, name, reversed_reduction(fn, False))
    try:
        yield
    finally:
        for name, fn in originals.items():
            setattr(torch.Tensor, name, fn)
        for name, fn in functions.items():
            setattr(torch, name, fn)


# ---- comparison ---------------------------------------------------------------------------------------
def _numpy(t):
    return None if t is None else t.detach().numpy()


def _dtype_name(t) -> str:
    return str(t.dtype).split(".")[-1]


def _differ(a: np.ndarray, b: np.ndarray, dtype: str, tolerances, signed_zeros: bool = True) -> np.ndarray:
    """Elementwise: `a` differs from the reference `b` (NaN, inf, zero signs exact; finite within tolerance)."""
    if dtype not in tolerances:
        return a != b
    a, b = a.astype(np.float64), b.astype(np.float64)
    rtol, atol = tolerances[dtype]
    na, nb = np.isnan(a), np.isnan(b)
    bad = na != nb
    both = ~na & ~nb
    inf = both & (np.isinf(a) | np.isinf(b))
    bad |= inf & (a != b)
    finite = both & ~inf
    with np.errstate(invalid="ignore"):                 # inf - inf where `finite` is False
        bad |= finite & ~(np.abs(a - b) <= atol + rtol * np.abs(b))
    if signed_zeros:
        bad |= finite & (a == 0) & (b == 0) & (np.signbit(a) != np.signbit(b))
    return bad


def _zero_signs_vary(b: np.ndarray, c: np.ndarray) -> bool:
    """PyTorch's float32 result `b` and float64 result `c` give a zero of different signs somewhere:
    the sign of a zero is then not PyTorch's semantics but its kernels' (softshrink's zeros inside
    (-lambd, lambd) take their sign from whether an element falls in a vector block or the scalar
    tail, and the block length differs between float32 and float64), so it is not compared anywhere
    in that tensor."""
    if b.shape != c.shape or b.dtype.kind != "f":
        return False
    zeros = (b == 0) & (c == 0)
    return bool(np.any(zeros & (np.signbit(b) != np.signbit(c))))


def _within_pytorchs_own_error(a, b, c, dtype: str, tolerances, signed: bool) -> np.ndarray:
    """Elementwise: ours (`a`) is no further from the float64 result `c` than OWN_ERROR_MULTIPLIER
    times PyTorch's float32 result `b` is (plus the tolerance), the test of PyTorch's own
    `torch._dynamo.utils.same(ref, res, fp64_ref)`, there on the tensor's RMSE with a multiplier of 3
    below 1000 elements. A 1-ulp difference in a rounding (NumPy's float32 `pow` vs PyTorch's, each
    off by 1 ulp on some elements) magnified by an ill-conditioned op after it (`x % 0.5` of x near 27:
    x 55 times the result) is as far from float64 as PyTorch's own result, not further (seed 2059).
    Finite values only, and (signed) a zero of the other sign than float64's is not near it."""
    if dtype not in tolerances:
        return np.zeros(a.shape, bool)
    rtol, atol = tolerances[dtype]
    a, b, c = a.astype(np.float64), b.astype(np.float64), c.astype(np.float64)
    with np.errstate(invalid="ignore"):
        near = np.abs(a - c) <= atol + rtol * np.abs(c) + OWN_ERROR_MULTIPLIER * np.abs(b - c)
    if signed:
        near &= ~((a == 0) & (c == 0) & (np.signbit(a) != np.signbit(c)))
    return near


def compare(ref, res, ref64, what: str, tolerances=TOLERANCES) -> str | None:
    """None if `res` (flambeau) matches `ref` (PyTorch), else a description of the first differences.
    The signs of zero gradients are not compared (how a backward formula spells a zero is not a
    semantic PyTorch keeps either: torch.compile changes them too)."""
    signed = tolerances is not GRAD_TOLERANCES
    if ref is None or res is None:
        if ref is None and res is None:
            return None
        other = res if ref is None else ref
        if not np.any(_numpy(other)):
            return None                                      # an unused input: None vs zeros
        return f"{what}: {'PyTorch' if ref is None else 'flambeau'} gives None"
    if _dtype_name(ref) != _dtype_name(res):
        return f"{what}: dtype {_dtype_name(res)}, PyTorch {_dtype_name(ref)}"
    if tuple(ref.shape) != tuple(res.shape):
        return f"{what}: shape {tuple(res.shape)}, PyTorch {tuple(ref.shape)}"
    dtype = _dtype_name(ref)
    a, b = _numpy(res), _numpy(ref)
    if signed and ref64 is not None and _zero_signs_vary(b, _numpy(ref64)):
        signed = False
    bad = _differ(a, b, dtype, tolerances, signed)
    if bad.any() and ref64 is not None:
        c = _numpy(ref64).astype(b.dtype) if dtype in tolerances else _numpy(ref64)
        if c.shape == b.shape:
            forgiven = (_differ(b, c, dtype, tolerances, signed) | ~_differ(a, c, dtype, tolerances, signed)
                        | _within_pytorchs_own_error(a, b, c, dtype, tolerances, signed))
            bad &= ~forgiven
    if not bad.any():
        return None
    where = np.argwhere(bad)[:MAX_REPORTED_ELEMENTS]
    pairs = ", ".join(f"{tuple(int(i) for i in ix)}: {a[tuple(ix)]!r} vs {b[tuple(ix)]!r}" for ix in where)
    return f"{what}: {int(bad.sum())} of {bad.size} elements differ (flambeau vs PyTorch) {pairs}"


def compare_runs(ref, res, ref64) -> str | None:
    """Outputs, gradients and inputs after the call of two `run` results."""
    (ro, rg, ri), (so, sg, si), (r64o, r64g, r64i) = ref, res, ref64
    if len(ro) != len(so):
        return f"{len(so)} outputs, PyTorch {len(ro)}"
    checks = [(ro[i], so[i], r64o[i], f"output {i}", TOLERANCES) for i in range(len(ro))]
    checks += [(ri[i], si[i], r64i[i], f"input {i} after the call", TOLERANCES) for i in range(len(ri))]
    if rg is not None or sg is not None:
        if rg is None or sg is None:
            return f"gradients: {'PyTorch' if rg is None else 'flambeau'} has none"
        checks += [(rg[i], sg[i], r64g[i], f"grad of leaf {i}", GRAD_TOLERANCES) for i in range(len(rg))]
    for r, s, r64, what, tol in checks:
        msg = compare(r, s, r64, what, tol)
        if msg:
            return msg
    return None


# ---- one program ----------------------------------------------------------------------------------------
MISSING_LOWERING = "no lowering"        # a node the code generator runs as an eager op (recorded, not silent)
op_fallbacks: collections.Counter = collections.Counter()   # those seen in this process, for the summary


def _fallbacks_snapshot() -> collections.Counter:
    return collections.Counter(counters[FALLBACKS])


def _failing_fallbacks(since: collections.Counter, strict: bool) -> list:
    """The fallbacks recorded after `since` that fail a program: a graph or frame run eagerly, a
    call sent to eager, and (strict) also single ops without a lowering."""
    new = fallbacks_since(since)
    ops = {k: n for k, n in new.items() if k.endswith(": " + MISSING_LOWERING)}
    op_fallbacks.update(ops)
    return sorted(k for k in new if strict or k not in ops)


@contextlib.contextmanager
def _strict_compile():
    """Capture and backend errors raise instead of running the frame eagerly."""
    from flambeau._dynamo import config
    old, config.suppress_errors = config.suppress_errors, False
    try:
        yield
    finally:
        config.suppress_errors = old


def check_seed(seed: int, modes=MODES, strict: bool = False) -> list:
    """The failures of the program of `seed` in each of `modes` (strict: an op without a lowering
    fails too)."""
    import torch

    import flambeau
    prog = generate(seed, torch_step)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        ref = _snapshot(run(prog, torch, "eager"))
        ref64 = _snapshot(run_float64(prog))
    failures = []
    for mode in modes:
        flambeau.compiler.reset()
        before = _fallbacks_snapshot()
        try:
            with _strict_compile(), warnings.catch_warnings():
                warnings.simplefilter("ignore")
                res = _snapshot(run(prog, flambeau, mode))
        except Exception as e:                            # noqa: BLE001 -- every exception is a finding
            failures.append(Failure(seed, mode, "error", f"{type(e).__name__}: {e}", prog))
            continue
        fell_back = _failing_fallbacks(before, strict)
        if fell_back:
            failures.append(Failure(seed, mode, "fallback", "; ".join(fell_back), prog))
            continue
        msg = compare_runs(ref, res, ref64)
        if msg:
            failures.append(Failure(seed, mode, "mismatch", msg, prog))
    return failures


def _snapshot(results):
    """Detach results (flambeau or torch) so later runs can't change them."""
    outs, grads, inputs = results
    keep = lambda ts: None if ts is None else tuple(None if t is None else t.detach().clone() for t in ts)  # noqa
    return keep(outs), keep(grads), keep(inputs)
