"""DTensor op cases shared by the worker (tests/dist_workers/dtensor.py, where `torch` is flambeau) and
the test (tests/test_distributed_dtensor.py, where `torch` is PyTorch and computes the reference on the
whole tensors): each case is (name, fn, [(shape, placement), ...], differentiable).

Placements are written as strings ("S0", "S1", "R"; "plain": a torch.Tensor, not distributed) so both sides
can read them; shapes are uneven
for 2 and 3 ranks on purpose (torch.chunk's cut leaves short and empty pieces).
"""
import numpy as np

def inputs(case_name: str, specs, ints=()):
    """The whole input tensors of a case as NumPy arrays (deterministic per case and position)."""
    out = []
    for i, (shape, _) in enumerate(specs):
        g = np.random.default_rng(_seed(case_name, i))
        if i in ints:
            out.append(g.integers(0, ints[i], size=shape).astype(np.int64))
        else:
            out.append(g.standard_normal(shape).astype(np.float64))
    return out


def _seed(name: str, i: int) -> int:
    return sum((k + 1) * ord(c) for k, c in enumerate(name)) * 31 + i


def _ln(torch, x, w, b):
    return torch.nn.functional.layer_norm(x, (x.shape[-1],), w, b)


# name -> (fn(torch, *tensors), [(shape, placement)], differentiable, {position: int upper bound})
CASES = {
    "add_s0_s0": (lambda torch, a, b: a + b, [((5, 7), "S0"), ((5, 7), "S0")], True, {}),
    "add_s0_r": (lambda torch, a, b: a + b, [((5, 7), "S0"), ((5, 7), "R")], True, {}),
    "add_bcast_s1": (lambda torch, a, b: a + b, [((5, 7), "S1"), ((7,), "R")], True, {}),
    "add_bcast_sharded_vec": (lambda torch, a, b: a - 2 * b, [((5, 7), "R"), ((7,), "S0")], True, {}),
    "mul_div_neg": (lambda torch, a, b: -(a * b) / (b * b + 1), [((5, 7), "S1"), ((5, 7), "S0")], True, {}),
    "tanh_exp_gelu_relu": (lambda torch, a: torch.nn.functional.gelu(torch.tanh(a)) + torch.relu(a).exp(),
                           [((5, 7), "S0")], True, {}),
    "sum_dim_sharded": (lambda torch, a: a.sum(0), [((5, 7), "S0")], True, {}),
    "sum_dim_kept": (lambda torch, a: a.sum(1, keepdim=True), [((5, 7), "S0")], True, {}),
    "sum_all": (lambda torch, a: a.sum(), [((5, 7), "S1")], True, {}),
    "mean_uneven": (lambda torch, a: a.mean(0), [((5, 7), "S0")], True, {}),
    "mean_all": (lambda torch, a: a.mean(), [((5, 7), "S1")], True, {}),
    "amax_sharded": (lambda torch, a: a.amax(1), [((5, 7), "S1")], False, {}),
    "mm_s0_r": (lambda torch, a, b: a @ b, [((5, 4), "S0"), ((4, 7), "R")], True, {}),
    "mm_r_s1": (lambda torch, a, b: torch.mm(a, b), [((5, 4), "R"), ((4, 7), "S1")], True, {}),
    "mm_s1_s0_partial": (lambda torch, a, b: torch.mm(a, b), [((5, 4), "S1"), ((4, 7), "S0")], True, {}),
    "mm_s0_s0": (lambda torch, a, b: torch.mm(a, b), [((5, 4), "S0"), ((4, 7), "S0")], True, {}),
    "addmm": (lambda torch, c, a, b: torch.addmm(c, a, b, beta=0.5, alpha=2.0),
              [((7,), "R"), ((5, 4), "S1"), ((4, 7), "S0")], True, {}),
    "bmm": (lambda torch, a, b: torch.bmm(a, b), [((3, 5, 4), "S0"), ((3, 4, 2), "S0")], True, {}),
    "linear_colwise": (lambda torch, x, w, b: torch.nn.functional.linear(x, w, b),
                       [((2, 5, 4), "R"), ((7, 4), "S0"), ((7,), "S0")], True, {}),
    "linear_rowwise": (lambda torch, x, w, b: torch.nn.functional.linear(x, w, b),
                       [((2, 5, 4), "S2"), ((7, 4), "S1"), ((7,), "R")], True, {}),
    "matmul_3d_2d": (lambda torch, a, b: torch.matmul(a, b), [((3, 5, 4), "S1"), ((4, 6), "R")], True, {}),
    "view_split_heads": (lambda torch, a: a.view(2, 3, 4, 2).transpose(1, 2).reshape(2, 4, 6),
                         [((2, 3, 8), "S2")], True, {}),
    "reshape_merge": (lambda torch, a: a.reshape(6, 5), [((6, 5), "S0")], True, {}),
    "permute_t": (lambda torch, a: a.permute(2, 0, 1).sum(0).t(), [((3, 5, 4), "S2")], True, {}),
    "split_unsqueeze": (lambda torch, a: a.split(3, dim=1)[1].unsqueeze(0) * 2, [((5, 7), "S0")], True, {}),
    "embedding_rows": (lambda torch, w, i: torch.nn.functional.embedding(i, w), [((11, 4), "S0"), ((3, 5), "R")],
                       True, {1: 11}),
    "embedding_cols": (lambda torch, w, i: torch.nn.functional.embedding(i, w), [((11, 4), "S1"), ((3, 5), "R")],
                       True, {1: 11}),
    "embedding_ids": (lambda torch, w, i: torch.nn.functional.embedding(i, w), [((11, 4), "R"), ((5, 3), "S0")],
                      True, {1: 11}),
    "layer_norm": (_ln, [((5, 3, 6), "S0"), ((6,), "R"), ((6,), "R")], True, {}),
    "softmax_other_dim": (lambda torch, a: torch.softmax(a, -1), [((5, 7), "S0")], True, {}),
    "log_softmax_same_dim": (lambda torch, a: torch.log_softmax(a, 0), [((5, 7), "S0")], True, {}),
    "cross_entropy_mean": (lambda torch, x, t: torch.nn.functional.cross_entropy(x, t),
                           [((7, 5), "S0"), ((7,), "S0")], True, {1: 5}),
    "cross_entropy_sum": (lambda torch, x, t: torch.nn.functional.cross_entropy(x, t, reduction="sum"),
                          [((7, 5), "S0"), ((7,), "S0")], True, {1: 5}),
    "cross_entropy_none": (lambda torch, x, t: torch.nn.functional.cross_entropy(x, t, reduction="none"),
                           [((7, 5), "S0"), ((7,), "S0")], True, {1: 5}),
    "fallback_cumsum": (lambda torch, a: torch.cumsum(a, 0), [((5, 7), "S0")], True, {}),
    "slice_sharded_dim": (lambda torch, a: a[1:4] * 1.5, [((5, 7), "S0")], True, {}),
    "slice_other_dim_step": (lambda torch, a: a[:, 1:6:2], [((5, 7), "S0")], True, {}),
    "narrow_other_dim": (lambda torch, a: a.narrow(0, 1, 3), [((5, 7), "S1")], True, {}),
    "select_sharded_dim": (lambda torch, a: a[2], [((5, 7), "S0")], True, {}),
    "select_other_dim": (lambda torch, a: a.select(1, 3), [((5, 7), "S0")], True, {}),
    "select_3d_after": (lambda torch, a: a[:, 1], [((3, 4, 5), "S2")], True, {}),
    "index_dtensor_ids": (lambda torch, a, i: a[i], [((5, 7), "S0"), ((4,), "R")], True, {1: 5}),
    "index_plain_ids": (lambda torch, a, i: a[i], [((5, 7), "S0"), ((4,), "plain")], True, {1: 5}),
    "index_plain_cols": (lambda torch, a, i: a[:, i] * 2, [((5, 7), "S1"), ((6,), "plain")], True, {1: 7}),
}

PLACEMENTS = ["S0", "S1", "R", "P"]
REDIST_SHAPE = (5, 7)
