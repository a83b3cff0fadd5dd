"""The operator registry: every operator is declared once here, with its schema, meta function,
eager kernel, derivative and optional decomposition.

    @defop("mul.Tensor(Tensor self, Tensor other) -> Tensor", method=True, inplace=True)
    def mul(xp, self, other): ...           # eager kernel over the array namespace xp
    @mul.def_meta
    def _(self, other): ...                 # output TensorSpec(s) from metadata alone
    @mul.def_derivative
    def _(grad, self, other): ...           # grads for each Tensor argument, in flambeau ops

An `Op` is callable; calling it goes through the dispatcher (`flambeau._dispatch`). `defop` also
exports the op as `flambeau.<name>` and, with `method=True`, as a Tensor method, and with
`inplace=True` derives the `<name>_` op and method (computed functionally, copied into `self`).
"""
from __future__ import annotations

import inspect

from . import _schema

OPS: dict = {}           # qualified name ('add.Tensor' or 'add') -> Op
EXPORTS: dict = {}       # flambeau.<name> -> callable
METHODS: dict = {}       # Tensor.<name> -> function
NN_FUNCTIONAL: dict = {} # flambeau.nn.functional.<name> -> callable
LINALG: dict = {}        # flambeau.linalg.<name> -> callable
SPECIAL: dict = {}       # flambeau.special.<name> -> callable
FFT: dict = {}           # flambeau.fft.<name> -> callable
_NAMESPACES = {"nn.functional": NN_FUNCTIONAL, "linalg": LINALG, "special": SPECIAL, "fft": FFT}
_fx_hook = None          # set by flambeau.fx while symbolic_trace runs: fn(target, args, kwargs) records
                         # the call when an argument is a Proxy, else returns NotImplemented


class TensorSpec:
    """What a meta function returns: the metadata of one output."""
    __slots__ = ("shape", "dtype", "strides", "offset")

    def __init__(self, shape, dtype, strides=None, offset=0):
        self.shape = tuple(shape)
        self.dtype = dtype
        self.strides = strides
        self.offset = offset

    def __repr__(self):
        return f"TensorSpec({self.shape}, {self.dtype})"


class Op:
    """One operator overload (PyTorch's OpOverload)."""

    def __init__(self, schema: str, kernel=None, *, meta=None, derivative=None, decomposition=None,
                 functional=None, nondeterministic=False, tags=(), out_device=None):
        self._schema = _schema.parse(schema)
        s = self._schema
        self.__name__ = s.name
        self.name = s.name if not s.overload else f"{s.name}.{s.overload}"
        self.kernel = kernel
        self.meta = meta
        self.decomposition = decomposition
        self.functional = functional          # for in-place ops: the out-of-place op
        self.is_view = s.is_view
        self.is_inplace = s.is_inplace
        self.nondeterministic = nondeterministic
        self.tags = tuple(tags)
        self.out_device = out_device          # fn(*args, **kwargs) -> device, for cross-device ops
        self.bind = _schema.make_binder(s, s.name)
        self.return_type = _schema.return_type(s)
        self.tensor_args = [i for i, a in enumerate(s.args) if a.type.startswith("Tensor")]
        self.derivative = None
        self.saved_names = ()
        if derivative is not None:
            self.def_derivative(derivative)

    # -- declaration helpers (decorators) --
    def def_meta(self, fn):
        self.meta = fn
        return fn

    def def_derivative(self, fn):
        """`fn(grad, <schema argument names it needs>, result=...)` -> grads per Tensor argument."""
        params = list(inspect.signature(fn).parameters)
        self.saved_names = tuple(params[1:])
        self.derivative = fn
        return fn

    def def_decomposition(self, fn):
        self.decomposition = fn
        return fn

    def __call__(self, *args, **kwargs):
        if _fx_hook is not None:
            r = _fx_hook(self, args, kwargs)
            if r is not NotImplemented:
                return r
        return _dispatch.dispatch(self, args, kwargs)

    def __repr__(self):
        return f"aten.{self.name}"

    @property
    def _overloadname(self):
        return self._schema.overload or "default"

    @property
    def default(self):
        return self


def defop(schema: str, *, method: bool | str = False, function: bool | str = True,
          inplace: bool = False, namespace: str | None = None, **kw):
    """Declare an operator whose kernel is the decorated function.

    function: export as flambeau.<name> (or the given name); method: as Tensor.<name>;
    namespace: also export into 'nn.functional', 'linalg', 'special' or 'fft'.
    """
    def wrap(kernel):
        op = Op(schema, kernel, **kw)
        register(op, method=method, function=function)
        if namespace:
            _NAMESPACES[namespace][op._schema.name if not isinstance(function, str) else function] = op
        if inplace:
            make_inplace(op, method=method)
        return op
    return wrap


def register(op: Op, *, method=False, function=True) -> Op:
    if op.name in OPS:
        raise RuntimeError(f"operator {op.name} registered twice")
    OPS[op.name] = op
    if function:
        EXPORTS[function if isinstance(function, str) else op._schema.name] = op
    if method:
        METHODS[method if isinstance(method, str) else op._schema.name] = op
    return op


def make_inplace(op: Op, *, method=True) -> Op:
    """Derive `<name>_` from a functional op: same arguments, `self` mutated and returned."""
    s = op._schema
    args = []
    seen_kw = False
    for i, a in enumerate(s.args):
        if a.kwarg_only and not seen_kw:
            args.append("*")
            seen_kw = True
        t = "Tensor(a!)" if i == 0 else a.type
        d = "" if a.default is _schema._NODEFAULT else "=" + _default_text(a.default)
        args.append(f"{t} {a.name}{d}")
    name = s.name + "_" + ("." + s.overload if s.overload else "")
    iop = Op(f"{name}({', '.join(args)}) -> Tensor(a!)", functional=op)
    iop.meta = op.meta
    register(iop, method=(s.name + "_") if method else False, function=False)
    op.inplace = iop
    return iop


def _default_text(v) -> str:
    if isinstance(v, str):
        return repr(v)
    if isinstance(v, tuple):
        return "[" + ", ".join(map(str, v)) + "]"
    return str(v)


def export(name: str | None = None, *, method: bool | str = False, function: bool = True,
           namespace: str | None = None):
    """Export a plain Python function (a composite over ops) as flambeau.<name> and/or a method,
    and/or into a namespace ('nn.functional', 'linalg', 'special', 'fft')."""
    def wrap(fn):
        n = name or fn.__name__
        public = _traceable(fn, n, "flambeau" if function else "flambeau." + namespace) \
            if function or namespace else fn
        if namespace:
            _NAMESPACES[namespace][n] = public
        if function:
            EXPORTS[n] = public
        if method:
            METHODS[method if isinstance(method, str) else n] = fn
        return fn
    return wrap


def _traceable(fn, name: str, module: str):
    """The public face of a Python composite: records itself when symbolic_trace passes a Proxy."""
    def public(*args, **kwargs):
        if _fx_hook is not None:
            r = _fx_hook(public, args, kwargs)
            if r is not NotImplemented:
                return r
        return fn(*args, **kwargs)
    public.__name__ = public.__qualname__ = name
    public.__module__ = module
    public.__doc__ = fn.__doc__
    public.__wrapped__ = fn
    return public


from .. import _dispatch  # noqa: E402  (circular: the dispatcher needs Op, Op needs dispatch)
