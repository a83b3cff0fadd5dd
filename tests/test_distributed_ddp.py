"""DistributedDataParallel on 2 processes (tests/dist_workers/ddp.py) against PyTorch in this process,
and DistributedSampler against PyTorch's.

DDP training must equal one PyTorch process training on the concatenated batch from the weights rank 0
broadcast (losses and parameters to 1e-6); no_sync must reduce the accumulated gradient; unused
parameters, the fp16 compression hook and the overlap of bucket all-reduces with backward are checked.
"""
from __future__ import annotations

import os

import numpy as np
import pytest
import torch

import flambeau
from tests.dist_helpers import launch

WORLD, BATCH = 2, 4


@pytest.fixture(scope="module")
def ranks(tmp_path_factory):
    out = tmp_path_factory.mktemp("ddp")
    rc, so, se = launch("ddp.py", WORLD, str(out))
    assert rc == 0, f"workers failed (rc {rc}):\n{so}\n{se}"
    return [dict(np.load(os.path.join(out, f"rank{r}.npz"))) for r in range(WORLD)]


def _batch(step, n):
    g = np.random.default_rng(100 + step)
    return torch.from_numpy(g.standard_normal((n, 8)).astype(np.float32)), \
        torch.from_numpy(g.standard_normal((n, 4)).astype(np.float32))


def _mlp(state):
    m = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 16), torch.nn.Tanh(),
                            torch.nn.Linear(16, 4))
    m.load_state_dict({k: torch.from_numpy(v) for k, v in state.items()})
    return m


def _prefixed(d, prefix):
    return {k[len(prefix):]: v for k, v in d.items() if k.startswith(prefix)}


def _train_on_the_whole_batch(ref, steps: int = 4) -> list:
    """One PyTorch process trained on every rank's rows at once (SGD with momentum): its losses."""
    opt = torch.optim.SGD(ref.parameters(), lr=0.1, momentum=0.9)
    losses = []
    for step in range(steps):
        x, y = _batch(step, BATCH * WORLD)
        loss = ((ref(x) - y) ** 2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses


def _assert_ranks_trained_as(ranks, prefix: str, ref, losses) -> None:
    """Every rank's losses and final weights (worker keys under `prefix`) equal the reference's."""
    for r in range(WORLD):
        np.testing.assert_allclose(ranks[r][f"{prefix}losses"], losses, rtol=1e-6, atol=1e-6)
        for k, v in ref.state_dict().items():
            np.testing.assert_allclose(ranks[r][f"{prefix}final/{k}"], v.numpy(), rtol=1e-6, atol=1e-6)


def test_ddp_training_equals_one_pytorch_process_on_the_whole_batch(ranks):
    init = _prefixed(ranks[0], "init/")
    for r in range(WORLD):                    # broadcast at construction: every rank starts from rank 0's
        for k, v in _prefixed(ranks[r], "init/").items():
            np.testing.assert_array_equal(v, init[k])
    assert int(ranks[0]["n_buckets"]) >= 2
    ref = _mlp(init)
    losses = _train_on_the_whole_batch(ref)
    _assert_ranks_trained_as(ranks, "", ref, losses)


def test_gradients_averaged_in_their_own_memory_train_the_same(ranks):
    """On an engine with a native average and grouped all-reduces (NCCL's traits) each bucket is one grouped
    operation over the `.grad` arrays themselves: no copy in or back, and the same training."""
    init = _prefixed(ranks[0], "init/")
    ref = _mlp(init)
    _assert_ranks_trained_as(ranks, "in_place/", ref, _train_on_the_whole_batch(ref))
    for r in range(WORLD):
        assert float(ranks[r]["in_place/groups_per_step"]) == int(ranks[r]["n_buckets"])
        assert bool(ranks[r]["in_place/last_step_reduced_the_grads"])
        assert int(ranks[r]["in_place/copies"]) == 0


def test_gradient_as_bucket_view_trains_the_same_with_grads_in_the_buckets(ranks):
    ref = _mlp(_prefixed(ranks[0], "init/"))
    losses = _train_on_the_whole_batch(ref)
    for r in range(WORLD):
        np.testing.assert_allclose(ranks[r]["as_view/losses"], losses, rtol=1e-6, atol=1e-6)
        assert ranks[r]["as_view/grads_are_views"].all()


def test_no_sync_accumulates_then_reduces_the_total(ranks):
    x, y = _batch(10, 2 * BATCH * WORLD)
    per_rank = []
    for r in range(WORLD):
        m = _mlp(flambeau_mlp_state_from_seed0())
        for i in range(2):
            rows = slice((2 * r + i) * BATCH, (2 * r + i + 1) * BATCH)
            ((m(x[rows]) - y[rows]) ** 2).mean().backward()
            if i == 0:
                np.testing.assert_allclose(ranks[r]["no_sync/local_grad"], m[0].weight.grad.numpy(), rtol=1e-5,
                                           atol=1e-6)
        per_rank.append({k: p.grad.numpy().copy() for k, p in m.named_parameters()})
    for k in per_rank[0]:
        want = sum(g[k] for g in per_rank) / WORLD
        for r in range(WORLD):
            np.testing.assert_allclose(ranks[r][f"no_sync/{k}"], want, rtol=1e-5, atol=1e-6)


def flambeau_mlp_state_from_seed0():
    """The weights `torch.manual_seed(0); mlp()` gives in the flambeau worker (flambeau's own generator)."""
    flambeau.manual_seed(0)
    m = flambeau.nn.Sequential(flambeau.nn.Linear(8, 16), flambeau.nn.Tanh(), flambeau.nn.Linear(16, 16),
                               flambeau.nn.Tanh(), flambeau.nn.Linear(16, 4))
    return {k: v.numpy().copy() for k, v in m.state_dict().items()}


def test_find_unused_parameters(ranks):
    for r in range(WORLD):
        np.testing.assert_allclose(ranks[r]["unused/a"], [[1.5 * 2] * 3] * 2)   # mean over ranks of 2*(r+1)
        np.testing.assert_allclose(ranks[r]["unused/b"], [[2.0] * 3] * 2)       # (0 + 2*2) / 2: rank 0 unused
        assert bool(ranks[r]["unused/c_is_none"])                               # unused everywhere: untouched


def test_unused_parameter_without_detection_fails_the_next_forward(ranks):
    for r in range(WORLD):
        assert "Expected to have finished reduction in the prior iteration" in str(ranks[r]["unfinished_error"])
        assert "find_unused_parameters=True" in str(ranks[r]["unfinished_error"])


def test_fp16_compress_hook_reduces_in_float16(ranks):
    keys = [k[len("fp16/local/"):] for k in ranks[0] if k.startswith("fp16/local/")]
    assert keys
    for k in keys:
        halves = [ranks[r][f"fp16/local/{k}"].astype(np.float16) / np.float16(WORLD) for r in range(WORLD)]
        want = (halves[0] + halves[1]).astype(np.float32)                         # one float16 rounding
        for r in range(WORLD):
            np.testing.assert_array_equal(ranks[r][f"fp16/{k}"], want)
        exact = sum(ranks[r][f"fp16/local/{k}"] for r in range(WORLD)) / WORLD
        np.testing.assert_allclose(ranks[0][f"fp16/{k}"], exact, rtol=2e-3, atol=1e-3)


def test_first_bucket_is_reduced_while_backward_still_runs(ranks):
    for r in range(WORLD):
        ready = ranks[r]["overlap/first_layer_grad_ready"].tolist()
        assert len(ready) >= 2 and ready[0] is False and ready[-1] is True


def test_buffers_and_parameters_broadcast_from_rank_0(ranks):
    for r in range(WORLD):
        np.testing.assert_array_equal(ranks[r]["bn/running_mean"], [1.0, 1.0, 1.0])
        np.testing.assert_array_equal(ranks[r]["bn/weight"], ranks[0]["bn/weight"])


def test_each_training_forward_starts_from_rank_0s_buffers(ranks):
    """Rank r's buffers after two forwards: rank 0's after the first forward, updated by rank r's second batch."""
    def x(step, rank):
        return torch.from_numpy(np.random.default_rng(50 + 10 * step + rank).standard_normal((6, 3)).astype(np.float32))
    torch.manual_seed(0)
    first = torch.nn.Sequential(torch.nn.BatchNorm1d(3), torch.nn.BatchNorm1d(3))
    first(x(0, 0))
    for r in range(WORLD):
        ref = torch.nn.Sequential(torch.nn.BatchNorm1d(3), torch.nn.BatchNorm1d(3))
        ref.load_state_dict(first.state_dict())
        ref(x(1, r))
        for k, b in ref.named_buffers():
            np.testing.assert_allclose(ranks[r][f"bn_sync/{k}"], b.numpy(), rtol=1e-6, atol=1e-7, err_msg=k)


def test_distributed_sampler_shards_by_the_process_group(ranks):
    shards = [ranks[r]["sampler"].tolist() for r in range(WORLD)]
    assert [len(s) for s in shards] == [6, 6]                       # ceil(11 / 2), padded
    assert sorted(set(shards[0]) | set(shards[1])) == list(range(11))
    ours = flambeau.utils.data.DistributedSampler(range(11), WORLD, 1, seed=3)
    assert list(ours) == shards[1]                                  # rank 1 used rank=get_rank()


@pytest.mark.parametrize("n,replicas,shuffle,drop_last", [(10, 3, False, False), (10, 3, False, True),
                                                          (11, 4, True, False), (11, 4, True, True)])
def test_distributed_sampler_against_pytorch(n, replicas, shuffle, drop_last):
    ours = [flambeau.utils.data.DistributedSampler(range(n), replicas, r, shuffle=shuffle, drop_last=drop_last)
            for r in range(replicas)]
    theirs = [torch.utils.data.DistributedSampler(range(n), replicas, r, shuffle=shuffle, drop_last=drop_last)
              for r in range(replicas)]
    assert [len(s) for s in ours] == [len(s) for s in theirs]
    if not shuffle:                                  # the same shards, index for index
        assert [list(s) for s in ours] == [list(s) for s in theirs]
        return
    shards = [list(s) for s in ours]                 # flambeau's generator is its own: check the contract
    flat = sorted(i for s in shards for i in s)
    if drop_last:
        assert len(set(flat)) == len(flat) == len(ours[0]) * replicas
    else:
        assert set(flat) == set(range(n)) and len(flat) == len(ours[0]) * replicas
    assert shards == [list(s) for s in ours]         # every rank agrees without talking
    for s in ours:
        s.set_epoch(1)
    assert [list(s) for s in ours] != shards


class _WithUnused(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.body = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 16),
                                        torch.nn.Tanh(), torch.nn.Linear(16, 4))
        self.unused = torch.nn.Linear(8, 4)

    def forward(self, x):
        return self.body(x)


def test_static_graph_trains_a_model_with_an_unused_parameter_as_one_process(ranks):
    init = _prefixed(ranks[0], "static/init/")
    ref = _WithUnused()
    ref.load_state_dict({k: torch.from_numpy(v) for k, v in init.items()})
    losses = _train_on_the_whole_batch(ref)
    _assert_ranks_trained_as(ranks, "static/", ref, losses)
    for r in range(WORLD):
        assert bool(ranks[r]["static/unused_grad_is_none"])       # unused everywhere: grad left as PyTorch's
        assert int(ranks[r]["static/graph_walks"]) == 1           # the first iteration's answer is reused


PERMUTED_FORWARD_ORDER = (2, 0, 3, 1)


@pytest.mark.parametrize("tag", ["rebuild", "rebuild_static"])
def test_buckets_are_rebuilt_in_gradient_arrival_order_after_the_first_iteration(ranks, tag):
    arrival = list(reversed(PERMUTED_FORWARD_ORDER))      # backward reaches the last-applied layer first
    for r in range(WORLD):
        before = ranks[r][f"{tag}/before"]
        assert [b[0] for b in before] == [3, 2, 1, 0]               # registration order, reversed
        assert all(len(set(b)) == 1 for b in before)                # one layer per bucket
        np.testing.assert_array_equal(ranks[r][f"{tag}/after1"], before)   # rebuilt at the next forward
        after = ranks[r][f"{tag}/after2"]
        assert [b[0] for b in after] == arrival and all(len(set(b)) == 1 for b in after)
    ref = torch.nn.ModuleList(torch.nn.Linear(4, 4) for _ in range(4))
    ref.load_state_dict({k[len("layers."):]: torch.from_numpy(v)
                         for k, v in _prefixed(ranks[0], f"{tag}/init/").items()})
    for _ in range(2):                                    # two iterations, both ranks' inputs: mean over ranks
        for r in range(WORLD):
            x = torch.ones(2, 4) * (r + 1)
            for i in PERMUTED_FORWARD_ORDER:
                x = torch.tanh(ref[i](x))
            (x.sum() / WORLD).backward()
    for r in range(WORLD):
        for k, p in ref.named_parameters():
            np.testing.assert_allclose(ranks[r][f"{tag}/grad/layers.{k}"], p.grad.numpy(), rtol=1e-6, atol=1e-6)


def test_ddp_moves_inputs_to_its_device_and_refuses_device_ids_on_the_cpu():
    """PyTorch's DDP with `device_ids` moves the forward's tensor inputs (nested in tuples, named tuples, lists
    and dicts) to that device (pytorch/examples distributed/ddp/example.py feeds it cpu tensors); `device_ids`
    with a cpu module raises PyTorch's ValueError, as torch's own DDP does."""
    import collections
    import flambeau
    import flambeau.distributed as fdist
    from flambeau.nn.parallel.distributed import _to_device
    P = collections.namedtuple("P", "a b")
    moved = _to_device((flambeau.ones(2), [flambeau.zeros(1)], {"k": P(flambeau.ones(1), 3)}), flambeau.device("meta"))
    assert moved[0].device.type == moved[1][0].device.type == moved[2]["k"].a.device.type == "meta"
    assert isinstance(moved[2]["k"], P) and moved[2]["k"].b == 3
    import torch.distributed as tdist
    for lib, d in ((flambeau, fdist), (torch, tdist)):
        d.init_process_group("gloo", store=d.HashStore(), rank=0, world_size=1)
        try:
            with pytest.raises(ValueError, match="device_ids and output_device arguments only work with"):
                lib.nn.parallel.DistributedDataParallel(lib.nn.Linear(2, 2), device_ids=[0])
        finally:
            d.destroy_process_group()
