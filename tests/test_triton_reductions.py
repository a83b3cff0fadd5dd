"""Reductions of the Triton code generator with few outputs and many elements each (BatchNorm's
per-channel sums over N*H*W), run by Triton's interpreter (TRITON_INTERPRET=1, tests/conftest.py):

- independent reductions over the same elements in one kernel (BatchNorm's backward: sum(dy),
  sum(dy * x_hat), ...) share one loop, a shared input loaded once per block, both when the kernel
  is split over a 2-D grid (partials, then a final kernel) and when each program loops over a row;
- values and gradients against PyTorch in float64, odd sizes, float32 and bfloat16 inputs (float32
  accumulation), NCHW and channels-last.
"""
from __future__ import annotations

import os
import re

import numpy as np
import pytest
import torch

import flambeau as fl

if not fl.cuda.is_available() and os.environ.get("TRITON_INTERPRET") != "1":
    raise RuntimeError("no GPU and TRITON_INTERPRET is not 1: tests/conftest.py sets it before Triton is imported")
triton = pytest.importorskip("triton")

from flambeau._inductor import config  # noqa: E402
from flambeau._dynamo.testing import no_unexpected_fallbacks  # noqa: E402
from tests.conftest import spy_compile_fx  # noqa: E402


def _bn_relu(lib, x, w, b):
    return lib.nn.functional.relu(lib.nn.functional.batch_norm(x, None, None, w, b, training=True))


def _body(src: str, name: str) -> str:
    """The body of jit function `name` in a generated module."""
    return src.split(f"def {name}(", 1)[1].split("\n@triton.jit", 1)[0]


def _loops(src: str, name: str) -> int:
    """The `for` loops over inner elements in the jit function `name`."""
    return len(re.findall(r"for r\d+offset in range", _body(src, name)))


def _most_sums_per_loop(src: str) -> int:
    """The most accumulators one inner-element loop of the module updates."""
    loops = re.split(r"\n    for r\d+offset in range", src)[1:]
    return max((len(re.findall(r"\n        acc\d+ = acc\d+ \+", lp.split("\n    acc", 1)[0].split("\n    tl.", 1)[0]))
                for lp in loops), default=0)


def _kernel_with(src: str, marker: str) -> str:
    """The name of the jit function whose body holds `marker`."""
    for part in src.split("@triton.jit\n")[1:]:
        if marker in part:
            return part.split("def ", 1)[1].split("(", 1)[0]
    raise AssertionError(f"no kernel holds {marker!r}")


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("split", [True, False], ids=["split", "rows"])
@pytest.mark.parametrize("channels_last", [False, True], ids=["nchw", "nhwc"])
def test_batchnorm_sums_share_one_pass(triton_backend, monkeypatch, dtype, split, channels_last):
    """BatchNorm(+ReLU) training step compiled: output and the three gradients against PyTorch in
    float64 (on the same bfloat16-rounded input); the backward's independent per-channel sums are one
    loop in their kernel (split: its partials kernel writes 2+ workspaces from one loop; rows: one
    program per channel loops over the channel once for all of them)."""
    monkeypatch.setattr(config, "triton_interpret_block", 16)
    monkeypatch.setattr(config, "triton_loop_block", 16)
    monkeypatch.setattr(config, "triton_persistent_limit", 16)
    if split:
        monkeypatch.setattr(config, "triton_split_min", 64)
        monkeypatch.setattr(config, "triton_interpret_split_programs", 16)
    else:
        monkeypatch.setattr(config, "triton_split_min", 1 << 30)
    shape = (3, 5, 7, 9)                          # N*H*W = 189: odd, not a multiple of any block
    rng = np.random.default_rng(11)
    x = (rng.standard_normal(shape) * 2 + 3).astype(np.float32)
    w = rng.standard_normal(5).astype(np.float32)
    b = rng.standard_normal(5).astype(np.float32)
    gy = rng.standard_normal(shape).astype(np.float32)
    fdt = getattr(fl, dtype)
    made = spy_compile_fx(monkeypatch, [])
    fx = fl.tensor(x).to(fdt)
    if channels_last:
        fx = fx.contiguous(memory_format=fl.channels_last)
    fx.requires_grad_()
    fw, fb = fl.tensor(w, requires_grad=True), fl.tensor(b, requires_grad=True)
    with no_unexpected_fallbacks({}):
        out = fl.compile(lambda *a: _bn_relu(fl, *a))(fx, fw, fb)
        out.backward(fl.tensor(gy).to(fdt))
    x64 = fx.detach().float().numpy().astype(np.float64)        # the input as rounded to dtype
    g64 = fl.tensor(gy).to(fdt).float().numpy().astype(np.float64)
    tx, tw, tb = (torch.tensor(v, dtype=torch.float64, requires_grad=True) for v in (x64, w, b))
    want = _bn_relu(torch, tx, tw, tb)
    want.backward(torch.tensor(g64))
    tol = dict(rtol=1e-4, atol=1e-4) if dtype == "float32" else dict(rtol=2e-2, atol=3e-2)
    assert out.dtype == fdt and fx.grad.dtype == fdt
    np.testing.assert_allclose(out.detach().float().numpy(), want.detach().numpy(), **tol)
    for g, t in ((fx, tx), (fw, tw), (fb, tb)):
        np.testing.assert_allclose(g.grad.float().numpy(), t.grad.numpy(), **tol)
    assert len(made) == 2, "forward and backward not both compiled"
    src = made[1].source
    assert _most_sums_per_loop(src) >= 2, f"no loop of the backward updates two sums:\n{src}"
    if split:
        name = _kernel_with(src, "tl.store(ws1_v")            # the backward's partials kernel (2+ sums)
        assert _loops(src, name) == 1, f"the split sums of {name} loop {_loops(src, name)} times:\n{src}"
    else:
        assert "ws0_v" not in src, "the rows case split"


def test_shared_pass_loads_a_shared_input_once(triton_backend, monkeypatch):
    """Two sums of one input (sum(x), sum(x * x)) over each row of a (4, 300) matrix: one loop, one
    load of x per block; values against NumPy in float64."""
    monkeypatch.setattr(config, "triton_loop_block", 64)
    monkeypatch.setattr(config, "triton_interpret_block", 64)
    monkeypatch.setattr(config, "triton_persistent_limit", 64)
    monkeypatch.setattr(config, "triton_split_min", 1 << 30)
    x = np.random.default_rng(2).standard_normal((4, 300)).astype(np.float32)
    made = spy_compile_fx(monkeypatch, [])
    with no_unexpected_fallbacks({}):
        s, q = fl.compile(lambda t: (t.sum(1), (t * t).sum(1)))(fl.tensor(x))
    x64 = x.astype(np.float64)
    np.testing.assert_allclose(s.numpy(), x64.sum(1), rtol=1e-5, atol=1e-4)
    np.testing.assert_allclose(q.numpy(), (x64 * x64).sum(1), rtol=1e-5, atol=1e-4)
    src = made[0].source
    name = _kernel_with(src, "acc1 =")
    assert _loops(src, name) == 1 and _body(src, name).count("tl.load(") == 1, src


def test_batchnorm_training_saves_its_input_and_reads_it_twice_backward(triton_backend, monkeypatch):
    """conv -> BatchNorm (running statistics) -> ReLU compiled for training. BatchNorm is one op for
    autograd (functionalization runs it without running statistics and writes those after it), so its
    backward is native_batch_norm_backward's: one pass for both per-channel sums, one for dx; the
    forward saves its input (the convolution's output), no x - mean (before: the decomposition was
    differentiated op by op, two full-size x - mean saved, five full-size backward passes). Output,
    running statistics and gradients vs PyTorch in float64; full-size buffers the wrappers allocate:
    forward 1 (the output), backward 1 (dx); the backward reduces 3 sums in 2 loops (dx's sums are the
    parameter gradients' sums; before, 5 sums in 4 loops)."""
    for knob, v in (("triton_interpret_block", 16), ("triton_loop_block", 16), ("triton_persistent_limit", 16),
                    ("triton_split_min", 32), ("triton_interpret_split_programs", 16)):
        monkeypatch.setattr(config, knob, v)             # split as the GPU's BatchNorm sums are
    # NCHW buffers counted (channels-last adds the input's and weight's conversion copies: test_layout_opt.py)
    monkeypatch.setattr(config, "layout_optimization", False)
    rng = np.random.default_rng(4)
    shapes = ((2, 3, 6, 5), (4, 3, 3, 3), (4,), (4,), (4,), (4,), (4,))
    vals = [rng.standard_normal(s).astype(np.float32) for s in shapes]
    vals[6] = np.abs(vals[6]) + 0.5                     # running variance

    def fn(lib, x, k, kb, w, b, rm, rv):
        F = lib.nn.functional
        return F.relu(F.batch_norm(F.conv2d(x, k, kb, padding=1), rm, rv, w, b, training=True))
    made = spy_compile_fx(monkeypatch, [])
    fl_params = [fl.tensor(v, requires_grad=True) for v in vals[:5]]
    frm, frv = fl.tensor(vals[5]), fl.tensor(vals[6])
    with no_unexpected_fallbacks({}):
        out = fl.compile(lambda *a: fn(fl, *a))(*fl_params, frm, frv)
        (out * out).sum().backward()
    t_params = [torch.tensor(v, dtype=torch.float64, requires_grad=True) for v in vals[:5]]
    trm, trv = (torch.tensor(v, dtype=torch.float64) for v in vals[5:])
    want = fn(torch, *t_params, trm, trv)
    (want * want).sum().backward()
    np.testing.assert_allclose(out.detach().numpy(), want.detach().numpy(), rtol=1e-4, atol=1e-4)
    for g, t in zip(fl_params, t_params):
        np.testing.assert_allclose(g.grad.numpy(), t.grad.numpy(), rtol=1e-4, atol=1e-4)
    for f, t in ((frm, trm), (frv, trv)):
        np.testing.assert_allclose(f.numpy(), t.numpy(), rtol=1e-5, atol=1e-6)
    fw, bw = (g.artifact.wrapper_source for g in made)
    assert fw.count("_empty((2, 4, 6, 5),") == 1, fw
    assert bw.count("_empty((2, 4, 6, 5),") == 1, bw
    bsrc = made[1].source                  # sums: BatchNorm's sum(g) and sum(g * x_hat), the conv bias's; in 2 loops
    assert len(re.findall(r"\n    acc\d+ = tl.full", bsrc)) == 3 and len(re.findall(r"for r\d+offset", bsrc)) == 2, bsrc


@pytest.mark.parametrize("limit", [None, 12], ids=["default", "old_limit"])
def test_gelu_tanh_is_recomputed_in_its_backward_kernel_not_stored(triton_backend, monkeypatch, limit):
    """A bf16 autocast Linear + GELU(tanh) trained compiled for the Triton generator. With the joint
    graph's CSE the backward's tanh is the forward's, recomputed in the backward for its two uses in one
    kernel; a multi-use value is stored only above `config.realize_opcount_threshold` ops (30, PyTorch's):
    with 12 the tanh chain was stored as a float32 (8, 32) buffer at the backward's start (on an H100, GPT-2's
    12 layers: 1.2 GB, 0.6 ms a step). Loss and gradients vs PyTorch's autocast on cpu."""
    if limit is not None:
        monkeypatch.setattr(config, "realize_opcount_threshold", limit)
    rng = np.random.default_rng(0)
    vals = [rng.standard_normal(s).astype(np.float32) for s in ((8, 16), (32, 16), (32,), (4, 32))]

    def fn(lib, x, w1, b1, w2):
        F = lib.nn.functional
        with lib.autocast("cpu", dtype=lib.bfloat16):
            h = F.gelu(F.linear(x, w1, b1), approximate="tanh")
            return F.linear(h, w2).float().square().sum()
    made = spy_compile_fx(monkeypatch, [])
    fl_params = [fl.tensor(v, requires_grad=True) for v in vals]
    out = fl.compile(lambda *a: fn(fl, *a))(*fl_params)
    out.backward()
    t_params = [torch.tensor(v, requires_grad=True) for v in vals]
    want = fn(torch, *t_params)
    want.backward()
    np.testing.assert_allclose(out.item(), want.item(), rtol=3e-2)
    for g, t in zip(fl_params, t_params):
        np.testing.assert_allclose(g.grad.numpy(), t.grad.numpy(), rtol=5e-2, atol=5e-2 * np.abs(t.grad.numpy()).max())
    bw = made[1].artifact.wrapper_source
    assert ("_empty((8, 32), _dt_float32)" in bw) == (limit == 12), bw
