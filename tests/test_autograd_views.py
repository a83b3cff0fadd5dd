"""Autograd of views whose base is modified in place, against PyTorch: the view's `grad_fn` read
directly is regenerated on the base's new value (AsStridedBackward0), and a view of a tensor that
did not require grad requires grad once its base is modified in place by one that does."""
import numpy as np
import pytest
import torch

import flambeau as fl


def _name(node):
    """A node's name (PyTorch's nodes and flambeau's both have `name()`)."""
    return None if node is None else node.name()


@pytest.mark.parametrize("inplace", ["mul_", "add_", "setitem"])
def test_view_grad_fn_read_after_an_inplace_op_on_its_base(inplace):
    """`v.grad_fn` read directly after `b.mul_(3)` is AsStridedBackward0 on b's new node, as PyTorch's
    (it was the stale SliceBackward0 on b's old one), and the gradient through it is PyTorch's."""
    def run(m):
        w = m.tensor([1.0, 2.0, 3.0], requires_grad=True)
        b = w * 2
        v = b[:2]
        before = v.grad_fn
        if inplace == "mul_":
            b.mul_(3)
        elif inplace == "add_":
            b.add_(w)
        else:
            b[2] = w[0] * 5
        after = v.grad_fn
        linked = after.next_functions[0][0] is b.grad_fn
        g, = m.autograd.grad((v * m.tensor([1.0, 10.0])).sum(), w)
        return before, after, linked, g.numpy()
    tb, ta, tlinked, tg = run(torch)
    fb, fa, flinked, fg = run(fl)
    assert (_name(fb), _name(fa)) == (_name(tb), _name(ta)) == ("SliceBackward0", "AsStridedBackward0")
    assert fa is not fb and flinked and tlinked
    np.testing.assert_array_equal(fg, tg)


def test_view_grad_fn_unchanged_without_an_inplace_op():
    w = fl.ones(3, requires_grad=True)
    v = (w * 2)[1:]
    assert v.grad_fn is v.grad_fn and v.grad_fn.name() == "SliceBackward0"


@pytest.mark.parametrize("through", ["base", "sibling view"])
def test_view_requires_grad_after_its_base_is_modified_by_a_tensor_that_does(through):
    """`a = zeros(3); v = a[:2]; a.add_(w)`, w requiring grad: v requires grad and its gradient reaches w,
    as in PyTorch (v stayed a constant: requires_grad False, and grad() raised)."""
    def run(m):
        a = m.zeros(4)
        v = a[:2]
        w = m.tensor([1.0, 2.0, 3.0, 4.0], requires_grad=True)
        if through == "base":
            a.add_(w)
        else:
            a[1:].mul_(w[1:])
        rg, name, leaf = v.requires_grad, _name(v.grad_fn), v.is_leaf
        g, = m.autograd.grad((v * m.tensor([3.0, 5.0])).sum(), w, allow_unused=True)
        return rg, name, leaf, None if g is None else g.numpy()
    ref, res = run(torch), run(fl)
    assert res[:3] == ref[:3]
    np.testing.assert_array_equal(res[3], ref[3])


def test_view_used_in_an_op_after_its_base_gains_grad():
    """The dispatcher sees the stale view as requiring grad: an op of it records a node (no read of
    `requires_grad` first)."""
    a = fl.zeros(3)
    v = a[1:]
    w = fl.tensor([1.0, 2.0, 3.0], requires_grad=True)
    a.add_(w)
    out = v * 4
    assert out.requires_grad
    g, = fl.autograd.grad(out.sum(), w)
    np.testing.assert_array_equal(g.numpy(), [0.0, 4.0, 4.0])


def test_detached_views_stay_constant_after_an_inplace_op():
    """A view made by detach() does not start requiring grad when its base is modified in place by a
    tensor that requires grad (PyTorch: detach is not a differentiable view)."""
    for m in (fl, torch):
        a = m.zeros(3)
        v = a[:2].detach()
        a.add_(m.ones(3, requires_grad=True))
        assert not v.requires_grad and v.grad_fn is None and not (v * 2).requires_grad


def _no_grad_view_cases():
    def base_then_use(m, a, b, v):
        b.mul_(3)
        return v * 2

    def base_under_no_grad_then_use(m, a, b, v):
        with m.no_grad():
            b.mul_(3)
        return v.clone()

    def sibling_then_use(m, a, b, v):
        b[2:].add_(1)
        return v[0]

    def grad_fn_read_under_no_grad(m, a, b, v):
        b.mul_(3)
        with m.no_grad():
            return v.grad_fn

    def view_of_it_in_grad_mode(m, a, b, v):
        w = v.view(2)
        b.mul_(3)
        return w * 2

    def written_itself(m, a, b, v):
        return v.mul_(2)

    def view_of_it_written(m, a, b, v):
        return v.view(2).mul_(2)

    def used_under_no_grad(m, a, b, v):          # no error
        b.mul_(3)
        with m.no_grad():
            return v * 2

    def base_requires_no_grad(m, a, b, v):       # no error
        a2 = m.ones(3)
        with m.no_grad():
            v2 = a2[:2]
        a2.mul_(3)
        return v2 * 2
    return {f.__name__: f for f in (base_then_use, base_under_no_grad_then_use, sibling_then_use,
                                    grad_fn_read_under_no_grad, view_of_it_in_grad_mode, written_itself,
                                    view_of_it_written, used_under_no_grad, base_requires_no_grad)}


_NO_GRAD_VIEW_CASES = _no_grad_view_cases()


@pytest.mark.parametrize("case", sorted(_NO_GRAD_VIEW_CASES))
def test_view_made_under_no_grad_then_its_base_modified_raises_as_pytorch(case):
    """A view made under no_grad of a tensor that requires grad (or a view of such a view), once it or
    its base is modified in place, raises PyTorch's RuntimeError when autograd would use it (an op in
    grad mode, its grad_fn read) or when it is written in place in grad mode; used under no_grad, or
    of a base that requires no grad, it is no error (flambeau regenerated its grad_fn silently)."""
    fn = _NO_GRAD_VIEW_CASES[case]
    outcomes = []
    for m in (torch, fl):
        a = m.ones(3, requires_grad=True)
        b = a * 2
        with m.no_grad():
            v = b[:2]
        try:
            fn(m, a, b, v)
            outcomes.append(None)
        except RuntimeError as e:
            outcomes.append(str(e))
    assert outcomes[1] == outcomes[0]
