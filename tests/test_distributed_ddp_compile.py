"""DDPOptimizer (flambeau/_dynamo/backends/distributed.py) on 2 MPI ranks (tests/dist_workers/ddp_compile.py):
a compiled DDP module's graph is split at its bucket boundaries, one subgraph per bucket, and trains to
eager DDP's losses and weights, and a bucket's all-reduce starts before backward reaches the input; so is
the graph of a model compiled inside DDP (`DDP(compile(model))`); with `optimize_ddp=False` the graph stays
whole. flambeau's default puts 4 buckets' worth in a subgraph (`config.ddp_subgraph_buckets`): the 2-rank
worker trains with 1 (PyTorch's cut) and with 2.
"""
from __future__ import annotations

import os

import numpy as np
import pytest

from tests.dist_helpers import launch

WORLD, LAYERS = 2, 4


@pytest.fixture(autouse=True)
def pytorch_cut(monkeypatch):
    """The in-process tests study where PyTorch's cut (a subgraph a bucket) falls: `ddp_subgraph_buckets` 1
    (flambeau's default puts 4 buckets in a subgraph; `test_subgraph_buckets_make_fewer_larger_subgraphs`)."""
    from flambeau._dynamo import config
    monkeypatch.setattr(config, "ddp_subgraph_buckets", 1)


@pytest.fixture(scope="module")
def ranks(tmp_path_factory):
    out = tmp_path_factory.mktemp("ddp_compile")
    rc, so, se = launch("ddp_compile.py", WORLD, str(out))
    assert rc == 0, f"workers failed (rc {rc}):\n{so}\n{se}"
    return [dict(np.load(os.path.join(out, f"rank{r}.npz"))) for r in range(WORLD)]


def test_compiled_ddp_graph_is_split_one_subgraph_per_bucket(ranks):
    for res in ranks:
        assert int(res["split/graphs"]) == LAYERS
        assert int(res["split2/graphs"]) == LAYERS // 2     # ddp_subgraph_buckets 2: two buckets a subgraph
        assert int(res["whole/graphs"]) == 1
        assert int(res["inner/graphs"]) == LAYERS       # DDP(compile(model)): split as well
        assert int(res["inner_whole/graphs"]) == 1


def test_ddp_forward_is_the_active_ddp_module_only_while_it_runs(ranks):
    """DDP's forward marks itself active for the compiler only while it runs, an exception included."""
    for res in ranks:
        assert bool(res["active_after_training"]) and bool(res["active_after_an_error"])

@pytest.mark.parametrize("tag", ["split", "split2", "whole", "inner", "inner_whole"])
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
        for tag, first in (("split", "bucket"), ("split2", "bucket"), ("whole", "input_grad"), ("eager", "bucket"),
                           ("inner", "bucket"), ("inner_whole", "input_grad")):
            events = [str(e) for e in res[f"{tag}/events"]]
            assert events.count("bucket") == LAYERS and events.count("input_grad") == 1, (tag, events)
            assert events[0] == first, (tag, events)


def _pre_ln_transformer(m, d=32, layers=3):
    nn, F = m.nn, m.nn.functional

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.ln_1, self.attn, self.ln_2 = nn.LayerNorm(d), nn.Linear(d, d), nn.LayerNorm(d)
            self.c_fc, self.c_proj = nn.Linear(d, 4 * d), nn.Linear(4 * d, d)

        def forward(self, x):
            x = x + self.attn(self.ln_1(x))
            return x + self.c_proj(F.gelu(self.c_fc(self.ln_2(x))))

    return nn.Sequential(*[Block() for _ in range(layers)], nn.LayerNorm(d))


def _transformer_split_per_block(m):
    """The pre-LN transformer and a maker of DDPOptimizers (pieces run uncompiled) with a block's bytes a bucket."""
    from flambeau._dynamo.backends.distributed import DDPOptimizer
    m.manual_seed(0)
    model = _pre_ln_transformer(m)
    block_bytes = sum(p.numel() * 4 for p in model[0].parameters())
    return model, lambda: DDPOptimizer(block_bytes, lambda g, ex: g.forward, first_bucket_bytes=block_bytes // 4)


@pytest.mark.parametrize("narrowest", [True, False])
def test_split_moves_each_cut_earlier_to_just_before_a_product(monkeypatch, narrowest):
    """With `ddp_split_narrowest` each cut moves back from inside the MLP (the cut where the bucket fills:
    the GELU's 4x-wide output and the residual cross it) to just before a matrix product, here the MLP's
    first, where layer norm's output and the residual cross (half the bytes; no fusion of layer norm with
    the residual add is cut); no parameter moves to an earlier subgraph (its bucket would be ready later);
    the split graph computes what the model does."""
    import flambeau as torch
    from flambeau._dynamo import config
    from flambeau._dynamo.backends.distributed import _split
    monkeypatch.setattr(config, "ddp_split_narrowest", narrowest)
    model, optimizer = _transformer_split_per_block(torch)
    seen = {}

    def backend(gm, example_inputs):
        opt = optimizer()
        seen["parts"] = opt.partitions(gm)
        seen["pieces"] = _split(gm, seen["parts"])
        with monkeypatch.context() as mp:
            mp.setattr(config, "ddp_split_narrowest", False)
            seen["at_bucket"] = opt.partitions(gm)
            seen["bucket_pieces"] = _split(gm, seen["at_bucket"])
        return opt(gm, example_inputs)

    x = torch.randn(2, 5, 32)
    out = torch.compile(model, backend=backend)(x)
    np.testing.assert_allclose(out.detach().numpy(), model(x).detach().numpy(), rtol=1e-5, atol=1e-6)

    def crossing(pieces):
        return [sum(a.meta["example_value"].numel() for a in p.inputs if a.op != "get_attr") for p in pieces[1:]]
    pieces = seen["pieces"]
    assert len(pieces) == 4
    firsts = [next(n for n in p.gm.graph.nodes if n.op not in ("placeholder", "get_attr")) for p in pieces[1:]]
    assert all(n.target is torch.nn.functional.linear for n in firsts), firsts
    width = x.numel()                   # the residual stream's elements; the GELU's output has 4x
    assert crossing(seen["bucket_pieces"]) == [5 * width] * 3
    assert crossing(pieces) == [(2 if narrowest else 5) * width] * 3, crossing(pieces)
    moved = [n.name for n, k in seen["parts"].items() if k != seen["at_bucket"][n]]
    assert bool(moved) == narrowest
    for node, k in seen["parts"].items():
        if node.op == "get_attr":
            assert k >= seen["at_bucket"][node], (node.name, k, seen["at_bucket"][node])


@pytest.mark.parametrize("k, pieces", [(1, 4), (2, 2), (4, 1)])
def test_subgraph_buckets_make_fewer_larger_subgraphs(monkeypatch, k, pieces):
    """`config.ddp_subgraph_buckets = k`: each subgraph holds k buckets' worth of parameters, the first one
    (the graph's end) too, so 3 blocks with a block's bytes a bucket split in 4 (k 1: PyTorch's cut, the first
    bucket a quarter), 2 (k 2) or none (k 4: the whole graph fits); the split graph computes the model's
    outputs and gradients."""
    import flambeau as torch
    from flambeau._dynamo import config
    monkeypatch.setattr(config, "ddp_subgraph_buckets", k)
    model, optimizer = _transformer_split_per_block(torch)
    made = []

    def backend(gm, example_inputs):
        made.append(optimizer())
        return made[-1](gm, example_inputs)

    x = torch.randn(2, 5, 32)
    out = torch.compile(model, backend=backend)(x)
    out.square().sum().backward()
    grads = [p.grad.numpy().copy() for p in model.parameters()]
    model.zero_grad()
    ref = model(x)
    ref.square().sum().backward()
    assert made[0].subgraphs == pieces
    np.testing.assert_allclose(out.detach().numpy(), ref.detach().numpy(), rtol=1e-5, atol=1e-6)
    for g, p in zip(grads, model.parameters()):
        np.testing.assert_allclose(g, p.grad.numpy(), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("autocast", [True, False])
def test_value_crossing_to_a_product_under_autocast_crosses_cast(monkeypatch, autocast):
    """Under bf16 autocast a value that a later subgraph uses only in a product (layer norm's output, before
    the MLP's first linear) is cast in the subgraph that computes it (where the cast fuses with the norm)
    and crosses in bf16; the residual stream, used by an add, crosses in float32. Without autocast both
    cross in float32. The split model computes what the whole one does."""
    import flambeau as torch
    from flambeau._dynamo.backends.distributed import _split
    model, optimizer = _transformer_split_per_block(torch)
    seen = {}

    def backend(gm, example_inputs):
        opt = optimizer()
        split = _split
        monkeypatch.setattr("flambeau._dynamo.backends.distributed._split",
                            lambda g, parts: seen.setdefault("pieces", split(g, parts)))
        return opt(gm, example_inputs)

    x = torch.randn(2, 5, 32)
    with torch.autocast(device_type="cpu", dtype=torch.bfloat16, enabled=autocast):
        out = torch.compile(model, backend=backend)(x)
        want = model(x)
    np.testing.assert_allclose(out.detach().float().numpy(), want.detach().float().numpy(), rtol=1e-5, atol=1e-6)
    for piece in seen["pieces"][1:]:
        crossing = [a for a in piece.inputs if a.op != "get_attr"]
        dtypes = sorted(str(a.meta["example_value"].dtype) if "example_value" in a.meta else
                        str(a.args[1]) for a in crossing)
        bf16, f32 = str(torch.bfloat16), str(torch.float32)
        assert dtypes == ([bf16, f32] if autocast else [f32, f32]), \
            [(a.name, dtypes) for a in crossing]


def _tied_lm(m, vocab=40, d=16, layers=3):
    nn = m.nn

    class LM(nn.Module):
        def __init__(self):
            super().__init__()
            self.wte = nn.Embedding(vocab, d)
            self.h = nn.ModuleList([nn.Sequential(nn.LayerNorm(d), nn.Linear(d, d), nn.GELU()) for _ in range(layers)])
            self.head = nn.Linear(d, vocab, bias=False)
            self.head.weight = self.wte.weight

        def forward(self, idx):
            x = self.wte(idx)
            for blk in self.h:
                x = x + blk(x)
            return self.head(x).float().logsumexp(-1).mean()
    return LM()


@pytest.mark.parametrize("autocast", [True, False])
def test_tied_parameter_under_autocast_is_cast_in_its_own_subgraph(autocast):
    """A tied embedding/output weight split across subgraphs (compiled): under bf16 autocast the output
    layer's subgraph takes a bf16 cast made in the embedding's subgraph, whose backward then adds the two
    gradients inside its compiled code: no eager add of the weight's gradient runs in backward. Without
    autocast the later subgraph takes the parameter, and the autograd engine adds its two gradients (one
    eager add). The gradients equal eager's."""
    import flambeau as torch
    from flambeau._dynamo.backends.distributed import DDPOptimizer
    from flambeau._dynamo.backends.registry import lookup_backend
    from tests.conftest import op_names_mode
    torch.manual_seed(0)
    model = _tied_lm(torch)
    idx = torch.randint(0, 40, (2, 6))
    block = sum(p.numel() * 4 for p in model.h[0].parameters())
    made = []

    def backend(gm, example_inputs):
        opt = DDPOptimizer(block, lookup_backend("inductor"), first_bucket_bytes=block // 4)
        made.append(opt)
        return opt(gm, example_inputs)

    grads, adds = {}, {}
    for tag, fn in (("eager", model), ("split", torch.compile(model, backend=backend))):
        with torch.autocast(device_type="cpu", dtype=torch.bfloat16, enabled=autocast):
            loss = fn(idx)
        mode = op_names_mode()
        with mode:
            loss.backward()
        adds[tag] = sum(n.startswith("add") for n in mode.names)
        grads[tag] = {n: p.grad.numpy().copy() for n, p in model.named_parameters()}
        model.zero_grad(set_to_none=True)
    assert made[0].subgraphs > 2
    for n, g in grads["eager"].items():
        np.testing.assert_allclose(grads["split"][n], g, rtol=5e-2 if autocast else 1e-5, atol=5e-3 if autocast
                                   else 1e-6, err_msg=n)
    assert adds["split"] == (0 if autocast else 1), adds
