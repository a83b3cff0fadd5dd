"""Layout optimization (flambeau/_inductor/layout_opt.py, `config.layout_optimization`): a graph for the
Triton code generator with 4-d convolutions runs channels-last. Run here on cpu tensors through the
Triton backend under Triton's interpreter (TRITON_INTERPRET=1, tests/conftest.py), as
test_inductor_triton.py does:

- a conv-BatchNorm-ReLU net with a max pool, a residual add and a 1x1 convolution, forward and backward,
  compiled with the flag on and off, against float64 PyTorch and against flambeau's eager run;
- with the flag on, the channels-last path is taken: every convolution extern gets channels-last
  operands, 4-d kernels store buffers laid out (N, H, W, C) and presented with channels-last strides,
  BatchNorm's statistics are column reductions (C innermost); with it off, none of that;
- what the caller sees keeps eager's strides: the output, the input's and the weights' gradients; an
  inference graph returning a 4-d activation returns it contiguous;
- the read vote (`reads_channels_last`) on hand-built values.
"""
from __future__ import annotations

import os

import numpy as np
import pytest
import torch

import flambeau as fl

if not fl.cuda.is_available() and os.environ.get("TRITON_INTERPRET") != "1":
    raise RuntimeError("no GPU and TRITON_INTERPRET is not 1: tests/conftest.py sets it before Triton is imported")
triton = pytest.importorskip("triton")

from flambeau._inductor import config, layout_opt  # noqa: E402
from flambeau._inductor.ir import InputBuffer, Layout, Pointwise  # noqa: E402
from flambeau._dynamo.testing import no_unexpected_fallbacks  # noqa: E402
from tests.conftest import spy_compile_fx  # noqa: E402


# triton_backend: the fixture of tests/conftest.py


def net(lib, x, w1, w2, w3, g1, b1, g2, b2):
    F = lib.nn.functional
    y = F.relu(F.batch_norm(F.conv2d(x, w1, padding=1), None, None, g1, b1, training=True))
    y = F.max_pool2d(y, 2)
    z = F.batch_norm(F.conv2d(y, w2, padding=1), None, None, g2, b2, training=True)
    z = F.relu(z + y)
    return F.conv2d(z, w3) * 0.5               # a 4-d output the caller sees


def _values(seed=0, n=2, c=6):
    rng = np.random.default_rng(seed)
    shapes = [(n, 3, 8, 10), (c, 3, 3, 3), (c, c, 3, 3), (5, c, 1, 1), (c,), (c,), (c,), (c,)]
    scale = [1, .3, .3, 1, 1, 1, 1, 1]
    return [(rng.standard_normal(s) * k).astype(np.float32) for s, k in zip(shapes, scale)]


def _contiguous(shape, strides) -> bool:
    want = np.empty(shape, np.int8).strides
    return all(a == b for a, b, s in zip(strides, want, shape) if s != 1)


def _conv_operands(graphs) -> list:
    out = []
    for g in graphs:
        for e in g.artifact.externs:
            if getattr(e.op, "name", None) in layout_opt.CONVOLUTIONS:
                out += [a for a in e.args[:2]]
    return out


@pytest.mark.parametrize("on", [True, False])
def test_conv_net_forward_backward_channels_last(triton_backend, monkeypatch, on):
    monkeypatch.setattr(config, "layout_optimization", on)
    vals = _values()
    graphs = spy_compile_fx(monkeypatch, [])
    args = [fl.tensor(v, requires_grad=True) for v in vals]
    with no_unexpected_fallbacks({"max_pool2d_with_indices", "_max_pool_backward"}):
        out = fl.compile(lambda *a: net(fl, *a))(*args)
        out.backward(fl.tensor(np.cos(np.arange(out.numel())).reshape(out.shape).astype(np.float32)))
    assert len(graphs) == 2, "forward and backward graphs were not compiled"

    eargs = [fl.tensor(v, requires_grad=True) for v in vals]
    eout = net(fl, *eargs)
    eout.backward(fl.tensor(np.cos(np.arange(out.numel())).reshape(out.shape).astype(np.float32)))
    targs = [torch.tensor(v, dtype=torch.float64, requires_grad=True) for v in vals]
    want = net(torch, *targs)
    want.backward(torch.cos(torch.arange(want.numel(), dtype=torch.float64)).reshape(want.shape))

    np.testing.assert_allclose(out.detach().numpy(), want.detach().numpy(), rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(out.detach().numpy(), eout.detach().numpy(), rtol=1e-4, atol=1e-4)
    for a, e, t in zip(args, eargs, targs):
        np.testing.assert_allclose(a.grad.numpy(), t.grad.numpy(), rtol=1e-3, atol=1e-4)
        np.testing.assert_allclose(a.grad.numpy(), e.grad.numpy(), rtol=1e-3, atol=1e-4)
        # what the caller sees has eager's (contiguous) strides
        assert _contiguous(tuple(a.grad.shape), a.grad.stride()), (tuple(a.grad.shape), a.grad.stride())
    assert _contiguous(tuple(out.shape), out.stride()), out.stride()

    operands = _conv_operands(graphs)
    assert len(operands) == 2 * 9          # forward: 3 convolutions; backward: 3 input, 3 weight gradients
    cl_operands = [a for a in operands if layout_opt.is_channels_last(a.layout)
                   and not _contiguous(a.layout.shape, a.layout.strides)]
    views = [v for g in graphs for v in _cl_views(g)]
    if on:
        assert len(cl_operands) == len([a for a in operands if a.shape[2:] != (1, 1)]), \
            "a convolution operand is not channels-last"
        assert views, "no 4-d value was computed channels-last"
        art = graphs[1].artifact           # the backward takes the saved activations as the forward left them
        assert any(len(sh) == 4 and sh[1] > 1 and tuple(b // 4 for b in st) == layout_opt.channels_last_strides(sh)
                   for sh, st in zip(art.input_shapes, art.input_strides)), \
            "the forward saved no activation channels-last"
    else:
        assert not cl_operands and not views


def _cl_views(g, n=2, c=6, hw=((8, 10), (4, 5))) -> list:
    """The buffers the graph's kernels store over the (N, H, W, C) ranges of the net's activations
    (those of values computed channels-last)."""
    nhwc = {(n, h, w, c) for h, w in hw}
    return [nd.buf for k in g.artifact.kernels for nd in k.nodes if tuple(nd.buf.layout.shape) in nhwc]


def test_batchnorm_statistics_are_column_reductions(triton_backend, monkeypatch):
    """With the flag on, BatchNorm's per-channel sums over a channels-last activation read C innermost:
    the generated reduction loads at `x0 + C*r` (a column reduction); off, at `... + HW*x0 + r`."""
    monkeypatch.setattr(config, "layout_optimization", True)
    vals = _values(1)
    graphs = spy_compile_fx(monkeypatch, [])
    with no_unexpected_fallbacks({"max_pool2d_with_indices"}):
        fl.compile(lambda *a: net(fl, *a))(*[fl.tensor(v) for v in vals])
    (g,) = graphs
    assert any(k.column for k in g.artifact.kernels), "no column reduction: BatchNorm's statistics are strided"


def _train_once_vs_torch(monkeypatch, vals) -> list:
    """The net compiled, forward and backward once on `vals`: output and gradients against float64
    PyTorch; returns the compiled graphs (forward, backward)."""
    graphs = spy_compile_fx(monkeypatch, [])
    args = [fl.tensor(v, requires_grad=True) for v in vals]
    with no_unexpected_fallbacks({"max_pool2d_with_indices", "_max_pool_backward"}):
        out = fl.compile(lambda *a: net(fl, *a))(*args)
        out.sum().backward()
    targs = [torch.tensor(v, dtype=torch.float64, requires_grad=True) for v in vals]
    want = net(torch, *targs)
    want.sum().backward()
    np.testing.assert_allclose(out.detach().numpy(), want.detach().numpy(), rtol=1e-4, atol=1e-4)
    for a, t in zip(args, targs):
        np.testing.assert_allclose(a.grad.numpy(), t.grad.numpy(), rtol=1e-3, atol=1e-4)
    return graphs


def test_batchnorm_column_statistics_fuse_and_split(triton_backend, monkeypatch):
    """Column reductions over one outer loop share a kernel with each other and with pointwise values over
    that loop (scheduler._may_join: BatchNorm's sum, mean, sum of squares, rstd; its backward's two sums),
    and such a kernel with few programs is split (partials, then a final kernel running the pointwise
    steps); values and gradients against float64 PyTorch."""
    monkeypatch.setattr(config, "layout_optimization", True)
    monkeypatch.setattr(config, "triton_split_min", 64)
    monkeypatch.setattr(config, "triton_interpret_block", 16)
    monkeypatch.setattr(config, "triton_interpret_split_programs", 16)
    monkeypatch.setattr(config, "triton_column_block", (4, 8))
    vals = _values(3, n=3, c=6)
    graphs = _train_once_vs_torch(monkeypatch, vals)
    fused = [k for g in graphs for k in g.artifact.kernels if k.column and sum(n.is_reduction for n in k.nodes) >= 2]
    assert len(fused) >= 3, "BatchNorm's column reductions were not fused"
    assert all(any(k.column and f"def {k.name}_final(" in g.source for k in g.artifact.kernels) for g in graphs), \
        "no column reduction was split"


def _kernel_source(g, name) -> str:
    src = g.source
    start = src.index(f"def {name}(")
    end = src.find("@triton.jit", start)
    return src[start:end if end >= 0 else len(src)]


def test_column_reductions_are_not_persistent_over_few_outputs(triton_backend, monkeypatch):
    """A column reduction (per-channel sums over a channels-last activation) whose persistent block would
    span fewer than 16 outputs loops over blocks of rows instead: a persistent [1, R] block reads each row
    with a stride of C elements, one element per memory sector (ResNet-50's last BatchNorm backward as
    [1, 4096] blocks: 0.67 ms on the H100). Values and gradients against float64 PyTorch."""
    monkeypatch.setattr(config, "layout_optimization", True)
    monkeypatch.setattr(config, "triton_interpret_block", 256)     # a persistent block: [256 // 256 = 1, 256]
    monkeypatch.setattr(config, "triton_column_block", (8, 16))
    vals = _values(5, n=2, c=6)
    graphs = _train_once_vs_torch(monkeypatch, vals)
    column = [(g, k) for g in graphs for k in g.artifact.kernels if k.column and any(n.is_reduction for n in k.nodes)]
    assert column, "no column reduction"
    for g, k in column:
        src = _kernel_source(g, k.name)
        assert "for r0offset" in src or f"def {k.name}_final(" in g.source, f"{k.name} is a persistent column block"


def test_inference_output_keeps_eager_strides(triton_backend, monkeypatch):
    monkeypatch.setattr(config, "layout_optimization", True)
    vals = _values(2)
    graphs = spy_compile_fx(monkeypatch, [])
    with fl.no_grad(), no_unexpected_fallbacks({"max_pool2d_with_indices"}):
        got = fl.compile(lambda *a: net(fl, *a))(*[fl.tensor(v) for v in vals])
    want = net(torch, *[torch.tensor(v, dtype=torch.float64) for v in vals])
    np.testing.assert_allclose(got.numpy(), want.numpy(), rtol=1e-4, atol=1e-4)
    assert _contiguous(tuple(got.shape), got.stride()), got.stride()
    assert graphs and any(_cl_views(g) for g in graphs)


def test_channels_last_vote():
    """`reads_channels_last`: a value reading a channels-last buffer (C's coefficient 1), or only a
    per-channel vector broadcast over H and W, is permuted; one reading a contiguous buffer is not, nor
    one reading as many of each."""
    shape = (2, 3, 4, 5)
    cl = InputBuffer("a", Layout(shape, fl.float32, layout_opt.channels_last_strides(shape)))
    nchw = InputBuffer("b", Layout(shape, fl.float32))
    vec = InputBuffer("v", Layout((1, 3, 1, 1), fl.float32))

    def pw(*bufs):
        loads = [(b.make_loader(), b.shape) for b in bufs]
        return Pointwise(shape, fl.float32, lambda i: [ld([x if s != 1 else type(x)() for x, s in zip(i, sh)])
                                                       for ld, sh in loads][-1])
    assert layout_opt.reads_channels_last(pw(cl))
    assert layout_opt.reads_channels_last(pw(cl, vec))
    assert not layout_opt.reads_channels_last(pw(nchw))
    assert layout_opt.reads_channels_last(pw(vec))
    assert not layout_opt.reads_channels_last(pw(nchw, vec))
    assert not layout_opt.reads_channels_last(pw(cl, nchw))       # a tie stays contiguous
    assert layout_opt.is_channels_last(cl.layout) and not layout_opt.is_channels_last(nchw.layout)


def test_as_strided_reads_the_storage_eager_has(triton_backend, monkeypatch):
    """as_strided reads its input's storage: a value the graph computed channels-last is read in its
    eager (contiguous) order, not in the (N, H, W, C) order of its buffer."""
    monkeypatch.setattr(config, "layout_optimization", True)

    def f(lib, x, w):
        y = lib.nn.functional.conv2d(x, w, padding=1) * 2 + 1
        return lib.nn.functional.conv2d(y, w, padding=1), y.as_strided((2, 5), (3, 7), 1) + 0
    rng = np.random.default_rng(5)
    x = rng.standard_normal((2, 4, 5, 6)).astype(np.float32)
    w = (rng.standard_normal((4, 4, 3, 3)) * .3).astype(np.float32)
    graphs = spy_compile_fx(monkeypatch, [])
    got = fl.compile(lambda *a: f(fl, *a))(fl.tensor(x), fl.tensor(w))
    want = f(torch, torch.tensor(x, dtype=torch.float64), torch.tensor(w, dtype=torch.float64))
    for g, t in zip(got, want):
        np.testing.assert_allclose(g.numpy(), t.numpy(), rtol=1e-4, atol=1e-4)
    assert any(layout_opt.is_channels_last(a.layout) and not _contiguous(a.layout.shape, a.layout.strides)
               for a in _conv_operands(graphs)), "the graph did not run channels-last"


def _resnet_like(lib):
    nn, F = lib.nn, lib.nn.functional

    class Block(nn.Module):
        def __init__(self, cin, cout, stride):
            super().__init__()
            self.c1, self.b1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False), nn.BatchNorm2d(cout)
            self.c2, self.b2 = nn.Conv2d(cout, cout, 1, bias=False), nn.BatchNorm2d(cout)
            self.down = nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout))

        def forward(self, x):
            y = F.relu(self.b1(self.c1(x)), inplace=True)
            y = self.b2(self.c2(y))
            y += self.down(x)
            return F.relu(y, inplace=True)

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.stem, self.bn = nn.Conv2d(3, 8, 3, 1, 1, bias=False), nn.BatchNorm2d(8)
            self.pool = nn.MaxPool2d(3, 2, 1)
            self.block = Block(8, 12, 2)
            self.fc = nn.Linear(12, 5)

        def forward(self, x):
            x = self.pool(F.relu(self.bn(self.stem(x))))
            return self.fc(lib.flatten(F.adaptive_avg_pool2d(self.block(x), 1), 1))
    return Net()


def test_resnet_like_module_trains_as_pytorch(triton_backend, monkeypatch):
    """A ResNet-like module (BatchNorm with running statistics, in-place ReLU, a strided downsample, max
    and adaptive average pooling, a linear head) trained 2 SGD steps compiled channels-last: losses, the
    first step's gradients (with eager's strides) and the final state against PyTorch."""
    monkeypatch.setattr(config, "layout_optimization", True)
    tm, fm = _resnet_like(torch), _resnet_like(fl)
    fm.load_state_dict({k: fl.tensor(v.detach().numpy()) for k, v in tm.state_dict().items()})
    rng = np.random.default_rng(6)
    x = rng.standard_normal((3, 3, 12, 14)).astype(np.float32)
    y = rng.integers(0, 5, 3)
    graphs = spy_compile_fx(monkeypatch, [])
    cm = fl.compile(fm)
    topt, fopt = torch.optim.SGD(tm.parameters(), lr=0.1), fl.optim.SGD(fm.parameters(), lr=0.1)
    for step in range(2):
        tloss = torch.nn.functional.cross_entropy(tm(torch.tensor(x)), torch.tensor(y))
        tloss.backward()
        floss = fl.nn.functional.cross_entropy(cm(fl.tensor(x)), fl.tensor(y))
        floss.backward()
        np.testing.assert_allclose(float(floss.detach()), float(tloss.detach()), rtol=1e-5)
        if step == 0:
            tgrads = dict(tm.named_parameters())
            for name, p in fm.named_parameters():
                np.testing.assert_allclose(p.grad.numpy(), tgrads[name].grad.numpy(), rtol=1e-3, atol=1e-5)
                assert p.grad.stride() == p.stride() or p.grad.shape[2:] == (1, 1), (name, p.grad.stride())
        topt.step()
        topt.zero_grad()
        fopt.step()
        fopt.zero_grad()
    want = tm.state_dict()
    for k, v in fm.state_dict().items():
        np.testing.assert_allclose(v.numpy(), want[k].numpy(), rtol=1e-4, atol=1e-5, err_msg=k)
    assert len(graphs) >= 2 and any(_cl_views(g, n=3, c=12, hw=((3, 4),)) for g in graphs), \
        "the block's values were not computed channels-last"


# ---- on the GPU machine ----------------------------------------------------------------------------
@pytest.mark.cuda
@pytest.mark.parametrize("amp", [False, True], ids=["float32", "bf16_autocast"])
def test_resnet_like_module_channels_last_on_cuda(amp, monkeypatch):
    """On cuda with the flag on: 3 compiled training steps of the ResNet-like module give eager's losses
    (and in float32 gradients); the convolutions get channels-last operands (no operand re-laid out by the
    cuDNN wrapper on the last step: `cudnn.copies` unchanged) and run their plans (`extern_conv.stats["fast"]`
    grows); the input's gradient has eager's strides."""
    from flambeau._backends import cudnn
    from flambeau._inductor import extern_conv
    monkeypatch.setattr(config, "layout_optimization", True)
    rng = np.random.default_rng(7)
    x = fl.tensor(rng.standard_normal((4, 3, 16, 20)).astype(np.float32)).cuda()
    y = fl.tensor(rng.integers(0, 5, 4)).cuda()

    def run(compiled, steps=3):
        fl.manual_seed(0)
        m = _resnet_like(fl).cuda()
        fwd = fl.compile(m) if compiled else m
        out, counts = [], {}
        for i in range(steps):
            if i == steps - 1:
                counts = {"copies": sum(cudnn.copies.values()), "fast": extern_conv.stats["fast"]}
            xi = x.clone().requires_grad_()
            with fl.autocast(device_type="cuda", dtype=fl.bfloat16, enabled=amp):
                loss = fl.nn.functional.cross_entropy(fwd(xi).float(), y)
            loss.backward()
            out.append((float(loss), [p.grad.float().cpu().numpy().copy() for p in m.parameters()], xi.grad.stride()))
            m.zero_grad(set_to_none=True)
        counts = {"copies": sum(cudnn.copies.values()) - counts["copies"], "fast": extern_conv.stats["fast"] - counts["fast"]}
        return out, counts
    ref, _ = run(False)
    graphs = spy_compile_fx(monkeypatch, [])
    got, counts = run(True)
    assert counts["copies"] == 0, f"the cuDNN wrapper re-laid out {counts['copies']} operands in a compiled step"
    assert counts["fast"] >= 5, counts
    assert any(layout_opt.is_channels_last(a.layout) and not _contiguous(a.layout.shape, a.layout.strides)
               for a in _conv_operands(graphs))
    for (lg, gg, sg), (lr, gr, sr) in zip(got, ref):
        np.testing.assert_allclose(lg, lr, rtol=2e-2 if amp else 1e-4)
        assert sg == sr
        if not amp:
            for a, b in zip(gg, gr):
                np.testing.assert_allclose(a, b, rtol=1e-3, atol=1e-4)


def test_autocast_weight_cast_is_stored_once_channels_last(triton_backend, monkeypatch):
    """Under bfloat16 autocast a 3x3 weight's cast is also saved for the backward: it is realised
    channels-last where it is computed (`graph._feeds_convolution`), not stored contiguous and then
    copied again for the convolution. The forward's output against float64 PyTorch at bf16 accuracy."""
    monkeypatch.setattr(config, "layout_optimization", True)
    vals = _values(4)
    graphs = spy_compile_fx(monkeypatch, [])
    args = [fl.tensor(v, requires_grad=True) for v in vals]
    with fl.autocast("cpu", dtype=fl.bfloat16), no_unexpected_fallbacks({"max_pool2d_with_indices"}):
        out = fl.compile(lambda *a: net(fl, *a))(*args)
    want = net(torch, *[torch.tensor(v, dtype=torch.float64) for v in vals]).numpy()
    np.testing.assert_allclose(out.float().detach().numpy(), want, atol=0.05 * np.abs(want).max())
    fw = graphs[0].artifact
    for w in vals[1:3]:                        # the 3x3 weights: one bf16 store each
        stores = [b for k in fw.kernels for b in k.stores if b.layout.numel == w.size and b.dtype is fl.bfloat16]
        assert len(stores) == 1, [b.layout for b in stores]
