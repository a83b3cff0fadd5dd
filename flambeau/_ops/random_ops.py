"""Random operators: rand/randn/randint/randperm (and *_like), normal, bernoulli, multinomial,
poisson, and the in-place fills (uniform_, normal_, exponential_, geometric_, log_normal_,
cauchy_, random_, bernoulli_).

Every op takes `generator=` (a `flambeau.Generator`); without one it draws from the device's
default generator, so `manual_seed` makes results reproducible. Values come from the array
namespace's Generator (NumPy's PCG64 on cpu, CuPy's on cuda); all distributions are derived from
uniform/normal/integer draws so both namespaces support them. Bit-equality with PyTorch is not a
goal. Random ops have no derivative except normal's with respect to mean and std (PyTorch's);
bernoulli and poisson pass a zero gradient, as PyTorch does.
"""
from __future__ import annotations

import math

import numpy as np

from .. import _dtype as D
from .._tensor import Tensor
from .._device import canonical
from .._backends import is_cupy, namespace_device
from ._registry import defop, export, make_inplace, TensorSpec, Tag
from ._helpers import broadcast_shapes
from .creation import _size, _size_kw, _dt, _finish, zeros_like, tensor, like_layout, like_strides_of
from .._dispatch import type_name
from ..random import generator_for, Generator


def _rng(xp, generator, device=None):
    """The array-namespace generator for this call (explicit generator or the device default)."""
    if generator is not None and not isinstance(generator, Generator):
        raise TypeError(f"expected a torch.Generator, got {type(generator).__name__}")
    if device is None:
        device = namespace_device(xp)
    return generator_for(canonical(device), generator).xp_generator(xp)


def _type_name(dt):
    return type_name(dt)


def _need_float(kernel_name, dt):
    if dt.category != D.FLOATING:
        raise NotImplementedError(f"\"{kernel_name}\" not implemented for '{_type_name(dt)}'")


def _uniform(xp, g, shape, dt: D.dtype, low=0.0, high=1.0):
    cd = np.float32 if dt.np == np.float32 else np.float64
    u = g.random(shape, dtype=cd)
    r = u if (low, high) == (0.0, 1.0) else low + (high - low) * u
    return xp.asarray(r).astype(dt.np, copy=False)


def _normal(xp, g, shape, dt: D.dtype):
    cd = np.float32 if dt.np == np.float32 else np.float64
    return xp.asarray(g.standard_normal(shape, dtype=cd))


def _zero_grad(grad, self_meta=None):
    return zeros_like(grad)


# ---- factories -------------------------------------------------------------------------------
@defop("rand(SymInt[] size, *, Generator? generator=None, ScalarType? dtype=None, Device? device=None) -> Tensor",
       function=False, tags=(Tag.core, Tag.nondeterministic_seeded, Tag.extern))
def _rand(xp, size, *, generator=None, dtype=None, device=None):
    _need_float("check_uniform_bounds", dtype)
    return _uniform(xp, _rng(xp, generator, device), size, dtype)


@defop("randn(SymInt[] size, *, Generator? generator=None, ScalarType? dtype=None, Device? device=None) -> Tensor",
       function=False, tags=(Tag.core, Tag.nondeterministic_seeded, Tag.extern))
def _randn(xp, size, *, generator=None, dtype=None, device=None):
    _need_float("normal_kernel_cpu", dtype)
    return _normal(xp, _rng(xp, generator, device), size, dtype).astype(dtype.np, copy=False)


def _check_float_meta(name):
    def meta(size, *, generator=None, dtype=None, device=None):
        _need_float(name, dtype)
        return TensorSpec(size, dtype)
    return meta


_rand.def_meta(_check_float_meta("check_uniform_bounds"))
_randn.def_meta(_check_float_meta("normal_kernel_cpu"))


def _factory(op, fname):
    def f(*size, generator=None, dtype=None, device=None, requires_grad=False, layout=None, pin_memory=False,
          out=None, names=None, **kw):
        t = op(_size(_size_kw(size, kw, fname)), generator=generator, dtype=_dt(dtype), device=device)
        return _finish(t, requires_grad) if out is None else out.resize_(t.shape).copy_(t)
    f.__name__ = fname
    return f


rand = export("rand")(_factory(_rand, "rand"))
randn = export("randn")(_factory(_randn, "randn"))


def _randint_check(low, high):
    if low >= high:
        raise RuntimeError(f"random_ expects 'from' to be less than 'to', but got from={low} >= to={high}")


@defop("randint.low(SymInt low, SymInt high, SymInt[] size, *, Generator? generator=None, ScalarType? dtype=None, "
       "Device? device=None) -> Tensor", function=False, tags=(Tag.core, Tag.nondeterministic_seeded, Tag.extern))
def _randint(xp, low, high, size, *, generator=None, dtype=None, device=None):
    _randint_check(low, high)
    r = _rng(xp, generator, device).integers(low, high, size=size, dtype=np.int64)
    return xp.asarray(r).astype(dtype.np, copy=False)


@_randint.def_meta
def _(low, high, size, *, generator=None, dtype=None, device=None):
    _randint_check(low, high)
    return TensorSpec(size, dtype)


@export()
def randint(*args, generator=None, dtype=None, device=None, requires_grad=False, layout=None, pin_memory=False,
            out=None, low=None, high=None, size=None):
    args = list(args)
    if size is None:
        size = args.pop()
    if high is None:
        high = args.pop()
    if low is None:
        low = args.pop() if args else 0
    if args:
        raise TypeError("randint() received an invalid combination of arguments")
    t = _randint(int(low), int(high), _size((size,)), generator=generator, dtype=_dt(dtype, D.int64), device=device)
    return _finish(t, requires_grad) if out is None else out.resize_(t.shape).copy_(t)


def _randperm_check(n):
    if n < 0:
        raise RuntimeError(f"Trying to create tensor with negative dimension {n}: [{n}]")
    return (n,)


@defop("randperm(SymInt n, *, Generator? generator=None, ScalarType? dtype=None, Device? device=None) -> Tensor",
       function=False, tags=(Tag.core, Tag.nondeterministic_seeded, Tag.extern))
def _randperm(xp, n, *, generator=None, dtype=None, device=None):
    _randperm_check(n)
    keys = _rng(xp, generator, device).random(n)
    return xp.argsort(xp.asarray(keys), kind="stable").astype(dtype.np)


_randperm.def_meta(lambda n, *, generator=None, dtype=None, device=None: TensorSpec(_randperm_check(n), dtype))


@export()
def randperm(n, *, generator=None, dtype=None, device=None, requires_grad=False, layout=None, pin_memory=False,
             out=None):
    t = _randperm(int(n), generator=generator, dtype=_dt(dtype, D.int64), device=device)
    return _finish(t, requires_grad) if out is None else out.resize_(t.shape).copy_(t)


def _like(fn):
    def like(input, *args, generator=None, dtype=None, device=None, requires_grad=False, layout=None,
             memory_format=None, pin_memory=False):
        strides = like_strides_of(input, memory_format, fn.__name__ + "_like")
        t = fn(*args, input.shape, generator=generator, dtype=dtype or input.dtype,
               device=device if device is not None else input.device)
        return like_layout(t, strides, requires_grad)
    return like


export("rand_like")(_like(rand))
export("randn_like")(_like(randn))
export("randint_like")(_like(randint))


# ---- normal ----------------------------------------------------------------------------------
def _check_std(xp, std):
    if bool(xp.any(std < 0)):
        raise RuntimeError("normal expects all elements of std >= 0.0")


@defop("normal.Tensor_Tensor(Tensor mean, Tensor std, *, Generator? generator=None) -> Tensor", function=False,
       tags=(Tag.nondeterministic_seeded,))
def _normal_tt(xp, mean, std, *, generator=None):
    dt = D.FROM_NP[mean.dtype]
    _need_float("normal_kernel_cpu", dt)
    _check_std(xp, std)
    shape = broadcast_shapes(mean.shape, std.shape)
    z = _normal(xp, _rng(xp, generator), shape, dt)
    return (mean + std * z).astype(dt.np, copy=False)


@_normal_tt.def_meta
def _(mean, std, *, generator=None):
    _need_float("normal_kernel_cpu", mean.dtype)
    return TensorSpec(broadcast_shapes(tuple(mean.shape), tuple(std.shape)), mean.dtype)


@_normal_tt.def_derivative
def _(grad, mean, std, result):
    return grad, (grad * (result - mean) / std).masked_fill(std == 0, 0)


@defop("normal.float_float(float mean, float std, SymInt[] size, *, Generator? generator=None, "
       "ScalarType? dtype=None, Device? device=None) -> Tensor", function=False,
       tags=(Tag.core, Tag.nondeterministic_seeded, Tag.extern))
def _normal_ff(xp, mean, std, size, *, generator=None, dtype=None, device=None):
    _need_float("normal_kernel_cpu", dtype)
    if std < 0:
        raise RuntimeError(f"normal expects std >= 0.0, but found std {std}")
    z = _normal(xp, _rng(xp, generator, device), size, dtype)
    return (mean + std * z).astype(dtype.np, copy=False)


_normal_ff.def_meta(lambda mean, std, size, *, generator=None, dtype=None, device=None:
                    (_need_float("normal_kernel_cpu", dtype), TensorSpec(size, dtype))[1])


@export()
def normal(mean, std=1.0, size=None, *, generator=None, dtype=None, device=None, requires_grad=False,
           layout=None, pin_memory=False, out=None):
    if isinstance(mean, Tensor) or isinstance(std, Tensor):
        ref = mean if isinstance(mean, Tensor) else std
        if not isinstance(mean, Tensor):
            mean = tensor(mean, dtype=ref.dtype, device=ref.device)
        if not isinstance(std, Tensor):
            if std < 0:
                raise RuntimeError(f"normal expects std >= 0.0, but found std {std}")
            std = tensor(std, dtype=ref.dtype, device=ref.device)
        t = _normal_tt(mean, std, generator=generator)
    else:
        if size is None:
            raise TypeError("normal() missing required argument 'size' when mean and std are floats")
        t = _normal_ff(float(mean), float(std), _size((size,)), generator=generator, dtype=_dt(dtype),
                       device=device)
        t = _finish(t, requires_grad)
    return t if out is None else out.resize_(t.shape).copy_(t)


# ---- in-place fills (functional op + derived `name_`) -----------------------------------------
def _fill_op(schema, sample, check=None, float_only="", *, tags=()):
    """A functional `name(self, ...)` sampling a tensor like self, and its in-place `name_`."""
    @defop(schema, function=False, derivative=_zero_grad, tags=tags)
    def op(xp, *a, **k):
        self, *args, generator = op.bind(*a, **k)
        dt = D.FROM_NP[self.dtype]
        if float_only:
            _need_float(float_only, dt)
        if check:
            check(dt, *args)
        g = _rng(xp, generator, canonical(f"cuda:{self.device.id}") if is_cupy(xp) else None)
        return xp.asarray(sample(xp, g, self.shape, dt, *args)).astype(self.dtype, copy=False)

    @op.def_meta
    def _(*a, **k):
        self, *args, generator = op.bind(*a, **k)
        if float_only:
            _need_float(float_only, self.dtype)
        if check:
            check(self.dtype, *args)
        return TensorSpec(self.shape, self.dtype)

    make_inplace(op, method=True)
    return op


def _check_uniform(dt, a=0.0, b=1.0):
    if a > b:
        raise RuntimeError(f"uniform_ expects to return a [from, to) range, but found from={a} > to={b}")


uniform = _fill_op("uniform(Tensor self, float from_=0, float to=1, *, Generator? generator=None) -> Tensor",
                   lambda xp, g, s, dt, a=0.0, b=1.0: _uniform(xp, g, s, dt, a, b), _check_uniform,
                   "check_uniform_bounds")


def _check_normal(dt, mean=0.0, std=1.0):
    if std < 0:
        raise RuntimeError(f"normal expects std >= 0.0, but found std {std}")


normal_fill = _fill_op("normal.self(Tensor self, float mean=0, float std=1, *, Generator? generator=None) -> Tensor",
                       lambda xp, g, s, dt, m=0.0, sd=1.0: m + sd * _normal(xp, g, s, dt), _check_normal,
                       "normal_kernel_cpu", tags=(Tag.nondeterministic_seeded,))


def _check_positive(name, what):
    def check(dt, v=1.0, *rest):
        if not v > 0:
            raise RuntimeError(f"{name} expects {what} > 0.0, but found {what}={v}")
    return check


def _exponential(xp, g, s, dt, lambd=1.0):
    return -xp.log1p(-_uniform(xp, g, s, D.float64)) / lambd


exponential = _fill_op("exponential(Tensor self, float lambd=1, *, Generator? generator=None) -> Tensor",
                       _exponential, _check_positive("exponential_", "lambda"), "exponential")


def _check_geometric(dt, p):
    if not 0 < p < 1:
        raise RuntimeError(f"geometric_ expects p to be in (0, 1), but got p={p}")


geometric = _fill_op("geometric(Tensor self, float p, *, Generator? generator=None) -> Tensor",
                     lambda xp, g, s, dt, p: xp.ceil(xp.log1p(-_uniform(xp, g, s, D.float64)) / math.log1p(-p)),
                     _check_geometric)


def _check_lognormal(dt, mean=1.0, std=2.0):
    if not std > 0:
        raise RuntimeError(f"log_normal_ expects std > 0.0, but found std={std}")


log_normal = _fill_op("log_normal(Tensor self, float mean=1, float std=2, *, Generator? generator=None) -> Tensor",
                      lambda xp, g, s, dt, m=1.0, sd=2.0: xp.exp(m + sd * _normal(xp, g, s, D.float64)),
                      _check_lognormal, "log_normal")
cauchy = _fill_op("cauchy(Tensor self, float median=0, float sigma=1, *, Generator? generator=None) -> Tensor",
                  lambda xp, g, s, dt, med=0.0, sig=1.0: med + sig * xp.tan(math.pi * (_uniform(xp, g, s, D.float64)
                                                                                        - 0.5)),
                  None, "cauchy")


def _random_bounds(dt, a, b):
    if b is None:
        if dt.category == D.FLOATING:
            digits = {"float16": 11, "bfloat16": 8, "float32": 24, "float64": 53}[dt.name]
            return 0, 2 ** digits + 1
        if dt is D.bool:
            return 0, 2
        return 0, int(np.iinfo(dt.np).max)
    if a >= b:
        raise RuntimeError(f"random_ expects 'from' to be less than 'to', but got from={a} >= to={b}")
    if dt.category == D.INTEGER and (a < np.iinfo(dt.np).min or b - 1 > np.iinfo(dt.np).max):
        raise RuntimeError(f"from is out of bounds for {dt.np.name}")
    return a, b


def _random_sample(xp, g, s, dt, a=0, b=None):
    lo, hi = _random_bounds(dt, a, b)
    return g.integers(lo, hi, size=s, dtype=np.int64)


random = _fill_op("random(Tensor self, int from_=0, int? to=None, *, Generator? generator=None) -> Tensor",
                  _random_sample, lambda dt, a=0, b=None: _random_bounds(dt, a, b), tags=(Tag.nondeterministic_seeded,))


@export("random_", method=True, function=False)
def random_(self, *args, generator=None, **kw):
    """self.random_(), random_(to), random_(from, to)."""
    if "from" in kw:
        kw["from_"] = kw.pop("from")
    if len(args) == 1 and not kw:
        args = (0, args[0])
    return random.inplace(self, *args, generator=generator, **kw)


# ---- bernoulli, poisson, multinomial ----------------------------------------------------------
def _check_p(xp, p):
    if bool(xp.any((p < 0) | (p > 1))):
        raise RuntimeError("Expected p_in >= 0 && p_in <= 1 to be true, but got false.")


@defop("bernoulli(Tensor self, *, Generator? generator=None) -> Tensor", function=False, derivative=_zero_grad,
       tags=(Tag.nondeterministic_seeded,))
def _bernoulli(xp, self, *, generator=None):
    dt = D.FROM_NP[self.dtype]
    _need_float("bernoulli_tensor_cpu_p_", dt)
    _check_p(xp, self)
    u = _uniform(xp, _rng(xp, generator), self.shape, D.float64)
    return (u < self).astype(self.dtype)


_bernoulli.def_meta(lambda self, *, generator=None: TensorSpec(self.shape, self.dtype))


@defop("bernoulli.p(Tensor self, float p, *, Generator? generator=None) -> Tensor", function=False,
       derivative=_zero_grad, tags=(Tag.nondeterministic_seeded,))
def _bernoulli_p(xp, self, p, *, generator=None):
    if not 0 <= p <= 1:
        raise RuntimeError(f"bernoulli_ expects p to be in [0, 1], but got p={p}")
    u = _uniform(xp, _rng(xp, generator), self.shape, D.float64)
    return (u < p).astype(self.dtype)


_bernoulli_p.def_meta(lambda self, p, *, generator=None: TensorSpec(self.shape, self.dtype))
make_inplace(_bernoulli_p, method=False)


@defop("bernoulli.Tensor(Tensor self, Tensor p, *, Generator? generator=None) -> Tensor", function=False,
       derivative=lambda grad: (zeros_like(grad), None), tags=(Tag.nondeterministic_seeded,))
def _bernoulli_t(xp, self, p, *, generator=None):
    _check_p(xp, p)
    u = _uniform(xp, _rng(xp, generator), self.shape, D.float64)
    return (u < xp.broadcast_to(p, self.shape)).astype(self.dtype)


_bernoulli_t.def_meta(lambda self, p, *, generator=None: TensorSpec(self.shape, self.dtype))
make_inplace(_bernoulli_t, method=False)


@export("bernoulli", method=True)
def bernoulli(input, p=None, *, generator=None, out=None):
    t = _bernoulli(input, generator=generator) if p is None else _bernoulli_p(input, float(p), generator=generator)
    return t if out is None else out.resize_(t.shape).copy_(t)


@export("bernoulli_", method=True, function=False)
def bernoulli_(self, p=0.5, *, generator=None):
    if isinstance(p, Tensor):
        return _bernoulli_t.inplace(self, p, generator=generator)
    return _bernoulli_p.inplace(self, float(p), generator=generator)


@defop("poisson(Tensor self, Generator? generator=None) -> Tensor", derivative=_zero_grad,
       tags=(Tag.core, Tag.nondeterministic_seeded, Tag.extern))
def poisson(xp, self, generator=None):
    dt = D.FROM_NP[self.dtype]
    _need_float("poisson_cpu", dt)
    if bool(xp.any(self < 0)):
        raise RuntimeError("poisson expects all elements of rates to be non-negative")
    r = _rng(xp, generator).poisson(self.astype(np.float64))
    return xp.asarray(r).astype(self.dtype)


poisson.def_meta(lambda self, generator=None: TensorSpec(self.shape, self.dtype))


def _multinomial_check(shape, dt, n, replacement):
    if len(shape) not in (1, 2):
        raise RuntimeError("prob_dist must be 1 or 2 dim")
    if dt.category != D.FLOATING:
        raise RuntimeError(f"multinomial only supports floating-point dtypes for input, got: {_type_name(dt)}")
    if n <= 0:
        raise RuntimeError("cannot sample n_sample <= 0 samples")
    if not replacement and n > shape[-1]:
        raise RuntimeError("cannot sample n_sample > prob_dist.size(-1) samples without replacement")
    return tuple(shape[:-1]) + (n,)


@defop("multinomial(Tensor self, int num_samples, bool replacement=False, *, Generator? generator=None) -> Tensor",
       method=True, tags=(Tag.core, Tag.nondeterministic_seeded, Tag.extern))
def multinomial(xp, self, num_samples, replacement=False, *, generator=None):
    shape = _multinomial_check(self.shape, D.FROM_NP[self.dtype], num_samples, replacement)
    p = self.astype(np.float64).reshape(-1, self.shape[-1])
    if not bool(xp.all(xp.isfinite(p))) or bool(xp.any(p < 0)):
        raise RuntimeError("probability tensor contains either `inf`, `nan` or element < 0")
    total = p.sum(-1, keepdims=True)
    if bool(xp.any(total <= 0)):
        raise RuntimeError("invalid multinomial distribution (sum of probabilities <= 0)")
    g = _rng(xp, generator)
    rows, m = p.shape
    if replacement:
        cdf = xp.cumsum(p / total, axis=-1)
        off = xp.arange(rows, dtype=np.float64)[:, None]
        u = xp.asarray(g.random((rows, num_samples))) + off
        idx = xp.searchsorted((cdf + off).reshape(-1), u.reshape(-1), side="right").reshape(rows, num_samples)
        idx = xp.minimum(idx - (off * m).astype(np.int64), m - 1)
    else:                       # Gumbel top-k: keys log(p) - log(E) with E ~ Exp(1)
        e = -xp.log1p(-xp.asarray(g.random((rows, m))))
        keys = xp.where(p > 0, xp.log(p) - xp.log(e), -xp.inf)
        idx = xp.argsort(-keys, axis=-1, kind="stable")[:, :num_samples]
        if bool(xp.any(xp.take_along_axis(keys, idx, -1) == -xp.inf)):
            raise RuntimeError("invalid multinomial distribution (with replacement=False, not enough non-negative "
                               "category to sample)")
    return idx.astype(np.int64).reshape(shape)


multinomial.def_meta(lambda self, num_samples, replacement=False, *, generator=None:
                     TensorSpec(_multinomial_check(self.shape, self.dtype, num_samples, replacement), D.int64))
