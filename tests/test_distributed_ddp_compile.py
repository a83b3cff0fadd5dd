"""DDPOptimizer (flambeau/_dynamo/backends/distributed.py) on 2 MPI ranks (tests/dist_workers/ddp_compile.py):
a compiled DDP module's graph is split at its bucket boundaries, one subgraph per bucket, and trains to
eager DDP's losses and weights, and a bucket's all-reduce starts before backward reaches the input; so is
the graph of a model compiled inside DDP (`DDP(compile(model))`); with `optimize_ddp=False` the graph stays
whole."""
from __future__ import annotations

import os

import numpy as np
import pytest

from tests.dist_helpers import launch

WORLD, LAYERS = 2, 4


@pytest.fixture(scope="module")
def ranks(tmp_path_factory):
    out = tmp_path_factory.mktemp("ddp_compile")
    rc, so, se = launch("ddp_compile.py", WORLD, str(out))
    assert rc == 0, f"workers failed (rc {rc}):\n{so}\n{se}"
    return [dict(np.load(os.path.join(out, f"rank{r}.npz"))) for r in range(WORLD)]


def test_compiled_ddp_graph_is_split_one_subgraph_per_bucket(ranks):
    for res in ranks:
        assert int(res["split/graphs"]) == LAYERS
        assert int(res["whole/graphs"]) == 1
        assert int(res["inner/graphs"]) == LAYERS       # DDP(compile(model)): split as well
        assert int(res["inner_whole/graphs"]) == 1


def test_ddp_forward_is_the_active_ddp_module_only_while_it_runs(ranks):
    """DDP's forward marks itself active for the compiler only while it runs, an exception included."""
    for res in ranks:
        assert bool(res["active_after_training"]) and bool(res["active_after_an_error"])

@pytest.mark.parametrize("tag", ["split", "whole", "inner", "inner_whole"])
def test_compiled_ddp_trains_as_eager_ddp(ranks, tag):
    for res in ranks:
        np.testing.assert_allclose(res[f"{tag}/losses"], res["eager/losses"], rtol=1e-6)
        for k in [k for k in res if k.startswith("eager/final/")]:
            np.testing.assert_allclose(res[k.replace("eager", tag, 1)], res[k], rtol=1e-5, atol=1e-6, err_msg=k)


def test_split_graph_reduces_a_bucket_before_backward_reaches_the_input(ranks):
    """Split: the last subgraph's bucket starts before the first subgraph's backward gives the input its
    gradient (overlap). Whole: one backward node yields every gradient at once and the input's, made last,
    is accumulated first: no bucket can start earlier."""
    for res in ranks:
        for tag, first in (("split", "bucket"), ("whole", "input_grad"), ("eager", "bucket"), ("inner", "bucket"),
                           ("inner_whole", "input_grad")):
            events = [str(e) for e in res[f"{tag}/events"]]
            assert events.count("bucket") == LAYERS and events.count("input_grad") == 1, (tag, events)
            assert events[0] == first, (tag, events)
