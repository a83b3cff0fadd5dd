"""Random programs for the compile fuzzer: one `Program` per seed, the same on every run.

A program is Python source over a module named `torch` (flambeau or PyTorch): an input builder
(literal data, then a layout: transposed, strided, offset, expanded) and a function `f` of 3-8
statements. Each statement is drawn from a family (pointwise ops of the op database, reductions,
views, in-place ops, matmul, softmax, indexing, casts, joins) and kept only if PyTorch runs it on
the program's data; the program is kept only if PyTorch also runs its forward and backward.
"""
from __future__ import annotations

import dataclasses
import math

import numpy as np

from tests.opdb import T, all_opinfos

MAX_STEPS = 8
MIN_STEPS = 3
MAX_NUMEL = 512                 # values bigger than this are rejected (keeps kernels and repros small)
MAX_NDIM = 5
TRIES_PER_STEP = 25
TRIES_PER_PROGRAM = 20
SPECIALS = (0.0, -0.0, math.inf, -math.inf, math.nan, 1.0, -1.0, 0.5, -0.5)
FLOAT_DTYPES = ("float32", "float64")
INT_DTYPES = ("int64", "int32")
EXCLUDED_OPS = {"conj_physical", "sgn", "angle", "real", "imag", "alias", "clone", "contiguous", "zero_",
                "positive", "isnan_special", "fix", "arcsin", "arctanh", "negative", "sigmoid_F", "tanh_F",
                "i0", "special.i1", "digamma", "lgamma", "erfinv", "rrelu", "nextafter", "eq_complex", "allclose",
                "equal", "ldexp", "pow_int_negative", "maximum_ties", "fmin_nan", "rsub", "compare_ops", "bit_ops",
                "floordiv_op", "mod_op", "mse_loss", "l1_loss", "smooth_l1_loss", "huber_loss", "kl_div",
                "poisson_nll_loss", "hinge_embedding_loss", "binary_cross_entropy", "dot", "vdot", "matmul",
                "masked_select", "getitem_mask", "gcd", "lcm", "cosine_similarity", "pairwise_distance",
                "binary_cross_entropy_with_logits", "multilabel_soft_margin_loss", "multilabel_margin_loss",
                "linalg.cross", "isclose"}
POINTWISE_FAMILIES = ("tests.opdb.pointwise", "tests.opdb.norm_loss_act")


@dataclasses.dataclass
class Input:
    """One argument of `f`: literal data (float64 values, or ints/bools) and the view taken of it."""
    name: str
    dtype: str
    base_shape: tuple
    data: list
    view: str                   # '' or a suffix like '.transpose(-1, -2)', '[::2]', '.expand(3, 4)'
    requires_grad: bool


@dataclasses.dataclass
class Program:
    seed: int
    inputs: list
    body: list                  # statements of f
    outputs: list               # names f returns
    grad: bool                  # float inputs require grad; the test also compares gradients

    def input_source(self, float64: bool = False) -> str:
        """`def make_inputs()` returning (leaves, inputs); float64=True builds float32 data as float64."""
        lines = ["def make_inputs():"]
        for x in self.inputs:
            dt = "float64" if float64 and x.dtype == "float32" else x.dtype
            rg = ".requires_grad_()" if x.requires_grad else ""
            lines.append(f"    {x.name}_base = torch.tensor({x.data!r}, dtype=torch.{dt}).reshape"
                         f"({', '.join(map(str, x.base_shape)) or '()'}){rg}")
        leaves = [f"{x.name}_base" for x in self.inputs if x.requires_grad]
        views = [f"{x.name}_base{x.view}" for x in self.inputs]
        lines.append(f"    return [{', '.join(leaves)}], [{', '.join(views)}]")
        return "\n".join(lines) + "\n"

    def function_source(self) -> str:
        args = ", ".join(x.name for x in self.inputs)
        body = "".join(f"    {s}\n" for s in self.body)
        outs = "".join(f"{o}, " for o in self.outputs)
        return f"def f({args}):\n{body}    return ({outs.rstrip()})\n"

    def repro(self, dynamic: bool = False, note: str = "") -> str:
        """A standalone script: eager vs compiled in flambeau (or PyTorch, with `import torch`)."""
        head = f"# flambeau compile fuzzer, seed {self.seed}: python -m tests.fuzz --seeds {self.seed} --show\n"
        if note:
            head += "".join(f"# {line}\n" for line in note.splitlines())
        return (head + "import math\nimport flambeau as torch   # `import torch` runs the same program on PyTorch\n"
                "inf, nan = math.inf, math.nan\n\n\n" + self.input_source() + "\n\n" + self.function_source() +
                "\n\n" + LOSS_SOURCE + "\n\n"
                "leaves, inputs = make_inputs()\n"
                "eager = f(*inputs)\n"
                f"cleaves, cinputs = make_inputs()\n"
                f"compiled = torch.compile(f, dynamic={dynamic})(*cinputs)\n"
                "for e, c in zip(eager, compiled):\n"
                "    print('eager:', e)\n    print('compiled:', c)\n"
                + ("print('grads eager:', torch.autograd.grad(loss_of(eager), leaves, allow_unused=True))\n"
                   "print('grads compiled:', torch.autograd.grad(loss_of(compiled), cleaves, allow_unused=True))\n"
                   if self.grad else ""))


LOSS_SOURCE = '''def loss_of(outs):
    """A scalar function of the float outputs: sum(out * cotangent), cotangent nowhere zero."""
    total = 0
    for o in outs:
        if o.requires_grad:
            cot = ((torch.arange(o.numel()) % 7).to(o.dtype) - 3.5).reshape(o.shape) / 4
            total = total + (o * cot).sum()
    return total
'''


# ---- the op pools ----------------------------------------------------------------------------------
def _pointwise_pools():
    """Unary and binary ops of the op database's pointwise/activation entries with a plain call."""
    unary, binary = [], []
    for info in all_opinfos():
        if info.random or info.call is not None or info.name in EXCLUDED_OPS or "inplace" in info.name \
                or info.name.endswith("_") or not info.samples.__module__.startswith(POINTWISE_FAMILIES):
            continue
        try:
            first = info.samples("float32")[0]
        except Exception:
            continue
        if first.kwargs or not all(isinstance(a, T) for a in first.args):
            continue
        fn = info.fn or info.name
        if len(first.args) == 1:
            unary.append((fn, info.method, tuple(info.dtypes)))
        elif len(first.args) == 2 and first.args[0].shape == first.args[1].shape:
            binary.append((fn, tuple(info.dtypes)))
    return sorted(unary), sorted(binary)


_POOLS: list = []


def pools():
    if not _POOLS:
        _POOLS.extend(_pointwise_pools())
    return _POOLS


# ---- statements ------------------------------------------------------------------------------------
@dataclasses.dataclass
class Value:
    name: str
    shape: tuple
    dtype: str
    aliases_input: bool         # a view of an input (in-place ops on it would mutate the caller's data)


def _dim(rng, v, extra=0):
    n = len(v.shape) + extra
    return int(rng.integers(-n, n)) if n else None


def _pick(rng, seq):
    return seq[int(rng.integers(len(seq)))]


def _unary_pointwise(rng, v, pool):
    fn, method, dtypes = _pick(rng, pools()[0])
    if v.dtype not in dtypes:
        return None
    return f"{v.name}.{method}()" if method and rng.random() < 0.5 else f"torch.{fn}({v.name})"


def _binary_pointwise(rng, v, pool):
    fn, dtypes = _pick(rng, pools()[1])
    r = rng.random()
    if r < 0.25:
        other = _pick(rng, ["2", "-1.5", "0.0", "-0.0", "3", "True"])
    else:
        other = _pick(rng, pool).name
    a, b = (v.name, other) if rng.random() < 0.8 else (other, v.name)
    if not (a[0].isalpha() or b[0].isalpha()) or (not a[0].isalpha() and not _scalar_first_ok(fn)):
        return None
    return f"torch.{fn}({a}, {b})"


def _scalar_first_ok(fn):
    return fn in ("add", "mul", "sub", "div", "pow", "maximum", "minimum")


def _arith(rng, v, pool):
    other = _pick(rng, pool).name if rng.random() < 0.5 else _pick(rng, ["2", "0.5", "-1", "-0.0", "3"])
    op = _pick(rng, ["+", "-", "*", "/", "//", "%", "**", "<", ">=", "==", "&", "|"])
    return f"{v.name} {op} {other}" if rng.random() < 0.7 else f"{other} {op} {v.name}"


def _reduction(rng, v, pool):
    op = _pick(rng, ["sum", "mean", "amax", "amin", "prod", "std", "var", "logsumexp", "argmax", "argmin",
                     "all", "any", "norm", "nansum", "cumsum", "cumprod", "max", "min"])
    d = _dim(rng, v)
    if op in ("cumsum", "cumprod"):
        return f"{v.name}.{op}({d if d is not None else 0})"
    if op in ("max", "min") and d is not None:
        return f"{v.name}.{op}({d}, keepdim={bool(rng.random() < 0.3)})[{int(rng.integers(2))}]"
    if d is None or (rng.random() < 0.2 and op not in ("logsumexp",)):
        return f"{v.name}.{op}()"
    keep = bool(rng.random() < 0.3)
    if op == "norm":
        return f"{v.name}.norm(dim={d}, keepdim={keep})"
    if op in ("std", "var") and rng.random() < 0.5:
        return f"{v.name}.{op}({d}, correction={int(rng.integers(2))}, keepdim={keep})"
    return f"{v.name}.{op}({d}, keepdim={keep})"


def _softmax(rng, v, pool):
    d = _dim(rng, v)
    if d is None:
        d = 0
    op = _pick(rng, ["torch.softmax", "torch.log_softmax", "torch.nn.functional.softmax",
                     "torch.nn.functional.log_softmax"])
    return f"{op}({v.name}, dim={d})"


def _view(rng, v, pool):
    n = len(v.shape)
    r = int(rng.integers(16))
    if r == 0 and n >= 2:
        a, b = rng.choice(n, 2, replace=False)
        return f"{v.name}.transpose({a}, {b})"
    if r == 1 and n >= 1:
        return f"{v.name}.permute({', '.join(map(str, rng.permutation(n)))})"
    if r == 2 and n >= 1:
        d = int(rng.integers(n))
        step = int(rng.integers(1, 4))
        start = int(rng.integers(0, 2))
        return f"{v.name}[{':, ' * d}{start}::{step}]"
    if r == 3:
        return f"{v.name}.unsqueeze({_dim(rng, v, 1)})"
    if r == 4 and 1 in v.shape:
        return f"{v.name}.squeeze({v.shape.index(1)})"
    if r == 5:
        shape = [_pick(rng, [2, 3]) if s == 1 else s for s in v.shape]
        lead = [int(rng.integers(1, 4))] if rng.random() < 0.4 else []
        return f"{v.name}.expand({', '.join(map(str, lead + shape))})" if lead + shape else None
    if r == 6:
        return f"{v.name}.reshape(-1)" if rng.random() < 0.5 else f"{v.name}.flatten()"
    if r == 7 and n >= 1 and v.shape[0] > 0:
        d = int(rng.integers(n))
        return f"{v.name}.select({d}, {int(rng.integers(-v.shape[d], v.shape[d]))})" if v.shape[d] else None
    if r == 8 and n >= 2:
        return f"{v.name}.diagonal({int(rng.integers(-1, 2))})"
    if r == 9 and n >= 2:
        return f"{v.name}.mT" if rng.random() < 0.5 else f"{v.name}.movedim(0, -1)"
    if r == 10 and n >= 1:
        d = int(rng.integers(n))
        size = v.shape[d]
        start = int(rng.integers(0, size + 1))
        return f"{v.name}.narrow({d}, {start}, {int(rng.integers(0, size - start + 1))})"
    if r == 11 and n >= 1:
        return f"{v.name}[..., {_pick(rng, ['None', '::2', '1:', ':-1', '0'])}]"
    if r == 12 and n >= 1:
        return f"{v.name}.view({', '.join(map(str, v.shape[::-1]))})" if rng.random() < 0.3 else \
            f"{v.name}.view(-1)"
    if r == 13 and n >= 1 and v.shape[-1] % 2 == 0:
        return f"{v.name}.unflatten(-1, (2, {v.shape[-1] // 2}))"
    if r == 14 and n >= 1:
        return f"{v.name}.split({max(1, v.shape[0] // 2)})[{0}]" if v.shape[0] else None
    if r == 15:
        return f"{v.name}[None, ...]" if n < MAX_NDIM else None
    return None


def _copying_shape(rng, v, pool):
    n = len(v.shape)
    r = int(rng.integers(7))
    if r == 0 and n >= 1:
        return f"{v.name}.flip({_dim(rng, v)})"
    if r == 1 and n >= 1:
        return f"{v.name}.roll({int(rng.integers(-3, 4))}, {_dim(rng, v)})"
    if r == 2:
        other = _pick(rng, pool)
        return f"torch.cat([{v.name}, {other.name}], {_dim(rng, v) if n else 0})"
    if r == 3:
        return f"torch.stack([{v.name}, {_pick(rng, pool).name}], {_dim(rng, v, 1)})"
    if r == 4 and n >= 1:
        return f"torch.nn.functional.pad({v.name}, ({int(rng.integers(0, 2))}, {int(rng.integers(0, 3))}))"
    if r == 5 and n >= 2:
        return f"{v.name}.{_pick(rng, ['tril', 'triu'])}({int(rng.integers(-1, 2))})"
    if r == 6:
        return f"{v.name}.repeat({', '.join(str(int(rng.integers(1, 3))) for _ in range(max(n, 1)))})"
    return None


def _matmul(rng, v, pool):
    n = len(v.shape)
    other = _pick(rng, pool)
    r = int(rng.integers(5))
    if r == 0 and n >= 2:
        return f"{v.name} @ {v.name}.mT"
    if r == 1 and n >= 2:
        return f"{v.name}.mT @ {v.name}"
    if r == 2 and n == 1:
        return f"{v.name} @ {v.name}"
    if r == 3:
        return f"torch.matmul({v.name}, {other.name})"
    if r == 4 and n >= 1:
        return f"{v.name} @ {other.name}.mT" if len(other.shape) >= 2 else f"{v.name} @ {other.name}"
    return None


def _indexing(rng, v, pool):
    n = len(v.shape)
    r = int(rng.integers(6))
    if n == 0:
        return None
    d = int(rng.integers(n))
    size = v.shape[d]
    if r == 0 and size:
        idx = rng.integers(-size, size, size=int(rng.integers(1, 5))).tolist()
        return f"{v.name}[{':, ' * d}torch.tensor({idx})]"
    if r == 1 and size:
        idx = rng.integers(0, size, size=int(rng.integers(1, 5))).tolist()
        return f"{v.name}.index_select({d}, torch.tensor({idx}))"
    if r == 2 and size and math.prod(v.shape) <= 64:
        idx = rng.integers(0, size, size=v.shape).tolist()
        return f"torch.gather({v.name}, {d}, torch.tensor({idx}))"
    if r == 3:
        return f"{v.name}.masked_fill({v.name} > 0, {_pick(rng, ['0.0', '-0.0', '1', 'nan', '-3'])})"
    if r == 4:
        other = _pick(rng, pool)
        return f"torch.where({v.name} < {other.name}, {v.name}, {other.name})"
    if r == 5:
        lo, hi = sorted(rng.choice([-1.0, -0.0, 0.0, 0.5, 2.0], 2, replace=False).tolist())
        return f"{v.name}.clamp({lo!r}, {hi!r})" if rng.random() < 0.5 else f"torch.clamp({v.name}, min={lo!r})"
    return None


def _cast(rng, v, pool):
    return f"{v.name}.{_pick(rng, ['float', 'double', 'long', 'int', 'bool'])}()"


def _inplace(rng, v, pool):
    """A statement mutating `v` (or a view of it), not an expression."""
    r = int(rng.integers(8))
    n = len(v.shape)
    other = _pick(rng, pool).name
    if r == 0:
        return f"{v.name}.{_pick(rng, ['add_', 'mul_', 'sub_', 'div_'])}({other})"
    if r == 1:
        return f"{v.name}.{_pick(rng, ['neg_', 'exp_', 'relu_', 'abs_', 'sin_', 'trunc_', 'sqrt_'])}()"
    if r == 2 and n >= 1:
        return f"{v.name}[{int(rng.integers(-v.shape[0], v.shape[0]))}] = {other}" if v.shape[0] else None
    if r == 3 and n >= 2:
        return f"{v.name}[:, ::2].mul_({_pick(rng, ['-1', '0.5', other])})"
    if r == 4 and n >= 2:
        return f"{v.name}.t().{_pick(rng, ['add_', 'mul_'])}({other})" if n == 2 else \
            f"{v.name}.transpose(0, 1)[0].add_(1)"
    if r == 5 and n >= 1:
        return f"{v.name}[..., 1:].copy_({other})"
    if r == 6:
        return f"{v.name}.clamp_(min={_pick(rng, ['-1.0', '0.0', '-0.0'])})"
    if r == 7 and n >= 1:
        method, plain = _pick(rng, ["zero_", "fill_"]), rng.random() < 0.5
        return f"{v.name}.zero_()" if method == "zero_" else f"{v.name}.fill_({'2' if plain else '-0.0'})"
    return None


EXPRESSIONS = [(_unary_pointwise, 20), (_binary_pointwise, 14), (_arith, 8), (_reduction, 12), (_softmax, 4),
               (_view, 16), (_copying_shape, 6), (_matmul, 6), (_indexing, 8), (_cast, 3)]
INPLACE_WEIGHT = 8


# ---- inputs ----------------------------------------------------------------------------------------
def _shape(rng):
    ndim = _pick(rng, [0, 1, 1, 2, 2, 2, 3, 3, 4])
    return tuple(int(_pick(rng, [1, 2, 3, 4, 5, 3, 4] + ([0] if rng.random() < 0.05 else []))) for _ in range(ndim))


def _related_shape(rng, shape):
    """A shape broadcastable with `shape`, the same, or unrelated."""
    r = rng.random()
    if r < 0.4:
        return shape
    if r < 0.8:
        drop = int(rng.integers(0, len(shape) + 1))
        return tuple(1 if rng.random() < 0.3 else s for s in shape[drop:])
    return _shape(rng)


def _data(rng, dtype, shape, specials):
    n = math.prod(shape)
    if dtype == "bool":
        return (rng.random(n) < 0.5).tolist()
    if dtype in INT_DTYPES:
        return rng.integers(-5, 7, size=n).tolist()
    vals = np.round(rng.uniform(-3, 3, size=n), 4)
    if specials:
        mask = rng.random(n) < 0.2
        vals = np.where(mask, rng.choice(np.array(SPECIALS), size=n), vals)
    return [float(x) for x in vals]


def _make_input(rng, name, dtype, shape, grad):
    """Data for `shape` stored in a base of another shape, with the view that recovers `shape`."""
    layout = _pick(rng, ["contiguous", "contiguous", "transposed", "strided", "offset", "expanded"])
    base, view = shape, ""
    if layout == "transposed" and len(shape) >= 2:
        base, view = shape[:-2] + (shape[-1], shape[-2]), ".transpose(-1, -2)"
    elif layout == "strided" and len(shape) >= 1:
        base, view = (shape[0] * 2,) + shape[1:], "[::2]"
    elif layout == "offset" and len(shape) >= 1:
        base, view = (shape[0] + 1,) + shape[1:], "[1:]"
    elif layout == "expanded" and len(shape) >= 1 and any(s > 1 for s in shape):
        base = tuple(1 if (s > 1 and rng.random() < 0.5) else s for s in shape)
        view = f".expand({', '.join(map(str, shape))})" if base != shape else ""
    data = _data(rng, dtype, base, rng.random() < 0.4)
    return Input(name, dtype, base, data, view, grad and dtype in FLOAT_DTYPES)


def _inputs(rng):
    kind = rng.random()
    first = _shape(rng)
    shapes = [first] + [_related_shape(rng, first) for _ in range(int(rng.integers(0, 3)))]
    if kind < 0.7:
        main = "float32" if rng.random() < 0.8 else "float64"
        dtypes = [main if rng.random() < 0.8 or i == 0 else _pick(rng, ["int64", "bool", "float64", "float32"])
                  for i in range(len(shapes))]
    elif kind < 0.9:
        dtypes = [_pick(rng, ["int64", "int64", "int32", "bool"]) for _ in shapes]
    else:
        dtypes = [_pick(rng, ["bool", "float32", "int64"]) for _ in shapes]
    grad = any(d in FLOAT_DTYPES for d in dtypes) and rng.random() < 0.75
    return [_make_input(rng, f"x{i}", d, s, grad) for i, (d, s) in enumerate(zip(dtypes, shapes))], grad


# ---- programs --------------------------------------------------------------------------------------
def generate(seed: int, run_step) -> Program:
    """The program for `seed`. `run_step(program, upto)` runs the program's first statements in PyTorch and
    returns {name: (shape, dtype)} or raises; `run_step(program, None)` runs forward and backward."""
    for attempt in range(TRIES_PER_PROGRAM):
        rng = np.random.default_rng([seed, attempt])
        inputs, grad = _inputs(rng)
        prog = Program(seed, inputs, [], [], grad)
        values = [Value(x.name, _shape_of(x), x.dtype, True) for x in inputs]
        for _ in range(int(rng.integers(MIN_STEPS, MAX_STEPS + 1))):
            _add_statement(rng, prog, values, run_step)
        if len(values) == len(inputs):
            continue
        outs = [values[-1].name] + [v.name for v in values[len(inputs):-1] if rng.random() < 0.25]
        prog.outputs = outs
        try:
            run_step(prog, None)
        except Exception:
            continue
        return prog
    raise RuntimeError(f"no valid program for seed {seed}")


def _shape_of(x: Input) -> tuple:
    if x.view == ".transpose(-1, -2)":
        return x.base_shape[:-2] + (x.base_shape[-1], x.base_shape[-2])
    if x.view == "[::2]":
        return ((x.base_shape[0] + 1) // 2,) + x.base_shape[1:]
    if x.view == "[1:]":
        return (x.base_shape[0] - 1,) + x.base_shape[1:]
    if x.view.startswith(".expand("):
        return tuple(int(s) for s in x.view[len(".expand("):-1].split(", "))
    return x.base_shape


def _add_statement(rng, prog, values, run_step):
    fns, weights = zip(*EXPRESSIONS)
    p = np.array(weights + (INPLACE_WEIGHT,), dtype=float)
    for _ in range(TRIES_PER_STEP):
        family = int(rng.choice(len(p), p=p / p.sum()))
        recent = values[-3:] if rng.random() < 0.7 else values
        v = _pick(rng, recent)
        if family == len(fns):
            if v.aliases_input and prog.grad:
                continue
            stmt, name = _inplace(rng, v, values), None
        else:
            expr = fns[family](rng, v, values)
            name = f"v{len(values) - len(prog.inputs)}"
            stmt = f"{name} = {expr}" if expr else None
        if stmt is None:
            continue
        prog.body.append(stmt)
        try:
            info = run_step(prog, len(prog.body))
        except Exception:
            prog.body.pop()
            continue
        if name is not None:
            shape, dtype, is_view_of_input = info[name]
            if math.prod(shape) > MAX_NUMEL or len(shape) > MAX_NDIM or dtype.startswith("complex"):
                prog.body.pop()
                continue
            values.append(Value(name, shape, dtype, is_view_of_input))
        return
