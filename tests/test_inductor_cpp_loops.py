"""The C++ code generator's loop nests: what is computed inside the innermost (vectorised) loops and what
before them, and which values a compiled graph stores instead of recomputing. Values vs PyTorch.

An `omp simd` loop that reads memory at an index computed inside it (an embedding's row, a value per
row) is compiled with AVX-512 gathers; values that don't vary in the loop are computed once before it
(codegen_cpp.CppHandler._emit); a loop whose conditional loads are at divided indices (a cat of
transposed pieces) is left scalar. A pointwise value with several users one of which is the graph's
output (a residual stream saved for the backward) is stored where it is computed and read by the
others (graph.GraphLowering._maybe_realize), so a layer norm does not recompute all earlier layers.
"""
import re
import warnings

import numpy as np
import pytest
import torch

import flambeau
from flambeau import _cpp_builder as cpp_builder
from flambeau._inductor import config
from tests.conftest import spy_compile_fx
from tests.test_inductor import check, randn



def _has_compiler() -> bool:
    try:
        cpp_builder.detect_flags()
        return True
    except cpp_builder.NoCompilerError:
        return False


pytestmark = pytest.mark.skipif(not _has_compiler(), reason="no C++ compiler")


@pytest.fixture(autouse=True)
def _cache_dir(tmp_path_factory, monkeypatch):
    monkeypatch.setattr(cpp_builder, "cache_dir", str(tmp_path_factory.getbasetemp() / "inductor_cache"))


def innermost_bodies(source: str) -> list:
    """The statements inside each `omp simd` loop of the C++ source (the loop after each pragma)."""
    lines, out = source.splitlines(), []
    for i, line in enumerate(lines):
        if "#pragma omp" in line and "simd" in line:
            depth, body = 0, []
            for s in lines[i + 1:]:
                depth += s.count("{") - s.count("}")
                body.append(s)
                if depth <= 0:
                    break
            out.append(body)
    return out


def _embedding_layer_norm(T, idx, w, pos, g, b):
    x = T.nn.functional.embedding(idx, w) + pos
    return T.nn.functional.layer_norm(x, (x.shape[-1],), g, b)


def invariant_loads(source: str) -> list:
    """Loads inside an `omp simd` loop at an index that doesn't depend on the loop: its variable or a
    value computed in the loop's body."""
    out = []
    for body in innermost_bodies(source):
        var = re.match(r"\s*for \(int64_t (\w+) =", body[0]).group(1)
        local = set(re.findall(r"^\s*\w+ (tmp\d+) =", "\n".join(body), re.M))
        for name, index in re.findall(r"= (\w+)\[([^\]]*)\];", "\n".join(body)):
            if not ({var} | local) & set(re.findall(r"\w+", index)):
                out.append(f"{name}[{index}]")
    return out


def test_a_row_index_is_read_before_the_inner_loop():
    idx = flambeau.tensor(np.random.default_rng(0).integers(0, 65, (8, 32)))
    w, pos, g, b = randn(65, 64), randn(32, 64), randn(64), randn(64)
    c = check(_embedding_layer_norm, idx, w, pos, g, b, atol=1e-5, rtol=1e-5)
    assert innermost_bodies(c.source) and "fl_index(" in c.source
    assert not any("fl_index(" in s for body in innermost_bodies(c.source) for s in body), c.source
    assert invariant_loads(c.source) == [], c.source


def test_a_value_per_row_is_read_in_the_row_loop_not_the_column_loop():
    x, d, t = randn(37, 65), randn(37).abs() + 0.5, flambeau.randint(0, 65, (37,))
    c = check(lambda T, x, d, t: (x / d[:, None] - (t[:, None] == T.arange(65)).float()) * (t[:, None] != 3),
              x, d, t, kernels=1)
    assert "for (int64_t y1" in c.source and invariant_loads(c.source) == [], c.source


def test_a_weight_gradient_over_normalised_rows_is_a_column_reduction():
    x, dy, g = randn(300, 48), randn(300, 48), randn(48)
    mean, rstd = x.mean(1), x.var(1, unbiased=False).add(1e-5).rsqrt()
    c = check(lambda T, x, dy, g, mean, rstd: [(dy * (x - mean[:, None]) * rstd[:, None]).sum(0), (dy * g).sum(0)],
              x, dy, g, mean, rstd, rtol=1e-5, atol=1e-5)
    assert c.source.count("acc[xi] +=") == 2, c.source      # both read a block of columns per row
    assert invariant_loads(c.source) == [], c.source       # (the row's mean and deviation: once per row)


def test_a_cat_of_transposed_pieces_runs_a_scalar_loop_and_matches():
    q, k, v = randn(2, 4, 8, 16), randn(2, 4, 8, 16), randn(2, 4, 8, 16)
    c = check(lambda T, q, k, v: T.cat([z.transpose(1, 2).reshape(2, 8, 64) for z in (q, k, v)], 2) * 2, q, k, v)
    assert "if (" in c.source, c.source
    assert not any("if (" in s for body in innermost_bodies(c.source) for s in body), c.source
    x, y = randn(4, 3), randn(4, 5)        # contiguous pieces: vectorised conditional loads stay simd
    c = check(lambda T, x, y: T.cat([x, y.exp()], dim=1), x, y)
    assert any("if (" in s for body in innermost_bodies(c.source) for s in body), c.source


def test_a_hoisted_out_of_range_index_still_raises():
    warnings.simplefilter("ignore")
    f = flambeau.compile(lambda w, i: flambeau.nn.functional.layer_norm(flambeau.nn.functional.embedding(i, w), (16,)),
                         backend="inductor")
    w = flambeau.randn(5, 16)
    ok = f(w, flambeau.tensor([[0, 4], [1, -5]]))
    ref = torch.nn.functional.layer_norm(torch.nn.functional.embedding(torch.tensor([[0, 4], [1, 0]]),
                                                                       torch.from_numpy(w.numpy())), (16,))
    torch.testing.assert_close(torch.from_numpy(ok.numpy()), ref)
    with pytest.raises(IndexError):
        f(w, flambeau.tensor([[0, 7], [1, 2]]))


def test_invariants_inside_and_outside_a_masked_body():
    x, y, s = randn(6, 5), randn(6, 7), randn(6)
    check(lambda T, x, y, s: [T.cat([x * s[:, None].exp(), y - s[:, None].exp()], 1).softmax(1),
                              T.cat([x, y], 1) * s[:, None].exp()], x, y, s)


def _residual_net(lib, width, depth):
    nn = lib.nn

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.norms = nn.ModuleList([nn.LayerNorm(width) for _ in range(depth)])
            self.lins = nn.ModuleList([nn.Linear(width, width) for _ in range(depth)])

        def forward(self, x):
            for ln, lin in zip(self.norms, self.lins):
                x = x + lin(ln(x))
            return x.square().mean()
    return Net()


@pytest.mark.parametrize("cse,saved_rule,reads_rule,bound", [
    (False, True, 10 ** 6, 5),      # without CSE the layer norms' backward saves the stream: stored as an output
    (True, True, 2, 7),             # with it they save the normalized values; the reads rule (large reads) stores
    (True, False, 10 ** 6, None)],  # the stream every other layer (a stream point is re-read by two layers at most)
    ids=["stored_as_output", "stored_by_reads", "recomputed"])
def test_a_saved_residual_stream_is_read_not_recomputed(monkeypatch, cse, saved_rule, reads_rule, bound):
    """A residual stream is stored where it is computed, not recomputed from every earlier layer by each
    layer norm: as a saved output with other users (`realize_saved_outputs`), or as a value with several
    users reading more than `realize_reads_threshold` large buffers; with neither it is recomputed."""
    from flambeau._functorch import config as aot_config
    monkeypatch.setattr(aot_config, "cse", cse)
    monkeypatch.setattr(config, "realize_saved_outputs", saved_rule)
    monkeypatch.setattr(config, "realize_reads_threshold", reads_rule)
    warnings.simplefilter("ignore")
    depth = 6
    graphs = spy_compile_fx(monkeypatch, [])
    model = _residual_net(flambeau, 32, depth)
    ref = _residual_net(torch, 32, depth)
    ref.load_state_dict({k: torch.from_numpy(v.numpy().copy()) for k, v in model.state_dict().items()})
    x = randn(16, 32)
    loss = flambeau.compile(model)(x)
    loss.backward()
    r = ref(torch.from_numpy(x.numpy().copy()))
    r.backward()
    torch.testing.assert_close(torch.tensor(loss.item()), r.detach(), rtol=1e-5, atol=1e-6)
    for (name, p), (_, q) in zip(model.named_parameters(), ref.named_parameters()):
        torch.testing.assert_close(torch.from_numpy(p.grad.numpy()), q.grad, rtol=1e-4, atol=1e-5, msg=name)
    forward = graphs[0].source
    assert invariant_loads(forward) == [], forward     # (the saved mean and deviation: scalars of the row)
    reads = [len(re.findall(r"const float\* __restrict__", sig))
             for sig in re.findall(r'extern "C" __attribute__\(\(noinline\)\) void kernel\d+\(([^)]*)\)', forward)]
    # stored: each layer norm reads the stream's last stored value, the new products and their biases, its
    # weight and bias; recomputed, the last one re-adds every earlier layer's product and bias
    if bound is None:
        assert max(reads) >= 2 * depth, (reads, forward)
    else:
        assert max(reads) <= bound, (reads, forward)
