"""What a leaf keeps as its first gradient (the engine's AccumulateGrad, `autograd.engine._stealable_or_copy`),
as PyTorch's: the incoming gradient itself when it owns its memory among this backward's leaves and has
the leaf's layout, else a copy in the leaf's layout. A later backward adds into `.grad` in place, so a
gradient shared by two leaves (`x + w`) or an expanded one (`w.sum()`) must not be kept as it is.
"""
import numpy as np
import pytest
import torch

import flambeau
from flambeau.autograd import engine


def _both(fn, *shapes, steps=2):
    """Run `fn(m, *leaves)` backward `steps` times without zeroing, in flambeau and PyTorch."""
    rng = np.random.default_rng(0)
    arrays = [rng.standard_normal(s) for s in shapes]
    out = {}
    for m in (flambeau, torch):
        leaves = [m.tensor(a, requires_grad=True) for a in arrays]
        for _ in range(steps):
            fn(m, *leaves).sum().backward()
        out[m.__name__] = leaves
    return out["flambeau"], out["torch"]


_CASES = {
    "one_gradient_two_leaves": (lambda m, x, w: (x + w) * 3, (3,), (3,)),
    "expanded_sum_gradient": (lambda m, x, w: x.sum() + w * 2, (4, 3), (3,)),
    "same_leaf_twice": (lambda m, x, w: x * 1 + x * 1 + w, (3,), (3,)),
}


@pytest.mark.parametrize("name", sorted(_CASES))
def test_accumulating_over_two_backwards_matches_pytorch(name):
    fn, *shapes = _CASES[name]
    ours, theirs = _both(fn, *shapes)
    for f, t in zip(ours, theirs):
        np.testing.assert_allclose(f.grad.numpy(), t.grad.numpy(), rtol=1e-12, atol=1e-12)
    # no two leaves' gradients share memory
    ptrs = [f.grad.data_ptr() for f in ours]
    assert len(set(ptrs)) == len(ptrs)


def test_views_of_one_gradient_are_not_both_kept():
    """Two leaves whose gradients are views of one array: the second is copied, so two backwards give twice
    the gradient (PyTorch keeps both views, whose storage is shared, and gives three times it here)."""
    x, w = flambeau.ones(2, 3, requires_grad=True), flambeau.ones(3, 2, requires_grad=True)
    for _ in range(2):
        ((x.view(6) + w.reshape(6)) * 3).sum().backward()
    np.testing.assert_array_equal(x.grad.numpy(), np.full((2, 3), 6.0))
    np.testing.assert_array_equal(w.grad.numpy(), np.full((3, 2), 6.0))


def test_a_transposed_leaf_gets_a_gradient_of_its_layout():
    for m in (flambeau, torch):
        a = m.randn(4, 3).t().detach().requires_grad_()
        (a * 2).sum().backward()
        assert a.grad.stride() == a.stride() == (1, 3), m.__name__


def test_a_fresh_gradient_and_disjoint_slices_are_kept_without_a_copy():
    """The common case costs no copy: products' fresh outputs, slices of one buffer (stack's backward)."""
    copies = []
    real = engine._stealable_or_copy

    def spy(var, grad, stored):
        r = real(var, grad, stored)
        copies.append(r is not grad)
        return r
    engine._stealable_or_copy = spy
    try:
        p, q, w = (flambeau.randn(3, 4, requires_grad=True) for _ in range(3))
        (flambeau.stack([p, q]) @ w.t()).sum().backward()
    finally:
        engine._stealable_or_copy = real
    assert copies == [False, False, False], copies


def test_leaves_made_ready_together_accumulate_most_recent_first():
    """One node (cat) makes five leaves ready at once: they accumulate most recently created AccumulateGrad
    first (the queue's order: every AccumulateGrad outranks other nodes, ties by sequence number; PyTorch's
    ties among leaves are its heap's), hooked and plain leaves alike: a post-accumulate hook sees exactly the
    leaves before it in that order with their gradient. The engine runs such leaves without queueing them
    (`engine._run_leaves`); the gradients are PyTorch's."""
    def run(lib):
        ws = [lib.full((2,), float(k), requires_grad=True) for k in range(5)]
        log = []
        for k in (1, 3):
            ws[k].register_post_accumulate_grad_hook(
                lambda p, k=k: log.append((k, [w.grad is not None for w in ws])))
        ws[2].register_hook(lambda g: g * 3)
        out = lib.cat(ws)
        nodes = [n for n, _ in out.grad_fn.next_functions]
        out.mul(lib.arange(10.0)).sum().backward()
        return log, [w.grad.tolist() for w in ws], nodes
    log, grads, nodes = run(flambeau)
    assert grads == run(torch)[1]
    order = sorted(range(5), key=lambda k: -nodes[k]._sequence_nr)
    assert order != list(range(5))
    expected = [(k, [j in order[:order.index(k) + 1] for j in range(5)]) for k in order if k in (1, 3)]
    assert log == expected
