"""The cheaper host paths of cuda ops (issue 11, item 6): Triton launches straight to cuLaunchKernel
through a parameter block made once per kernel and thread (`_backends/triton_launch.py`), dtype casts
as one raw kernel launched the same way (`_backends/cuda_cast.py`), no zero gradients made for unused
statistics outputs (`Tag.optional_output_grads`), CuPy reductions returned without a copy, zero fills
as memsets.

On cpu: the launch's parameter block read back by a recording fake driver, the cast's choice of
operands and kernel against a fake CuPy namespace, the cast source compiled by nvcc (when present)
without flush-to-zero instructions, and the count of zero-filled tensors in a backward against
PyTorch's. On the GPU (`cuda` marks): every cast pair bit for bit against PyTorch cuda, sums,
means, fills and BatchNorm/LayerNorm backward against PyTorch cuda.
"""
import contextlib
import ctypes
import shutil
import subprocess
import threading
import warnings

import ml_dtypes
import numpy as np
import pytest
import torch

import flambeau as fl
from flambeau._backends import cuda_cast, triton_launch as TL
from flambeau.utils._python_dispatch import TorchDispatchMode as FlMode
from torch.utils._python_dispatch import TorchDispatchMode as TorchMode

FLOATS = ["float32", "float64", "float16", "bfloat16"]
SPECIAL = [0.0, -0.0, 1.0, -1.5, float("inf"), float("-inf"), float("nan"), 1e-30, 6.5e4, 7e4, 3e38, 1e-38,
           3e-39, -2e-45, 1.0009765625, 1.00390625, 2 ** -24, 2 ** -25, 3 * 2 ** -26, 1 + 2 ** -11, 1 + 3 * 2 ** -12,
           1e300, 1e-300]


class _Function:
    """What a launch reads of a loaded kernel: its address."""
    ptr = 0xF00


class _Driver:
    """cuLaunchKernel and the current stream, recording each launch with the parameter values read
    back from the block's `void*[]` through their slots' C types."""

    def __init__(self, kernel):
        self.kernel, self.calls = kernel, []

    def launch(self, f, gx, gy, gz, bx, by, bz, shared, stream, params, extra):
        types = TL.c_types(self.kernel.arg_types)
        addresses = (ctypes.c_void_p * len(types)).from_address(params)
        values = [t.from_address(a).value for t, a in zip(types, addresses)]
        self.calls.append(((gx, gy, gz), (bx, by, bz), values, shared, stream, f, extra))


@pytest.fixture
def fake_driver(monkeypatch):
    def make(arg_types, global_scratch=0):
        k = TL.kernel_of(_Function(), None, arg_types, 4, 96, global_scratch)
        d = _Driver(k)
        monkeypatch.setattr(TL, "_driver", [d.launch, lambda: 0x5EA])
        return k, d
    return make


class _Array:
    """A CuPy array as a launch reads it: its data pointer."""

    def __init__(self, ptr):
        self.data = type("D", (), {"ptr": ptr})()


def test_launch_writes_each_argument_into_a_slot_of_its_signature_type(fake_driver):
    k, d = fake_driver(("*fp32", "*bf16", "*fp32", "i32", "i64", "fp32", "fp64"))
    TL.launch(k, (3, 2), _Array(8192), TL.Ptr(4096), None, 7, 2 ** 40, 0.1, 0.1)
    (grid, block, values, shared, stream, f, extra), = d.calls
    assert grid == (3, 2, 1) and block == (128, 1, 1) and shared == 96 and stream == 0x5EA and f == 0xF00
    assert extra == 0
    assert values[:5] == [8192, 4096, 0, 7, 2 ** 40]
    assert values[5] == float(np.float32(0.1)) and values[6] == 0.1
    assert len(values) == 9 and values[7] == 0 and values[8] == 0      # global and profile scratch: null


def test_launch_reuses_its_parameter_block_per_thread(fake_driver):
    k, d = fake_driver(("*fp32", "i32"))
    TL.launch(k, (1,), None, 1)
    TL.launch(k, (1,), TL.Ptr(64), 2)
    assert [c[2][:2] for c in d.calls] == [[0, 1], [64, 2]]
    assert len(k.blocks) == 1
    other = []
    t = threading.Thread(target=lambda: other.append(TL.param_block(k)))
    t.start()
    t.join()
    assert other[0] is not TL.param_block(k) and len(k.blocks) == 2


def test_launch_passes_a_global_scratch_of_the_grid_size_after_the_arguments(fake_driver, monkeypatch):
    k, d = fake_driver(("*fp32", "i32", "i64"), global_scratch=48)
    sizes = []

    class Cupy:
        @staticmethod
        def empty(n, dtype):
            sizes.append(n)
            return _Array(0xABC00 + n)
    monkeypatch.setattr(TL, "_cupy", lambda: Cupy)
    TL.launch(k, (3, 2), _Array(8192), 5, 2 ** 40)
    TL.launch_values(k, (2,), (4096, 6, 7))
    assert sizes == [48 * 6, 48 * 2]
    assert [c[2] for c in d.calls] == [[8192, 5, 2 ** 40, 0xABC00 + 288, 0], [4096, 6, 7, 0xABC00 + 96, 0]]


def test_launch_takes_a_float_beyond_float32_as_infinity_without_a_warning(fake_driver):
    k, d = fake_driver(("fp32", "fp32"))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        TL.launch(k, (1,), 1e300, -1e300)
    assert d.calls[0][2][:2] == [np.inf, -np.inf]


@pytest.mark.parametrize("value", [2 ** 31, -(2 ** 31) - 1, 2 ** 40])
def test_launch_refuses_an_i32_argument_beyond_32_bits_instead_of_wrapping(fake_driver, value):
    k, d = fake_driver(("*fp32", "i32"))
    TL.launch(k, (1,), None, 2 ** 31 - 1)
    TL.launch(k, (1,), None, -(2 ** 31))
    assert [c[2][1] for c in d.calls] == [2 ** 31 - 1, -(2 ** 31)]
    with pytest.raises(OverflowError, match=f"integer argument {value} does not fit the kernel's 32-bit"):
        TL.launch(k, (1,), None, value)
    assert len(d.calls) == 2


def test_launch_refuses_a_wrong_argument_count_and_skips_an_empty_grid(fake_driver):
    k, d = fake_driver(("*fp32", "i32"))
    with pytest.raises(TypeError, match="takes 2 runtime arguments, got 1"):
        TL.launch(k, (1,), None)
    TL.launch(k, (4, 0), None, 1)
    TL.launch(k, (0,), None, 1)
    assert d.calls == []


def test_triton_types_of_dtypes():
    assert TL.type_of(np.dtype(np.float32)) == "fp32"
    assert TL.type_of(np.dtype(ml_dtypes.bfloat16)) == "bf16"
    assert TL.type_of(np.dtype(np.float16)) == "fp16"
    assert TL.type_of(np.dtype(np.int64)) == "i64"
    with pytest.raises(KeyError, match="complex64"):
        TL.type_of(np.dtype(np.complex64))


class _FakeArray:
    """What `cuda_cast.cast` reads of a CuPy array."""
    _next_ptr = [0x10000]

    def __init__(self, shape, dtype, contiguous=True, device=0, strides=None):
        self.shape, self.dtype = tuple(shape), np.dtype(dtype)
        self.size = int(np.prod(shape))
        self.itemsize = self.dtype.itemsize
        if strides is None:                   # C order, or (not contiguous) every other element
            strides = np.zeros(self.shape, self.dtype).strides if contiguous else \
                np.zeros(self.shape[:-1] + (2 * self.shape[-1],), self.dtype)[..., ::2].strides
        self.strides = tuple(strides)
        self.flags = type("F", (), {"c_contiguous": contiguous})()
        self._c_contiguous = contiguous       # CuPy's attribute behind `flags.c_contiguous`
        self._next_ptr[0] += 0x1000
        self.data = type("D", (), {"device_id": device, "ptr": self._next_ptr[0]})()


class _FakeCupy:
    """A CuPy namespace whose RawModule records the source; with the fake driver below, the launches
    (kernel name, grid, block, the cast's (pointer, pointer, int64) parameters read back)."""

    __name__ = "cupy"

    def __init__(self):
        self.ndarray = _FakeArray
        self.launches = []
        self.sources = []
        self.names = {}
        fake = self

        class RawModule:
            def __init__(self, code, options):
                fake.sources.append(code)

            def get_function(self, name):
                f = type("Function", (), {"ptr": 0x100 + len(fake.names)})()
                fake.names[f.ptr] = name
                return type("RawKernel", (), {"kernel": f})()
        self.RawModule = RawModule
        self.cuda = type("C", (), {"device": type("Dv", (), {"get_device_id": staticmethod(lambda: 0)}),
                                   "runtime": type("R", (), {"getDevice": staticmethod(lambda: 0)})})()

        def as_strided(x, shape, strides):
            out = _FakeArray(shape, x.dtype, contiguous=False, strides=strides)
            out.data = x.data
            return out
        self.lib = type("L", (), {"stride_tricks": type("S", (), {"as_strided": staticmethod(as_strided)})})()

    def launch(self, f, gx, gy, gz, bx, by, bz, shared, stream, params, extra):
        types = (ctypes.c_uint64, ctypes.c_uint64, ctypes.c_int64)
        addresses = (ctypes.c_void_p * len(types)).from_address(params)
        values = [t.from_address(a).value for t, a in zip(types, addresses)]
        self.launches.append((self.names[f], (gx, gy, gz), (bx, by, bz), values))


@pytest.fixture
def fake_cupy(monkeypatch):
    monkeypatch.setattr(cuda_cast, "_module", [])
    monkeypatch.setattr(cuda_cast, "_functions", {})
    monkeypatch.setattr(cuda_cast, "_device_id", [])
    monkeypatch.setattr(cuda_cast, "_namespace", [None, None])
    fake = _FakeCupy()
    monkeypatch.setattr(TL, "_driver", [fake.launch, lambda: 0])
    return fake


def test_cast_launches_the_kernel_of_its_dtype_pair(fake_cupy, monkeypatch):
    monkeypatch.setattr(cuda_cast, "MAX_BLOCKS", 5)
    a = _FakeArray((3, 700), np.float32)
    out = cuda_cast.cast(fake_cupy, a, np.dtype(ml_dtypes.bfloat16))
    assert type(out) is _FakeArray and out.shape == (3, 700) and out.dtype == np.dtype(ml_dtypes.bfloat16)
    (name, grid, block, args), = fake_cupy.launches
    assert name == "flm_cast_f32_bf16"
    assert grid == (5, 1, 1) and block == (cuda_cast.THREADS, 1, 1)   # 9 blocks wanted, the grid-stride loop does the rest
    assert args == [a.data.ptr, out.data.ptr, 2100]
    cuda_cast.cast(fake_cupy, _FakeArray((4,), np.float64), np.dtype(np.float16))
    assert fake_cupy.launches[-1][0] == "flm_cast_f64_f16" and fake_cupy.launches[-1][1] == (1, 1, 1)
    assert len(fake_cupy.sources) == 1                               # one module, compiled once


def test_cast_finds_the_kernel_of_each_pair_seen_before_by_one_lookup(fake_cupy):
    """A pair seen before is found by one (source, target, device) lookup: each target of one source
    keeps its own kernel, and a same-type or integer cast still goes to CuPy after float pairs are cached."""
    bf16, f16, f32 = np.dtype(ml_dtypes.bfloat16), np.dtype(np.float16), np.dtype(np.float32)
    a = _FakeArray((4, 4), np.float32)
    for dt in (bf16, f16, bf16, f16):
        assert cuda_cast.cast(fake_cupy, a, dt).dtype == dt
    assert [n for n, *_ in fake_cupy.launches] == ["flm_cast_f32_bf16", "flm_cast_f32_f16"] * 2
    assert set(cuda_cast._functions) == {(f32, bf16, 0), (f32, f16, 0)}
    assert cuda_cast.cast(fake_cupy, a, f32) is None
    assert cuda_cast.cast(fake_cupy, a, np.dtype(np.int32)) is None
    assert cuda_cast.cast(fake_cupy, _FakeArray((4,), np.int64), bf16) is None
    assert len(fake_cupy.launches) == 4


def test_cast_keeps_a_channels_last_layout(fake_cupy):
    """A dense permuted array (channels-last activations under autocast) casts in the same one kernel,
    its result in its layout: element i of the output at offset i, as of the input."""
    t = torch.empty(2, 3, 4, 5).contiguous(memory_format=torch.channels_last)
    a = _FakeArray(t.shape, np.float32, contiguous=False, strides=[s * 4 for s in t.stride()])
    out = cuda_cast.cast(fake_cupy, a, np.dtype(ml_dtypes.bfloat16))
    assert out.shape == a.shape and out.strides == tuple(s * 2 for s in t.stride())
    (name, _, _, args), = fake_cupy.launches
    assert name == "flm_cast_f32_bf16" and args == [a.data.ptr, out.data.ptr, 120]


def test_raw_binary_kernel_keeps_one_dense_layout(fake_cupy, monkeypatch):
    """add/sub/mul/div's raw kernel walks memory: two channels-last operands (a residual add) run in
    it with the result channels-last; a channels-last and a contiguous one go the general way."""
    from flambeau._backends import cuda_binary
    launched = []
    monkeypatch.setattr(cuda_binary, "_device_id", [])
    monkeypatch.setattr(cuda_binary, "_function", lambda *a: "kernel")
    monkeypatch.setattr(cuda_binary, "_launch", lambda f, n, args: launched.append((n, args)))
    t = torch.empty(2, 3, 4, 5).contiguous(memory_format=torch.channels_last)
    cl = [s * 4 for s in t.stride()]
    a, b = (_FakeArray(t.shape, np.float32, contiguous=False, strides=cl) for _ in range(2))
    out = cuda_binary.binary(fake_cupy, a, b, "add")
    assert out.strides == tuple(cl) and launched == [(120, (a, b, out, 120))]
    assert cuda_binary.binary(fake_cupy, a, 2.0, "mul").strides == tuple(cl)
    assert cuda_binary.binary(fake_cupy, a, _FakeArray(t.shape, np.float32), "add") is None
    assert cuda_binary.binary(fake_cupy, _FakeArray(t.shape, np.float32), b, "add") is None
    assert cuda_binary.binary(fake_cupy, _FakeArray(t.shape, np.float32, contiguous=False), b, "add") is None
    assert len(launched) == 2


@pytest.mark.parametrize("dtype", ["float32", "float64", "float16", "bfloat16"])
def test_raw_binary_kernel_takes_large_arrays_of_four_bytes_and_more(fake_cupy, monkeypatch, dtype):
    """Beyond MAX_ELEMENTS, float32/float64 operands (GPT-2's residual-gradient sums) still take the raw kernel,
    over the whole array in one launch; float16/bfloat16 ones go the general way (CuPy's ufunc)."""
    from flambeau._backends import cuda_binary
    launched = []
    monkeypatch.setattr(cuda_binary, "MAX_ELEMENTS", 16)
    monkeypatch.setattr(cuda_binary, "_device_id", [])
    monkeypatch.setattr(cuda_binary, "_function", lambda cupy, name, dt, kind, dev: (name, dt, kind))
    monkeypatch.setattr(cuda_binary, "_launch", lambda f, n, args: launched.append((f, n, args)))
    dt = np.dtype(ml_dtypes.bfloat16) if dtype == "bfloat16" else np.dtype(dtype)
    a, b = _FakeArray((3, 7), dt), _FakeArray((3, 7), dt)
    out = cuda_binary.binary(fake_cupy, a, b, "add")
    scaled = cuda_binary.binary(fake_cupy, a, 0.5, "mul")
    if dt.itemsize < 4:
        assert out is None and scaled is None and not launched
        return
    assert out.shape == (3, 7) and out.dtype == dt and scaled.dtype == dt
    assert launched == [(("add", dt, "tt"), 21, (a, b, out, 21)), (("mul", dt, "ts"), 21, (a, 0.5, scaled, 21))]
    assert cuda_binary.binary(fake_cupy, _FakeArray((4,), dt), b, "add") is None       # shapes differ: general


def test_cast_and_binary_kernels_read_cupys_contiguity_attribute_not_flags(fake_cupy, monkeypatch):
    """CuPy's `flags` makes a new Flags object per read; the cast and binary kernels read `_c_contiguous`."""
    from flambeau._backends import cuda_binary

    class NoFlags(_FakeArray):
        @property
        def flags(self):
            raise AssertionError("flags read")

        @flags.setter
        def flags(self, value):
            pass
    fake_cupy.ndarray = NoFlags
    monkeypatch.setattr(cuda_binary, "_device_id", [])
    monkeypatch.setattr(cuda_binary, "_function", lambda *a: "kernel")
    monkeypatch.setattr(cuda_binary, "_launch", lambda f, n, args: None)
    a, b = NoFlags((4, 4), np.float32), NoFlags((4, 4), np.float32)
    assert cuda_cast.cast(fake_cupy, a, np.dtype(np.float16)).dtype == np.float16
    assert cuda_binary.binary(fake_cupy, a, b, "add").shape == (4, 4)


@pytest.mark.parametrize("case", ["same dtype", "not contiguous", "integer source", "integer target", "empty",
                                  "other device", "to another device", "not a cupy array"])
def test_cast_leaves_other_operands_to_cupy(fake_cupy, case):
    a, dt = _FakeArray((4, 4), np.float32), np.dtype(np.float16)
    if case == "to another device":
        assert cuda_cast.cast(fake_cupy, a, dt, 1) is None
        assert fake_cupy.launches == []
        cuda_cast.cast(fake_cupy, a, dt, 0)
        assert len(fake_cupy.launches) == 1
        return
    if case == "same dtype":
        dt = np.dtype(np.float32)
    elif case == "not contiguous":
        a = _FakeArray((4, 4), np.float32, contiguous=False)
    elif case == "integer source":
        a = _FakeArray((4, 4), np.int64)
    elif case == "integer target":
        dt = np.dtype(np.int32)
    elif case == "empty":
        a = _FakeArray((0, 4), np.float32)
    elif case == "other device":
        a = _FakeArray((4, 4), np.float32, device=1)
    else:
        a = np.zeros((4, 4), np.float32)
    assert cuda_cast.cast(fake_cupy, a, dt) is None
    assert fake_cupy.launches == []


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="needs nvcc")
def test_cast_source_compiles_without_flush_to_zero(tmp_path):
    src = tmp_path / "cast.cu"
    src.write_text(cuda_cast._source())
    ptx = tmp_path / "cast.ptx"
    subprocess.run(["nvcc", "-arch=sm_90", "--std=c++14", "-ftz=true", "-ptx", str(src), "-o", str(ptx)], check=True)
    text = ptx.read_text()
    assert ".ftz" not in text
    assert text.count(".entry flm_cast_") == len(cuda_cast.TYPES) ** 2


def _counting(mode_base):
    """A dispatch mode over `mode_base` (flambeau's or PyTorch's) that records each op's name."""

    class Counting(mode_base):
        def __init__(self):
            super().__init__()
            self.names = []

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            self.names.append(str(func))
            return func(*args, **(kwargs or {}))

    return Counting


_CountFl, _CountTorch = _counting(FlMode), _counting(TorchMode)


def _fills(names):
    return [n for n in names if any(w in n for w in ("full", "zeros", "fill", "new_zeros"))]


@pytest.mark.parametrize("layer", ["batch_norm", "layer_norm", "max_pool2d", "sdpa_FLASH_ATTENTION", "sdpa_MATH",
                                   "sdpa_EFFICIENT_ATTENTION"])
def test_no_zero_gradients_for_unused_statistics_as_pytorch(layer):
    """Also attention's log-sum-exp (and dropout state) outputs: flambeau's cpu flash kernel, math and blocked
    paths (`sdpa_kernel` picks; PyTorch runs its own choice)."""
    x = np.random.default_rng(0).standard_normal((4, 3, 6, 6)).astype(np.float32)
    fills = {}
    for m, mode in ((fl, _CountFl), (torch, _CountTorch)):
        t = m.tensor(x, requires_grad=True)
        if layer == "batch_norm":
            y = m.nn.functional.batch_norm(t, None, None, m.ones(3), m.zeros(3), training=True)
        elif layer == "layer_norm":
            y = m.nn.functional.layer_norm(t, (6,), m.ones(6), m.zeros(6))
        elif layer.startswith("sdpa"):
            from flambeau.nn.attention import SDPBackend, sdpa_kernel
            with sdpa_kernel(getattr(SDPBackend, layer[5:])) if m is fl else contextlib.nullcontext():
                y = m.nn.functional.scaled_dot_product_attention(t, t * 2, t * 3, is_causal=True)
            if m is fl:
                assert y.grad_fn.name() == {"FLASH_ATTENTION": "SdpaFlashCpuBackward0", "MATH": "SdpaMathBackward0",
                                            "EFFICIENT_ATTENTION": "SdpaBlockedBackward0"}[layer[5:]]
        else:
            y = m.nn.functional.max_pool2d(t, 2)
        g = m.ones_like(y)
        with mode() as counter:
            y.backward(g)
        fills[m.__name__] = _fills(counter.names)
    assert fills["flambeau"] == [] and fills["torch"] == []


def test_statistics_gradients_still_flow_when_one_is_used():
    """Autograd fills zeros for the unused statistic when the other one has a gradient (reference:
    the same layer norm written out in PyTorch ops, float64)."""
    x = np.random.default_rng(1).standard_normal((5, 8))
    t = fl.tensor(x, requires_grad=True)
    out, mean, rstd = fl.native_layer_norm(t, (8,), None, None, 1e-5)
    (out.sum() + 3 * rstd.sum()).backward()
    r = torch.tensor(x, requires_grad=True)
    mu = r.mean(-1, keepdim=True)
    rs = 1 / torch.sqrt(((r - mu) ** 2).mean(-1, keepdim=True) + 1e-5)
    (((r - mu) * rs).sum() + 3 * rs.sum()).backward()
    np.testing.assert_allclose(t.grad.numpy(), r.grad.numpy(), rtol=1e-9, atol=1e-12)


# ---- on the GPU -----------------------------------------------------------------------------------
def _values(dtype, n=4096, seed=0):
    rng = np.random.default_rng(seed)
    v = rng.standard_normal(n) * np.exp(rng.uniform(-30, 30, n))
    v[:len(SPECIAL)] = SPECIAL
    return torch.tensor(v, dtype=torch.float64).to(getattr(torch, dtype)).cuda()


def _same_bits(f, t):
    assert str(f.dtype) == str(t.dtype) and tuple(f.shape) == tuple(t.shape)
    ref = t.cpu()
    got = torch.from_numpy(np.asarray(f.cpu().numpy()).view(np.uint8).copy()).view(ref.dtype).reshape(ref.shape)
    nan = torch.isnan(ref)
    assert torch.equal(torch.isnan(got), nan)
    itype = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}[ref.element_size()]
    assert torch.equal(got[~nan].view(itype), ref[~nan].view(itype))


@pytest.mark.cuda
@pytest.mark.parametrize("dst", FLOATS)
@pytest.mark.parametrize("src", FLOATS)
def test_casts_bit_for_bit_as_pytorch(src, dst):
    t = _values(src)
    f = fl.tensor(t.cpu().view(torch.int16 if t.element_size() == 2 else torch.int32 if t.element_size() == 4
                               else torch.int64).numpy(), device="cuda").view(getattr(fl, src))
    cuda_cast._functions.clear()
    _same_bits(f.to(getattr(fl, dst)), t.to(getattr(torch, dst)))
    _same_bits(f.reshape(64, 64).to(getattr(fl, dst)), t.reshape(64, 64).to(getattr(torch, dst)))
    assert bool(cuda_cast._functions) == (src != dst)


@pytest.mark.cuda
def test_cast_gradients_take_the_raw_kernel_as_pytorch():
    x = np.random.default_rng(7).standard_normal((33, 17)).astype(np.float32)
    g = np.random.default_rng(8).standard_normal((33, 17)).astype(np.float32)
    grads = {}
    for m in (fl, torch):
        t = m.tensor(x, device="cuda", requires_grad=True)
        y = (t.to(m.bfloat16) * 3).float()
        if m is fl:
            cuda_cast._functions.clear()
        y.backward(m.tensor(g, device="cuda"))   # a contiguous gradient (a sum's would be expanded)
        grads[m.__name__] = t.grad
    # the derivative of a cast passes device=: the same kernels serve both casts back
    assert {(k[0].name, k[1].name) for k in cuda_cast._functions} == {("float32", "bfloat16"),
                                                                      ("bfloat16", "float32")}
    _same_bits(grads["flambeau"], grads["torch"])


@pytest.mark.cuda
def test_float32_subnormals_survive_a_cast_as_pytorch():
    t = torch.tensor([1e-38, 3e-39, -2e-39, 1e-45], device="cuda")
    f = fl.tensor(t.cpu().numpy(), device="cuda")
    _same_bits(f.double(), t.double())
    _same_bits(f.double().float(), t.double().float())


@pytest.mark.cuda
def test_autocast_step_gradients_as_pytorch():
    x = np.random.default_rng(2).standard_normal((16, 32)).astype(np.float32)
    w = np.random.default_rng(3).standard_normal((8, 32)).astype(np.float32)
    grads = {}
    for m in (fl, torch):
        wt = m.tensor(w, device="cuda", requires_grad=True)
        with m.autocast("cuda", dtype=m.bfloat16):
            y = m.nn.functional.linear(m.tensor(x, device="cuda"), wt)
        y.float().relu().mean().backward()
        grads[m.__name__] = wt.grad.cpu().numpy()
    np.testing.assert_allclose(grads["flambeau"], grads["torch"], rtol=2e-2, atol=1e-3)


@pytest.mark.cuda
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_sums_and_means_as_pytorch_and_not_aliased(dtype):
    x = np.random.default_rng(4).standard_normal((6, 5, 7)).astype(np.float32)
    t = torch.tensor(x, device="cuda").to(getattr(torch, dtype))
    f = fl.tensor(x, device="cuda").to(getattr(fl, dtype))
    tol = dict(rtol=1e-5, atol=1e-5) if dtype == "float32" else dict(rtol=1.6e-2, atol=1e-2)
    for name in ("sum", "mean"):
        for kw in ({}, {"dim": -1}, {"dim": (0, 2), "keepdim": True}):
            a, b = getattr(f, name)(**kw), getattr(t, name)(**kw)
            assert str(a.dtype) == str(b.dtype) and tuple(a.shape) == tuple(b.shape)
            np.testing.assert_allclose(a.float().cpu().numpy(), b.float().cpu().numpy(), **tol)
            before = a.float().cpu().numpy()
            f.add_(1)                     # the result is not a view of the input or of a reused buffer
            t.add_(1)
            np.testing.assert_array_equal(a.float().cpu().numpy(), before)


@pytest.mark.cuda
def test_zero_fills_as_pytorch():
    for v in (0, 0.0, -0.0, False, 2.5):
        a, b = fl.full((3, 4), v, device="cuda"), torch.full((3, 4), v, device="cuda")
        assert str(a.dtype) == str(b.dtype)
        np.testing.assert_array_equal(np.signbit(a.cpu().numpy()), np.signbit(b.cpu().numpy()))
        np.testing.assert_array_equal(a.cpu().numpy(), b.cpu().numpy())
    z = fl.zeros(5, device="cuda", dtype=fl.bfloat16)
    assert z.float().abs().sum().item() == 0.0


@pytest.mark.cuda
@pytest.mark.parametrize("layer", ["batch_norm", "layer_norm"])
def test_norm_backward_without_statistics_gradients_as_pytorch(layer):
    x = np.random.default_rng(5).standard_normal((8, 4, 5, 5)).astype(np.float32)
    grads = {}
    for m in (fl, torch):
        t = m.tensor(x, device="cuda", requires_grad=True)
        w = m.tensor(np.linspace(0.5, 1.5, 4 if layer == "batch_norm" else 5).astype(np.float32), device="cuda",
                     requires_grad=True)
        if layer == "batch_norm":
            y = m.nn.functional.batch_norm(t, None, None, w, None, training=True)
        else:
            y = m.nn.functional.layer_norm(t, (5,), w)
        (y * y).sum().backward()
        grads[m.__name__] = (t.grad.cpu().numpy(), w.grad.cpu().numpy())
    for a, b in zip(grads["flambeau"], grads["torch"]):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("block", ["bn_relu", "layer_norm", "relu_inplace"])
def test_saved_activations_as_pytorch(block):
    """Distinct full-size tensors autograd keeps for backward, the next layer (a product with a
    weight) saving its input: a BatchNorm keeps its input and mean/rstd (not its output), ReLU its
    output (which the next layer keeps anyway), LayerNorm its input: no activation is kept alive that
    PyTorch lets go (ResNet-50's peak memory)."""
    x = np.random.default_rng(6).standard_normal((4, 3, 5, 5)).astype(np.float32)
    kept, grads = {}, {}
    for m in (fl, torch):
        ptrs = set()

        def pack(t, ptrs=ptrs):
            if tuple(t.shape) == x.shape:
                ptrs.add(t.data_ptr())
            return t

        t = m.tensor(x, requires_grad=True)
        w = m.tensor(np.linspace(0.5, 2.0, 5).astype(np.float32), requires_grad=True)
        with m.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            if block == "bn_relu":
                y = m.relu(m.nn.functional.batch_norm(t + 1, None, None, m.ones(3), m.zeros(3), training=True))
            elif block == "layer_norm":
                y = m.nn.functional.layer_norm(t + 1, (5,), m.ones(5), m.zeros(5))
            else:
                y = m.nn.functional.relu(t + 1, inplace=True)
            z = y * w
        z.sum().backward()
        kept[m.__name__] = len(ptrs)
        grads[m.__name__] = t.grad.numpy()
    assert kept["flambeau"] == kept["torch"]
    np.testing.assert_allclose(grads["flambeau"], grads["torch"], rtol=1e-4, atol=1e-5)


def test_column_sum_compiles_its_kernels_once_and_launches_both(monkeypatch):
    """triton_sum.column_sum's host side: the two kernels are found once per (dtypes, device), not
    rebuilt from their signature on each call; each call launches the partial sums over (column
    blocks, row chunks) into a float32 (S, N) scratch, then the final sums into an (N,) result."""
    pytest.importorskip("triton")
    from flambeau._backends import triton_sum as T
    compiled, launches = [], []

    class Array:
        def __init__(self, shape, dtype):
            self.shape, self.dtype, self.size = tuple(shape), np.dtype(dtype), int(np.prod(shape))

    monkeypatch.setattr(T, "cupy", type("C", (), {"ndarray": Array}))
    monkeypatch.setattr(T, "_kernels", {})
    monkeypatch.setattr(T, "_plans", {})
    monkeypatch.setattr(TL, "compile_kernel", lambda fn, sig, consts, **kw: compiled.append((fn, sig)) or
                        ("kernel", fn, sig["X" if "X" in sig else "Y"]))
    monkeypatch.setattr(TL, "launch", lambda k, grid, *args: launches.append((k, grid, args)))
    sm_queries = []
    monkeypatch.setattr(TL, "multiprocessors", lambda: sm_queries.append(1) or 4)
    monkeypatch.setattr(TL, "current_device", lambda: 0)
    x = Array((1000, 300), ml_dtypes.bfloat16)
    for _ in range(3):
        y = T.column_sum(x, 1000, np.dtype(np.float32))
        assert y.shape == (300,) and y.dtype == np.float32
    assert len(sm_queries) == 1                   # the row chunks of a shape seen before: no device query
    assert [(fn, sig.get("X", sig.get("Y"))) for fn, sig in compiled] == \
        [(T._colsum_partial, "*bf16"), (T._colsum_final, "*fp32")]
    S, rows_per = T.splits(1000, 300, 4)
    blocks = -(-300 // T.BLOCK_N)
    assert len(launches) == 6
    (k1, g1, a1), (k2, g2, a2) = launches[-2:]
    assert k1[1] is T._colsum_partial and g1 == (blocks, S) and a1[0] is x and a1[2:] == (1000, 300, rows_per)
    assert a1[1].shape == (S, 300) and a1[1].dtype == np.float32
    assert k2[1] is T._colsum_final and g2 == (blocks,) and a2[0] is a1[1] and a2[2:] == (S, 300)
    assert a2[1] is y
    T.column_sum(Array((64, 300), ml_dtypes.bfloat16), 64, np.dtype(np.float32))     # other rows: their own chunks
    assert len(sm_queries) == 2 and len(compiled) == 2
    assert launches[-2][1] == (blocks, T.splits(64, 300, 4)[0]) and launches[-2][2][4] == T.splits(64, 300, 4)[1]


def test_layer_norm_compiles_its_kernels_once_per_signature(monkeypatch):
    """triton_norm.forward/backward and triton_sum.sum_partials on the host: each kernel is found once
    per (dtypes, columns, device) by one lookup, not rebuilt from its signature dict on each call (that
    cost ~4 us a call); the signatures are those of the operands (weight/bias types, or fp32 for None), a
    new column count or dtype gets its own kernel, and the launches get the kernels of their call."""
    pytest.importorskip("triton")
    from flambeau._backends import triton_norm as N, triton_sum as T
    compiled, launches = [], []

    class Array:
        def __init__(self, shape, dtype):
            self.shape, self.dtype, self.size = tuple(shape), np.dtype(dtype), int(np.prod(shape))

    cp = type("C", (), {"ndarray": Array, "ascontiguousarray": staticmethod(lambda a: a)})
    monkeypatch.setattr(N, "cupy", cp)
    monkeypatch.setattr(T, "cupy", cp)
    monkeypatch.setattr(N, "_kernels", {})
    monkeypatch.setattr(T, "_kernels", {})
    monkeypatch.setattr(TL, "compile_kernel", lambda fn, sig, consts, **kw: compiled.append((fn, sig, consts, kw))
                        or ("kernel", fn, tuple(sig.values()), tuple(sorted(consts.items())), kw["num_warps"]))
    monkeypatch.setattr(TL, "launch", lambda k, grid, *args: launches.append((k, grid, args)))
    monkeypatch.setattr(TL, "multiprocessors", lambda: 4)
    monkeypatch.setattr(TL, "current_device", lambda: 0)
    slow = []
    for mod, name in ((N, "_forward_kernel"), (N, "_backward_kernel"), (T, "_final_kernel")):
        real = getattr(mod, name)
        monkeypatch.setattr(mod, name, lambda *a, _r=real, _n=name: slow.append(_n) or _r(*a))
    bf = ml_dtypes.bfloat16
    x, w = Array((64, 768), bf), Array((768,), np.float32)
    for _ in range(3):
        y, mean, rstd = N.forward(x, w, None, 768, 1e-5)
        dx, part = N.backward(y, x, mean, rstd, w, 768)
    assert y.shape == (64, 768) and y.dtype == bf and mean.shape == rstd.shape == (64,) and part.shape == (2, 768)
    assert [(fn, sig.get("W"), sig.get("B"), consts) for fn, sig, consts, _ in compiled] == [
        (N._ln_fwd, "*fp32", "*fp32", dict(HAS_W=True, HAS_B=False, BLOCK_N=1024)),
        (N._ln_bwd, "*fp32", None, dict(HAS_W=True, BLOCK_N=1024)),
        (T._colsum_final, None, None, dict(BLOCK_N=T.BLOCK_N))]
    assert compiled[0][1]["X"] == compiled[0][1]["Y"] == compiled[0][1]["MEAN"] == "*bf16"
    assert compiled[1][1]["DY"] == compiled[1][1]["DX"] == "*bf16" and compiled[0][3]["num_warps"] == 4
    assert len(launches) == 9 and [k[1] for k, _, _ in launches[-3:]] == [N._ln_fwd, N._ln_bwd, T._colsum_final]
    assert slow == ["_forward_kernel", "_backward_kernel", "_final_kernel"], "a call seen before took the slow path"
    _, m2, r2 = N.forward(x, w, w, 768, 1e-5, (2, 32, 1))        # a bias: another kernel; stats in their shape
    assert m2.shape == r2.shape == (2, 32, 1)
    N.forward(Array((64, 96), bf), w, w, 96, 1e-5)               # other columns: another kernel
    N.forward(Array((64, 768), np.float32), w, None, 768, 1e-5)   # another dtype: another kernel
    assert len(compiled) == 6 and compiled[3][2] == dict(HAS_W=True, HAS_B=True, BLOCK_N=1024)
    assert compiled[4][2] == dict(HAS_W=True, HAS_B=True, BLOCK_N=128)
    assert compiled[5][1]["X"] == "*fp32" and launches[-1][0][1] is N._ln_fwd and launches[-1][0][2][0] == "*fp32"


def test_column_sum_returns_the_kernels_array_and_reshapes_only_to_another_shape(monkeypatch):
    """reduction's cuda column sum (a linear layer's bias gradient): the (N,) result of
    `triton_sum.column_sum` is returned as it is (no reshape view), a keepdim or multi-dim sum is
    reshaped; the module is looked up once (no `from` import per call)."""
    from flambeau._ops import reduction as R
    made = []

    class Array:
        def __init__(self, shape, dtype=np.float32):
            self.shape, self.dtype, self.size, self.ndim = tuple(shape), np.dtype(dtype), int(np.prod(shape)), len(shape)

        def reshape(self, shape):
            made.append(("reshape", tuple(shape)))
            return Array(shape, self.dtype)

    fake = type("TS", (), {"supported": staticmethod(lambda x, rows, out: True),
                           "column_sum": staticmethod(lambda x, rows, out: made.append(Array((x.size // rows,), out))
                                                      or made[-1])})
    monkeypatch.setattr(R, "_triton_sum", [fake])
    monkeypatch.setattr(R.triton_launch, "available", lambda: True)
    r = R._cuda_column_sum(Array((64, 8)), [0], False, None)
    assert r is made[0] and len(made) == 1
    r = R._cuda_column_sum(Array((4, 16, 8)), [0, 1], True, None)
    assert made[-1] == ("reshape", (1, 1, 8)) and r.shape == (1, 1, 8)


def test_cudnn_graph_plan_keeps_a_variant_pack_per_pointer_set_least_recently_used_out(monkeypatch):
    """A graph-API plan's `execute` builds a variant pack only for pointers (x, w, y, workspace) none of its
    kept packs has (`cudnn.variant_packs` counts the builds: bench/gpu_train.py reports them a step),
    keeps the last `_VARIANT_PACKS` used, and destroys the least recently used one when a new one comes."""
    from flambeau._backends import cudnn
    executed, destroyed = [], []

    class Lib:
        def cudnnBackendExecute(self, h, plan, pack):
            executed.append(pack)
            return 0

        def cudnnBackendDestroyDescriptor(self, d):
            destroyed.append(d)
            return 0
    monkeypatch.setattr(cudnn._GraphPlan, "_variant_pack", lambda self, key: ("pack",) + key)
    monkeypatch.setattr(cudnn._GraphPlan, "__del__", lambda self: None)
    monkeypatch.setitem(cudnn.variant_packs, "built", 0)
    plan = cudnn._GraphPlan.__new__(cudnn._GraphPlan)
    plan.lib, plan.plan, plan.ws = Lib(), 1, 0
    plan.execute(None, (16, 32, 48))
    plan.execute(None, (16, 32, 48))
    assert executed == [("pack", 16, 32, 48, 0)] * 2 and cudnn.variant_packs["built"] == 1
    n = cudnn._VARIANT_PACKS
    for i in range(n - 1):                      # fills the kept packs; the first stays the most recently used
        plan.execute(None, (64 * i + 1024, 32, 48))
        plan.execute(None, (16, 32, 48))
    assert cudnn.variant_packs["built"] == n and not destroyed
    plan.execute(None, (9999, 32, 48))          # a new one: the least recently used goes, not the first
    assert destroyed == [("pack", 1024, 32, 48, 0)] and cudnn.variant_packs["built"] == n + 1
    plan.execute(None, (16, 32, 48))
    assert cudnn.variant_packs["built"] == n + 1 and executed[-1] == ("pack", 16, 32, 48, 0)


@pytest.mark.parametrize("fail", [None, "ids", "pointers", "workspace", "finalize"])
def test_cudnn_variant_pack_sets_its_ids_pointers_and_workspace_and_reports_a_failure(monkeypatch, fail):
    """`_GraphPlan._variant_pack` makes a variant pack descriptor with the plan's unique ids (x, w, y), the
    pointers of `key` and its workspace pointer (none: a null pointer), then finalizes it; a failing
    call destroys the descriptor and raises RuntimeError naming cuDNN's message."""
    import ctypes
    from flambeau._backends import cudnn
    from flambeau._backends.cudnn_enums import (BackendAttributeName as A, BackendAttributeType as T,
                                                BackendDescriptorType as BE)
    calls, destroyed = [], []
    names = {A.VARIANT_PACK_UNIQUE_IDS: "ids", A.VARIANT_PACK_DATA_POINTERS: "pointers",
             A.VARIANT_PACK_WORKSPACE: "workspace"}

    class Lib:
        def cudnnBackendCreateDescriptor(self, kind, out):
            assert kind == BE.VARIANT_PACK_DESCRIPTOR
            ctypes.cast(out, ctypes.POINTER(ctypes.c_void_p))[0] = 0x5000
            return 0

        def cudnnBackendSetAttribute(self, d, attr, typ, n, arr):
            name = names[attr]
            vals = [arr[i] for i in range(n)]
            calls.append((name, typ, vals))
            return 3 if name == fail else 0

        def cudnnBackendFinalize(self, d):
            calls.append(("finalize",))
            return 3 if fail == "finalize" else 0

        def cudnnBackendDestroyDescriptor(self, d):
            destroyed.append(d.value)
            return 0

        def cudnnGetErrorString(self, status):
            return b"CUDNN_STATUS_BAD_PARAM"
    monkeypatch.setitem(cudnn._state, "lib", Lib())
    monkeypatch.setattr(cudnn._GraphPlan, "__del__", lambda self: None)
    plan = cudnn._GraphPlan.__new__(cudnn._GraphPlan)
    plan.lib, plan.uids = cudnn._state["lib"], (ctypes.c_int64 * 3)(1, 2, 3)
    for ws in (0x9000, 0):
        calls.clear()
        if fail is None:
            pack = plan._variant_pack((0x1000, 0x2000, 0x3000, ws))
            assert pack.value == 0x5000 and not destroyed
        else:
            with pytest.raises(RuntimeError, match="cuDNN error: CUDNN_STATUS_BAD_PARAM"):
                plan._variant_pack((0x1000, 0x2000, 0x3000, ws))
            assert destroyed == [0x5000]
            destroyed.clear()
        want = [("ids", T.INT64, [1, 2, 3]), ("pointers", T.VOID_PTR, [0x1000, 0x2000, 0x3000]),
                ("workspace", T.VOID_PTR, [ws or None]), ("finalize",)]
        stop = [w[0] for w in want].index(fail) + 1 if fail else len(want)
        assert calls == want[:stop]


def test_triton_launch_available_is_answered_once(monkeypatch):
    """`triton_launch.available()` imports Triton and CuPy once per process (the eager cuda ops ask before
    every fused kernel; a missing package would be searched for on the whole path at each call), and
    answers as the imports did."""
    import builtins
    tried = []
    real = builtins.__import__

    def counting(name, *a, **k):
        if name in ("triton", "cupy"):
            tried.append(name)
        return real(name, *a, **k)
    monkeypatch.setattr(TL, "_available", [])
    monkeypatch.setattr(builtins, "__import__", counting)
    first = TL.available()
    n = len(tried)
    assert [TL.available() for _ in range(3)] == [first] * 3 and len(tried) == n and n >= 1
    try:
        import triton, cupy  # noqa: F401,E401
        expected = True
    except ImportError:
        expected = False
    assert first is expected
