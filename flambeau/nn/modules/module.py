"""`nn.Module`: the base class of every layer.

Attribute assignment registers Parameters, buffers and submodules in ordered dicts; traversal
(`named_parameters`, `named_modules`...), `state_dict`/`load_state_dict`, device/dtype conversion
(`to`, `_apply`), train/eval, forward and backward hooks and `repr` follow PyTorch."""
from __future__ import annotations

import functools
import itertools
from collections import OrderedDict
from typing import Callable

from ..._tensor import Tensor, _no_grad
from ..._compile_lock import thread as _compile_thread, eager_frames_running as _eager_frames_running
from ... import _dtype as D, _state
from ..parameter import Parameter, Buffer
from ._module_utils import RemovableHandle, _IncompatibleKeys, _typename, _addindent, _parse_to
from ...autograd import Function
from ..._device import device as Device
from ..._ops.creation import empty_like

__all__ = ["Module", "RemovableHandle"]

# The compiler's entry point, for `Module.compile`: the compiler sits above nn in the layer order, so
# it registers `flambeau.compile` here as it loads (`register_compiler`), and nn never imports it.
_compiler: list = []


def register_compiler(compile_fn: Callable) -> None:
    """Make `compile_fn` (`flambeau.compile`) the function `Module.compile` calls."""
    _compiler[:] = [compile_fn]


_EXTRA_STATE_KEY_SUFFIX = "_extra_state"   # state_dict key of get_extra_state()'s value, after the prefix


def _forward_unimplemented(self, *input):
    raise NotImplementedError(f'Module [{type(self).__name__}] is missing the required "forward" function')


class _BackwardHookFn:
    """Identity autograd functions placed on a module's inputs and outputs to run full backward hooks."""

    @staticmethod
    def make(on_grad):

        class _Hook(Function):
            @staticmethod
            def forward(ctx, *tensors):
                return tuple(t.view_as(t) for t in tensors)

            @staticmethod
            def backward(ctx, *grads):
                res = on_grad(grads)
                return tuple(res) if res is not None else grads
        return _Hook


class Module:
    """Base class for all neural network modules (see module docstring)."""

    dump_patches = False
    _version = 1
    _compiled_call_impl = None     # set by Module.compile: what calling the module runs instead
    training: bool
    call_super_init = False

    def __init__(self, *args, **kwargs) -> None:
        if args or kwargs:
            raise TypeError(f"{type(self).__name__}.__init__() got an unexpected keyword argument "
                            f"'{next(iter(kwargs))}'" if kwargs else
                            f"{type(self).__name__}.__init__() takes 1 positional argument but "
                            f"{len(args) + 1} were given")
        s = super().__setattr__
        s("training", True)
        s("_parameters", OrderedDict())
        s("_buffers", OrderedDict())
        s("_non_persistent_buffers_set", set())
        s("_backward_pre_hooks", OrderedDict())
        s("_backward_hooks", OrderedDict())
        s("_is_full_backward_hook", None)
        s("_forward_hooks", OrderedDict())
        s("_forward_hooks_with_kwargs", OrderedDict())
        s("_forward_hooks_always_called", OrderedDict())
        s("_forward_pre_hooks", OrderedDict())
        s("_forward_pre_hooks_with_kwargs", OrderedDict())
        s("_state_dict_hooks", OrderedDict())
        s("_state_dict_pre_hooks", OrderedDict())
        s("_load_state_dict_pre_hooks", OrderedDict())
        s("_load_state_dict_post_hooks", OrderedDict())
        s("_modules", OrderedDict())

    forward = _forward_unimplemented

    # ---- registration -------------------------------------------------------------------
    def register_buffer(self, name: str, tensor: Tensor | None, persistent: bool = True) -> None:
        if "_buffers" not in self.__dict__:
            raise AttributeError("cannot assign buffer before Module.__init__() call")
        if not isinstance(name, str):
            raise TypeError(f"buffer name should be a string. Got {_typename(name)}")
        if "." in name:
            raise KeyError('buffer name can\'t contain "."')
        if name == "":
            raise KeyError('buffer name can\'t be empty string ""')
        if hasattr(self, name) and name not in self._buffers:
            raise KeyError(f"attribute '{name}' already exists")
        if tensor is not None and not isinstance(tensor, Tensor):
            raise TypeError(f"cannot assign '{_typename(tensor)}' object to buffer '{name}' "
                            "(torch Tensor or None required)")
        if isinstance(tensor, Buffer):
            persistent = tensor.persistent
            tensor = tensor.detach() if not tensor.requires_grad else Tensor._from(tensor)
        self._buffers[name] = tensor
        if persistent:
            self._non_persistent_buffers_set.discard(name)
        else:
            self._non_persistent_buffers_set.add(name)

    def register_parameter(self, name: str, param: Parameter | None) -> None:
        if "_parameters" not in self.__dict__:
            raise AttributeError("cannot assign parameter before Module.__init__() call")
        if not isinstance(name, str):
            raise TypeError(f"parameter name should be a string. Got {_typename(name)}")
        if "." in name:
            raise KeyError('parameter name can\'t contain "."')
        if name == "":
            raise KeyError('parameter name can\'t be empty string ""')
        if hasattr(self, name) and name not in self._parameters:
            raise KeyError(f"attribute '{name}' already exists")
        if param is None:
            self._parameters[name] = None
            return
        if not isinstance(param, Parameter):
            raise TypeError(f"cannot assign '{_typename(param)}' object to parameter '{name}' "
                            "(torch.nn.Parameter or None required)")
        if param.grad_fn is not None:
            raise ValueError(f"Cannot assign non-leaf Tensor to parameter '{name}'. Model parameters must be "
                             f"created explicitly. To express '{name}' as a function of another Tensor, "
                             "compute the value in the forward() method.")
        self._parameters[name] = param

    def add_module(self, name: str, module: "Module | None") -> None:
        if not isinstance(module, Module) and module is not None:
            raise TypeError(f"{_typename(module)} is not a Module subclass")
        if not isinstance(name, str):
            raise TypeError(f"module name should be a string. Got {_typename(name)}")
        if hasattr(self, name) and name not in self._modules:
            raise KeyError(f"attribute '{name}' already exists")
        if "." in name:
            raise KeyError(f'module name can\'t contain ".", got: {name}')
        if name == "":
            raise KeyError('module name can\'t be empty string ""')
        self._modules[name] = module

    def register_module(self, name: str, module: "Module | None") -> None:
        self.add_module(name, module)

    def get_submodule(self, target: str) -> "Module":
        if target == "":
            return self
        mod = self
        for item in target.split("."):
            if not hasattr(mod, item):
                raise AttributeError(mod._get_name() + " has no attribute `" + item + "`")
            mod = getattr(mod, item)
            if not isinstance(mod, Module):
                raise AttributeError("`" + item + "` is not an nn.Module")
        return mod

    def set_submodule(self, target: str, module: "Module", strict: bool = False) -> None:
        if target == "":
            raise ValueError("Cannot set the submodule without a target name!")
        *path, name = target.split(".")
        parent = self.get_submodule(".".join(path))
        if strict and not hasattr(parent, name):
            raise AttributeError(parent._get_name() + " has no attribute `" + name + "`")
        setattr(parent, name, module)

    def get_parameter(self, target: str) -> Parameter:
        module_path, _, name = target.rpartition(".")
        mod = self.get_submodule(module_path)
        if not hasattr(mod, name):
            raise AttributeError(mod._get_name() + " has no attribute `" + name + "`")
        param = getattr(mod, name)
        if not isinstance(param, Parameter):
            raise AttributeError("`" + name + "` is not an nn.Parameter")
        return param

    def get_buffer(self, target: str) -> Tensor:
        module_path, _, name = target.rpartition(".")
        mod = self.get_submodule(module_path)
        if not hasattr(mod, name):
            raise AttributeError(mod._get_name() + " has no attribute `" + name + "`")
        if name not in mod._buffers:
            raise AttributeError("`" + name + "` is not a buffer")
        return getattr(mod, name)

    # ---- attribute protocol -------------------------------------------------------------
    def __getattr__(self, name: str):
        d = self.__dict__
        for store in ("_parameters", "_buffers", "_modules"):
            if store in d and name in d[store]:
                return d[store][name]
        raise AttributeError(f"'{type(self).__name__}' object has no attribute '{name}'")

    def __setattr__(self, name: str, value) -> None:
        def remove_from(*dicts_or_sets):
            for d in dicts_or_sets:
                if name in d:
                    if isinstance(d, dict):
                        del d[name]
                    else:
                        d.discard(name)

        params = self.__dict__.get("_parameters")
        if isinstance(value, Parameter):
            if params is None:
                raise AttributeError("cannot assign parameters before Module.__init__() call")
            remove_from(self.__dict__, self._buffers, self._modules, self._non_persistent_buffers_set)
            self.register_parameter(name, value)
            return
        if params is not None and name in params:
            if value is not None:
                raise TypeError(f"cannot assign '{_typename(value)}' as parameter '{name}' "
                                "(torch.nn.Parameter or None expected)")
            self.register_parameter(name, value)
            return
        modules = self.__dict__.get("_modules")
        if isinstance(value, Module):
            if modules is None:
                raise AttributeError("cannot assign module before Module.__init__() call")
            remove_from(self.__dict__, self._parameters, self._buffers, self._non_persistent_buffers_set)
            modules[name] = value
            return
        if modules is not None and name in modules:
            if value is not None:
                raise TypeError(f"cannot assign '{_typename(value)}' as child module '{name}' "
                                "(torch.nn.Module or None expected)")
            modules[name] = value
            return
        buffers = self.__dict__.get("_buffers")
        if isinstance(value, Buffer) or (buffers is not None and name in buffers):
            if value is not None and not isinstance(value, Tensor):
                raise TypeError(f"cannot assign '{_typename(value)}' as buffer '{name}' "
                                "(torch.nn.Buffer, torch.Tensor or None expected)")
            if isinstance(value, Buffer):
                persistent = value.persistent
            else:
                persistent = name not in self._non_persistent_buffers_set
            if buffers is None:
                raise AttributeError("cannot assign buffer before Module.__init__() call")
            remove_from(self.__dict__, self._parameters, self._modules)
            self.register_buffer(name, value, persistent)
            return
        super().__setattr__(name, value)

    def __delattr__(self, name: str) -> None:
        if name in self._parameters:
            del self._parameters[name]
        elif name in self._buffers:
            del self._buffers[name]
            self._non_persistent_buffers_set.discard(name)
        elif name in self._modules:
            del self._modules[name]
        else:
            super().__delattr__(name)

    def __dir__(self):
        keys = list(super().__dir__())
        keys += list(self._parameters) + list(self._modules) + list(self._buffers)
        keys = [k for k in keys if not k[0].isdigit()]
        return sorted(set(keys))

    def __setstate__(self, state):
        self.__dict__.update(state)

    # ---- traversal ----------------------------------------------------------------------
    def _named_members(self, get_members_fn, prefix="", recurse=True, remove_duplicate=True):
        memo = set()
        modules = self.named_modules(prefix=prefix, remove_duplicate=remove_duplicate) if recurse \
            else [(prefix, self)]
        for module_prefix, module in modules:
            for k, v in get_members_fn(module):
                if v is None or (remove_duplicate and id(v) in memo):
                    continue
                if remove_duplicate:
                    memo.add(id(v))
                yield module_prefix + ("." if module_prefix else "") + k, v

    def parameters(self, recurse: bool = True):
        for _, p in self.named_parameters(recurse=recurse):
            yield p

    def named_parameters(self, prefix: str = "", recurse: bool = True, remove_duplicate: bool = True):
        yield from self._named_members(lambda m: m._parameters.items(), prefix, recurse, remove_duplicate)

    def buffers(self, recurse: bool = True):
        for _, b in self.named_buffers(recurse=recurse):
            yield b

    def named_buffers(self, prefix: str = "", recurse: bool = True, remove_duplicate: bool = True):
        yield from self._named_members(lambda m: m._buffers.items(), prefix, recurse, remove_duplicate)

    def children(self):
        for _, m in self.named_children():
            yield m

    def named_children(self):
        memo = set()
        for name, m in self._modules.items():
            if m is not None and id(m) not in memo:
                memo.add(id(m))
                yield name, m

    def modules(self):
        for _, m in self.named_modules():
            yield m

    def named_modules(self, memo=None, prefix: str = "", remove_duplicate: bool = True):
        if memo is None:
            memo = set()
        if self in memo:
            return
        if remove_duplicate:
            memo.add(self)
        yield prefix, self
        for name, m in self._modules.items():
            if m is None:
                continue
            sub = prefix + ("." if prefix else "") + name
            yield from m.named_modules(memo, sub, remove_duplicate)

    __hash__ = object.__hash__

    # ---- modes and conversions ----------------------------------------------------------
    def train(self, mode: bool = True) -> "Module":
        if not isinstance(mode, bool):
            raise ValueError("training mode is expected to be boolean")
        self.training = mode
        for m in self.children():
            m.train(mode)
        return self

    def eval(self) -> "Module":
        return self.train(False)

    def requires_grad_(self, requires_grad: bool = True) -> "Module":
        for p in self.parameters():
            p.requires_grad_(requires_grad)
        return self

    def zero_grad(self, set_to_none: bool = True) -> None:
        for p in self.parameters():
            if p.grad is None:
                continue
            if set_to_none:
                p.grad = None
            else:
                g = p.grad
                if g.grad_fn is not None:
                    g.detach_()
                else:
                    g.requires_grad_(False)
                g.zero_()

    def apply(self, fn) -> "Module":
        for m in self.children():
            m.apply(fn)
        fn(self)
        return self

    def _apply(self, fn, recurse: bool = True) -> "Module":
        if recurse:
            for m in self.children():
                m._apply(fn)
        for key, param in self._parameters.items():
            if param is None:
                continue
            with _no_grad():
                applied = fn(param)
            param.data = applied
            if param.grad is not None:
                with _no_grad():
                    g = fn(param.grad)
                param._grad = g
        for key, buf in self._buffers.items():
            if buf is not None:
                self._buffers[key] = fn(buf)
        return self

    def to(self, *args, **kwargs) -> "Module":
        device, dtype, non_blocking, memory_format = _parse_to(*args, **kwargs)
        if dtype is not None and dtype.category < D.FLOATING:
            raise TypeError("nn.Module.to only accepts floating point or complex dtypes, but got desired "
                            f"dtype={dtype}")

        def convert(t):
            cast = dtype if dtype is not None and (t.is_floating_point() or t.is_complex()) else None
            if memory_format is not None and t.dim() in (4, 5):      # as PyTorch: 4-d and 5-d tensors only
                return t.to(device, cast, non_blocking, memory_format=memory_format)
            if cast is None and device is None:
                return t
            if cast is None:
                return t.to(device)
            if device is None:
                return t.to(cast)
            return t.to(device, cast)
        return self._apply(convert)

    def cuda(self, device=None) -> "Module":
        dev = Device("cuda" if device is None else (f"cuda:{device}" if isinstance(device, int) else device))
        return self._apply(lambda t: t.to(dev))

    def cpu(self) -> "Module":
        return self._apply(lambda t: t.to("cpu"))

    def type(self, dst_type) -> "Module":
        return self._apply(lambda t: t.to(dst_type))

    def _cast_float(self, dt) -> "Module":
        return self._apply(lambda t: t.to(dt) if t.is_floating_point() else t)

    def float(self) -> "Module":
        return self._cast_float(D.float32)

    def double(self) -> "Module":
        return self._cast_float(D.float64)

    def half(self) -> "Module":
        return self._cast_float(D.float16)

    def bfloat16(self) -> "Module":
        return self._cast_float(D.bfloat16)

    def to_empty(self, *, device=None, recurse: bool = True) -> "Module":
        return self._apply(lambda t: empty_like(t, device=device), recurse=recurse)

    def share_memory(self) -> "Module":
        """Every parameter and buffer moved into memory other processes share (`Tensor.share_memory_`)."""
        return self._apply(lambda t: t.share_memory_())

    # ---- state dict ---------------------------------------------------------------------
    def _save_to_state_dict(self, destination, prefix, keep_vars):
        for name, param in self._parameters.items():
            if param is not None:
                destination[prefix + name] = param if keep_vars else param.detach()
        for name, buf in self._buffers.items():
            if buf is not None and name not in self._non_persistent_buffers_set:
                destination[prefix + name] = buf if keep_vars else buf.detach()
        extra = prefix + _EXTRA_STATE_KEY_SUFFIX
        if type(self).get_extra_state is not Module.get_extra_state:
            destination[extra] = self.get_extra_state()

    def get_extra_state(self):
        raise RuntimeError("Reached a code path in Module.get_extra_state() that should never be called.")

    def set_extra_state(self, state) -> None:
        raise RuntimeError("Reached a code path in Module.set_extra_state() that should never be called.")

    def state_dict(self, *args, destination=None, prefix: str = "", keep_vars: bool = False):
        if args:
            destination = args[0] if len(args) > 0 else destination
            prefix = args[1] if len(args) > 1 else prefix
            keep_vars = args[2] if len(args) > 2 else keep_vars
        if destination is None:
            destination = OrderedDict()
            destination._metadata = OrderedDict()
        if hasattr(destination, "_metadata"):
            destination._metadata[prefix[:-1]] = {"version": self._version}
        for hook in self._state_dict_pre_hooks.values():
            hook(self, prefix, keep_vars)
        self._save_to_state_dict(destination, prefix, keep_vars)
        for name, m in self._modules.items():
            if m is not None:
                m.state_dict(destination=destination, prefix=prefix + name + ".", keep_vars=keep_vars)
        for hook in self._state_dict_hooks.values():
            res = hook(self, destination, prefix, {"version": self._version})
            if res is not None:
                destination = res
        return destination

    def _load_from_state_dict(self, state_dict, prefix, local_metadata, strict, missing_keys,
                              unexpected_keys, error_msgs, assign=False):
        for hook in self._load_state_dict_pre_hooks.values():
            hook(state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys, error_msgs)
        persistent = {k: v for k, v in self._buffers.items() if k not in self._non_persistent_buffers_set}
        local_state = {k: v for k, v in itertools.chain(self._parameters.items(), persistent.items())
                       if v is not None}
        for name, param in local_state.items():
            key = prefix + name
            if key not in state_dict:
                if strict:
                    missing_keys.append(key)
                continue
            src = state_dict[key]
            if not isinstance(src, Tensor):
                error_msgs.append(f'While copying the parameter named "{key}", expected torch.Tensor or '
                                  f"Tensor-like object from checkpoint but received {type(src)}")
                continue
            if param.ndim == 0 and src.ndim == 1 and src.shape[0] == 1:
                src = src.reshape(())
            if tuple(src.shape) != tuple(param.shape):
                error_msgs.append(f"size mismatch for {key}: copying a param with shape {src.shape} from "
                                  f"checkpoint, the shape in current model is {param.shape}.")
                continue
            try:
                with _no_grad():
                    if assign:
                        new = src if isinstance(param, Parameter) is False or isinstance(src, Parameter) \
                            else Parameter(src, requires_grad=param.requires_grad)
                        setattr(self, name, new)
                    else:
                        param.copy_(src)
            except Exception as ex:  # noqa: BLE001 -- reported in the load error, as PyTorch does
                error_msgs.append(f'While copying the parameter named "{key}", whose dimensions in the model '
                                  f"are {param.shape} and whose dimensions in the checkpoint are {src.shape}, "
                                  f"an exception occurred : {ex.args}.")
        extra = prefix + _EXTRA_STATE_KEY_SUFFIX
        if type(self).set_extra_state is not Module.set_extra_state:
            if extra in state_dict:
                self.set_extra_state(state_dict[extra])
            elif strict:
                missing_keys.append(extra)
        if strict:
            for key in state_dict:
                if key.startswith(prefix) and key != extra:
                    parts = key[len(prefix):].split(".", 1)
                    if len(parts) > 1:
                        if parts[0] not in self._modules:
                            unexpected_keys.append(key)
                    elif parts[0] not in local_state:
                        unexpected_keys.append(key)

    def load_state_dict(self, state_dict, strict: bool = True, assign: bool = False):
        if not hasattr(state_dict, "keys") or not hasattr(state_dict, "__getitem__"):
            raise TypeError(f"Expected state_dict to be dict-like, got {type(state_dict)}.")
        missing, unexpected, errors = [], [], []
        metadata = getattr(state_dict, "_metadata", None)
        state_dict = OrderedDict(state_dict)
        if metadata is not None:
            state_dict._metadata = metadata

        def load(module, local_sd, prefix=""):
            meta = {} if metadata is None else metadata.get(prefix[:-1], {})
            module._load_from_state_dict(local_sd, prefix, meta, True, missing, unexpected, errors, assign)
            for name, child in module._modules.items():
                if child is not None:
                    cp = prefix + name + "."
                    load(child, {k: v for k, v in local_sd.items() if k.startswith(cp)}, cp)
            incompatible = _IncompatibleKeys(missing, unexpected)
            for hook in module._load_state_dict_post_hooks.values():
                hook(module, incompatible)

        load(self, state_dict)
        if strict:
            if unexpected:
                errors.insert(0, "Unexpected key(s) in state_dict: {}. ".format(
                    ", ".join(f'"{k}"' for k in unexpected)))
            if missing:
                errors.insert(0, "Missing key(s) in state_dict: {}. ".format(", ".join(f'"{k}"' for k in missing)))
        if errors:
            raise RuntimeError("Error(s) in loading state_dict for {}:\n\t{}".format(
                type(self).__name__, "\n\t".join(errors)))
        return _IncompatibleKeys(missing, unexpected)

    def register_state_dict_pre_hook(self, hook) -> RemovableHandle:
        h = RemovableHandle(self._state_dict_pre_hooks)
        self._state_dict_pre_hooks[h.id] = hook
        return h

    def register_state_dict_post_hook(self, hook) -> RemovableHandle:
        h = RemovableHandle(self._state_dict_hooks)
        self._state_dict_hooks[h.id] = hook
        return h

    _register_state_dict_hook = register_state_dict_post_hook

    def register_load_state_dict_pre_hook(self, hook) -> RemovableHandle:
        h = RemovableHandle(self._load_state_dict_pre_hooks)
        self._load_state_dict_pre_hooks[h.id] = functools.partial(hook, self)
        return h

    def _register_load_state_dict_pre_hook(self, hook, with_module: bool = False) -> RemovableHandle:
        h = RemovableHandle(self._load_state_dict_pre_hooks)
        self._load_state_dict_pre_hooks[h.id] = functools.partial(hook, self) if with_module else hook
        return h

    def register_load_state_dict_post_hook(self, hook) -> RemovableHandle:
        h = RemovableHandle(self._load_state_dict_post_hooks)
        self._load_state_dict_post_hooks[h.id] = hook
        return h

    # ---- hooks and calling --------------------------------------------------------------
    def register_forward_pre_hook(self, hook, *, prepend: bool = False, with_kwargs: bool = False):
        h = RemovableHandle(self._forward_pre_hooks, extra_dict=[self._forward_pre_hooks_with_kwargs])
        self._forward_pre_hooks[h.id] = hook
        if with_kwargs:
            self._forward_pre_hooks_with_kwargs[h.id] = True
        if prepend:
            self._forward_pre_hooks.move_to_end(h.id, last=False)
        return h

    def register_forward_hook(self, hook, *, prepend: bool = False, with_kwargs: bool = False,
                              always_call: bool = False):
        h = RemovableHandle(self._forward_hooks, extra_dict=[self._forward_hooks_with_kwargs,
                                                             self._forward_hooks_always_called])
        self._forward_hooks[h.id] = hook
        if with_kwargs:
            self._forward_hooks_with_kwargs[h.id] = True
        if always_call:
            self._forward_hooks_always_called[h.id] = True
        if prepend:
            self._forward_hooks.move_to_end(h.id, last=False)
        return h

    def register_full_backward_pre_hook(self, hook, prepend: bool = False):
        h = RemovableHandle(self._backward_pre_hooks)
        self._backward_pre_hooks[h.id] = hook
        if prepend:
            self._backward_pre_hooks.move_to_end(h.id, last=False)
        return h

    def register_full_backward_hook(self, hook, prepend: bool = False):
        if self._is_full_backward_hook is False:
            raise RuntimeError("Cannot use both regular backward hooks and full backward hooks on a single "
                               "Module. Please use only one of them.")
        self._is_full_backward_hook = True
        h = RemovableHandle(self._backward_hooks)
        self._backward_hooks[h.id] = hook
        if prepend:
            self._backward_hooks.move_to_end(h.id, last=False)
        return h

    def register_backward_hook(self, hook):
        if self._is_full_backward_hook is True:
            raise RuntimeError("Cannot use both regular backward hooks and full backward hooks on a single "
                               "Module. Please use only one of them.")
        self._is_full_backward_hook = False
        h = RemovableHandle(self._backward_hooks)
        self._backward_hooks[h.id] = hook
        return h

    def _run_pre_hooks(self, args, kwargs):
        for hid, hook in list(self._forward_pre_hooks.items()):
            if hid in self._forward_pre_hooks_with_kwargs:
                res = hook(self, args, kwargs)
                if res is not None:
                    if not (isinstance(res, tuple) and len(res) == 2):
                        raise RuntimeError("forward pre-hook must return None or a tuple of (new_args, "
                                           f"new_kwargs), but got {res}.")
                    args, kwargs = res
            else:
                res = hook(self, args)
                if res is not None:
                    args = res if isinstance(res, tuple) else (res,)
        return args, kwargs

    def _wrap_backward_hooks(self, args):
        """Route grads of the tensor inputs and outputs through identity functions calling the hooks."""
        state = {"grad_output": None}
        idx = [i for i, a in enumerate(args) if isinstance(a, Tensor) and a.requires_grad]

        def on_input_grads(grads):
            res = self._call_backward_hooks(grads, state["grad_output"])
            return res

        if idx:
            fn = _BackwardHookFn.make(on_input_grads)
            wrapped = fn.apply(*[args[i] for i in idx])
            args = list(args)
            for i, w in zip(idx, wrapped):
                args[i] = w
            args = tuple(args)

        def on_output_grads(grads):
            for hook in self._backward_pre_hooks.values():
                res = hook(self, grads)
                if res is not None:
                    grads = tuple(res) if isinstance(res, (tuple, list)) else (res,)
            state["grad_output"] = grads
            if not idx:
                self._call_backward_hooks((None,), grads)
            return grads

        def wrap_outputs(out):
            tensors = [out] if isinstance(out, Tensor) else [o for o in out] if isinstance(out, tuple) else None
            if not tensors or not all(isinstance(t, Tensor) for t in tensors):
                return out
            if not any(t.requires_grad for t in tensors):
                return out
            res = _BackwardHookFn.make(on_output_grads).apply(*tensors)
            res = res if isinstance(res, tuple) else (res,)
            return res[0] if isinstance(out, Tensor) else tuple(res)
        return args, wrap_outputs

    def _call_backward_hooks(self, grad_input, grad_output):
        for hook in self._backward_hooks.values():
            res = hook(self, grad_input, grad_output)
            if res is not None:
                grad_input = tuple(res) if isinstance(res, (tuple, list)) else (res,)
        return grad_input

    def _call_impl(self, *args, **kwargs):
        if not (self._forward_hooks or self._forward_pre_hooks or self._backward_hooks
                or self._backward_pre_hooks):
            return self.forward(*args, **kwargs)
        if self._forward_pre_hooks:
            args, kwargs = self._run_pre_hooks(args, kwargs)
        wrap_outputs = None
        full_bw = (self._backward_hooks and self._is_full_backward_hook) or self._backward_pre_hooks
        if full_bw and _grad_enabled():
            args, wrap_outputs = self._wrap_backward_hooks(args)
        result = self._run_forward_hooks(args, kwargs, self.forward(*args, **kwargs))
        if wrap_outputs is not None:
            result = wrap_outputs(result)
        return result

    def _run_forward_hooks(self, args, kwargs, result):
        for hid, hook in list(self._forward_hooks.items()):
            if hid in self._forward_hooks_with_kwargs:
                res = hook(self, args, kwargs, result)
            else:
                res = hook(self, args, result)
            if res is not None:
                result = res
        return result

    def _wrapped_call_impl(self, *args, **kwargs):
        if not (self._forward_hooks or self._forward_pre_hooks or self._backward_hooks
                or self._backward_pre_hooks or self._compiled_call_impl or _eager_frames_running[0]):
            return self.forward(*args, **kwargs)
        if self._compiled_call_impl is not None:
            return self._compiled_call_impl(*args, **kwargs)
        frames = _compile_thread.eager_frames if _eager_frames_running[0] else None
        if frames and not (_compile_thread.tracing or _compile_thread.disabled):
            compiled = frames[-1](self)      # a compiled frame runs eagerly (skipped): its module calls compile
            if compiled is not None:         # as their own frames, as PyTorch's frame hook sees every frame
                return compiled(*args, **kwargs)
        return self._call_impl(*args, **kwargs)

    __call__ = _wrapped_call_impl

    # ---- repr ---------------------------------------------------------------------------
    def extra_repr(self) -> str:
        return ""

    def _get_name(self) -> str:
        return type(self).__name__

    def __repr__(self) -> str:
        extra = self.extra_repr()
        extra_lines = extra.split("\n") if extra else []
        child_lines = ["(" + k + "): " + _addindent(repr(m), 2) for k, m in self._modules.items()]
        lines = extra_lines + child_lines
        s = self._get_name() + "("
        if lines:
            if len(extra_lines) == 1 and not child_lines:
                s += extra_lines[0]
            else:
                s += "\n  " + "\n  ".join(lines) + "\n"
        return s + ")"

    def compile(self, *args, **kwargs) -> None:
        """Compile this module's calls in place: `flambeau.compile(self._call_impl, *args, **kwargs)`
        runs whenever the module is called from now on (PyTorch's `Module.compile`)."""
        if not _compiler:
            raise RuntimeError("Module.compile: no compiler registered (import flambeau loads flambeau.compiler)")
        self._compiled_call_impl = _compiler[0](self._call_impl, *args, **kwargs)


def _grad_enabled() -> bool:
    return _state.tls.grad_enabled
