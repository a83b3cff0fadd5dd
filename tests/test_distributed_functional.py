"""Functional collectives (`_functional_collectives`) and `distributed.nn.functional` at world size 2 on the CPU
engine (MPI): eager results and gradients against NumPy references; under `flambeau.compile` each collective
is one graph node (fullgraph=True: no graph break) and compiled results equal eager ones (also with Inductor,
which calls the collective as an extern kernel). Marked cuda: the same on NCCL with 2 GPUs.
"""
from __future__ import annotations

import os

import numpy as np
import pytest

from tests.dist_helpers import launch
from tests.dist_workers.inputs import make

TOL = 2e-5
OPS = ("all_reduce", "all_gather_into_tensor", "reduce_scatter_tensor", "all_to_all_single", "broadcast")


def _gpus() -> int:
    import flambeau
    return flambeau.cuda.device_count()


@pytest.fixture(scope="module", params=[pytest.param(("gloo", "cpu"), id="gloo"),
                                        pytest.param(("nccl", "cuda"), id="nccl", marks=pytest.mark.cuda)])
def run(request, tmp_path_factory):
    backend, device = request.param
    world = 2
    if device == "cuda" and _gpus() < world:
        pytest.skip(f"needs {world} GPUs, {_gpus()} present")
    out = tmp_path_factory.mktemp("functional")
    rc, so, se = launch("functional.py", world, str(out), backend, device)
    assert rc == 0, f"workers failed (rc {rc}):\n{so}\n{se}"
    return world, [dict(np.load(os.path.join(out, f"rank{r}.npz"))) for r in range(world)]


def _expected(world: int, rank: int) -> list:
    xs = [make(r, "fx", (4, 6), "float32").astype(np.float64) for r in range(world)]
    splits = [1] * (world - 1) + [4 - (world - 1)]
    starts = np.concatenate([[0], np.cumsum(splits)])
    total = sum(xs)
    return [2 * total, np.concatenate(xs, axis=1), total[2 * rank:2 * rank + 2],
            np.concatenate([x[starts[rank]:starts[rank + 1]] for x in xs]), xs[world - 1] + 1]


@pytest.mark.parametrize("mode", ["eager", "compiled", "inductor"])
def test_functional_collectives_against_numpy(run, mode):
    world, ranks = run
    for r in range(world):
        for i, want in enumerate(_expected(world, r)):
            np.testing.assert_allclose(ranks[r][f"{mode}/{i}"], want, rtol=TOL, atol=TOL, err_msg=f"{mode} {OPS[i]}")


def test_each_collective_is_a_graph_node(run):
    world, ranks = run
    targets = set(ranks[0]["graph_targets"].tolist())
    for op in OPS:
        assert f"_c10d_functional::{op}" in targets, sorted(targets)


@pytest.mark.parametrize("mode", ["eager", "compiled", "inductor"])
def test_nn_functional_gradients_sum_over_ranks(run, mode):
    """loss_r = sum_j <all_gather(all_reduce(x*w))[j], c_j>; d(sum_r loss_r)/dx_r = world * sum_j c_j * w_r."""
    world, ranks = run
    big_c = sum(make(j, "fc", (4, 6), "float32").astype(np.float64) for j in range(world))
    s = sum(make(r, "fx", (4, 6), "float32").astype(np.float64) * make(r, "fw", (4, 6), "float32")
            for r in range(world))
    for r in range(world):
        want = world * big_c * make(r, "fw", (4, 6), "float32")
        np.testing.assert_allclose(ranks[r][f"grad/{mode}"], want, rtol=TOL, atol=TOL)
        np.testing.assert_allclose(ranks[r][f"loss/{mode}"], (s * big_c).sum(), rtol=1e-4)
