"""`opcheck(op, args, kwargs)`: test a custom operator's registrations as PyTorch's
`torch.library.opcheck` does, returning `{test name: "SUCCESS" | exception}`.

  test_schema                 the op writes only the arguments its schema marks mutable, and its
                              outputs alias no input
  test_autograd_registration  with an input requiring grad, a differentiable output gets a grad_fn
                              from a registered backward (not from tracing through the kernel)
  test_faketensor             the fake function gives the real outputs' shapes, dtypes and strides
  test_aot_dispatch_dynamic   compiled through AOT autograd with dynamic shapes (registered by the
                              compiler layer, `register_opcheck_test`): outputs and gradients equal eager's
"""
from __future__ import annotations

from typing import Callable, Sequence

import numpy as np

from .._tensor import Tensor
from .._subclasses.fake_tensor import FakeTensorMode
from ..autograd import grad as autograd_grad
from .custom_ops import CustomOp, CustomOpDef, OpOverloadPacket

__all__ = ["opcheck", "OpCheckError", "register_opcheck_test", "DEFAULT_TEST_UTILS"]

DEFAULT_TEST_UTILS = ("test_schema", "test_autograd_registration", "test_faketensor", "test_aot_dispatch_dynamic")
_TESTS: dict[str, Callable] = {}


class OpCheckError(Exception):
    pass


def register_opcheck_test(name: str, fn: Callable) -> None:
    """`fn(op, args, kwargs, *, rtol, atol)` raises when `op` fails the test `name` (a higher layer's check)."""
    _TESTS[name] = fn


def _tensors(x) -> list:
    if isinstance(x, Tensor):
        return [x]
    if isinstance(x, (list, tuple)):
        return [t for v in x for t in _tensors(v)]
    if isinstance(x, dict):
        return [t for v in x.values() for t in _tensors(v)]
    return []


def _clone(x):
    if isinstance(x, Tensor):
        c = x.detach().clone()
        c.requires_grad_(x.requires_grad)
        return c
    if isinstance(x, (list, tuple)):
        return type(x)(_clone(v) for v in x)
    if isinstance(x, dict):
        return {k: _clone(v) for k, v in x.items()}
    return x


def assert_close(actual, expected, rtol, atol, what: str) -> None:
    a, e = _tensors(actual), _tensors(expected)
    if len(a) != len(e):
        raise AssertionError(f"{what}: {len(a)} tensors, expected {len(e)}")
    for x, y in zip(a, e):
        if tuple(x.shape) != tuple(y.shape) or x.dtype != y.dtype:
            raise AssertionError(f"{what}: got shape {tuple(x.shape)} {x.dtype}, expected {tuple(y.shape)} {y.dtype}")
        r, t = (rtol, atol) if rtol is not None else (1.3e-6, 1e-5)
        np.testing.assert_allclose(x.detach().cpu().numpy(), y.detach().cpu().numpy(), rtol=r, atol=t, err_msg=what)


def _schema_check(op: CustomOp, args, kwargs, *, rtol=None, atol=None) -> None:
    bound = op.bind(*args, **kwargs)
    before = [[t.detach().cpu().numpy().copy() for t in _tensors(v)] for v in bound]
    work = _clone(args), _clone(kwargs)
    wb = op.bind(*work[0], **work[1])
    out = op(*work[0], **work[1])
    inputs = {id(t._data) for v in wb for t in _tensors(v)}
    for o in _tensors(out):
        if id(o._data) in inputs or id(getattr(o._data, "base", None)) in inputs:
            raise RuntimeError(f"{op.qualname}: output aliases an input, which its schema {op._schema} does not allow")
    for i, (arg, old, new) in enumerate(zip(op._schema.args, before, wb)):
        changed = any(not np.array_equal(a, t.detach().cpu().numpy(), equal_nan=True)
                      for a, t in zip(old, _tensors(new)))
        if changed and not arg.mutated:
            raise RuntimeError(f"{op.qualname}: Argument {arg.name} is not defined as mutable but was mutated")


def _autograd_registration_check(op: CustomOp, args, kwargs, *, rtol=None, atol=None) -> None:
    if not any(t.requires_grad for t in _tensors((args, kwargs))):
        raise RuntimeError("autograd_registration_check: no inputs have requires_grad=True so we are unable to "
                           "actually perform this test. Please pass inputs that do require grad.")
    if op.backward_fn is not None or op.decomposition is not None or op.owner is not None:
        return      # custom_op always has an autograd kernel (one that raises without register_autograd)
    outs = [o for o in _tensors(op(*_clone(args), **_clone(kwargs))) if o.requires_grad]
    if outs:
        raise AssertionError(f"{op.qualname}: at least one output of this operator has requires_grad=True but "
                             f"the operator does not have an autograd kernel defined at an autograd key (e.g. "
                             f"DispatchKey::Autograd). This could mean that you have incorrectly registered an "
                             f"autograd kernel to a non-Autograd DispatchKey, which may lead to silently incorrect "
                             f"results. If your operator consists of regular PyTorch operations, consider not "
                             f"using an operator at all or registering your operator as "
                             f"CompositeImplicitAutograd. If you have an autograd.Function registered to a backend "
                             f"(CPU/CUDA/XPU) key, the correct location for it is the Autograd key.")


def _fake_tree(mode: FakeTensorMode, x):
    if isinstance(x, Tensor):
        return mode.from_tensor(x)
    if isinstance(x, (list, tuple)):
        return type(x)(_fake_tree(mode, v) for v in x)
    if isinstance(x, dict):
        return {k: _fake_tree(mode, v) for k, v in x.items()}
    return x


def _faketensor_check(op: CustomOp, args, kwargs, *, rtol=None, atol=None) -> None:
    real = op(*_clone(args), **_clone(kwargs))
    mode = FakeTensorMode()
    fa, fk = _fake_tree(mode, _clone(args)), _fake_tree(mode, _clone(kwargs))
    with mode:
        fake = op(*fa, **fk)
    r, f = _tensors(real), _tensors(fake)
    if len(r) != len(f):
        raise AssertionError(f"{op.qualname}: the fake function returned {len(f)} tensors, the kernel {len(r)}")
    for i, (x, y) in enumerate(zip(r, f)):
        if tuple(x.shape) != tuple(y.shape) or x.dtype != y.dtype or x.device != y.device:
            raise AssertionError(f"{op.qualname}: output {i}: the fake function gives shape {tuple(y.shape)}, "
                                 f"{y.dtype} on {y.device}; the kernel gives {tuple(x.shape)}, {x.dtype} on "
                                 f"{x.device}")
        if x.numel() > 1 and tuple(x.stride()) != tuple(y.stride()):
            raise AssertionError(f"{op.qualname}: output {i}: the fake function gives strides {tuple(y.stride())}, "
                                 f"the kernel {tuple(x.stride())}")


def outputs_and_grads(fn: Callable, args, kwargs) -> tuple:
    """`fn`'s outputs on copies of the inputs, and the gradients of their sum with respect to the
    inputs requiring grad."""
    a, k = _clone(args), _clone(kwargs)
    out = fn(*a, **k)
    inputs = [t for t in _tensors((a, k)) if t.requires_grad]
    diff = [o for o in _tensors(out) if o.requires_grad]
    if not inputs or not diff:
        return out, ()
    total = sum(o.sum() for o in diff)
    return out, autograd_grad(total, inputs, allow_unused=True)


register_opcheck_test("test_schema", _schema_check)
register_opcheck_test("test_autograd_registration", _autograd_registration_check)
register_opcheck_test("test_faketensor", _faketensor_check)


def opcheck(op, args: tuple, kwargs: dict | None = None, *, test_utils: str | Sequence[str] = DEFAULT_TEST_UTILS,
            raise_exception: bool = True, rtol: float | None = None, atol: float | None = None) -> dict:
    """Run `test_utils` on `op(*args, **kwargs)` (see the module docstring)."""
    if (rtol is None) ^ (atol is None):
        raise ValueError("opcheck(op, ...): if you specify one of rtol/atol, you must specify both")
    kwargs = kwargs or {}
    if isinstance(op, CustomOpDef):
        op = op._opoverload
    if isinstance(op, OpOverloadPacket):
        op = op.default
    if not isinstance(op, CustomOp):
        raise ValueError(f"opcheck(op, ...): op must be instance of torch._ops.OpOverload, e.g. "
                         f"torch.ops.aten.sin.default, got {type(op)}")
    if test_utils == "ALL":
        test_utils = tuple(_TESTS)
    if isinstance(test_utils, str):
        test_utils = (test_utils,)
    if not isinstance(test_utils, (tuple, list)) or not set(test_utils).issubset(_TESTS):
        raise ValueError(f"opcheck(op, ..., test_utils={test_utils}), expected test_utils to be subset of "
                         f"{tuple(_TESTS)} but it was not")
    results = {}
    for name in test_utils:
        try:
            _TESTS[name](op, args, kwargs, rtol=rtol, atol=atol)
            results[name] = "SUCCESS"
        except Exception as ex:
            if raise_exception:
                raise OpCheckError(f"opcheck(op, ...): {name} failed with {ex} (scroll up for stack trace)") from ex
            results[name] = ex
    return results
