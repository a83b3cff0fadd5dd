"""Graph breaks and continuations, side effects, generators and exceptions, vs PyTorch's TorchDynamo.

Each compiled function must behave exactly as the eager one (values, printed output, mutations,
raised exceptions); graph counts are PyTorch's.
"""
from __future__ import annotations

import traceback

import pytest

from tests.test_dynamo import lib, Counter, compiled, same  # noqa: F401


# ---- breaks and continuation --------------------------------------------------------------------------
def test_print_in_the_middle(lib, capsys):
    def f(x):
        a = x.sin() + 1
        print("midway", a.shape[0])
        return a.cos() * 2

    cf, cnt = compiled(lib, f)
    x = lib.randn(4)
    same(lib, cf(x), f(x))
    assert capsys.readouterr().out == "midway 4\nmidway 4\n"
    assert cnt.frame_count == 2
    cf(x)
    assert cnt.frame_count == 2


def test_item_feeding_control_flow(lib):
    def f(x):
        s = x.sum().item()
        if s > 0:
            return x * s
        return x - s

    cf, cnt = compiled(lib, f)
    for x in (lib.ones(3), -lib.ones(3)):
        same(lib, cf(x), f(x))
    assert cnt.frame_count == 3


def test_data_dependent_branch_on_a_tensor(lib):
    def f(x):
        y = x * 2
        if y.sum() > 0:
            z = y + 1
        else:
            z = y - 1
        return z.relu()

    cf, cnt = compiled(lib, f)
    pos, neg = lib.ones(3), -lib.ones(3)
    same(lib, cf(pos), f(pos))
    assert cnt.frame_count == 2
    same(lib, cf(neg), f(neg))
    assert cnt.frame_count == 3
    same(lib, cf(pos), f(pos))
    assert cnt.frame_count == 3


def test_break_in_a_nested_call(lib, capsys):
    def inner(t):
        t = t + 1
        print("inner")
        return t * 3

    def f(x):
        y = x.cos()
        z = inner(y)
        return z - x

    cf, cnt = compiled(lib, f)
    x = lib.randn(3)
    same(lib, cf(x), f(x))
    assert capsys.readouterr().out == "inner\ninner\n"
    assert cnt.frame_count == 4


def test_break_inside_a_loop(lib, capsys):
    def f(x):
        for i in range(3):
            x = x + i
            print(i)
        return x * 2

    cf, cnt = compiled(lib, f)
    x = lib.randn(2)
    same(lib, cf(x), f(x))
    assert cnt.frame_count == 0


def test_break_inside_no_grad_block(lib, capsys):
    def f(x):
        with lib.no_grad():
            y = x * 2
            print("in block")
            z = y + x
        return z, x * 3

    cf, cnt = compiled(lib, f)
    x = lib.randn(3, requires_grad=True)
    z, w = cf(x)
    assert not z.requires_grad and w.requires_grad
    assert lib.is_grad_enabled()
    same(lib, (z, w), f(x))
    assert cnt.frame_count == 2


def test_break_with_keyword_call_and_live_stack(lib, capsys):
    def f(x):
        return lib.cat([x.sin(), _show(x, sep="-")], dim=0) + 1

    cf, cnt = compiled(lib, f)
    x = lib.randn(2)
    same(lib, cf(x), f(x))
    assert capsys.readouterr().out == "x-x\n" * 2
    assert cnt.frame_count == 3          # _show is compiled as its own frame (its part after print)


def _show(x, sep):
    print("x", "x", sep=sep)
    return x * 2


def test_explicit_graph_break(lib):
    def f(x):
        x = x + 1
        lib._dynamo.graph_break()
        return x + 2

    cf, cnt = compiled(lib, f)
    x = lib.randn(2)
    same(lib, cf(x), f(x))
    assert cnt.frame_count == 2


def test_disable_runs_eagerly_and_breaks(lib):
    calls = []

    @lib._dynamo.disable
    def eager_only(t):
        calls.append(1)
        return t + 1

    def f(x):
        return eager_only(x * 2) * 3

    cf, cnt = compiled(lib, f)
    x = lib.randn(2)
    same(lib, cf(x), f(x))
    assert cnt.frame_count == 2 and len(calls) == 2


def test_unknown_object_construction_breaks(lib):
    class Box:
        def __init__(self, v):
            self.v = v

    def f(x):
        b = Box(x + 1)
        return b.v * 2

    cf, cnt = compiled(lib, f)
    x = lib.randn(2)
    same(lib, cf(x), f(x))


def test_tolist_breaks(lib):
    def f(x):
        vals = (x * 2).tolist()
        return x + len(vals)

    cf, cnt = compiled(lib, f)
    x = lib.randn(3)
    same(lib, cf(x), f(x))
    assert cnt.frame_count == 2


# ---- side effects ----------------------------------------------------------------------------------
def test_list_append_and_dict_set_on_inputs(lib):
    def f(x, acc, d):
        acc.append(x + 1)
        d["y"] = x * 2
        return x.sum()

    cf, cnt = compiled(lib, f)
    x = lib.randn(3)
    acc, d = [], {"a": 1}
    acc2, d2 = [], {"a": 1}
    same(lib, cf(x, acc, d), f(x, acc2, d2))
    assert len(acc) == 1 and list(d) == ["a", "y"]
    same(lib, acc[0], acc2[0])
    same(lib, d["y"], d2["y"])
    assert cnt.frame_count == 1


def test_side_effects_before_a_break_are_visible(lib, capsys):
    def f(x, log):
        log.append("before")
        print(len(log))
        log.append("after")
        return x + 1

    cf, cnt = compiled(lib, f)
    log = []
    cf(lib.randn(2), log)
    assert log == ["before", "after"]
    assert capsys.readouterr().out == "1\n"


def test_module_attribute_assignment(lib):
    nn = lib.nn

    class M(nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = nn.Linear(2, 2)
            self.calls = 0

        def forward(self, x):
            self.calls = self.calls + 1
            self.last = x * 2
            return self.lin(x)

    m = M()
    cf, cnt = compiled(lib, m)
    x = lib.randn(2, 2)
    cf(x)
    assert m.calls == 1
    same(lib, m.last, x * 2)


def test_object_attribute_assignment_and_global_write(lib):
    class State:
        pass

    st = State()
    st.n = 0

    def f(x, s):
        global _COUNTER
        s.n = s.n + 1
        s.out = x.abs()
        _COUNTER = _COUNTER + 1
        return x - 1

    global _COUNTER
    _COUNTER = 0
    cf, cnt = compiled(lib, f)
    x = lib.randn(3)
    cf(x, st)
    assert st.n == 1 and _COUNTER == 1
    same(lib, st.out, x.abs())


_COUNTER = 0


def test_aliasing_preserved_in_outputs(lib):
    def f(x):
        lst = [x + 1]
        return lst, lst

    cf, _ = compiled(lib, f)
    a, b = cf(lib.randn(2))
    assert a is b


def test_list_mutation_then_break(lib, capsys):
    def f(x, items):
        items.append(x * 2)
        print(len(items))
        items.append(x * 3)
        return items[-1] + items[-2]

    cf, _ = compiled(lib, f)
    x = lib.randn(2)
    a, b = [], []
    same(lib, cf(x, a), f(x, b))
    assert len(a) == 2


# ---- generators, exceptions -------------------------------------------------------------------------
def test_generator_function_runs_eagerly(lib):
    def gen(x):
        for i in range(3):
            yield x + i

    cg, cnt = compiled(lib, gen)
    x = lib.randn(2)
    outs = list(cg(x))
    assert len(outs) == 3
    same(lib, outs[2], x + 2)
    assert cnt.frame_count == 0


def test_calling_a_generator_from_compiled_code(lib):
    def gen(x):
        yield x + 1
        yield x + 2

    def f(x):
        return [t * 2 for t in gen(x)]

    cf, cnt = compiled(lib, f)
    x = lib.randn(2)
    same(lib, cf(x), f(x))


def test_exception_surfaces_with_user_traceback(lib):
    def f(x):
        y = x + 1
        if y.shape[0] == 3:
            raise ValueError("bad size")
        return y

    cf, cnt = compiled(lib, f)
    with pytest.raises(ValueError, match="bad size") as ei:
        cf(lib.randn(3))
    lines = "".join(traceback.format_tb(ei.tb))
    assert 'raise ValueError("bad size")' in lines


def test_shape_error_surfaces_as_eager_would(lib):
    def f(x, y):
        return x @ y

    cf, _ = compiled(lib, f)
    with pytest.raises(RuntimeError):
        cf(lib.randn(2, 3), lib.randn(4, 5))


def test_try_except_around_tensor_code(lib):
    def f(x):
        try:
            y = x * 2
        except RuntimeError:
            y = x
        return y + 1

    cf, cnt = compiled(lib, f)
    x = lib.randn(2)
    same(lib, cf(x), f(x))
    assert cnt.frame_count == 1


def test_break_in_a_frame_with_closure_cells(lib, capsys):
    def f(x):
        acc = x + 1

        def add(t):
            return t + acc
        y = add(x)
        print("hi")
        acc = acc * 10
        return add(y) * 2, add

    cf, cnt = compiled(lib, f)
    x = lib.randn(3)
    (a, fa), (b, fb) = cf(x), f(x)
    same(lib, a, b)
    same(lib, fa(x), fb(x))
    assert cnt.frame_count == 2


def test_nonlocal_counter_across_a_break(lib, capsys):
    def f(x):
        n = 0

        def bump():
            nonlocal n
            n += 1
        bump()
        print("g")
        bump()
        return x * n

    cf, _ = compiled(lib, f)
    x = lib.randn(3)
    same(lib, cf(x), f(x))
