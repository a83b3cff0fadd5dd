"""Run flambeau's Triton max-pooling kernels (flambeau/_backends/triton_max_pool.py) under Triton's
interpreter (TRITON_INTERPRET=1, set by the caller) on CPU tensors and compare them with PyTorch on
the CPU: the forward's values and indices exactly (ties, NaN, -inf, a plane of -inf under padding),
the input gradient of float32/float64 bit for bit (ATen's CPU backward adds in the same order)
and of float16 against the float64 gradient rounded once (bfloat16 within one unit in the last
place: the interpreter truncates float32 to bfloat16 where the GPU rounds to nearest even). 1-d,
2-d and 3-d, padding, dilation, ceil_mode, strides, contiguous, channels-last and sliced inputs, a
non-contiguous output gradient. Then flambeau's own F.max_pool1d/2d/3d forward and backward on CPU tensors with the cuda
dispatch taken (NumPy standing in for CuPy, the interpreter for the launcher): exactly one launch
each way, values, indices and gradients against PyTorch (the wrapper's strides, shapes and the
derivative's arguments). Prints one line per case (its number of mismatching checks) and exits
non-zero on a mismatch. Used by tests/test_max_pool_cuda.py."""
import sys

import numpy as np
import torch
import torch.nn.functional as F
import triton.language as tl
import interp_numpy2  # noqa: F401  (before any kernel runs)
from interp_numpy2 import HostCupy, HostLauncher, report

from flambeau._backends import triton_max_pool as MP

# (spatial dims, input shape, kernel, stride, padding, dilation, ceil_mode, layout, dtype, values)
CASES = (
    (2, (2, 3, 9, 8), 3, 2, 1, 1, False, "contiguous", "float32", "ties"),           # ResNet's stem pool
    (2, (2, 3, 9, 8), 3, 2, 1, 1, False, "channels_last", "bfloat16", "ties"),
    (2, (2, 3, 8, 8), 2, 2, 0, 1, False, "contiguous", "float16", "randn"),
    (2, (2, 2, 7, 9), (3, 2), (2, 1), 1, (1, 2), True, "contiguous", "float32", "nan"),
    (2, (3, 7, 7), 3, 2, 1, 2, True, "sliced", "float32", "randn"),
    (2, (1, 2, 6, 5), 2, None, 0, 1, True, "contiguous", "bfloat16", "nan"),
    (2, (1, 2, 5, 5), 3, 1, 1, 1, False, "contiguous", "float32", "-inf"),
    (1, (2, 3, 11), 3, 2, 1, 2, True, "contiguous", "float32", "ties"),
    (1, (3, 10), 3, 2, 1, 1, True, "contiguous", "float16", "nan"),
    (1, (2, 3, 12), 4, 3, 2, 1, False, "sliced", "bfloat16", "randn"),
    (3, (1, 2, 5, 6, 7), (2, 3, 2), (2, 1, 2), (1, 1, 0), 1, True, "contiguous", "float32", "ties"),
    (3, (1, 2, 4, 5, 5), 2, 2, 1, 1, False, "channels_last", "float32", "nan"),
    (3, (2, 4, 5, 5), 3, 1, 1, (2, 1, 1), False, "contiguous", "float16", "randn"),
    (2, (2, 3, 7, 7), 3, 2, 1, 1, True, "channels_last", "float64", "nan"),
)


def _input(shape, layout, dtype, values, g):
    full = list(shape)
    if layout == "sliced":
        full[-1] = 2 * shape[-1]
    if values == "ties":
        x = torch.randint(-3, 3, full, generator=g).float()
    else:
        x = torch.randn(full, generator=g)
    if values == "nan":
        x.view(-1)[torch.randperm(x.numel(), generator=g)[: max(2, x.numel() // 6)]] = float("nan")
        x.view(-1)[3] = float("-inf")
    if values == "-inf":
        x[0, 0] = float("-inf")
    x = x.to(getattr(torch, dtype))
    if layout == "sliced":
        x = x[..., ::2]
    if layout == "channels_last":
        x = x.to(memory_format=torch.channels_last if x.dim() == 4 else torch.channels_last_3d)
    return x


def _elements(t):
    return tuple(t.stride())


def run(nd, shape, kernel, stride, padding, dilation, ceil_mode, layout, dtype, values):
    g = torch.Generator().manual_seed(sum(shape) + nd)
    x = _input(shape, layout, dtype, values, g)
    pool = getattr(F, f"max_pool{nd}d")
    ref, ref_idx = pool(x, kernel, stride, padding, dilation, ceil_mode, return_indices=True)
    ks, st, pd, dl = (tuple(v) if isinstance(v, tuple) else (v,) * nd
                      for v in (kernel, kernel if stride is None else stride, padding, dilation))
    out = tuple(ref.shape[-nd:])
    acc = tl.float64 if dtype == "float64" else tl.float32
    # a channels-last input is pooled in channels-last element order (CL) into channels-last outputs
    cl = layout == "channels_last" and x.dim() == nd + 2
    fmt = (torch.channels_last if x.dim() == 4 else torch.channels_last_3d) if cl else torch.contiguous_format
    y = torch.empty(ref.shape, dtype=x.dtype).contiguous(memory_format=fmt)
    idx = torch.empty(ref.shape, dtype=torch.int64).contiguous(memory_format=fmt)
    args = MP.forward_args(tuple(x.shape), _elements(x), nd, out, ks, st, pd, dl)
    MP._max_pool_fwd[(-(-args[-1] // MP.BLOCK),)](x, y, idx, *args, ACC=acc, BLOCK=MP.BLOCK, CL=cl)
    bad = int(not torch.equal(idx, ref_idx)) + int(not torch.equal(y.isnan(), ref.isnan()))
    bad += int(not torch.equal(torch.nan_to_num(y.float(), 0.0), torch.nan_to_num(ref.float(), 0.0)))

    # the output gradient: a transposed copy (non-contiguous), with -0.0 in it
    base = torch.randn(tuple(reversed(ref.shape)), generator=g).to(x.dtype)
    base.view(-1)[:2] = -0.0
    dy = base.permute(*reversed(range(ref.dim())))
    dx = torch.empty(x.shape, dtype=x.dtype).contiguous(memory_format=fmt)
    bargs = MP.backward_args(tuple(x.shape), _elements(dy), _elements(idx), nd, out, ks, st, pd, dl)
    MP._max_pool_bwd[(-(-bargs[-1] // MP.BLOCK),)](dy, idx, dx, *bargs, ACC=acc, BLOCK=MP.BLOCK, CL=cl)
    if dtype in ("float32", "float64"):
        xr = x.detach().clone().requires_grad_()
        pool(xr, kernel, stride, padding, dilation, ceil_mode).backward(dy)
        want = xr.grad
        bad += int(not torch.equal(dx, want)) + int(not torch.equal(dx.signbit(), want.signbit()))
    else:
        want = torch.zeros(x.shape, dtype=torch.float64).view(x.shape[:len(x.shape) - nd] + (-1,))
        want.scatter_add_(-1, ref_idx.reshape(want.shape[:-1] + (-1,)), dy.double().reshape(want.shape[:-1] + (-1,)))
        want = want.reshape(x.shape)
        if dtype == "bfloat16":     # the interpreter truncates float32 -> bfloat16 (the GPU rounds to nearest even)
            bad += int(not bool(((dx.double() - want).abs() <= want.abs() * 2.0 ** -7).all()))
        else:
            bad += int(not torch.equal(dx, want.to(x.dtype)))
    return float(bad)


# ---- through flambeau's ops: the cuda dispatch with a host stand-in for CuPy and the launcher -------
# (spatial dims, input shape, kernel, stride, padding, dilation, ceil_mode, layout, dtype)
GLUE_CASES = (
    (2, (2, 3, 9, 8), 3, 2, 1, 1, False, "channels_last", "bfloat16"),
    (2, (3, 9, 9), 2, None, 0, 1, True, "sliced", "float32"),
    (1, (2, 3, 12), 3, 2, 1, 2, True, "contiguous", "float16"),
    (3, (1, 2, 5, 6, 7), (2, 3, 2), (2, 1, 2), 1, 1, True, "contiguous", "float32"),
)


def run_glue(nd, shape, kernel, stride, padding, dilation, ceil_mode, layout, dtype):
    """flambeau's F.max_pool{nd}d forward and backward with the Triton kernels routed in as on cuda
    (one launch each way) against PyTorch on the CPU; the number of mismatching checks."""
    import flambeau
    g = torch.Generator().manual_seed(sum(shape))
    x = _input(shape, layout, "float32", "nan", g).to(getattr(torch, dtype))
    xt = x.detach().requires_grad_()
    ref, ref_idx = getattr(F, f"max_pool{nd}d")(xt, kernel, stride, padding, dilation, ceil_mode, return_indices=True)
    dy = torch.randn(ref.shape, generator=g).to(x.dtype)
    ref.backward(dy)
    fx = flambeau.tensor(x.float().numpy()).to(getattr(flambeau, dtype))
    if layout == "channels_last":
        fx = fx.contiguous(memory_format=flambeau.channels_last)
    elif layout == "sliced":
        fx = flambeau.tensor(_input(shape, layout, "float32", "nan", torch.Generator().manual_seed(sum(shape)))
                             ._base.numpy())[..., ::2]
    fx = fx.detach().requires_grad_()
    assert fx.stride() == x.stride(), (fx.stride(), x.stride())
    before = len(HostLauncher.launches)
    y, idx = getattr(flambeau.nn.functional, f"max_pool{nd}d")(fx, kernel, stride, padding, dilation, ceil_mode,
                                                               return_indices=True)
    y.backward(flambeau.tensor(dy.float().numpy()).to(getattr(flambeau, dtype)))
    bad = int(HostLauncher.launches[before:] != ["_max_pool_fwd", "_max_pool_bwd"])
    # the input's memory format kept, as PyTorch keeps it (channels-last: made so by the kernels, no copy)
    bad += int(y.stride() != ref.stride()) + int(idx.stride() != ref_idx.stride()) + int(fx.grad.stride() != xt.grad.stride())
    bad += int(layout == "channels_last" and MADE_CHANNELS_LAST[-2:] != [True, True])
    bad += int(not np.array_equal(idx.numpy(), ref_idx.numpy()))
    bad += int(not np.array_equal(y.detach().float().numpy(), ref.detach().float().numpy(), equal_nan=True))
    want = xt.grad.double().numpy()
    got = fx.grad.double().numpy()
    bad += int(not np.allclose(got, want, rtol=2.0 ** -7, atol=1e-3)) if dtype != "float32" else \
        int(not np.array_equal(got, want))
    return float(bad)


MADE_CHANNELS_LAST: list = []   # per kernel call through flambeau: whether it returned C-fastest arrays


def _spy(fn):
    def call(*args, **kwargs):
        r = fn(*args, **kwargs)
        first = r[0] if isinstance(r, tuple) else r
        MADE_CHANNELS_LAST.append(first.ndim >= 4 and first.strides[1] == first.itemsize and first.shape[1] > 1)
        return r
    return call


def main() -> int:
    status = report(CASES, run, "nd, shape, kernel, stride, padding, dilation, ceil, layout, dtype, values", 0.5)
    from flambeau._ops import nn_pool
    MP.TL, MP.cupy = HostLauncher, HostCupy
    MP.forward, MP.backward = _spy(MP.forward), _spy(MP.backward)
    nn_pool._triton_max_pool = lambda xp: MP
    return status | report(GLUE_CASES, run_glue, "through flambeau: nd, shape, kernel, stride, padding, dilation, "
                           "ceil, layout, dtype", 0.5)


if __name__ == "__main__":
    sys.exit(main())
