"""flambeau functions and context managers while tracing.

`TorchFunctionVariable` is a function of `flambeau`, `flambeau.nn.functional`, `flambeau.linalg`,
`flambeau.special` or `flambeau.fft` (operators and Python composites): a call becomes one
call_function node, its output's metadata computed by running the function on fake tensors.
A few are not graph material: grad-mode switches are modelled (`GradModeVariable`, which also
records `_set_grad_enabled` nodes so the graph runs each op under the right mode), pure queries
are answered at trace time (`is_grad_enabled`, `get_default_dtype`), and functions with global
effects (`manual_seed`, `save`, `set_default_dtype`, ...) break the graph.

`flambeau.func` transforms (the last part of this file; PyTorch captures them as functorch
higher-order ops): grad, grad_and_value, vmap, jacrev, jacfwd and hessian return a function:
`FuncTransformVariable` is the transform, and once applied, the function it transformed (`fn`,
possibly another transformed function: they compose in any order) with the transform's options.
Calling it records ONE call_function node. jvp(f, primals, tangents) is one node too; vjp(f, *primals) and
linearize(f, *primals) are a node for the outputs and return a function (`LinearFunctionVariable`)
whose call is another node that evaluates the transform again at the same primals (a graph holds no
function values; the forward is computed twice, which the compiler may share); returned from the
compiled function, it is made after the graph by the eager transform. `functional_call(module, ...)`
is one node too (`FuncModuleCallVariable`: the module's own state lifted as below).

A node's target (`_transform_call`) rebuilds the user's function and applies the transforms each time
the node runs: on fake tensors for the node's metadata, on AOT autograd's proxies (so the
transform's operations land in the compiled forward and backward graphs as primitive ops and the
inductor compiles them), on real tensors for the eager backend. The user's function is a function
object, a bound method, or a function made in the traced frame; the tensors it closes over are the
node's extra operands, rebound into fresh cells at each run (graph inputs: values and gradients flow
through them, and to the transforms they are captured constants, as in torch.func); so are the
parameters and buffers of modules it closes over (swapped into the module while it runs) and the
tensors and modules it reads as globals of the traced frame (read through dynamo, so guarded like
the frame's own reads); constants, functions, classes and Python modules are baked. Globals of other
modules, and the Python of functions it calls, are specialised without guards of their own. A function that cannot be rebuilt, or a body
that fails on fake tensors (data-dependent Python, `.item()`), is a graph break with the reason
(FLAMBEAU_LOGS=graph_breaks): the transform then runs eagerly.
"""
from __future__ import annotations

import contextlib
import dis
import functools
import importlib
import types

from ... import _api, _state, _tensor
from ..._public import PACKAGE, public_namespace
from ..exc import Unsupported
from ..compiled_state import is_compiling
from ..utils import is_disabled
from .base import VariableTracker, ValueVariable, const
from ..._device import device, canonical
from ..._functorch import eager_transforms, vmap as _vmap
from ..._functorch.functional_call import _Swapped, functional_call, stack_module_state
from ...autograd import grad_mode
from ...amp import autocast_mode
from ...amp.autocast_mode import autocast
from .tensor import TensorVariable, NumpyNdarrayVariable, as_tensor_vt, np_wrappers
from .. import variables as kinds  # the kinds imported after this one, read at call time (see __init__)
from ..._ops._registry import Op
from ...fx._aten import CustomOpPacket, OpOverloadPacket, _Ops, _Namespace, _CustomNamespace
from ...library import CustomOpDef

_BREAKING = {"manual_seed", "seed", "initial_seed", "save", "load", "set_default_dtype", "set_default_device",
             "set_printoptions", "compile", "use_deterministic_algorithms", "set_num_threads", "get_rng_state",
             "set_rng_state", "from_numpy", "set_anomaly_enabled", "set_autocast_enabled", "set_autocast_dtype",
             "set_autocast_cpu_enabled", "set_autocast_gpu_dtype", "set_autocast_cpu_dtype",
             "autocast_increment_nesting", "autocast_decrement_nesting", "clear_autocast_cache",
             "set_autocast_cache_enabled", "set_float32_matmul_precision", "set_flush_denormal",
             "set_deterministic_debug_mode", "frombuffer", "asarray", "graph_break", "_amp_update_scale_",
             "_amp_foreach_non_finite_check_and_unscale_"}
_FROM_NUMPY = ("from_numpy", "asarray")
_NAMESPACES = ("flambeau", "flambeau.nn.functional", "flambeau.linalg", "flambeau.special", "flambeau.fft",
               "flambeau.nn.init")
_in_graph: dict | None = None


def _set_grad_enabled(mode: bool) -> None:
    """Recorded in graphs to switch grad mode at run time (inside `with no_grad():` etc.)."""
    _state.tls.grad_enabled = mode


def torch_functions() -> dict:
    """{id(fn): qualified name} of the flambeau functions recorded as graph nodes."""
    global _in_graph
    if _in_graph is None:
        table = {}
        for modname in _NAMESPACES:
            try:
                mod = public_namespace() if modname == PACKAGE else importlib.import_module(modname)
            except ImportError:
                continue
            for name, v in vars(mod).items():
                if name.startswith("__") or isinstance(v, (type, types.ModuleType)) or not callable(v):
                    continue
                if name in _BREAKING or name in _SPECIAL:
                    continue
                table.setdefault(id(v), (f"{modname}.{name}", v))
        _in_graph = table
    return _in_graph


def special_function(v):
    """The handler name for flambeau functions modelled at trace time, else None."""
    if v is is_compiling:                  # also flambeau.compiler.is_compiling
        return "is_compiling"
    for name, fn in (*SPECIAL_FUNCTIONS.items(), *NUMPY_VIEWS.items()):
        if fn is v:
            return name
    if getattr(v, "__name__", None) in _BREAKING and getattr(v, "__module__", "").startswith("flambeau"):
        return "break"
    return None


# modelled at trace time: the public function (flambeau.<name>, also flambeau.autograd.<name> for the
# grad modes) by name, taken from the module that defines it
SPECIAL_FUNCTIONS = {
    "is_grad_enabled": grad_mode.is_grad_enabled, "is_inference_mode_enabled": grad_mode.is_inference_mode_enabled,
    "set_grad_enabled": grad_mode.set_grad_enabled, "no_grad": grad_mode.no_grad,
    "enable_grad": grad_mode.enable_grad, "inference_mode": grad_mode.inference_mode,
    "get_default_dtype": _api.get_default_dtype, "get_default_device": _api.get_default_device,
    "is_autocast_enabled": autocast_mode.is_autocast_enabled, "is_tensor": _tensor.is_tensor}
# wrap_numpy's conversions (flambeau._numpy._wrappers), modelled by name like the functions above
NUMPY_VIEWS = {"tensor_to_ndarray": np_wrappers.tensor_to_ndarray, "ndarray_to_tensor": np_wrappers.ndarray_to_tensor}
_SPECIAL = set(SPECIAL_FUNCTIONS)


class TorchFunctionVariable(ValueVariable):
    def __init__(self, fn, name: str = "", source=None):
        super().__init__(fn, source)
        self.name = name or getattr(fn, "__name__", str(fn))

    def __repr__(self):
        return f"TorchFunctionVariable({self.name})"

    def var_getattr(self, tx, name):
        if isinstance(self.value, (OpOverloadPacket, Op)):   # `packet.default`, `op.tensor`: an Op
            return kinds.builder.build(tx, getattr(self.value, name), None)
        return super().var_getattr(tx, name)

    def call_function(self, tx, args, kwargs):
        args = [as_tensor_vt(a) for a in args]        # flambeau.tensor(ndarray), as_tensor(...)
        fn = self.value
        if isinstance(fn, OpOverloadPacket):
            fn = overload_for(fn, args, kwargs)
        return tx.output.call_in_graph(tx, "call_function", fn, args, kwargs)

    def reconstruct(self, cg):
        return cg.const(self.value)


def overload_for(packet: OpOverloadPacket, args, kwargs) -> Op:
    """The overload a call of `packet` with these traced arguments reaches: the first whose schema
    binds them with tensors exactly in its Tensor-typed slots (the packet's own rule, at trace time)."""
    for op in packet._overloads.values():
        try:
            bound = op.bind(*args, **kwargs)
        except TypeError:
            continue
        if all(isinstance(bound[i], TensorVariable) == op._schema.args[i].is_tensor
               for i in op.tensor_args if not op._schema.args[i].is_tensor_list
               and not (bound[i] is None or getattr(bound[i], "value", 0) is None)):
            return op
    raise Unsupported(f"{packet!r}: no overload accepts these arguments")


class OpNamespaceVariable(VariableTracker):
    """`flambeau.ops`, `flambeau.ops.aten`, `flambeau.ops.<ns>` and a custom op's packet
    `flambeau.ops.<ns>.<name>`: attribute reads reach operators; calling a packet records its op."""

    def __init__(self, value):
        self.value = value

    def python_type(self):
        return type(self.value)

    def as_python_constant(self):
        return self.value

    def var_getattr(self, tx, name):
        return kinds.builder.build(tx, getattr(self.value, name), None)

    def call_function(self, tx, args, kwargs):
        target = operator_target(self.value)
        if target is None:
            raise Unsupported(f"call of {self.value!r}")
        return tx.output.call_in_graph(tx, "call_function", target, args, kwargs)

    def reconstruct(self, cg):
        return cg.const(self.value)


def operator_target(v):
    """The `Op` a call of `v` records (an Op, a custom op's packet `flambeau.ops.ns.name` or its
    `CustomOpDef`), else None."""
    if isinstance(v, Op):
        return v
    if isinstance(v, CustomOpPacket):
        return v.default
    if isinstance(v, OpOverloadPacket) and len(v._overloads) == 1:
        return next(iter(v._overloads.values()))
    if isinstance(v, CustomOpDef):
        return v._opoverload
    return None


def is_op_namespace(v) -> bool:
    return isinstance(v, (_Ops, _Namespace, _CustomNamespace, CustomOpPacket))


class AutogradFunctionApplyVariable(ValueVariable):
    """`MyFunction.apply` of a user `autograd.Function`: a call traces its forward and backward into
    one `autograd_function_apply` node (`OutputGraph.call_autograd_function`)."""

    def __init__(self, cls, source=None):
        super().__init__(cls.apply, source)
        self.cls = cls

    def __repr__(self):
        return f"AutogradFunctionApplyVariable({self.cls.__name__})"

    def call_function(self, tx, args, kwargs):
        return tx.output.call_autograd_function(tx, self.cls, args, kwargs)

    def reconstruct(self, cg):
        return cg.const(self.value)


class TorchSpecialVariable(VariableTracker):
    """A flambeau function answered or modelled at trace time (see module docstring)."""

    def __init__(self, fn, kind: str):
        self.value = fn
        self.kind = kind

    def as_python_constant(self):
        return self.value

    def python_type(self):
        return type(self.value)

    def reconstruct(self, cg):
        return cg.const(self.value)

    def call_function(self, tx, args, kwargs):
        k = self.kind
        if k == "break" and getattr(self.value, "__name__", None) in _FROM_NUMPY and len(args) == 1 and \
                isinstance(args[0], NumpyNdarrayVariable):
            return args[0].tensor          # from_numpy(a) / asarray(a) of a traced array: the tensor holding it
        if k == "break":
            raise Unsupported(f"call to flambeau.{getattr(self.value, '__name__', '?')} (global effects)")
        if k == "is_compiling":
            return const(True)
        if k == "tensor_to_ndarray":           # wrap_numpy: the tensor seen as an array, gradients kept
            return NumpyNdarrayVariable(args[0]) if isinstance(args[0], TensorVariable) else args[0]
        if k == "ndarray_to_tensor":
            return as_tensor_vt(args[0])
        if k == "is_grad_enabled":
            return const(tx.output.grad_enabled)
        if k == "get_default_dtype":
            return const(_state.default_dtype)
        if k == "get_default_device":
            return const(canonical(_state.tls.default_device))
        if k == "is_inference_mode_enabled":
            return const(_state.tls.inference_mode)
        if k == "is_tensor":
            return const(isinstance(args[0], TensorVariable))
        if k in ("no_grad", "enable_grad"):
            if args:
                raise Unsupported(f"{k} used as a decorator inside the compiled code")
            return GradModeVariable(k == "enable_grad", None)
        if k == "set_grad_enabled":
            mode = args[0].as_python_constant() if args else kwargs["mode"].as_python_constant()
            v = GradModeVariable(bool(mode), tx.output.grad_enabled)
            v.apply(tx, bool(mode))
            return v
        raise Unsupported(f"flambeau.{k} inside the compiled code")


class GradModeVariable(VariableTracker):
    """A `no_grad()` / `enable_grad()` / `set_grad_enabled(m)` object; `prev` is the mode to restore
    (set on entering; set_grad_enabled switches when called, like eager)."""

    def __init__(self, target: bool, prev: bool | None):
        self.target = target
        self.prev = prev

    def python_type(self):
        return grad_mode.no_grad if not self.target else grad_mode.enable_grad

    @staticmethod
    def apply(tx, mode: bool) -> None:
        if tx.output.grad_enabled != mode:
            tx.output.graph.call_function(_set_grad_enabled, (mode,))
            tx.output.grad_enabled = mode

    def enter(self, tx) -> VariableTracker:
        if self.prev is None:
            self.prev = tx.output.grad_enabled
            self.apply(tx, self.target)
        return GradModeExitVariable(self.prev)

    def call_method(self, tx, name, args, kwargs):
        if name == "__enter__":
            self.enter(tx)
            return const(None)
        if name == "__exit__":
            self.apply(tx, self.prev)
            return const(None)
        raise Unsupported(f"grad mode object .{name}")

    def reconstruct(self, cg):
        if self.prev is not None:
            raise Unsupported("an entered grad-mode object is live after the graph")
        return f"{cg.const(grad_mode.no_grad if not self.target else grad_mode.enable_grad)}()"


class GradModeExit:
    """The real `__exit__` left on the stack when a graph breaks inside `with no_grad():` (restores `prev`)."""
    __slots__ = ("prev",)

    def __init__(self, prev: bool):
        self.prev = prev

    def __call__(self, *exc):
        _state.tls.grad_enabled = self.prev
        return False


class GradModeExitVariable(VariableTracker):
    """The `__exit__` of an entered grad-mode context, as pushed by BEFORE_WITH."""

    def __init__(self, prev: bool, source=None):
        self.prev = prev
        self.source = source

    def call_function(self, tx, args, kwargs):
        GradModeVariable.apply(tx, self.prev)
        return const(None)

    def reconstruct(self, cg):
        return f"{cg.const(GradModeExit)}({self.prev})"


def _enter_autocast(device_type: str, dtype, enabled: bool, cache_enabled: bool) -> autocast:
    """Recorded in graphs: enter an autocast region at run time; returns the entered object."""
    ctx = autocast(device_type, dtype=dtype, enabled=enabled, cache_enabled=cache_enabled)
    ctx.__enter__()
    return ctx


def _exit_autocast(ctx: autocast) -> None:
    """Recorded in graphs: leave the region `_enter_autocast` entered."""
    ctx.__exit__(None, None, None)


class AutocastVariable(VariableTracker):
    """An autocast object: made in the traced code (`autocast(...)`, `amp.autocast(...)`,
    `cpu.amp.autocast(...)` with constant arguments: constructed once, at trace time) or read from
    the frame (the object an `@autocast(...)` decorated function closes over: guarded by identity).
    Its resolved settings (device, dtype, enabled, cache_enabled) are what the graph records.
    Entering records an `_enter_autocast` node (so the graph runs its ops under autocast, and AOT
    autograd traces them with their casts) and enters a real region for the rest of the trace (so
    fake outputs get autocast dtypes); leaving does both in reverse."""

    def __init__(self, real: autocast, source=None):
        self.real = real
        self.source = source
        self.live = 0

    def python_type(self):
        return type(self.real)

    def settings(self) -> tuple:
        r = self.real
        return (r.device, r.fast_dtype, r._enabled, r._cache_enabled)

    def enter(self, tx):
        out = tx.output
        node = out.graph.call_function(_enter_autocast, self.settings())
        entered = _enter_autocast(*self.settings())
        out.entered.append(entered)
        self.live += 1
        return AutocastExitVariable(self, node, entered)

    def reconstruct(self, cg):
        if self.live:
            raise Unsupported("an entered autocast object is live after the graph")
        if self.source is not None:
            return self.source.expr
        device_type, dtype, enabled, cache_enabled = self.settings()
        return (f"{cg.const(autocast)}({cg.const(device_type)}, dtype={cg.const(dtype)}, "
                f"enabled={cg.const(enabled)}, cache_enabled={cg.const(cache_enabled)})")


class AutocastExitVariable(VariableTracker):
    """The `__exit__` of one entry into an autocast region, as pushed by BEFORE_WITH."""

    def __init__(self, ctx: AutocastVariable, node, entered: autocast):
        self.ctx, self.node, self.entered = ctx, node, entered

    def call_function(self, tx, args, kwargs):
        out = tx.output
        out.graph.call_function(_exit_autocast, (self.node,))
        _exit_autocast(self.entered)
        out.entered.remove(self.entered)
        self.ctx.live -= 1
        return const(None)


def class_call(tx, cls, args, kwargs):
    """Constructing flambeau classes while tracing (None: not handled)."""
    if cls is device and all(a.is_python_constant() for a in args):
        return const(device(*(a.as_python_constant() for a in args)))
    if cls in (grad_mode.no_grad, grad_mode.enable_grad, grad_mode.set_grad_enabled):
        return TorchSpecialVariable(cls, cls.__name__).call_function(tx, args, kwargs)
    if isinstance(cls, type) and issubclass(cls, autocast) and all(a.is_python_constant() for a in args) and \
            all(v.is_python_constant() for v in kwargs.values()):
        return AutocastVariable(cls(*(a.as_python_constant() for a in args),
                                    **{k: v.as_python_constant() for k, v in kwargs.items()}))
    return None


# ---- flambeau.func transforms (see the module docstring) ------------------------------------------
# the transforms returning a function, traced as graph nodes (by object), each named for messages
FUNC_TRANSFORMS = {eager_transforms.grad: "grad", eager_transforms.grad_and_value: "grad_and_value",
                   _vmap.vmap: "vmap", eager_transforms.jacrev: "jacrev", eager_transforms.jacfwd: "jacfwd",
                   eager_transforms.hessian: "hessian"}
# the transforms called on primals directly
FUNC_CALLS = {eager_transforms.jvp: "jvp", eager_transforms.vjp: "vjp", eager_transforms.linearize: "linearize"}
# the calls of modules with their state given or stacked (`FuncModuleCallVariable`)
FUNC_MODULE_CALLS = {functional_call: "functional_call", stack_module_state: "stack_module_state"}


class _Builder:
    """How a node rebuilds the user's (transformed) function from its extra operands: `make(extras)`
    returns the callable; `operands` are the trackers of the extras (the closure's tensors)."""

    def __init__(self, make, operands: list, name: str):
        self.make = make
        self.operands = operands
        self.name = name


def function_builder(tx, vt, api: str) -> _Builder:
    """The `_Builder` of the function tracker `vt` that `flambeau.func.<api>` is applied to."""
    if isinstance(vt, FuncTransformVariable) and vt.fn is not None:
        inner = function_builder(tx, vt.fn, FUNC_TRANSFORMS[vt.transform])
        transform, options, kw_options = vt.transform, vt.options, vt.kw_options
        return _Builder(lambda extras: transform(inner.make(extras), *options, **kw_options), inner.operands,
                        f"{FUNC_TRANSFORMS[transform]}_{inner.name}")
    if isinstance(vt, TorchFunctionVariable):
        return _constant_builder(vt.value)
    if isinstance(vt, kinds.functions.UserFunctionVariable) and not is_disabled(vt.value):
        fn = vt.value
        if fn.__kwdefaults__ is not None:
            return _constant_builder(fn)
        return _rebuilt(tx, fn.__code__, fn.__globals__, fn.__name__, fn.__defaults__, [(False, c) for c in
                        (fn.__closure__ or ())], [], [], cells_are_cells=True)
    if isinstance(vt, kinds.functions.UserMethodVariable) and hasattr(vt.obj, "value") and \
            not is_disabled(vt.value):
        return _constant_builder(types.MethodType(vt.value, vt.obj.value))
    if isinstance(vt, kinds.functions.NestedUserFunctionVariable):
        return _closure_builder(tx, vt, api)
    raise Unsupported(f"flambeau.func.{api} of {vt}: only a function, a bound method or a function made in the "
                      "frame is traced (this transform runs eagerly)")


def _constant_builder(fn) -> _Builder:
    return _Builder(lambda extras: fn, [], getattr(fn, "__name__", "fn"))


def _closure_builder(tx, vt, api: str) -> _Builder:
    """A function made in the frame: its cells hold baked values or extra operands (tensors)."""
    if tx is None:
        raise Unsupported(f"flambeau.func.{api} of {vt.name}, a function made in the frame, live after the graph")
    if vt.kwdefaults is not None or (vt.defaults is not None and not vt.defaults.is_python_constant()):
        raise Unsupported(f"flambeau.func.{api} of {vt.name}: defaults that are not constants")
    defaults = None if vt.defaults is None else tuple(d.as_python_constant() for d in vt.defaults.items)
    template, operands, swaps = [], [], []
    for name, cell in zip(vt.code.co_freevars, vt.closure or ()):
        value = _cell_tracker(tx, cell, name)
        if _holds_tensor(value):
            template.append((True, len(operands)))
            operands.append(value)
        elif value.is_python_constant():
            template.append((False, value.as_python_constant()))
        elif isinstance(value, kinds.nn_module.NNModuleVariable) and value.source is not None:
            template.append((False, value.value))
            swaps.append((value.value, _lift_module_state(tx, value, operands)))
        elif isinstance(getattr(value, "value", None), _STATELESS) and not isinstance(value, _containers()):
            template.append((False, value.value))          # a function, a class, a Python module, an op
        else:
            raise Unsupported(f"flambeau.func.{api} of {vt.name}: its free variable {name!r} is {value}, which "
                              "cannot be passed to the transformed function")
    return _rebuilt(tx, vt.code, vt.f_globals, vt.name, defaults, template, operands, swaps)


def _rebuilt(tx, code, f_globals, fname, defaults, template, operands, swaps, cells_are_cells=False):
    """The `_Builder` of a function rebuilt from its code: `template` gives each closure cell (a baked
    value, or a cell as it is, or an operand index); the tensors and modules it reads as globals of
    the traced frame are lifted too (`_lift_globals`)."""
    overrides = _lift_globals(tx, code, f_globals, operands, swaps) if tx is not None else {}

    def make(extras):
        cells = tuple(types.CellType(extras[v]) if is_operand else (v if cells_are_cells else types.CellType(v))
                      for is_operand, v in template)
        g = f_globals if not overrides else {**f_globals, **{k: extras[i] for k, i in overrides.items()}}
        fn = types.FunctionType(code, g, fname, defaults, cells or None)
        if not swaps:
            return fn
        state = [(module, {k: extras[i] for k, i in names.items()}) for module, names in swaps]

        def with_module_state(*args, **kwargs):
            with contextlib.ExitStack() as stack:
                for module, tensors in state:
                    stack.enter_context(_Swapped(module, tensors))
                return fn(*args, **kwargs)
        return with_module_state
    return _Builder(make, operands, fname.rsplit(".", 1)[-1].replace("<lambda>", "lambda"))


def _lift_globals(tx, code, f_globals, operands: list, swaps: list) -> dict:
    """The globals of the traced frame that `code` loads, read through dynamo (so they are guarded
    like the frame's own reads): tensors become operands (returned as {name: operand index}, bound
    in a copy of the globals when the node runs), modules have their state lifted."""
    if f_globals is not tx.f_globals:
        return {}
    overrides = {}
    for name in dict.fromkeys(i.argval for i in dis.get_instructions(code) if i.opname == "LOAD_GLOBAL"):
        if name not in f_globals:
            continue
        value = tx.load_global(name)
        if isinstance(value, TensorVariable):
            overrides[name] = len(operands)
            operands.append(value)
        elif isinstance(value, kinds.nn_module.NNModuleVariable):
            swaps.append((value.value, _lift_module_state(tx, value, operands)))
    return overrides


# free variables baked into a rebuilt function as they are: values that hold no tensors of their own
_STATELESS = (types.FunctionType, types.BuiltinFunctionType, type, types.ModuleType, Op)


def _lift_module_state(tx, module_vt, operands: list) -> dict:
    """A module the function closes over: its parameters and buffers (as the graph's get_attr
    tensors) become operands, swapped into the module while the function runs, so AOT autograd sees
    them as inputs and gradients reach them. Returns {name: operand index}."""
    names = {}
    for store, items in (("_parameters", module_vt.value.named_parameters(remove_duplicate=False)),
                         ("_buffers", module_vt.value.named_buffers(remove_duplicate=False))):
        for qualified, t in items:
            src = module_vt.source
            *path, leaf = qualified.split(".")
            for part in path:
                src = src.attr("_modules").item(part)
            names[qualified] = len(operands)
            operands.append(tx.output.module_tensor(t, src.attr(store).item(leaf), is_param=store == "_parameters"))
    return names


def _cell_tracker(tx, cell, name: str) -> VariableTracker:
    if isinstance(cell, kinds.functions.CellVariable):
        if cell.value is None:
            raise Unsupported(f"NameError: free variable {name!r} referenced before assignment")
        return cell.value
    pending = tx.output.side_effects.pending_cell(cell)
    if pending is not None:
        return pending
    try:
        value = cell.cell.cell_contents
    except ValueError:
        raise Unsupported(f"NameError: free variable {name!r} referenced before assignment")
    if cell.source is None:
        return kinds.builder.wrap_constant_like(value)
    return kinds.builder.build(tx, value, cell.source)


def _containers() -> tuple:
    c = kinds.containers
    return c.TupleVariable, c.ListVariable, c.DictVariable


def _holds_tensor(vt) -> bool:
    if isinstance(vt, TensorVariable):
        return True
    if isinstance(vt, _containers()[:2]):
        return any(_holds_tensor(x) for x in vt.items)
    if isinstance(vt, kinds.containers.DictVariable):
        return any(_holds_tensor(x) for x in vt.items.values())
    return False


def _transform_call(name: str, make, n_lead: int, apply):
    """A node target: `apply(fn, *lead)` with `fn = make(extras)`, the operands after the first
    `n_lead` being the extras."""
    def call(*args, **kwargs):
        return apply(make(args[n_lead:]), *args[:n_lead], **kwargs)
    call.__name__ = call.__qualname__ = name
    return call


def _record(tx, name: str, builder: _Builder, lead: list, apply, kwargs: dict | None = None):
    target = _transform_call(name, builder.make, len(lead), apply)
    return tx.output.call_in_graph(tx, "call_function", target, list(lead) + builder.operands, kwargs or {})


class FuncTransformVariable(VariableTracker):
    """A `flambeau.func` transform (`grad`), or a function it transformed (`grad(f, argnums=1)`:
    `fn` is the tracker of f, `options` the transform's other arguments), see the module docstring."""

    def __init__(self, transform, fn=None, options: tuple = (), kw_options: dict | None = None):
        self.transform = transform
        self.fn = fn
        self.options = options
        self.kw_options = kw_options or {}

    def __repr__(self):
        inner = "" if self.fn is None else f"({self.fn})"
        return f"FuncTransformVariable({FUNC_TRANSFORMS[self.transform]}{inner})"

    def python_type(self):
        return types.FunctionType

    def call_function(self, tx, args, kwargs):
        name = FUNC_TRANSFORMS[self.transform]
        if self.fn is None:                       # grad(f, ...): the transformed function
            if not args:
                raise Unsupported(f"flambeau.func.{name}() without a function")
            opts = list(args[1:]) + list(kwargs.values())
            if not all(o.is_python_constant() for o in opts):
                raise Unsupported(f"flambeau.func.{name}: options that are not constants")
            return FuncTransformVariable(self.transform, args[0], tuple(a.as_python_constant() for a in args[1:]),
                                         {k: v.as_python_constant() for k, v in kwargs.items()})
        builder = function_builder(tx, self, name)
        return _record(tx, builder.name, builder, list(args), _call_with, kwargs)

    def reconstruct(self, cg):
        if self.fn is None:
            return cg.const(self.transform)
        builder = function_builder(None, self, FUNC_TRANSFORMS[self.transform])
        return cg.const(builder.make(()))


def _call_with(fn, *args, **kwargs):
    return fn(*args, **kwargs)


class _FuncApiVariable(VariableTracker):
    """A `flambeau.func` function called at the traced frame's own level, named by its class's table."""
    NAMES: dict = {}

    def __init__(self, fn):
        self.value = fn
        self.name = self.NAMES[fn]

    def __repr__(self):
        return f"{type(self).__name__}({self.name})"

    def python_type(self):
        return types.FunctionType

    def as_python_constant(self):
        return self.value

    def reconstruct(self, cg):
        return cg.const(self.value)


class FuncCallVariable(_FuncApiVariable):
    """`flambeau.func.jvp`, `vjp` or `linearize` (see the module docstring)."""

    NAMES = FUNC_CALLS

    def call_function(self, tx, args, kwargs):
        if not args:
            raise Unsupported(f"flambeau.func.{self.name}() without a function")
        if not all(v.is_python_constant() for v in kwargs.values()):
            raise Unsupported(f"flambeau.func.{self.name}: options that are not constants")
        options = {k: v.as_python_constant() for k, v in kwargs.items()}
        builder = function_builder(tx, args[0], self.name)
        if self.name == "jvp":
            if len(args) != 3:
                raise Unsupported("flambeau.func.jvp(f, primals, tangents) with other arguments")
            return _record(tx, f"jvp_{builder.name}", builder, [args[1], args[2]],
                           lambda fn, primals, tangents: eager_transforms.jvp(fn, primals, tangents, **options))
        primals = kinds.containers.TupleVariable(list(args[1:]))
        fn_api = self.value
        if self.name == "vjp":
            out = _record(tx, f"vjp_{builder.name}", builder, [primals],
                          lambda fn, p: _without_function(fn_api(fn, *p, **options)))
            items = out.items if isinstance(out, kinds.containers.TupleVariable) else [out]
            vjp_fn = LinearFunctionVariable("vjp", builder, primals, options)
            return kinds.containers.TupleVariable([items[0], vjp_fn] + items[1:])
        out = _record(tx, f"linearize_{builder.name}", builder, [primals], lambda fn, p: fn_api(fn, *p)[0])
        return kinds.containers.TupleVariable([out, LinearFunctionVariable("linearize", builder, primals, options)])


def _without_function(result: tuple) -> tuple:
    """vjp's `(out, vjp_fn[, aux])` without vjp_fn: the node's outputs."""
    return (result[0],) + tuple(result[2:])


class LinearFunctionVariable(VariableTracker):
    """The `vjp_fn` of `vjp(f, *primals)` or the `jvp_fn` of `linearize(f, *primals)`: a call is one
    node evaluating the transform at the primals again (see the module docstring)."""

    def __init__(self, api: str, builder: _Builder, primals, options: dict):
        self.api = api
        self.builder = builder
        self.primals = primals
        self.options = options

    def __repr__(self):
        return f"LinearFunctionVariable({self.api}_fn of {self.builder.name})"

    def python_type(self):
        return types.FunctionType

    def reconstruct(self, cg):
        """Returned from the compiled function (or live across a graph break): made after the graph
        by the eager transform at the same primals, from the function's operands (graph values)."""
        operands = "(" + "".join(cg.reconstruct(o) + ", " for o in self.builder.operands) + ")"
        made = cg.const(functools.partial(_linear_function_after_graph, self.api, self.builder.make, self.options))
        return cg.new_temp(f"{made}({cg.reconstruct(self.primals)}, {operands})")

    def call_function(self, tx, args, kwargs):
        options = self.options
        if not all(v.is_python_constant() for v in kwargs.values()):
            raise Unsupported(f"{self.api}_fn: options that are not constants")
        fn_kwargs = {k: v.as_python_constant() for k, v in kwargs.items()}
        if self.api == "vjp":
            def apply(fn, primals, cotangents):
                return eager_transforms.vjp(fn, *primals, **options)[1](*cotangents, **fn_kwargs)
        else:
            def apply(fn, primals, tangents):
                return eager_transforms.jvp(fn, primals, tangents)[1]
        return _record(tx, f"{self.api}_fn_{self.builder.name}", self.builder,
                       [self.primals, kinds.containers.TupleVariable(list(args))], apply)


def _linear_function_after_graph(api: str, make, options: dict, primals: tuple, extras: tuple):
    """The `vjp_fn` of `vjp(f, *primals)` (or the `jvp_fn` of `linearize`), `f = make(extras)`, made
    eagerly by the entry of a compiled frame that returns it."""
    if api == "vjp":
        return eager_transforms.vjp(make(extras), *primals, **options)[1]
    return eager_transforms.linearize(make(extras), *primals)[1]


class FuncModuleCallVariable(_FuncApiVariable):
    """`flambeau.func.functional_call(module, params, args, kwargs)` at the traced frame's own level:
    one call_function node whose target swaps the module's own parameters and buffers (node
    operands, as for a transformed function closing over a module: see `_lift_module_state`) into it
    and calls functional_call, so gradients reach both the given and the module's own tensors and
    AOT autograd traces the module's forward as flat ops. `stack_module_state` breaks the graph with
    its reason: its outputs are new leaves."""

    NAMES = FUNC_MODULE_CALLS

    def call_function(self, tx, args, kwargs):
        if not all(v.is_python_constant() for v in kwargs.values() if not _holds_tensor(v)):
            raise Unsupported(f"flambeau.func.{self.name}: options that are not constants")
        if self.name == "stack_module_state":
            raise Unsupported("flambeau.func.stack_module_state makes new leaf tensors that require grad, which a "
                              "graph cannot return: it runs eagerly (call it outside the compiled function)")
        if not args:
            raise Unsupported("flambeau.func.functional_call() without a module")
        module = args[0]
        if not isinstance(module, kinds.nn_module.NNModuleVariable) or module.source is None:
            raise Unsupported(f"flambeau.func.functional_call of {module}: only a module read from the frame is traced")
        options = {k: v.as_python_constant() for k, v in kwargs.items() if k != "kwargs"}
        operands = []
        names = _lift_module_state(tx, module, operands)
        fn, value = self.value, module.value

        def make(extras):
            own = {k: extras[i] for k, i in names.items()}

            def call(*lead_values, **kw):
                with _Swapped(value, own):
                    return fn(value, *lead_values, **kw, **options)
            return call
        return _record(tx, self.name, _Builder(make, operands, self.name), list(args[1:]), _call_with,
                       {k: v for k, v in kwargs.items() if k == "kwargs"})
