"""Collectives of flambeau.distributed against NumPy references: on the CPU engine (MPI) with world sizes 2
and 3, under the mixed backend "cpu:gloo,cuda:nccl" with cpu tensors (routed to MPI), and on NCCL with cuda
tensors (marked cuda: world size 1, and 2 where two GPUs are present).

One launch per configuration runs tests/dist_workers/collectives.py (a PyTorch script, run through the
launcher's aliasing); each rank saves its results and the tests below rebuild every rank's inputs
(tests/dist_workers/inputs.py) and compute the expected result here.
"""
from __future__ import annotations

import json
import os

import numpy as np
import pytest

from tests.dist_helpers import launch
from tests.dist_workers.inputs import DTYPES, make, ops_for, reduce_ref, stored

TOL = {"float32": 2e-6, "float64": 1e-12, "float16": 1e-3, "bfloat16": 8e-3, "complex64": 2e-6}


def _gpus() -> int:
    import flambeau
    return flambeau.cuda.device_count()


CONFIGS = [pytest.param(("gloo", "cpu", 2), id="world2"), pytest.param(("gloo", "cpu", 3), id="world3"),
           pytest.param(("cpu:gloo,cuda:nccl", "cpu", 2), id="mixed-cpu-world2"),
           pytest.param(("nccl", "cuda", 1), id="nccl-world1", marks=pytest.mark.cuda),
           pytest.param(("nccl", "cuda", 2), id="nccl-world2", marks=pytest.mark.cuda)]


@pytest.fixture(scope="module", params=CONFIGS)
def run(request, tmp_path_factory):
    backend, device, world = request.param
    if device == "cuda" and _gpus() < world:
        pytest.skip(f"needs {world} GPUs, {_gpus()} present")
    out = tmp_path_factory.mktemp(f"collectives{world}")
    rc, so, se = launch("collectives.py", world, str(out), backend, device)
    assert rc == 0, f"workers failed (rc {rc}):\n{so}\n{se}"
    ranks = [dict(np.load(os.path.join(out, f"rank{r}.npz"))) for r in range(world)]
    return world, ranks, backend if device == "cuda" else "gloo"


def _close(got, want, name="float64"):
    want = stored(np.asarray(want))
    assert got.shape == want.shape, (got.shape, want.shape)
    if name in TOL:
        np.testing.assert_allclose(got, want, rtol=TOL[name], atol=TOL[name])
    else:
        np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("name", list(DTYPES))
def test_all_reduce_every_op(run, name):
    world, ranks, backend = run
    for op in ops_for(name, backend):
        want = reduce_ref([make(r, f"ar/{name}/{op}", (5, 3), name) for r in range(world)], op)
        for r in range(world):
            _close(ranks[r][f"all_reduce/{name}/{op}"], want, name)


@pytest.mark.parametrize("name", list(DTYPES))
def test_broadcast_and_uneven_all_gather(run, name):
    world, ranks, _ = run
    for r in range(world):
        _close(ranks[r][f"broadcast/{name}"], make(world - 1, f"bc/{name}", (7,), name), name)
        for src in range(world):
            _close(ranks[r][f"all_gather/{name}/{src}"], make(src, f"ag/{name}", (src + 1,), name), name)


def test_nccl_all_reduce_many_averages_each_array_in_place(run):
    world, ranks, backend = run
    if backend != "nccl":
        pytest.skip("NCCL's grouped all-reduce (DDP's in-place average)")
    for i, (shape, name) in enumerate((((3,), "float32"), ((1000,), "float32"), ((5, 7), "float64"),
                                       ((2, 3), "float32"))):
        want = reduce_ref([make(r, f"arm/{i}", shape, name) for r in range(world)], "SUM") / world
        for r in range(world):
            _close(ranks[r][f"all_reduce_many/{i}"], want, name)


def test_async_work_handles_and_future(run):
    world, ranks, _ = run
    for i in range(3):
        want = reduce_ref([make(r, f"async/{i}", (1000,), "float32") for r in range(world)], "SUM")
        for r in range(world):
            _close(ranks[r][f"async/{i}"], want, "float32")
    want = reduce_ref([make(r, "fut", (4,), "float64") for r in range(world)], "SUM") * 2
    for r in range(world):
        _close(ranks[r]["future"], want)


def test_reduce_to_one_rank(run):
    world, ranks, _ = run
    for name, op in (("float32", "SUM"), ("int64", "MAX"), ("float64", "AVG")):
        want = reduce_ref([make(r, f"red/{name}", (6,), name) for r in range(world)], op)
        _close(ranks[world - 1][f"reduce/{name}/{op}"], want, name)
        assert world == 1 or f"reduce/{name}/{op}" not in ranks[0]


def test_all_gather_into_tensor(run):
    world, ranks, _ = run
    want = np.concatenate([make(r, "agit", (2, 3), "float32") for r in range(world)])
    for r in range(world):
        _close(ranks[r]["all_gather_into_tensor"], want, "float32")


def test_reduce_scatter_uneven_and_tensor_avg(run):
    world, ranks, _ = run
    for r in range(world):
        want = reduce_ref([make(q, f"rs/{r}", (r + 2,), "float32") for q in range(world)], "SUM")
        _close(ranks[r]["reduce_scatter"], want, "float32")
        full = reduce_ref([make(q, "rst", (world * 3, 2), "float64") for q in range(world)], "AVG")
        _close(ranks[r]["reduce_scatter_tensor"], full[3 * r:3 * r + 3])


def test_all_to_all_uneven_and_single(run):
    world, ranks, _ = run
    for r in range(world):
        for j in range(world):
            _close(ranks[r][f"all_to_all/{j}"], make(j, f"a2a/{r}", (j + r + 1,), "int64"))
        pieces = []
        for j in range(world):
            x = make(j, "a2as", (sum(range(1, world + 1)), 2), "float32")
            start = sum(range(1, r + 1))
            pieces.append(x[start:start + r + 1])
        _close(ranks[r]["all_to_all_single"], np.concatenate(pieces), "float32")
        even = np.concatenate([make(j, "a2ae", (world * 2,), "bfloat16")[2 * r:2 * r + 2] for j in range(world)])
        _close(ranks[r]["all_to_all_single_even"], even, "bfloat16")


def test_gather_and_scatter(run):
    world, ranks, _ = run
    for src in range(world):
        _close(ranks[0][f"gather/{src}"], make(src, "gather", (4,), "float32"), "float32")
    for r in range(world):
        _close(ranks[r]["scatter"], make(min(1, world - 1), f"scatter/{r}", (3,), "int32"))


def test_point_to_point(run):
    world, ranks, _ = run
    for r in range(world):
        left, right = (r - 1) % world, (r + 1) % world
        if world > 1:
            _close(ranks[r]["send_recv"], make(left, "p2p", (5,), "float32"), "float32")
            assert int(ranks[r]["recv_src"]) == left
        _close(ranks[r]["batch/from_left"], make(left, "batch/r", (6,), "float64"))
        _close(ranks[r]["batch/from_right"], make(right, "batch/l", (2,), "float64"))


def test_non_contiguous_tensor_is_written_back(run):
    world, ranks, _ = run
    want = reduce_ref([make(r, "noncontig", (3, 4), "float32") for r in range(world)], "SUM")
    for r in range(world):
        _close(ranks[r]["noncontig"], want, "float32")


def test_new_group_of_first_and_last(run):
    world, ranks, _ = run
    members = sorted({0, world - 1})
    want = reduce_ref([make(r, "group", (3,), "float32") for r in members], "SUM")
    for r in range(world):
        if r in members:
            _close(ranks[r]["group"], want, "float32")
            _close(ranks[r]["group_bcast"], np.full(2, world - 1, dtype=np.float32), "float32")
        else:
            assert "group" not in ranks[r]


@pytest.mark.parametrize("mode", ["pinned", "free"])
def test_an_oversubscribed_host_waits_by_sleeping(tmp_path, mode):
    """Two ranks on one core: a rank waiting for its late peer sleeps OVERSUBSCRIBED_POLL_S between tests
    from the start (sync and async waits), leaving the core to the peer; with a core each the async wait is
    MPI's own (no sleep) and the sync one tests SPIN_TESTS times before its first sleep."""
    from flambeau.distributed._mpi_backend import OVERSUBSCRIBED_POLL_S
    if mode == "free" and len(os.sched_getaffinity(0)) < 2:
        pytest.skip("needs 2 cores")
    rc, so, se = launch("waiting.py", 2, str(tmp_path), mode)
    assert rc == 0, f"workers failed (rc {rc}):\n{so}\n{se}"
    waiter = json.load(open(tmp_path / "rank0.json"))
    for kind in ("sync", "async"):
        assert waiter[kind]["values"] == [3.0]                   # 1 + 2 on every element
    if mode == "pinned":
        assert waiter["idle_sleep_s"] == OVERSUBSCRIBED_POLL_S
        for kind in ("sync", "async"):
            assert waiter[kind]["sleeps"] and set(waiter[kind]["sleeps"]) == {OVERSUBSCRIBED_POLL_S}, kind
    else:
        assert waiter["idle_sleep_s"] == 0.0
        assert waiter["async"]["sleeps"] == []
        assert waiter["sync"]["sleeps"] and len(set(waiter["sync"]["sleeps"])) > 1    # growing sleeps
