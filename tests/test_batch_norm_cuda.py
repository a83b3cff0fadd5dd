"""BatchNorm in training on cuda as Triton kernels (flambeau/_backends/triton_batch_norm.py), ReLU as
one Triton kernel each way (triton_pointwise.RELU), half-precision binary ops in one kernel, column
sums (bias gradients, triton_sum.py), the BatchNorm derivative's shortcut and dropout(p=0).

On the CPU: the BatchNorm kernels under Triton's interpreter against float64 PyTorch
(tests/scripts/triton_batch_norm_interp.py; ReLU is in triton_pointwise_interp.py, run by
tests/test_norm_fused.py), and the derivative skipping the statistics' term. On the GPU (marked
`cuda`): forward, running statistics and backward through flambeau's ops against PyTorch on cuda,
float32 and bfloat16, with the kernels spied on."""
import importlib.util

import numpy as np
import pytest
import torch

import flambeau
from flambeau._ops import norm_loss
from tests.conftest import run_interpreted_script
from tests.test_norm_fused import _spy


@pytest.mark.skipif(importlib.util.find_spec("triton") is None, reason="Triton is not installed")
@pytest.mark.parametrize("script", ["triton_batch_norm_interp.py", "triton_sum_interp.py"])
def test_kernels_under_the_interpreter(script):
    run_interpreted_script(script)


def test_dropout_of_zero_is_the_input_itself():
    """PyTorch's dropout with p=0 (GPT-2's nn.Dropout(0.0) in training) returns its input: no mask,
    no random draw, no kernels."""
    x = flambeau.randn(4, 5, requires_grad=True)
    state = flambeau.get_rng_state()
    assert flambeau.nn.functional.dropout(x, 0.0, training=True) is x
    assert flambeau.dropout(x, 0.0, True) is x
    assert flambeau.equal(flambeau.get_rng_state(), state)
    assert torch.nn.functional.dropout(torch.ones(2), 0.0, training=True).data_ptr() is not None


def test_derivative_skips_the_statistics_term_without_their_gradients(monkeypatch):
    """Only the output gets a gradient in training: the term through the saved mean/rstd (double
    backward's) is not computed (it was, on every step: the engine's zero gradients lost their mark
    in a reshape), and still is when the statistics do get one."""
    calls = []
    real = norm_loss._through_stats
    monkeypatch.setattr(norm_loss, "_through_stats", lambda *a: calls.append(1) or real(*a))
    x = flambeau.randn(4, 3, 5, requires_grad=True)
    w = flambeau.ones(3, requires_grad=True)
    flambeau.nn.functional.batch_norm(x, None, None, w, None, training=True).square().sum().backward()
    assert calls == []
    y, mean, rstd = flambeau.ops.aten.native_batch_norm(x, w, None, None, None, True, 0.1, 1e-5)
    (y.sum() + mean.sum() + rstd.sum()).backward()
    assert calls == [1]


# the output and input gradient are rounded to the storage type; the statistics and the parameter
# gradients are float32 sums whatever it is
TOL = {"float32": 1e-4, "bfloat16": 1e-2}
SUM_TOL = 1e-4


@pytest.mark.cuda
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("shape,affine", [((8, 16, 10, 10), True), ((64, 3), True), ((4, 6, 5), False),
                                          ((16, 64, 56, 56), True), ((64, 256, 14, 14), True), ((8, 512, 7, 7), False)])
def test_batch_norm_matches_float64_torch(shape, affine, dtype, monkeypatch):
    """Against float64 PyTorch on the same (rounded) inputs: PyTorch's own bfloat16 cuda kernels are
    several percent off in the parameter gradients (6% at 16 in the (16, 64, 56, 56) case). The last
    two shapes (as many channels as an H100/H200 has multiprocessors or more, at most 16384 elements
    each) take the one-program-per-channel kernels."""
    from flambeau._backends import triton_batch_norm
    calls = _spy(monkeypatch, triton_batch_norm, ["forward", "backward"])
    rng = np.random.default_rng(sum(shape))
    C = shape[1]
    x = flambeau.tensor((rng.standard_normal(shape) * 2 + 1).astype(np.float32)).to(getattr(flambeau, dtype))
    dy = flambeau.tensor(rng.standard_normal(shape).astype(np.float32)).to(getattr(flambeau, dtype))
    w, b = rng.standard_normal(C).astype(np.float32), rng.standard_normal(C).astype(np.float32)
    out = []
    for lib, dev, src in ((torch, "cpu", lambda t: torch.tensor(t.float().numpy(), dtype=torch.float64)),
                          (flambeau, "cuda", lambda t: t.to("cuda"))):
        xt = src(x).requires_grad_()
        params = [lib.tensor(p, device=dev, requires_grad=True) for p in (w, b)] if affine else [None, None]
        if lib is torch:
            params = [p if p is None else p.double().detach().requires_grad_() for p in params]
        rm, rv = lib.zeros(C, device=dev, dtype=xt.dtype if lib is torch else lib.float32), \
            lib.ones(C, device=dev, dtype=xt.dtype if lib is torch else lib.float32)
        y = lib.nn.functional.batch_norm(xt, rm, rv, *params, training=True, momentum=0.3)
        y.backward(src(dy))
        got = [y, xt.grad, rm, rv] + ([p.grad for p in params] if affine else [])
        out.append([t.detach().cpu().float().numpy() for t in got])
    assert calls == ["forward", "backward"]
    for name, f, t in zip(("y", "x.grad", "running_mean", "running_var", "weight.grad", "bias.grad"), *out[::-1]):
        tol = TOL[dtype] if name in ("y", "x.grad") else SUM_TOL
        np.testing.assert_allclose(f, t, rtol=tol, atol=tol * max(1.0, np.abs(t).max()), err_msg=name)


@pytest.mark.cuda
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_relu_matches_torch_on_cuda(dtype, monkeypatch):
    from flambeau._backends import triton_pointwise
    calls = _spy(monkeypatch, triton_pointwise, ["forward", "backward"])
    rng = np.random.default_rng(0)
    x = rng.standard_normal((4, 1000, 3)).astype(np.float32)
    x[0, :3, 0] = [0.0, -0.0, np.nan]
    dy = rng.standard_normal(x.shape).astype(np.float32)
    out = []
    for lib in (torch, flambeau):
        dt = getattr(lib, dtype)
        xt = lib.tensor(x, device="cuda").to(dt).requires_grad_()
        y = lib.nn.functional.relu(xt)
        y.backward(lib.tensor(dy, device="cuda").to(dt))
        out.append([t.detach().float().cpu().numpy() for t in (y, xt.grad)])
    assert calls == ["forward", "backward"]
    for f, t in zip(out[1], out[0]):
        np.testing.assert_array_equal(f, t)


@pytest.mark.cuda
@pytest.mark.parametrize("op", ["add", "sub", "mul", "div"])
def test_half_precision_binary_ops_are_one_kernel_and_match_torch(op, monkeypatch):
    """bfloat16 add/sub/mul/div (a ResNet's residual add, GPT's elementwise chains), and float32 with
    bfloat16 (GPT's residual stream), in one Triton kernel, float32 arithmetic rounded once: bit for
    bit PyTorch's cuda result."""
    from flambeau._backends import triton_pointwise, cuda_binary
    monkeypatch.setattr(cuda_binary, "MAX_ELEMENTS", 0)     # smaller arrays take the raw kernel (test_cuda_binary.py)
    calls = _spy(monkeypatch, triton_pointwise, ["binary"])
    rng = np.random.default_rng(1)
    a, b = rng.standard_normal((3, 1000, 7)).astype(np.float32), rng.standard_normal((3, 1000, 7)).astype(np.float32)
    out = []
    for lib in (torch, flambeau):
        x, y = (lib.tensor(v, device="cuda").to(lib.bfloat16) for v in (a, b))
        r = getattr(lib, op)(x, y)
        s = getattr(lib, op)(x, 3)
        mixed = getattr(lib, op)(lib.tensor(a, device="cuda"), y)        # float32 with bfloat16: float32
        assert r.dtype == s.dtype == lib.bfloat16 and mixed.dtype == lib.float32
        out.append([t.float().cpu().numpy() for t in (r, s, mixed)])
    assert calls == ["binary", "binary", "binary"]
    np.testing.assert_array_equal(out[1][0], out[0][0])
    np.testing.assert_allclose(out[1][1], out[0][1], rtol=1e-2)
    np.testing.assert_array_equal(out[1][2], out[0][2])


@pytest.mark.cuda
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_bias_gradient_column_sum_on_cuda(dtype, monkeypatch):
    """Sums over leading dims (a Linear's bias gradient) through the Triton column sum, against
    float64 on the same rounded values."""
    from flambeau._backends import triton_sum
    calls = _spy(monkeypatch, triton_sum, ["column_sum"])
    dt = getattr(flambeau, dtype)
    g = flambeau.tensor(np.random.default_rng(2).standard_normal((8, 300, 200)).astype(np.float32) + 1).to(dt)
    gc = g.to("cuda")
    s, k = gc.sum((0, 1)), gc.sum([0], keepdim=True)
    lin = flambeau.nn.Linear(50, 200).to("cuda").to(dt)
    lin(flambeau.randn(8, 300, 50, device="cuda").to(dt)).backward(gc)
    assert calls.count("column_sum") >= 2 and s.dtype == lin.bias.grad.dtype == dt and tuple(k.shape) == (1, 300, 200)
    tol = dict(rtol=1e-2, atol=1e-2) if dtype == "bfloat16" else dict(rtol=1e-5, atol=1e-4)
    ref = g.double().sum((0, 1)).numpy()
    np.testing.assert_allclose(s.double().cpu().numpy(), ref, **tol)
    np.testing.assert_allclose(lin.bias.grad.double().cpu().numpy(), ref, **tol)
    np.testing.assert_allclose(k.double().cpu().numpy()[0], g.double().sum(0).numpy(), **tol)


def test_eager_triton_wrappers_find_their_kernels_without_hashing_a_jit_function(monkeypatch):
    """The BatchNorm and activation wrappers find their compiled kernels by the JITFunction's id: a lookup
    hashes no JITFunction (its __hash__ is a Python call taking a lock, about a microsecond; a BatchNorm
    makes four or five lookups each way) and each call launches its own kernel (split and one-program
    BatchNorm, ReLU both ways, a half-precision add), the same on a second round. A BatchNorm call's
    launches are planned once per layout and dtypes (`_plans`); an input that needs a copy is planned
    each call."""
    import types
    from flambeau._backends import triton_batch_norm as BN, triton_launch as TL, triton_pointwise as TP
    hashed, launched = [], []
    kernel_type = type(BN._bn_stats)         # JITFunction (InterpretedFunction under TRITON_INTERPRET)
    real_hash = kernel_type.__hash__
    monkeypatch.setattr(kernel_type, "__hash__", lambda self: hashed.append(self) or real_hash(self))
    monkeypatch.setattr(TL, "launch", lambda k, grid, *a: launched.append(k))
    monkeypatch.setattr(TL, "compile_kernel", lambda fn, sig, const, **kw: (fn.__name__, tuple(sorted(const.items()))))
    monkeypatch.setattr(TL, "multiprocessors", lambda: 132)
    monkeypatch.setattr(TL, "current_device", lambda: 0)
    monkeypatch.setattr(TL, "current_stream", lambda: 0)
    fake = types.SimpleNamespace(ndarray=lambda shape, dtype: np.empty(shape, dtype))
    for mod in (BN, TP):
        monkeypatch.setattr(mod, "cupy", fake)
        monkeypatch.setattr(mod, "_kernels", {})
    bf16 = np.dtype(flambeau.bfloat16.np)

    def one_round():
        launched.clear()
        for shape in ((4, 8, 64, 64), (4, 200, 8, 8)):             # split kernels; one program per channel
            C = shape[1]
            x = np.ones(shape, bf16)
            w, b, rm, rv = (np.ones(C, np.float32) for _ in range(4))
            y, mean, rstd = BN.forward(x, w, b, rm, rv, 0.1, 1e-5)
            BN.backward(y, x, w, b, mean, rstd)
        x = np.ones((3, 5), bf16)
        TP.backward(x, TP.forward(x, TP.RELU), TP.RELU)
        TP.binary(x, x, "add", bf16)
        return [k[0] for k in launched]

    monkeypatch.setattr(BN, "_plans", {})
    planned = []
    real_geometry = BN._geometry
    monkeypatch.setattr(BN, "_geometry", lambda x, cl=False: planned.append(x.shape) or real_geometry(x, cl))
    first = one_round()
    assert first == ["_bn_stats", "_bn_finalize", "_bn_apply", "_bn_bwd_reduce", "_bn_bwd_finalize", "_bn_bwd_apply",
                     "_bn_fwd_onchip", "_bn_bwd_onchip", "_act_fwd", "_act_bwd", "_binary"]
    assert len(planned) == 4                 # each BatchNorm call planned once (`_plans`), not again below
    hashed.clear()
    assert one_round() == first and hashed == [] and len(planned) == 4
    # an input in neither layout is copied (counted) and planned at each call, its plan not kept
    x = np.ones((4, 8, 64, 128), bf16)[..., ::2]
    w, b, rm, rv = (np.ones(8, np.float32) for _ in range(4))
    copies, kept = BN.copies["forward"], len(BN._plans)
    for _ in range(2):
        launched.clear()
        BN.forward(x, w, b, rm, rv, 0.1, 1e-5)
        assert [k[0] for k in launched] == ["_bn_stats", "_bn_finalize", "_bn_apply"]
    assert BN.copies["forward"] == copies + 2 and len(planned) == 6 and len(BN._plans) == kept


def test_split_batch_norm_keeps_its_partial_buffers_per_stream(monkeypatch):
    """The split BatchNorm's partial statistics and coefficients are scratch read only by the call's own
    launches: each (device, stream) keeps one buffer per role, grown to the largest size asked for, so a
    repeated call allocates only its results (forward: y, mean, rstd; backward: dx and the parameter
    gradients), not 5 arrays each way. Another stream gets buffers of its own (its calls may overlap the
    first stream's); `flambeau.cuda.empty_cache` drops them. The wrappers' results through these buffers
    are checked against float64 PyTorch by the interpreter script (`triton_batch_norm_interp.py`)."""
    import types
    from flambeau._backends import triton_batch_norm as BN, triton_launch as TL
    launched, made, stream = [], [], [0x100]
    monkeypatch.setattr(TL, "launch", lambda k, grid, *a: launched.append(a))
    monkeypatch.setattr(TL, "compile_kernel", lambda fn, sig, const, **kw: fn.__name__)
    monkeypatch.setattr(TL, "multiprocessors", lambda: 132)
    monkeypatch.setattr(TL, "current_device", lambda: 0)
    monkeypatch.setattr(TL, "current_stream", lambda: stream[0])
    monkeypatch.setattr(BN, "cupy", types.SimpleNamespace(ndarray=lambda shape, dtype: made.append(shape) or
                                                          np.empty(shape, dtype)))
    for name in ("_kernels", "_plans", "_scratch"):
        monkeypatch.setattr(BN, name, {})
    bf16 = np.dtype(flambeau.bfloat16.np)

    def call(C):
        x = np.ones((4, C, 64, 64), bf16)
        w, b, rm, rv = (np.ones(C, np.float32) for _ in range(4))
        made.clear(), launched.clear()
        y, mean, rstd = BN.forward(x, w, b, rm, rv, 0.1, 1e-5)
        fwd = list(made)
        made.clear()
        BN.backward(y, x, w, b, mean, rstd)
        # the scratch each launch got: forward's stats (part) and finalize (part, coef); backward's alike
        part_f, coef_f, part_b, coef_b = launched[0][1], launched[1][5], launched[3][3], launched[4][6]
        return fwd, list(made), (part_f, coef_f, part_b, coef_b)

    call(8)                                           # (backward's coefficients grow the forward's buffer)
    _, _, first = call(8)
    fwd, bwd, again = call(8)
    assert fwd == [(8,), (8,), (4, 8, 64, 64)] and bwd == [(8,), (8,), (4, 8, 64, 64)]
    assert all(a is b for a, b in zip(first, again))
    part_f, coef_f, part_b, coef_b = again
    assert part_f is part_b and coef_f is coef_b and part_f is not coef_f
    S, _ = BN.splits(8, 4 * 64 * 64, 132)
    assert part_f.size >= S * 3 * 8 and coef_f.size >= 3 * 8 and part_f.dtype == np.float32
    _, _, wider = call(64)                            # more channels: the buffers grow
    S64, _ = BN.splits(64, 4 * 64 * 64, 132)
    assert wider[0].size >= S64 * 3 * 64 and wider[1].size >= 2 * 64 and wider[3].size >= 3 * 64
    assert wider[0] is not part_f
    stream[0] = 0x200                                 # another stream: buffers of its own
    _, _, other = call(64)
    assert not any(a is b for a, b in zip(other, wider))
    stream[0] = 0x100
    assert call(64)[2][0] is wider[0]
    BN.release_scratch()
    assert BN._scratch == {}


@pytest.mark.cuda
def test_batch_norm_module_on_cuda_counts_batches_in_place_and_matches_torch(monkeypatch):
    """A BatchNorm2d module trained on cuda (split and one-program layers, bfloat16 input): three training
    forwards then one in eval mode give PyTorch's num_batches_tracked (counted in place: the counter's
    array stays the same, no add_ dispatched), running statistics and outputs; the split layer's scratch
    buffers are reused across the calls."""
    from flambeau._backends import triton_batch_norm as BN
    from tests.conftest import op_names_mode
    rng = np.random.default_rng(3)
    for shape in ((8, 16, 20, 20), (4, 256, 7, 7)):
        x = rng.standard_normal(shape).astype(np.float32) * 2 + 1
        res = []
        for lib in (torch, flambeau):
            bn = lib.nn.BatchNorm2d(shape[1]).to("cuda")
            counter = bn.num_batches_tracked
            arr = counter._data if lib is flambeau else None
            outs = [bn(lib.tensor(x, device="cuda").to(lib.bfloat16).float()) for _ in range(3)]
            outs.append(bn.eval()(lib.tensor(x, device="cuda")))
            res.append([o.detach().float().cpu().numpy() for o in outs] + [bn.running_mean.cpu().numpy(),
                                                                 bn.running_var.cpu().numpy(),
                                                                 int(bn.num_batches_tracked.item())])
            if lib is flambeau:
                assert bn.num_batches_tracked is counter and counter._data is arr
                mode = op_names_mode()
                with mode:
                    bn.train()(lib.tensor(x, device="cuda"))
                assert "add_" in mode.names and int(counter.item()) == 4     # a mode still sees add_
        t, f = res
        assert f[-1] == t[-1] == 3
        for a, b in zip(f[:-1], t[:-1]):
            np.testing.assert_allclose(a, b, rtol=2e-2, atol=2e-2)
    assert len(BN._scratch) >= 1


def test_a_channels_last_result_is_one_array_over_its_own_block(monkeypatch):
    """The BatchNorm wrappers' channels-last results (`_like`) are one array each: CuPy's constructor over a
    `cuda.alloc` block with PyTorch's channels-last strides, not an NHWC array and its transposed view."""
    import types
    from flambeau._backends import triton_batch_norm as BN
    made = []

    def ndarray(shape, dtype, memptr=None, strides=None):
        made.append(shape)
        return np.ndarray(shape, dtype, buffer=memptr, strides=strides)
    monkeypatch.setattr(BN, "cupy", types.SimpleNamespace(ndarray=ndarray, cuda=types.SimpleNamespace(
        alloc=lambda n: np.empty(n, np.uint8))))
    for shape in ((4, 8, 5, 6), (2, 3, 4, 5, 6)):
        t = torch.empty(shape, dtype=torch.bfloat16,
                        memory_format=torch.channels_last if len(shape) == 4 else torch.channels_last_3d)
        x = np.empty(shape, np.dtype(flambeau.bfloat16.np))
        made.clear()
        y = BN._like(x, True)
        assert made == [shape] and y.shape == shape and y.strides == tuple(2 * s for s in t.stride())
        assert y.base.nbytes == 2 * t.numel()


def test_the_cuda_batch_norm_choice_imports_nothing_after_its_first_call(monkeypatch):
    """`norm_loss._cuda_batch_norm` (two calls per BatchNorm a training step) finds the Triton module
    kept from its first call, with no import statement each call; it still answers per call (a float64
    input is not the Triton kernels', a CuPy namespace only)."""
    import builtins
    import types
    from flambeau._backends import triton_batch_norm as BN, triton_launch as TL
    monkeypatch.setattr(TL, "available", lambda: True)
    xp = types.SimpleNamespace(__name__="cupy")
    x = np.ones((4, 8, 3, 3), np.dtype(flambeau.bfloat16.np))
    per = tuple(np.ones(8, np.float32) for _ in range(4))
    assert norm_loss._cuda_batch_norm(xp, x, per) is BN
    x64 = x.astype(np.float64)
    real, seen = builtins.__import__, []
    monkeypatch.setattr(builtins, "__import__", lambda *a, **k: seen.append(a) or real(*a, **k))
    for _ in range(3):
        assert norm_loss._cuda_batch_norm(xp, x, per) is BN
        assert norm_loss._cuda_batch_norm(xp, x64, per) is None
        assert norm_loss._cuda_batch_norm(np, x, per) is None
    monkeypatch.setattr(builtins, "__import__", real)
    assert not [a for a in seen if "triton_batch_norm" in (a[3] if len(a) > 3 and a[3] else ())], seen


@pytest.mark.parametrize("bad", ["weight", "bias", "running_mean", "running_var"])
def test_batch_norm_per_channel_size_errors_as_pytorch(bad):
    """`_bn_check` compares the per-channel arrays' shapes without a tuple() each (arrays' shapes are
    tuples) and still raises PyTorch's RuntimeError, naming the argument, for a wrong size."""
    errors = []
    for m in (flambeau, torch):
        kw = dict(running_mean=m.zeros(3), running_var=m.ones(3), weight=m.ones(3), bias=m.zeros(3))
        kw[bad] = m.ones(5)
        with pytest.raises(RuntimeError) as e:
            m.nn.functional.batch_norm(m.ones(2, 3, 4, 4), training=True, **kw)
        errors.append(str(e.value))
    assert errors[0] == errors[1] == f"{bad} should contain 3 elements not 5", errors


def test_split_batch_norm_asks_for_the_device_and_stream_once_a_call(monkeypatch):
    """A remembered split BatchNorm call (forward, backward) reads the current device and stream once each
    (its plan key and both scratch buffers), not once per buffer."""
    import types
    from flambeau._backends import triton_batch_norm as BN, triton_launch as TL
    asked = []
    monkeypatch.setattr(TL, "launch", lambda k, grid, *a: None)
    monkeypatch.setattr(TL, "compile_kernel", lambda fn, sig, const, **kw: fn.__name__)
    monkeypatch.setattr(TL, "multiprocessors", lambda: 132)
    monkeypatch.setattr(TL, "current_device", lambda: asked.append("device") or 0)
    monkeypatch.setattr(TL, "current_stream", lambda: asked.append("stream") or 0x100)
    monkeypatch.setattr(BN, "cupy", types.SimpleNamespace(ndarray=lambda shape, dtype: np.empty(shape, dtype)))
    for name in ("_kernels", "_plans", "_scratch"):
        monkeypatch.setattr(BN, name, {})
    x = np.ones((4, 8, 64, 64), np.dtype(flambeau.bfloat16.np))
    w, b, rm, rv = (np.ones(8, np.float32) for _ in range(4))
    y, mean, rstd = BN.forward(x, w, b, rm, rv, 0.1, 1e-5)
    BN.backward(y, x, w, b, mean, rstd)
    asked.clear()
    y, mean, rstd = BN.forward(x, w, b, rm, rv, 0.1, 1e-5)
    assert sorted(asked) == ["device", "stream"]
    asked.clear()
    BN.backward(y, x, w, b, mean, rstd)
    assert sorted(asked) == ["device", "stream"]
    assert {k[:2] for k in BN._scratch} == {(0, 0x100)}
