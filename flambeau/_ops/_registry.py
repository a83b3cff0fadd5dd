"""The operator registry: every operator is declared once, and every fact about it lives on its `Op`.

An `Op` carries, declared next to its kernel in `flambeau/_ops/*.py` or attached to it by the layer
that owns the rule (always keyed by the `Op` object, never by a name string):

    schema            the `defop` string: binding, in-place variant, method and function exports
    kernel, meta      eager kernel over the array namespace `xp`; output metadata (`def_meta`)
    derivative        grads in flambeau ops (`def_derivative`)
    tags              a frozenset of `Tag`: membership of the core set (`core`), `extern` (the compiler
                      calls the eager kernel as a library call), `pointwise`, `recomputable` (the
                      partitioner may recompute it in the backward), `nondeterministic_seeded`, the
                      autocast policy (`autocast_*` for cuda and every other device, `cpu_autocast_*`
                      for cpu), and `view`/`inplace`, which the schema decides
    no_decomposition  for a non-core op with no decomposition: the reason it stays opaque
    eager_fallback    why the code generator may run this op's eager kernel inside compiled code
                      (no lowering, or none for some inputs); such a run is recorded as a fallback,
                      and compile tests accept it for this op only. `Tag.extern` ops are library
                      calls by design and never need it
    decomposition     set by `flambeau._decomp`'s `@register_decomposition(aten.x)`
    lowering          set by `flambeau._inductor.lowering`'s `@register_lowering(aten.x)`
    pointwise         `PointwiseSpelling` (`_spelling.py`) of a pointwise op: its formula per code
                      generator (C++, NumPy, Triton); the lowering and the printers read it, and the
                      loop IR's arithmetic (`ops.add`, `ops.where`, casts) is these spellings
    batching_rule     for vmap (`def_batching_rule`, factories in `_batching.py`); ops tagged `pointwise`
                      share one without declaring it; None: vmap decomposes the op or loops
    sharding_rule     for DTensor (`def_sharding_rule`); None until written

Adding one rule to one op is one decorator next to the op (or in the layer that owns the rule);
nothing else lists op names.

    @defop("mul.Tensor(Tensor self, Tensor other) -> Tensor", method=True, inplace=True,
           tags=(Tag.core, Tag.pointwise, Tag.recomputable))
    def mul(xp, self, other): ...           # eager kernel over the array namespace xp
    @mul.def_meta
    def _mul_meta(self, other): ...         # output TensorSpec(s) from metadata alone
    @mul.def_derivative
    def _mul_derivative(grad, self, other): ...   # grads for each Tensor argument, in flambeau ops

    # in flambeau/_decomp, flambeau/_inductor (higher layers), keyed by the op object:
    @register_decomposition(aten.gelu)
    def gelu(x, approximate="none"): ...
    @register_lowering(aten.mul)
    def _mul_lowering(g, a, b): ...

An `Op` is callable; calling it goes through the dispatcher (`flambeau._dispatch`). `defop` also
exports the op as `flambeau.<name>` and, with `method=True`, as a Tensor method, and with
`inplace=True` derives the `<name>_` op and method (computed functionally, copied into `self`).
"""
from __future__ import annotations

import inspect

from . import _schema
from .._tags import Tag
from ._spelling import PointwiseSpelling  # noqa: F401  (declared with ops: `defop(..., pointwise=...)`)

OPS: dict = {}           # qualified name ('add.Tensor' or 'add') -> Op
_OVERLOADS: dict = {}    # base name ('add') -> ([its Ops], {overload name ('Tensor'): Op})
EXPORTS: dict = {}       # flambeau.<name> -> callable
METHODS: dict = {}       # Tensor.<name> -> function
NN_FUNCTIONAL: dict = {} # flambeau.nn.functional.<name> -> callable
LINALG: dict = {}        # flambeau.linalg.<name> -> callable
SPECIAL: dict = {}       # flambeau.special.<name> -> callable
FFT: dict = {}           # flambeau.fft.<name> -> callable
_NAMESPACES = {"nn.functional": NN_FUNCTIONAL, "linalg": LINALG, "special": SPECIAL, "fft": FFT}
OP_LIBRARIES: set = set()  # libraries other than aten with operators in OPS ("quantized_decomposed")
_fx_hook = None          # installed by flambeau.fx (set_fx_hook) while symbolic_trace runs


def set_fx_hook(hook):
    """Install `hook(target, args, kwargs)`, asked before every registry call: it records the call
    and returns the result when an argument is an FX Proxy, else returns NotImplemented. FX installs
    it for the duration of `symbolic_trace` (None removes it). Returns the hook it replaces."""
    global _fx_hook
    previous, _fx_hook = _fx_hook, hook
    return previous


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


_SCHEMA_TAGS = frozenset({Tag.view, Tag.inplace})
# every autocast policy tag (`flambeau.amp.autocast_mode` reads which one applies on which device)
_AUTOCAST_POLICY_TAGS = frozenset(t for t in Tag if t.name.startswith(("autocast_", "cpu_autocast_")))


def _tags(op_name: str, tags, schema) -> frozenset:
    out = set()
    for t in tags:
        if not isinstance(t, Tag):
            raise TypeError(f"{op_name}: tags must be flambeau.Tag members, got {t!r}")
        if t in _SCHEMA_TAGS:
            raise ValueError(f"{op_name}: Tag.{t.name} comes from the schema's alias annotation, not by hand")
        out.add(t)
    if schema.is_view:
        out.add(Tag.view)
    if schema.is_inplace:
        out.add(Tag.inplace)
    return frozenset(out)


class Op:
    """One operator overload (PyTorch's OpOverload)."""
    namespace = "aten"           # `flambeau.ops.<namespace>`; custom operators (flambeau.library) set theirs
    mutated_args: tuple = ()     # positions of arguments a non-in-place op writes (custom operators)

    def __init__(self, schema: str, kernel=None, *, meta=None, derivative=None, decomposition=None,
                 functional=None, tags=(), out_device=None, pointwise: PointwiseSpelling | None = None,
                 no_decomposition: str | None = None, eager_fallback: str | None = None,
                 op_namespace: str | None = None):
        self._schema = _schema.parse(schema)
        s = self._schema
        self.__name__ = s.name
        self.name = s.name if not s.overload else f"{s.name}.{s.overload}"
        if op_namespace is not None:
            # an operator of another library declared with the aten ones (`quantized_decomposed`):
            # registered as "<library>::<name>", reached as `flambeau.ops.<library>.<name>`
            self.namespace = op_namespace
            self.name = f"{op_namespace}::{self.name}"
        self.kernel = kernel
        self.meta = meta
        self.decomposition = decomposition
        self.functional = functional          # for in-place ops: the out-of-place op
        self._tags = _tags(self.name, tags, s)
        # read on every dispatch: plain attributes, derived once from the (immutable) tags
        self.is_view = Tag.view in self._tags
        self.is_inplace = Tag.inplace in self._tags
        self.nondeterministic = Tag.nondeterministic_seeded in self._tags
        self.optional_output_grads = Tag.optional_output_grads in self._tags
        # autocast casts this op's inputs on some device: without such a tag, an autocast region
        # leaves its calls alone, and the hot callers skip the autocast layer (`_dispatch.dispatch`)
        self.autocast_tagged = not self._tags.isdisjoint(_AUTOCAST_POLICY_TAGS)
        # NumPy's FP errors are silenced around the kernel unless it computes nothing that can raise one
        self.quiet_fp_errors = not (self.is_view or Tag.no_fp_errors in self._tags)
        self.pointwise = pointwise
        self.no_decomposition = no_decomposition
        self.eager_fallback = eager_fallback
        self.lowering = None
        self.batching_rule = None
        self.sharding_rule = None
        self.out_device = out_device          # fn(*args, **kwargs) -> device, for cross-device ops
        self.bind = _schema.make_binder(s, s.name)
        self.return_type = _schema.return_type(s)
        self.tensor_args = [i for i, a in enumerate(s.args) if a.type.startswith("Tensor")]
        self.derivative = None
        self.saved_names = ()
        self.result_needed_for = ()
        if derivative is not None:
            self.def_derivative(derivative)

    @property
    def tags(self) -> frozenset:
        """The op's `Tag`s, fixed at declaration (`is_view`, `is_inplace` and `nondeterministic`
        are read from them)."""
        return self._tags

    # -- declaration helpers (decorators) --
    def def_meta(self, fn):
        self.meta = fn
        return fn

    def def_derivative(self, fn, *, result_needed_for: tuple[str, ...] = ()):
        """`fn(grad, <schema argument names it needs>, result=...)` -> grads per Tensor argument.

        A parameter named `output_mask` receives, per Tensor argument, whether its gradient is needed
        (`flambeau.autograd.graph.OUTPUT_MASK`): the derivative may return None for the others.
        result_needed_for: the arguments whose gradient alone reads `result`; when none of them is a
        Tensor (PyTorch's overload taking a number there, e.g. pow.Tensor_Scalar) the output is not
        saved and arrives as None, so it may be modified in place before backward."""
        params = list(inspect.signature(fn).parameters)
        self.saved_names = tuple(params[1:])
        self.result_needed_for = result_needed_for
        self.derivative = fn
        return fn

    def def_decomposition(self, fn):
        self.decomposition = fn
        return fn

    def def_lowering(self, fn):
        """The compiler back end's rule (`flambeau._inductor.lowering.register_lowering`)."""
        if self.lowering is not None:
            raise RuntimeError(f"{self.name} already has a lowering ({self.lowering.__name__})")
        self.lowering = fn
        return fn

    def def_batching_rule(self, fn):
        """vmap's rule: `fn(in_dims, <schema args in order, batched tensors as their physical values>)`
        -> (outputs, out_dims), or NotImplemented to decline (`flambeau._ops._batching`)."""
        self.batching_rule = fn
        return fn

    def def_sharding_rule(self, fn):
        """DTensor's rule: `fn(<schema args with placements>)` -> output placements (and any redistribution)."""
        self.sharding_rule = fn
        return fn

    def __call__(self, *args, **kwargs):
        if _fx_hook is not None:
            r = _fx_hook(self, args, kwargs)
            if r is not NotImplemented:
                return r
        elif not (kwargs or self.is_inplace
                  or (_state.interposed and (_state.tls.modes or (_state.tls.autocast and self.autocast_tagged)))):
            return _dispatch.call_functional(self, args, kwargs)
        return _dispatch.dispatch(self, args, kwargs)

    def __repr__(self):
        if self.namespace != "aten" and "::" in self.name:
            return self.name.replace("::", ".")
        return f"aten.{self.name}"

    @property
    def _overloadname(self):
        return self._schema.overload or "default"

    @property
    def default(self):
        return self


def call(op: Op, args: tuple):
    """`op(*args)` routed as `Op.__call__` routes it, for positional arguments, without the call slot's
    repacking of them (hot Python composites: `Tensor.__getitem__`'s slices)."""
    if _fx_hook is None and not (op.is_inplace or (_state.interposed and (
            _state.tls.modes or (_state.tls.autocast and op.autocast_tagged)))):
        return _dispatch.call_functional(op, args, {})
    return op(*args)


def defop(schema: str, *, method: bool | str = False, function: bool | str = True,
          inplace: bool = False, namespace: str | None = None, inplace_tags=(), **kw):
    """Declare an operator whose kernel is the decorated function.

    function: export as flambeau.<name> (or the given name); method: as Tensor.<name>;
    namespace: also export into 'nn.functional', 'linalg', 'special' or 'fft'; inplace: derive
    `<name>_` too, tagged with `inplace_tags`; the other keywords (tags, pointwise, ...) go to `Op`.
    """
    def wrap(kernel):
        op = Op(schema, kernel, **kw)
        register(op, method=method, function=function)
        if namespace:
            _NAMESPACES[namespace][op._schema.name if not isinstance(function, str) else function] = op
        if inplace:
            make_inplace(op, method=method, tags=inplace_tags)
        return op
    return wrap


def register(op: Op, *, method=False, function=True) -> Op:
    if op.name in OPS:
        raise RuntimeError(f"operator {op.name} registered twice")
    OPS[op.name] = op
    if "::" in op.name:
        OP_LIBRARIES.add(op.namespace)
    _link_overloads(op)
    if function:
        EXPORTS[function if isinstance(function, str) else op._schema.name] = op
    if method:
        METHODS[method if isinstance(method, str) else op._schema.name] = op
    return op


def _link_overloads(op: Op) -> None:
    """PyTorch's packet spelling: every overload of a name is an attribute of each of its siblings
    (`aten.max.dim` where `aten.max` is the overload 'max'; `aten.add.Tensor` is 'add.Tensor' itself).
    Set as plain attributes at registration, never shadowing one the Op has: a `__getattr__` on
    `Op` would make every attribute read of the dispatcher's hot path take the slow generic route."""
    ops, overloads = _OVERLOADS.setdefault(op.name.partition(".")[0], ([], {}))
    ops.append(op)
    if op._schema.overload:
        overloads[op._schema.overload] = op
        for sibling in ops:
            _set_overload(sibling, op._schema.overload, op)
    for overload, other in overloads.items():
        _set_overload(op, overload, other)


def _set_overload(op: Op, overload: str, target: Op) -> None:
    if not overload.startswith("_") and overload not in op.__dict__ and not hasattr(type(op), overload):
        op.__dict__[overload] = target


def make_inplace(op: Op, *, method=True, tags=()) -> Op:
    """Derive `<name>_` from a functional op: same arguments, `self` mutated and returned. It draws
    from the generator when the functional op does; other tags are its own."""
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
    tags = tuple(tags) + ((Tag.nondeterministic_seeded,) if op.nondeterministic else ())
    iop = Op(f"{name}({', '.join(args)}) -> Tensor(a!)", functional=op, tags=tags)
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


_AUTOCAST_TAGS = frozenset({Tag.autocast_lower_precision, Tag.autocast_fp32, Tag.autocast_promote,
                            Tag.autocast_banned, Tag.cpu_autocast_lower_precision, Tag.cpu_autocast_fp32,
                            Tag.cpu_autocast_promote})


class Composite:
    """What the autocast layer reads of a Python composite that has a mixed-precision policy: its
    name and its autocast tags (PyTorch lists such functions, e.g. `binary_cross_entropy_with_logits`,
    among its autocast ops)."""
    __slots__ = ("__name__", "tags")

    def __init__(self, name: str, tags):
        bad = [t for t in tags if t not in _AUTOCAST_TAGS]
        if bad:
            raise ValueError(f"{name}: a composite takes autocast tags only (no schema for the others), got {bad}")
        self.__name__ = name
        self.tags = frozenset(tags)

    def __repr__(self):
        return f"Composite({self.__name__})"


def autocast_policy(name: str, tags):
    """Decorator: `fn` (a Python composite) gets the autocast policy of `tags` under the op name
    `name`: while autocast is on, its inputs are cast as an op's, and its body runs with autocast
    off on the devices whose policy applied (as PyTorch runs an op below its autocast layer)."""
    op = Composite(name, tags)

    def wrap(fn):
        def with_policy(*args, **kwargs):
            if _state.interposed and _state.tls.autocast:
                return _dispatch._call_composite(op, fn, args, kwargs)
            return fn(*args, **kwargs)
        with_policy.__name__ = with_policy.__qualname__ = fn.__name__
        with_policy.__doc__ = fn.__doc__
        with_policy.__wrapped__ = fn
        with_policy.autocast_op = op
        return with_policy
    return wrap


def export(name: str | None = None, *, method: bool | str = False, function: bool = True,
           namespace: str | None = None, tags=()):
    """Export a plain Python function (a composite over ops) as flambeau.<name> and/or a method,
    and/or into a namespace ('nn.functional', 'linalg', 'special', 'fft'). `tags`: its autocast
    policy (see `autocast_policy`); the function returned (and exported) then applies it."""
    def wrap(fn):
        n = name or fn.__name__
        if tags:
            fn = autocast_policy(n, tags)(fn)
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


from .. import _dispatch, _state  # noqa: E402  (circular: the dispatcher needs Op, Op needs dispatch)
