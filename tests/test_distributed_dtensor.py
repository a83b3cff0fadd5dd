"""DTensor on the MPI backend with 2 and 3 ranks: every op case of tests/dist_workers/dtensor_cases.py
against PyTorch computing the same function on the whole tensors (gather-then-compute), gradients
included; every redistribution between placements; the 2-D mesh (4 ranks) in test_distributed_mesh.py.

The worker saves each case's full result, output placements and the gradients of sum(out * out); the
reference here rebuilds the inputs and runs the case's function on PyTorch tensors.
"""
from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest
import torch

from tests.dist_helpers import RUN_TIMEOUT_S, WORKERS, launch
from tests.dist_workers.dtensor_cases import CASES, PLACEMENTS, REDIST_SHAPE, inputs

# the layout a rule must choose (a fallback or a needless all-gather shows up here)
EXPECTED_PLACEMENTS = {"add_s0_s0": "S(0)", "add_bcast_s1": "S(1)", "add_bcast_sharded_vec": "S(1)",
                       "sum_dim_sharded": "P(sum)", "sum_dim_kept": "S(0)", "mean_uneven": "P(sum)",
                       "amax_sharded": "P(max)", "mm_s0_r": "S(0)", "mm_r_s1": "S(1)", "mm_s1_s0_partial": "P(sum)",
                       "addmm": "P(sum)", "bmm": "S(0)", "linear_colwise": "S(2)", "linear_rowwise": "P(sum)",
                       "matmul_3d_2d": "S(1)", "view_split_heads": "S(1)", "reshape_merge": "S(0)",
                       "permute_t": "P(sum)", "split_unsqueeze": "S(1)", "embedding_rows": "P(sum)",
                       "embedding_cols": "S(2)", "embedding_ids": "S(0)", "layer_norm": "S(0)",
                       "softmax_other_dim": "S(0)", "log_softmax_same_dim": "R", "cross_entropy_mean": "P(sum)",
                       "cross_entropy_sum": "P(sum)", "cross_entropy_none": "S(0)", "fallback_cumsum": "R",
                       "slice_sharded_dim": "R", "slice_other_dim_step": "S(0)", "narrow_other_dim": "S(1)",
                       "select_sharded_dim": "R", "select_other_dim": "S(0)", "select_3d_after": "S(1)",
                       "index_dtensor_ids": "R", "index_plain_ids": "R", "index_plain_cols": "R"}
UNEVEN_HEADS = {3: {"view_split_heads": "R"}}     # 4 heads do not split over 3 ranks: gathered, not cut


@pytest.fixture(scope="module", params=[2, 3], ids=lambda w: f"world{w}")
def ranks(request, tmp_path_factory):
    world = request.param
    out = tmp_path_factory.mktemp(f"dtensor{world}")
    rc, so, se = launch("dtensor.py", world, str(out))
    assert rc == 0, f"workers failed (rc {rc}):\n{so}\n{se}"
    return [dict(np.load(os.path.join(out, f"rank{r}.npz"))) for r in range(world)]


def _reference(name):
    fn, specs, differentiable, ints = CASES[name]
    xs = []
    for i, a in enumerate(inputs(name, specs, ints)):
        t = torch.from_numpy(a)
        if differentiable and i not in ints:
            t.requires_grad_(True)
        xs.append(t)
    out = fn(torch, *xs)
    grads = {}
    if differentiable:
        (out * out).sum().backward()
        grads = {i: x.grad.numpy() for i, x in enumerate(xs) if x.grad is not None}
    return out.detach().numpy(), grads


def _spec_placement(p: str) -> str:
    return "R" if p == "R" else f"S({p[1:]})"


@pytest.mark.parametrize("name", list(CASES))
def test_op_rule_matches_gather_then_compute(ranks, name):
    want, grads = _reference(name)
    for r, res in enumerate(ranks):
        assert f"{name}/error" not in res, f"rank {r}:\n{res[f'{name}/error']}"
        np.testing.assert_allclose(res[f"{name}/out"], want, rtol=1e-10, atol=1e-12)
        want_placement = UNEVEN_HEADS.get(len(ranks), {}).get(name, EXPECTED_PLACEMENTS.get(name))
        if want_placement is not None:
            assert str(res[f"{name}/placements"]) == want_placement
        for i, g in grads.items():
            np.testing.assert_allclose(res[f"{name}/grad{i}"], g, rtol=1e-10, atol=1e-12)
            assert bool(res[f"{name}/grad{i}/is_dtensor"])
            # a leaf's gradient has the leaf's layout (the optimizer steps local shards)
            assert str(res[f"{name}/grad{i}/placements"]) == _spec_placement(CASES[name][1][i][1])


@pytest.mark.parametrize("src", PLACEMENTS)
def test_redistribute_between_all_placements(ranks, src):
    world = len(ranks)
    full = np.random.default_rng(7).integers(-9, 9, REDIST_SHAPE).astype(np.float64)
    for dst in ["S0", "S1", "R"] + (["P"] if src == "P" else []):
        key = f"redistribute/{src}/{dst}"
        for r, res in enumerate(ranks):
            assert f"{key}/error" not in res, f"rank {r}:\n{res[f'{key}/error']}"
            np.testing.assert_array_equal(res[f"{key}/full"], full)
            if dst.startswith("S"):
                pieces = torch.from_numpy(full).chunk(world, int(dst[1:]))
                want = pieces[r].numpy() if r < len(pieces) else None
                if want is not None:
                    np.testing.assert_array_equal(res[f"{key}/local"], want)
                else:
                    assert res[f"{key}/local"].size == 0
            elif dst == "R":
                np.testing.assert_array_equal(res[f"{key}/local"], full)
            if dst == "P":      # every rank's local term 3 * y: the Partial gradient sums them (PyTorch's)
                np.testing.assert_array_equal(res[f"{key}/grad"], np.full(REDIST_SHAPE, 3.0 * world))
            else:
                # d/dx sum(y * y) = 2 * full, reaching a Partial source as a replicated gradient
                np.testing.assert_array_equal(res[f"{key}/grad"], 2 * full)
            if src != "P":
                assert str(res[f"{key}/grad/placements"]) == _spec_placement(src)


def test_rule_count_and_fallback_log():
    from flambeau.distributed.tensor import ops_with_rules
    names = ops_with_rules()
    for op in ("mm", "addmm", "bmm", "linear", "matmul", "view", "transpose.int", "permute", "split_with_sizes",
               "embedding", "native_layer_norm", "softmax.int", "log_softmax.int", "cross_entropy_loss",
               "sum.dim_IntList", "mean.dim", "add.Tensor", "tanh"):
        assert op in names, op
    assert len(names) >= 80


# where our rules choose another valid layout than PyTorch's (cheaper by our cost, or exact where PyTorch
# replicates), or PyTorch's DTensor raises (uneven mean of cross_entropy, a MaskPartial backward, cat
# of split gradients, a plain index tensor: ours counts it as replicated)
DIFFERENT_CHOICE = {"mean_all", "mean_uneven", "mm_s0_s0", "mul_div_neg"}
PYTORCH_RAISES = {"cross_entropy_mean", "embedding_rows", "split_unsqueeze",
                  "index_plain_ids", "index_plain_cols"}   # a plain index tensor: "got mixed torch.Tensor and DTensor"


@pytest.fixture(scope="module")
def pytorch_ranks(tmp_path_factory):
    """The same worker on PyTorch's DTensor: 2 processes under torchrun with gloo."""
    out = tmp_path_factory.mktemp("dtensor_pytorch")
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH="")
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
           os.path.join(WORKERS, "dtensor.py"), str(out)]
    p = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=RUN_TIMEOUT_S)
    assert p.returncode == 0, p.stderr[-3000:]
    return [dict(np.load(os.path.join(out, f"rank{r}.npz"))) for r in range(2)]


@pytest.mark.parametrize("name", sorted(set(CASES) - PYTORCH_RAISES))
def test_layouts_and_values_agree_with_pytorch_dtensor(ranks, pytorch_ranks, name):
    if len(ranks) != 2:
        pytest.skip("compared at world size 2")
    for ours, theirs in zip(ranks, pytorch_ranks):
        assert f"{name}/error" not in theirs, str(theirs[f"{name}/error"])
        np.testing.assert_allclose(ours[f"{name}/out"], theirs[f"{name}/out"], rtol=1e-10, atol=1e-12)
        same = str(ours[f"{name}/placements"]) == str(theirs[f"{name}/placements"])
        assert same != (name in DIFFERENT_CHOICE), (name, str(ours[f"{name}/placements"]),
                                                    str(theirs[f"{name}/placements"]))


def test_pytorch_dtensor_raises_where_we_compute(pytorch_ranks):
    for name in PYTORCH_RAISES:
        assert f"{name}/error" in pytorch_ranks[0]


def test_cast_backward_of_a_dtensor_stays_a_dtensor_on_its_local_device():
    """Autocast casts DTensor parameters (tensor parallel under bf16 autocast): the cast's derivative names the
    input's device, which for a DTensor is its local tensors' device, not the dispatcher's wrapper device."""
    pytest.importorskip("mpi4py")
    import flambeau
    import flambeau.distributed as dist
    from flambeau.distributed.device_mesh import init_device_mesh
    from flambeau.distributed.tensor import DTensor, Shard, distribute_tensor
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        w = np.arange(6.0, dtype=np.float32).reshape(2, 3)
        d = distribute_tensor(flambeau.tensor(w), init_device_mesh("cpu", (1,)), [Shard(0)]).requires_grad_()
        (d.to(flambeau.bfloat16).float() * 2).sum().backward()
        ref = torch.tensor(w, requires_grad=True)
        (ref.to(torch.bfloat16).float() * 2).sum().backward()
        assert isinstance(d.grad, DTensor) and d.grad.placements == (Shard(0),)
        assert d.grad.dtype == flambeau.float32
        np.testing.assert_array_equal(d.grad.full_tensor().numpy(), ref.grad.numpy())
    finally:
        dist.destroy_process_group()


def test_sharding_decisions_are_kept_per_signature(monkeypatch):
    """A DTensor call's sharding decision and global output shapes are worked out once per signature (op,
    mesh, the DTensors' shapes, dtypes and placements, the other arguments' values) and reused, as PyTorch's
    sharding propagator caches per op schema; another placement, shape or scalar is another signature."""
    pytest.importorskip("mpi4py")
    import flambeau
    import flambeau.distributed as dist
    from flambeau.distributed.device_mesh import init_device_mesh
    from flambeau.distributed.tensor import Replicate, Shard, distribute_tensor
    from flambeau.distributed.tensor import _dispatch as D
    made = []
    real = D._Plan.__init__

    def counting(self, op, *args):
        made.append(str(op))
        real(self, op, *args)
    monkeypatch.setattr(D._Plan, "__init__", counting)
    monkeypatch.setattr(D, "_PLANS", {})
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        mesh = init_device_mesh("cpu", (1,))
        x = np.arange(12.0, dtype=np.float32).reshape(3, 4)
        a, b = (distribute_tensor(flambeau.tensor(x), mesh, [Shard(0)]) for _ in range(2))
        for _ in range(3):
            out = a * b + 1.0
        assert made.count("aten.mul.Tensor") == 1 and made.count("aten.add.Tensor") == 1, made
        np.testing.assert_array_equal(out.full_tensor().numpy(), x * x + 1)
        r = distribute_tensor(flambeau.tensor(x), mesh, [Replicate()])
        assert (a * r).placements == (Shard(0),) and made.count("aten.mul.Tensor") == 2
        a * 2.0, a * 3.0
        assert made.count("aten.mul.Tensor") == 4            # another scalar: another signature
        c = distribute_tensor(flambeau.tensor(np.ones((5, 4), np.float32)), mesh, [Shard(0)])
        c * c
        assert made.count("aten.mul.Tensor") == 5
        n = distribute_tensor(flambeau.tensor(np.arange(4)), mesh, [Shard(0)])
        kinds = [(n * s).dtype for s in (1, 1.0, True)]       # equal as keys, other result dtypes
        assert kinds == [flambeau.int64, flambeau.float32, flambeau.int64], kinds
    finally:
        dist.destroy_process_group()
