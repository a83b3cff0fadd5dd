"""Tensor semantics against PyTorch: repr/str, conversions and memory sharing with NumPy and
DLPack, strides of views, default dtype, devices, and that `import flambeau` does not import torch."""
import subprocess
import sys

import numpy as np
import pytest
import torch

import flambeau as fl

BOTH = (fl, torch)

F32 = np.float32
REPR_CASES = {
    "ints": lambda m: m.tensor([1, 2, 3]),
    "neg_ints": lambda m: m.tensor([1, -200, 30000]),
    "int_floats": lambda m: m.tensor([1.0, 2.0, 3.0]),
    "floats": lambda m: m.tensor([1.5, 2.25]),
    "mixed_width": lambda m: m.tensor([-1.5, 100.25]),
    "f32_rounding": lambda m: m.tensor([123456.7]),
    "bools": lambda m: m.tensor([True, False]),
    "scalar_float": lambda m: m.tensor(3.0),
    "scalar_int": lambda m: m.tensor(3),
    "scalar_bool": lambda m: m.tensor(True),
    "scalar_tiny": lambda m: m.tensor(1e-8),
    "empty": lambda m: m.tensor([]),
    "empty_2d": lambda m: m.zeros(0, 3),
    "empty_int": lambda m: m.zeros(2, 0, dtype=m.int64),
    "empty_f64": lambda m: m.tensor([], dtype=m.float64),
    "sci_big": lambda m: m.tensor([1e10, 1.0]),
    "sci_small": lambda m: m.tensor([1e-5, 1.0]),
    "sci_ratio": lambda m: m.tensor([1e-4, 1e4]),
    "nonfinite": lambda m: m.tensor([float("nan"), float("inf"), -float("inf"), 1.0]),
    "nonfinite_frac": lambda m: m.tensor([float("nan"), 0.5]),
    "zeros": lambda m: m.zeros(3),
    "matrix": lambda m: m.tensor([[1.0, 2.0], [3.0, 4.0]]),
    "cube": lambda m: m.ones(2, 2, 2),
    "int32": lambda m: m.tensor([1, 2], dtype=m.int32),
    "uint8": lambda m: m.tensor([1, 255], dtype=m.uint8),
    "f64": lambda m: m.tensor([1.0, 2.0], dtype=m.float64),
    "f64_scalar": lambda m: m.tensor(2.5, dtype=m.float64),
    "f16": lambda m: m.tensor([0.1, 0.2], dtype=m.float16),
    "bf16": lambda m: m.tensor([1.0, 2.0], dtype=m.bfloat16),
    "requires_grad": lambda m: m.tensor([1.0, 2.0], requires_grad=True),
    "grad_fn": lambda m: m.tensor([1.0, 2.0], requires_grad=True) * 2,
    "grad_fn_add": lambda m: m.tensor([1.0, 2.0], requires_grad=True) + 2,
    "meta": lambda m: m.zeros(3, device="meta"),
    "meta_int": lambda m: m.zeros(3, 2, device="meta", dtype=m.int32),
    "long_row": lambda m: m.tensor(np.linspace(-3, 3, 40).astype(F32)),
    "summarized": lambda m: m.tensor(np.arange(2000.0, dtype=F32)),
    "summarized_2d": lambda m: m.tensor(np.arange(3000, dtype=np.int64).reshape(30, 100)),
    "wide_matrix": lambda m: m.tensor(np.arange(60, dtype=F32).reshape(3, 20) / 7),
    "long_suffix": lambda m: m.tensor(np.linspace(0, 1, 12).astype(np.float64), requires_grad=True),
}


@pytest.mark.parametrize("name", list(REPR_CASES))
def test_repr_matches_torch(name):
    mk = REPR_CASES[name]
    a, b = mk(fl), mk(torch)
    assert repr(a) == repr(b)
    assert str(a) == str(b)


def test_repr_with_default_dtype_changed():
    for mod in BOTH:
        mod.set_default_dtype(mod.float64)
    try:
        for mk in (lambda m: m.tensor([1.5, 2.0]), lambda m: m.tensor([1.5], dtype=m.float32),
                   lambda m: m.tensor([])):
            assert repr(mk(fl)) == repr(mk(torch))
    finally:
        for mod in BOTH:
            mod.set_default_dtype(mod.float32)


def test_set_printoptions():
    for mod in BOTH:
        mod.set_printoptions(precision=2)
    try:
        assert repr(fl.tensor([1.2345, 2.0])) == repr(torch.tensor([1.2345, 2.0]))
    finally:
        for mod in BOTH:
            mod.set_printoptions(profile="default")


def test_set_default_dtype():
    for mod in BOTH:
        assert mod.get_default_dtype() is mod.float32
        mod.set_default_dtype(mod.float64)
        try:
            assert mod.tensor([1.0]).dtype is mod.float64
            assert mod.tensor([1]).dtype is mod.int64
            assert mod.ones(2).dtype is mod.float64
            assert (mod.tensor([1]) * 1.5).dtype is mod.float64
        finally:
            mod.set_default_dtype(mod.float32)
    with pytest.raises(TypeError):
        fl.set_default_dtype(fl.int64)


# ---- conversions -------------------------------------------------------------------------
def test_item_and_tolist():
    for mod in BOTH:
        assert mod.tensor(2.5).item() == 2.5 and type(mod.tensor(2.5).item()) is float
        assert type(mod.tensor(3).item()) is int and type(mod.tensor(True).item()) is bool
        assert mod.tensor([[1, 2], [3, 4]]).tolist() == [[1, 2], [3, 4]]
        assert mod.tensor(1.5).tolist() == 1.5
        assert mod.tensor([1.5], dtype=mod.bfloat16).tolist() == [1.5]
    with pytest.raises(RuntimeError, match="cannot be converted to Scalar"):
        fl.tensor([1.0, 2.0]).item()


def test_numpy_shares_memory():
    for mod in BOTH:
        t = mod.tensor([1.0, 2.0, 3.0])
        a = t.numpy()
        a[0] = 10
        assert t.tolist() == [10.0, 2.0, 3.0]
        t.add_(1)
        assert a.tolist() == [11.0, 3.0, 4.0]
    with pytest.raises(RuntimeError, match="requires grad"):
        fl.ones(2, requires_grad=True).numpy()


def test_from_numpy_shares_memory():
    for mod in BOTH:
        a = np.arange(6, dtype=np.float32).reshape(2, 3)
        t = mod.from_numpy(a)
        a[0, 0] = 100
        assert t.tolist()[0][0] == 100
        t.mul_(2)
        assert a[1, 2] == 10
        assert t.dtype is mod.float32


def test_from_numpy_strides():
    a = np.arange(12, dtype=np.int64).reshape(3, 4)[:, ::2]
    assert fl.from_numpy(a).stride() == torch.from_numpy(a).stride()
    assert fl.from_numpy(a).tolist() == a.tolist()


def test_dlpack_roundtrip_through_numpy():
    for mod in BOTH:
        t = mod.tensor([[1.0, 2.0], [3.0, 4.0]])
        a = np.from_dlpack(t)
        assert a.tolist() == [[1.0, 2.0], [3.0, 4.0]]
        a[0, 0] = 7
        assert t.tolist()[0][0] == 7.0
        assert t.__dlpack_device__()[0] == 1     # kDLCPU


def test_dlpack_from_numpy_into_flambeau():
    a = np.arange(4.0)
    t = fl.from_dlpack(a) if hasattr(fl, "from_dlpack") else pytest.skip("flambeau.from_dlpack missing")
    a[1] = 9
    assert t.tolist() == [0.0, 9.0, 2.0, 3.0]


# ---- strides of views ------------------------------------------------------------------------
VIEW_CASES = {
    "contiguous": lambda t: t,
    "transpose": lambda t: t.transpose(0, 1),
    "permute": lambda t: t.permute(2, 0, 1),
    "view": lambda t: t.view(6, 4),
    "unsqueeze": lambda t: t.unsqueeze(1),
    "expand": lambda t: t[:, :1].expand(2, 5, 4),
    "slice": lambda t: t[:, 1:],
    "step_slice": lambda t: t[:, ::2, 1:],
    "select": lambda t: t[1],
    "narrow": lambda t: t.narrow(2, 1, 2),
    "diagonal": lambda t: t.diagonal(0, 1, 2),
    "t_of_2d": lambda t: t[0].t(),
}


@pytest.mark.parametrize("name", list(VIEW_CASES))
def test_view_strides_match_torch(name):
    f = VIEW_CASES[name]
    a = np.arange(24, dtype=np.float32).reshape(2, 3, 4)
    base_f, base_t = fl.tensor(a), torch.tensor(a)
    vf, vt = f(base_f), f(base_t)
    assert tuple(vf.shape) == tuple(vt.shape)
    assert vf.stride() == vt.stride()
    assert vf.storage_offset() == vt.storage_offset()
    assert vf.is_contiguous() == vt.is_contiguous()
    itemsize = 4
    assert vf.data_ptr() - base_f.data_ptr() == vt.data_ptr() - base_t.data_ptr() == vt.storage_offset() * itemsize
    assert vf.tolist() == vt.tolist()
    assert (vf._base is base_f) == (vt._base is base_t)


def test_contiguous_and_channels_last():
    for mod in BOTH:
        t = mod.ones(2, 3, 4, 5)
        assert t.is_contiguous() and not t.is_contiguous(memory_format=mod.channels_last)
        c = t.permute(0, 2, 3, 1).contiguous().permute(0, 3, 1, 2)
        assert c.is_contiguous(memory_format=mod.channels_last)
        tt = t.transpose(1, 2)
        assert not tt.is_contiguous() and tt.contiguous().is_contiguous()
        assert tt.contiguous().stride() == (60, 15, 5, 1)


# ---- devices --------------------------------------------------------------------------------
@pytest.mark.parametrize("spec", ["cpu", "cuda", "cuda:1", "meta"])
def test_device_parsing(spec):
    a, b = fl.device(spec), torch.device(spec)
    assert (a.type, a.index) == (b.type, b.index)
    assert str(a) == str(b) and repr(a) == repr(b)
    assert a == spec and fl.device(a.type, a.index) == a


def test_device_errors_and_int():
    for bad in ("cuda:x", "gpu", "cpu:0:1"):
        with pytest.raises(RuntimeError):
            fl.device(bad)
        with pytest.raises(RuntimeError):
            torch.device(bad)
    assert fl.device(0) == fl.device("cuda:0")
    assert hash(fl.device("cpu")) == hash(fl.device("cpu"))


def test_with_device_meta():
    with fl.device("meta"):
        t = fl.ones(2, 3)
        assert t.device.type == "meta" and t.is_meta
        u = t * 2
        assert u.shape == (2, 3) and u.device.type == "meta"
    assert fl.ones(1).device.type == "cpu"
    with torch.device("meta"):
        assert torch.ones(1).is_meta


# ---- import hygiene ---------------------------------------------------------------------
def test_import_flambeau_does_not_import_torch():
    code = ("import sys, flambeau, flambeau.nn, flambeau.autograd.functional, flambeau.autograd.forward_ad\n"
            "bad = sorted(m for m in sys.modules if m == 'torch' or m.startswith('torch.'))\n"
            "print(bad); sys.exit(1 if bad else 0)")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                       cwd=__file__.rsplit("/tests/", 1)[0])
    assert r.returncode == 0, r.stdout + r.stderr
