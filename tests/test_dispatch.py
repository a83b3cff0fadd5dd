"""TorchDispatchMode: user modes see every op (forward and backward), can change results, nest."""
import pytest
import torch

import flambeau as fl
from flambeau.utils._python_dispatch import TorchDispatchMode, _get_current_dispatch_mode


def _names(ops):
    return [str(o).split(".")[1] for o in ops]


def _logging_mode(mod):
    class Log(mod.utils._python_dispatch.TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.ops = []

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            self.ops.append(func)
            return func(*args, **(kwargs or {}))
    return Log


def test_logging_mode_sees_forward_and_backward():
    import torch.utils._python_dispatch  # noqa: F401
    logs = {}
    for mod in (fl, torch):
        Log = _logging_mode(mod)
        x = mod.tensor([1.0, 2.0, 3.0], requires_grad=True)
        with Log() as m:
            y = (x * x).exp().sum()
            fw = len(m.ops)
            y.backward()
        logs[mod.__name__] = (_names(m.ops[:fw]), _names(m.ops[fw:]))
        assert mod.allclose(x.grad, 2 * x.detach() * (x.detach() * x.detach()).exp())
    fwd, bwd = logs["flambeau"]
    assert fwd == ["mul", "exp", "sum"] == [n for n in logs["torch"][0] if n != "detach"]
    # backward runs derivative formulas through the dispatcher too: mul (exp's and mul's) ops appear
    assert "mul" in bwd and len(bwd) >= 3
    assert fwd and bwd


def test_mode_is_popped_inside_handler_and_restored():
    seen = []

    class M(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            seen.append(_get_current_dispatch_mode())
            return func(*args, **(kwargs or {}))

    with M() as m:
        assert _get_current_dispatch_mode() is m
        fl.tensor([1.0]) + fl.tensor([2.0])
    assert seen and all(s is None for s in seen)
    assert _get_current_dispatch_mode() is None


def test_mode_types_argument():
    got = []

    class M(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            got.append(types)
            return func(*args, **(kwargs or {}))

    with M():
        fl.tensor([1.0]) * fl.tensor([2.0])
    assert got[-1] == (fl.Tensor,)


def _swap_mode(mod):
    class Swap(mod.utils._python_dispatch.TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            if str(func).split(".")[1] == "add":
                return mod.sub(*args, **(kwargs or {}))
            return func(*args, **(kwargs or {}))
    return Swap


def test_mode_can_change_results():
    import torch.utils._python_dispatch  # noqa: F401
    for mod in (fl, torch):
        a, b = mod.tensor([5.0, 7.0]), mod.tensor([1.0, 2.0])
        with _swap_mode(mod)():
            r = a + b
        assert r.tolist() == [4.0, 5.0]
        assert (a + b).tolist() == [6.0, 9.0]


def test_nested_modes_innermost_first():
    import torch.utils._python_dispatch  # noqa: F401
    for mod in (fl, torch):
        order = []

        def make(tag):
            class M(mod.utils._python_dispatch.TorchDispatchMode):
                def __torch_dispatch__(self, func, types, args=(), kwargs=None):
                    order.append(tag)
                    return func(*args, **(kwargs or {}))
            return M

        Outer, Inner = make("outer"), make("inner")
        with Outer(), Inner():
            mod.tensor([1.0]).mul(2.0)
        assert order[-2:] == ["inner", "outer"], mod.__name__


def test_nested_swap_then_log():
    """The outer logging mode sees what the inner mode forwards (sub, not add)."""
    Log = _logging_mode(fl)
    Swap = _swap_mode(fl)
    with Log() as log, Swap():
        r = fl.tensor([3.0]) + fl.tensor([1.0])
    assert r.tolist() == [2.0]
    assert "sub" in _names(log.ops) and "add" not in _names(log.ops)


def test_mode_exit_on_exception_restores_stack():
    class Boom(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            raise ValueError("boom")

    with pytest.raises(ValueError):
        with Boom():
            fl.tensor([1.0]) + 1
    assert _get_current_dispatch_mode() is None
    assert (fl.tensor([1.0]) + 1).tolist() == [2.0]
