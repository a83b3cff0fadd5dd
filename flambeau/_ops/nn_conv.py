"""Convolution: conv1d/2d/3d and conv_transpose1d/2d/3d through one `convolution` op, plus
nn.functional.unfold/fold (`im2col`/`col2im`).

A convolution is an im2col copy (one strided slice per kernel position: a loop over the kernel's
few positions, never over pixels) followed by a GEMM, the groups being a batch dimension of that
matmul. On CPU this runs block by block through a cache-sized column buffer, each GEMM writing
straight into the output; on CuPy it is one column buffer for the whole batch and one cuBLAS GEMM
(see the kernel section). 1x1 stride-1 convolutions need no copy, depthwise ones are multiply-adds.
Where cuDNN is available (`flambeau._backends.cudnn`), the cuda forward, input-gradient and
weight-gradient kernels call it instead, keeping the CuPy path for the cases it does not take.
On cuda, float16/bfloat16 operands go to cuDNN as they are (tensor cores, float32 accumulation, as
PyTorch's cuDNN convolutions under autocast), 1x1 ones included; only the CuPy fallbacks cast up.

The transposed convolution is the adjoint of the convolution (matmul, then col2im scatter-add),
so the derivatives close over two ops: the input gradient of one is the other, and the weight
gradient is `_convolution_weight_grad`, whose own derivatives are convolutions again (double
backward works).
"""
from __future__ import annotations

import itertools
import math
import os
from concurrent.futures import ThreadPoolExecutor

import numpy as np

from .. import _dtype as D
from .._backends import cpu_kernels, cudnn, is_cupy
from ._registry import defop, export, TensorSpec, Tag
from ._helpers import direct_call, direct_device, opmath
from .memory_format import as_format, conv_memory_format, meta_strides
from .._tensor import contiguous_format
from .._dispatch import type_name
from .nn_pad import constant_pad_nd
from . import _batching


def ntuple(v, n: int, name: str) -> tuple:
    if type(v) is tuple and len(v) == n:
        for x in v:                    # a loop, not all(<genexpr>): this runs several times per convolution
            if type(x) is not int:
                break
        else:
            return v
    if isinstance(v, (list, tuple)):
        if len(v) == 1 and n != 1:
            return (int(v[0]),) * n
        if len(v) != n:
            raise RuntimeError(f"expected {name} to be a single integer value or a list of {n} values to match "
                               f"the convolution dimensions, but got {name}={list(v)}")
        return tuple(int(x) for x in v)
    return (int(v),) * n


def out_size(size, k, s, p, d) -> int:
    return (size + 2 * p - d * (k - 1) - 1) // s + 1


def _x(sizes) -> str:
    return " x ".join(map(str, sizes))


def _tname(dt) -> str:
    return type_name(dt)


def conv_output_shape(inp, weight, bias, stride, padding, dilation, transposed, output_padding, groups):
    """Validate a `convolution` call like PyTorch and return the output shape (inputs: arrays or Tensors)."""
    ish, wsh = tuple(inp.shape), tuple(weight.shape)
    nd = len(wsh) - 2
    if len(ish) != nd + 2:
        raise RuntimeError(f"Expected {nd + 2}-dimensional input for {nd + 2}-dimensional weight {list(wsh)}, "
                           f"but got {len(ish)}-dimensional input of size {list(ish)} instead")
    stride, padding, dilation = (ntuple(stride, nd, "stride"), ntuple(padding, nd, "padding"),
                                 ntuple(dilation, nd, "dilation"))
    output_padding = ntuple(output_padding, nd, "output_padding")
    if any(s <= 0 for s in stride):
        raise RuntimeError("non-positive stride is not supported")
    if any(p < 0 for p in padding):
        raise RuntimeError("negative padding is not supported")
    if any(d <= 0 for d in dilation):
        raise RuntimeError("dilation should be greater than zero")
    if groups <= 0:
        raise RuntimeError("non-positive groups is not supported")
    if any(o < 0 for o in output_padding):
        raise RuntimeError("negative output_padding is not supported")
    C, ks = ish[1], wsh[2:]
    if not transposed:
        if wsh[0] % groups:
            raise RuntimeError(f"Given groups={groups}, expected weight to be divisible by {groups} at dimension 0, "
                               f"but got weight of size [{list(wsh)}] instead")
        if C != wsh[1] * groups:
            raise RuntimeError(f"Given groups={groups}, weight of size {list(wsh)}, expected input{list(ish)} to have "
                               f"{wsh[1] * groups} channels, but got {C} channels instead")
        nout = wsh[0]
        padded = [ish[2 + i] + 2 * padding[i] for i in range(nd)]
        kd = [dilation[i] * (ks[i] - 1) + 1 for i in range(nd)]
        if any(k > p for k, p in zip(kd, padded)):
            raise RuntimeError(f"Calculated padded input size per channel: ({_x(padded)}). Kernel size: ({_x(kd)}). "
                               "Kernel size can't be greater than actual input size")
        spatial = [out_size(ish[2 + i], ks[i], stride[i], padding[i], dilation[i]) for i in range(nd)]
    else:
        if C != wsh[0]:
            raise RuntimeError(f"Given transposed=1, weight of size {list(wsh)}, expected input{list(ish)} to have "
                               f"{wsh[0]} channels, but got {C} channels instead")
        if wsh[0] % groups:
            raise RuntimeError(f"Given groups={groups}, expected weight to be divisible by {groups} at dimension 0, "
                               f"but got weight of size [{list(wsh)}] instead")
        if any(o >= s and o >= d for o, s, d in zip(output_padding, stride, dilation)):
            names = ["depth", "height", "width"][3 - nd:] if nd <= 3 else [str(i) for i in range(nd)]
            parts = [f"output_padding_{n}: {o}" for n, o in zip(names, output_padding)]
            parts += [f"stride_{n}: {s}" for n, s in zip(names, stride)]
            parts += [f"dilation_{n}: {d}" for n, d in zip(names, dilation)]
            raise RuntimeError("output padding must be smaller than either stride or dilation, but got " + " ".join(parts))
        nout = wsh[1] * groups
        spatial = [(ish[2 + i] - 1) * stride[i] - 2 * padding[i] + dilation[i] * (ks[i] - 1) + output_padding[i] + 1
                   for i in range(nd)]
        if any(s <= 0 for s in spatial):
            raise RuntimeError(f"Given input size per channel: ({_x(ish[2:])}). Calculated output size per channel: "
                               f"({_x(spatial)}). Output size is too small")
    if bias is not None and tuple(bias.shape) != (nout,):
        raise RuntimeError(f"Given weight of size {list(wsh)}, expected bias to be 1-dimensional with {nout} "
                           f"elements, but got bias of size {list(bias.shape)} instead")
    return (ish[0], nout) + tuple(spatial)


_CALLS: dict = {}       # an eager call's operand layouts, dtypes and parameters -> `_conv_call`'s answer
_MAX_CALLS = 4096


def _key(v):
    return tuple(v) if type(v) is list else v


def _conv_call(xp, inp, weight, bias, stride, padding, dilation, transposed, output_padding, groups) -> tuple:
    """What an eager convolution call's operands and parameters decide: (result dtype, compute dtype,
    `conv_output_shape`, normalised stride, padding, dilation, memory format, whether an operand needs a
    cast), after the dtype and geometry checks (PyTorch's errors). `convolution` remembers it per call
    (`_CALLS`: operand shapes, strides, dtypes, parameters, device kind): the checks, the geometry and the
    layout rule cost ~10 us a call and a training loop repeats each call every step."""
    dt = _dtype_checks(inp, weight, bias)
    shape = conv_output_shape(inp, weight, bias, stride, padding, dilation, transposed, output_padding, groups)
    nd = weight.ndim - 2
    cd = opmath(dt) if xp is np else dt.np      # cuda: half/bfloat16 stay so (conv_*_arrays cast where needed)
    cast = inp.dtype != cd or weight.dtype != cd or (bias is not None and bias.dtype != cd)
    return (dt.np, cd, shape, ntuple(stride, nd, "stride"), ntuple(padding, nd, "padding"),
            ntuple(dilation, nd, "dilation"), conv_memory_format(inp, weight, xp is not np), cast)


def _dtype_checks(inp, weight, bias):
    di, dw = D.FROM_NP[inp.dtype] if not hasattr(inp, "_dtype") else inp._dtype, \
        D.FROM_NP[weight.dtype] if not hasattr(weight, "_dtype") else weight._dtype
    if di is not dw:
        raise RuntimeError(f"expected scalar type {_tname(di)} but found {_tname(dw)}")
    if bias is not None:
        db = D.FROM_NP[bias.dtype] if not hasattr(bias, "_dtype") else bias._dtype
        if db is not di:
            raise RuntimeError(f"Input type ({_tname(di).lower()}) and bias type ({_tname(db).lower()}) should be the same")
    if di.category < D.FLOATING:
        raise NotImplementedError(f'"convolution" not implemented for \'{_tname(di)}\' in flambeau')
    return di


# ---- im2col / col2im kernels (nn.functional.unfold / fold) ----------------------------------------
_POOL = []


def _over_batch(xp, N, size, fill):
    """Run `fill(batch_slice)` over chunks of the batch, on threads for large NumPy copies (NumPy
    releases the GIL while copying, so the copy then runs at several cores' bandwidth)."""
    workers = min(os.cpu_count() or 1, N)
    if xp is not np or workers < 2 or size < (1 << 22):
        fill(slice(None))
        return
    if not _POOL:
        _POOL.append(ThreadPoolExecutor(os.cpu_count() or 1, thread_name_prefix="flambeau-im2col"))
    step = -(-N // workers)
    list(_POOL[0].map(fill, [slice(i, i + step) for i in range(0, N, step)]))


def _positions(ks):
    return list(itertools.product(*[range(k) for k in ks]))


def _windows(ks, st, dil, out, r0=0, r1=None):
    """Per kernel position, the input slices (of a padded input) that output rows [r0, r1) of the
    first spatial dim and all of the others read."""
    r1 = out[0] if r1 is None else r1
    return [(slice(idx[0] * dil[0] + st[0] * r0, idx[0] * dil[0] + st[0] * (r1 - 1) + 1, st[0]),)
            + tuple(slice(idx[i] * dil[i], idx[i] * dil[i] + st[i] * (out[i] - 1) + 1, st[i]) for i in range(1, len(ks)))
            for idx in _positions(ks)]


def _padded(xp, x, pads):
    """x (N, C, *S) zero-padded by pads [(lo, hi), ...] (x itself when there is nothing to pad)."""
    if not any(a or b for a, b in pads):
        return x
    r = xp.zeros(tuple(x.shape[:2]) + tuple(s + a + b for s, (a, b) in zip(x.shape[2:], pads)), x.dtype)
    r[(slice(None), slice(None)) + tuple(slice(a, a + s) for s, (a, _) in zip(x.shape[2:], pads))] = x
    return r


def im2col_arrays(xp, x, ks, st, pad, dil):
    """x (N, C, *S) -> cols (N, C, K, L) with L the flattened output positions."""
    N, C = x.shape[:2]
    out = tuple(out_size(x.shape[2 + i], ks[i], st[i], pad[i], dil[i]) for i in range(len(ks)))
    xpd = _padded(xp, x, [(p, p) for p in pad])
    cols = xp.empty((N, C, math.prod(ks)) + out, x.dtype)
    sls = _windows(ks, st, dil, out)

    def fill(b):
        for k, sl in enumerate(sls):
            cols[b, :, k] = xpd[(b, slice(None)) + sl]
    _over_batch(xp, N, cols.size, fill)
    return cols.reshape(N, C, math.prod(ks), math.prod(out))


def col2im_arrays(xp, cols, size, ks, st, pad, dil):
    """Adjoint of im2col: cols (N, C, K, *out) scatter-added into (N, C, *size)."""
    N, C = cols.shape[:2]
    out = cols.shape[3:]
    nd = len(ks)
    P = [max(size[i] + 2 * pad[i], dil[i] * (ks[i] - 1) + st[i] * (out[i] - 1) + 1) for i in range(nd)]
    acc = xp.zeros((N, C) + tuple(P), cols.dtype)
    sls = _windows(ks, st, dil, out)

    def fill(b):
        for k, sl in enumerate(sls):
            acc[(b, slice(None)) + sl] += cols[b, :, k]
    _over_batch(xp, N, cols.size, fill)
    crop = tuple(slice(pad[i], pad[i] + size[i]) for i in range(nd))
    return xp.ascontiguousarray(acc[(slice(None), slice(None)) + crop])


# ---- convolution kernels -------------------------------------------------------------------------
# CPU: the batch is cut into blocks (several whole items, or bands of output rows of one item) whose
# column buffer fits in about one core's L2 cache; each block is an im2col copy into a reused buffer
# and one GEMM that writes straight into the output (no crop, no transpose; bias added while the
# block is hot). OpenBLAS threads each GEMM: Python threads over blocks, each with a multi-threaded
# BLAS inside, measured ~2x slower on 2 cores (oversubscription), so blocks run in order.
# CuPy: one column buffer for the whole batch in (C*K, N*L) layout, one cuBLAS GEMM (batched over
# groups only), one transposing copy back to (N, O, *out) that also adds the bias.
_BLOCK_BYTES = 1 << 21
# Column buffer of `_weight_grad_by_groups`' chunks of groups. Fewer chunks, fewer small GEMM and copy
# calls: bench/func.py's 64 per-example weight gradients of an 8->16 3x3 layer take 0.81 ms in 10 chunks
# (256 KiB) and 0.61 ms in 3 (1 MiB; thread CPU, loaded box); vmap's caching allocator serves the buffer.
_GROUP_BLOCK_BYTES = 1 << 20


# A grouped 2-D weight gradient with at least this many output channels per group goes to
# `cpu_kernels.conv2d_weight_grad` (one group's outputs are the lanes of its accumulators, padded to 8 or 16).
_KERNEL_WEIGHT_GRAD_MIN_OG = 8


def _blocks(N, out, row_bytes):
    """(items per block, rows per block, [(n0, n1, r0, r1)]) for a per-output-row column size."""
    fit = max(1, _BLOCK_BYTES // max(row_bytes, 1))
    if fit >= out[0]:
        nb = max(1, min(N, fit // max(out[0], 1)))
        return nb, out[0], [(n, min(n + nb, N), 0, out[0]) for n in range(0, N, nb)]
    return 1, fit, [(n, n + 1, r, min(r + fit, out[0])) for n in range(N) for r in range(0, out[0], fit)]


def _geometry(x, wshape, st, dil, pads):
    N, C = x.shape[:2]
    O, ks = wshape[0], tuple(wshape[2:])
    out = tuple((x.shape[2 + i] + pads[i][0] + pads[i][1] - dil[i] * (ks[i] - 1) - 1) // st[i] + 1
                for i in range(len(ks)))
    return N, C, O, ks, out


def _pointwise(ks, st, pads):
    return math.prod(ks) == 1 and all(s == 1 for s in st) and not any(a or b for a, b in pads)


def _cpu_forward(x, w, bias, st, pads, dil, G):
    N, C, O, ks, out = _geometry(x, w.shape, st, dil, pads)
    K, Cg, Og = math.prod(ks), C // G, O // G
    if G == 1 and len(ks) == 2 and not _pointwise(ks, st, pads):
        r = cpu_kernels.conv2d(x, w, bias, st, pads, dil, out)      # implicit GEMM or direct, no column buffer
        if r is not None:
            return r
    rest = math.prod(out[1:])
    L = out[0] * rest
    y = np.empty((N, O) + out, x.dtype)
    yv = y.reshape(N, G, Og, L)
    bv = None if bias is None else bias.reshape(G, Og, 1)
    if _pointwise(ks, st, pads):
        cpu_kernels.matmul(w.reshape(G, Og, Cg), x.reshape(N, G, Cg, L), out=yv)
        if bv is not None:
            yv += bv
        return y
    xpd = _padded(np, x, pads)
    if Cg == 1:
        return _cpu_depthwise(xpd, w, bv, st, dil, G, out, y)
    wm = w.reshape(G, Og, Cg * K)
    nb, rows, blocks = _blocks(N, out, C * K * rest * x.itemsize)
    buf = np.empty((nb, C, K, rows) + out[1:], x.dtype)
    cols = buf.reshape(nb, G, Cg * K, rows * rest)
    for n0, n1, r0, r1 in blocks:
        b, r = n1 - n0, r1 - r0
        for k, sl in enumerate(_windows(ks, st, dil, out, r0, r1)):
            buf[:b, :, k, :r] = xpd[(slice(n0, n1), slice(None)) + sl]
        dst = yv[n0:n1, :, :, r0 * rest:r1 * rest]
        cpu_kernels.matmul(wm, cols[:b, :, :, :r * rest], out=dst)
        if bv is not None:
            dst += bv
    return y


def _cpu_depthwise(xpd, w, bv, st, dil, G, out, y):
    """One input channel per group: a multiply-add per kernel position, block by block, the blocks
    spread over the thread pool (no BLAS here, and NumPy releases the GIL in the element loops)."""
    N, O, ks = y.shape[0], y.shape[1], tuple(w.shape[2:])
    Og, rest = O // G, math.prod(out[1:])
    wk = w.reshape(G, Og, math.prod(ks)).transpose(2, 0, 1)[(...,) + (None,) * len(out)]
    yv = y.reshape((N, G, Og) + out)
    nb, rows, blocks = _blocks(N, out, 2 * O * rest * y.itemsize)

    def run(part):
        tmp = np.empty((nb, G, Og, rows) + out[1:], y.dtype)
        for n0, n1, r0, r1 in part:
            dst, t = yv[n0:n1, :, :, r0:r1], tmp[:n1 - n0, :, :, :r1 - r0]
            for k, sl in enumerate(_windows(ks, st, dil, out, r0, r1)):
                src = xpd[(slice(n0, n1), slice(None)) + sl][:, :, None]
                if k == 0:
                    np.multiply(src, wk[0], out=dst)
                else:
                    np.multiply(src, wk[k], out=t)
                    dst += t
            if bv is not None:
                dst += bv.reshape((G, Og) + (1,) * len(out))
    workers = min(os.cpu_count() or 1, len(blocks))
    if workers < 2 or y.size < (1 << 20):
        run(blocks)
    else:
        if not _POOL:
            _POOL.append(ThreadPoolExecutor(os.cpu_count() or 1, thread_name_prefix="flambeau-im2col"))
        list(_POOL[0].map(run, [blocks[i::workers] for i in range(workers)]))
    return y


def _cpu_weight_grad(x, gy, wshape, st, pads, dil, G):
    N, C, O, ks, _ = _geometry(x, wshape, st, dil, pads)
    out = tuple(gy.shape[2:])
    K, Cg, Og = math.prod(ks), C // G, O // G
    rest = math.prod(out[1:])
    L = out[0] * rest
    if G > 1 and Og >= _KERNEL_WEIGHT_GRAD_MIN_OG and len(ks) == 2:
        r = cpu_kernels.conv2d_weight_grad(_padded(np, x, pads), gy, wshape, G, st, dil)
        if r is not None:
            return r
    per_group = Cg * K * L * x.itemsize
    chunk = max(1, _GROUP_BLOCK_BYTES // per_group)
    if N == 1 and chunk < G and per_group * G > _BLOCK_BYTES and not _pointwise(ks, st, pads):
        return _weight_grad_by_groups(x, gy, wshape, st, pads, dil, G, chunk)
    gyv = gy.reshape(N, G, Og, L)
    if _pointwise(ks, st, pads):
        return cpu_kernels.matmul(gyv, x.reshape(N, G, Cg, L).swapaxes(-1, -2)).sum(0).reshape(wshape)
    xpd = _padded(np, x, pads)
    nb, rows, blocks = _blocks(N, out, C * K * rest * x.itemsize)
    buf = np.empty((nb, C, K, rows) + out[1:], x.dtype)
    cols = buf.reshape(nb, G, Cg * K, rows * rest)
    acc = np.zeros((G, Og, Cg * K), x.dtype)
    part = np.empty((nb, G, Og, Cg * K), x.dtype)
    for n0, n1, r0, r1 in blocks:
        b, r = n1 - n0, r1 - r0
        for k, sl in enumerate(_windows(ks, st, dil, out, r0, r1)):
            buf[:b, :, k, :r] = xpd[(slice(n0, n1), slice(None)) + sl]
        cpu_kernels.matmul(gyv[n0:n1, :, :, r0 * rest:r1 * rest], cols[:b, :, :, :r * rest].swapaxes(-1, -2), out=part[:b])
        acc += part[:b].sum(0) if b > 1 else part[0]
    return acc.reshape(wshape)


def _weight_grad_by_groups(x, gy, wshape, st, pads, dil, G, chunk):
    """The weight gradient of a one-item, many-group convolution (vmap's per-example weight
    gradients: the examples are the groups) a few groups at a time, so its column buffer stays
    small (a whole-batch buffer is megabytes of fresh pages each step)."""
    Cg, Og = x.shape[1] // G, wshape[0] // G
    gw = np.empty(wshape, x.dtype)
    for g0 in range(0, G, chunk):
        g1 = min(G, g0 + chunk)
        gw[g0 * Og:g1 * Og] = _cpu_weight_grad(x[:, g0 * Cg:g1 * Cg], gy[:, g0 * Og:g1 * Og],
                                               ((g1 - g0) * Og,) + tuple(wshape[1:]), st, pads, dil, g1 - g0)
    return gw


def _cpu_col2im_adjoint(gy, w, st, pad, dil, G, size):
    """Transposed convolution by blocks: GEMM into a reused column buffer, scatter-added at once."""
    N, O = gy.shape[:2]
    out, ks = tuple(gy.shape[2:]), tuple(w.shape[2:])
    Cg, Og, K, nd = w.shape[1], O // G, math.prod(ks), len(ks)
    C, rest = Cg * G, math.prod(out[1:])
    P = [max(size[i] + 2 * pad[i], dil[i] * (ks[i] - 1) + st[i] * (out[i] - 1) + 1) for i in range(nd)]
    acc = np.zeros((N, C) + tuple(P), gy.dtype)
    wt = w.reshape(G, Og, Cg * K).swapaxes(1, 2)
    gyv = gy.reshape(N, G, Og, out[0] * rest)
    nb, rows, blocks = _blocks(N, out, C * K * rest * gy.itemsize)
    buf = np.empty((nb, C, K, rows) + out[1:], gy.dtype)
    cols = buf.reshape(nb, G, Cg * K, rows * rest)
    for n0, n1, r0, r1 in blocks:
        b, r = n1 - n0, r1 - r0
        cpu_kernels.matmul(wt, gyv[n0:n1, :, :, r0 * rest:r1 * rest], out=cols[:b, :, :, :r * rest])
        for k, sl in enumerate(_windows(ks, st, dil, out, r0, r1)):
            acc[(slice(n0, n1), slice(None)) + sl] += buf[:b, :, k, :r]
    crop = tuple(slice(pad[i], pad[i] + size[i]) for i in range(nd))
    return np.ascontiguousarray(acc[(slice(None), slice(None)) + crop])


def _gpu_columns(xp, x, ks, st, pads, dil, out):
    """x (N, C, *S) -> cols (C, K, N, *out) for the whole batch: one copy per kernel position."""
    N, C = x.shape[:2]
    xpd = _padded(xp, x, pads)
    cols = xp.empty((C, math.prod(ks), N) + out, x.dtype)
    for k, sl in enumerate(_windows(ks, st, dil, out)):
        cols[:, k] = xpd[(slice(None), slice(None)) + sl].swapaxes(0, 1)
    return cols


def _gpu_forward(xp, x, w, bias, st, pads, dil, G):
    N, C, O, ks, out = _geometry(x, w.shape, st, dil, pads)
    Cg, Og, K, L = C // G, O // G, math.prod(ks), math.prod(out)
    if _pointwise(ks, st, pads):
        cols = x.reshape(N, C, L).swapaxes(0, 1)
    else:
        cols = _gpu_columns(xp, x, ks, st, pads, dil, out)
    wm = w.reshape(G, Og, Cg * K)
    r = xp.matmul(wm[0], cols.reshape(Cg * K, N * L)) if G == 1 else xp.matmul(wm, cols.reshape(G, Cg * K, N * L))
    rt = r.reshape(O, N, L).swapaxes(0, 1)
    y = xp.empty((N, O, L), x.dtype)
    if bias is None:
        y[...] = rt
    else:
        xp.add(rt, bias.reshape(O, 1), out=y)
    return y.reshape((N, O) + out)


def _gpu_weight_grad(xp, x, gy, wshape, st, pads, dil, G):
    N, C, O, ks, _ = _geometry(x, wshape, st, dil, pads)
    out = tuple(gy.shape[2:])
    Cg, Og, K, L = C // G, O // G, math.prod(ks), math.prod(out)
    if _pointwise(ks, st, pads):
        cols = xp.ascontiguousarray(x.reshape(N, C, L).swapaxes(0, 1))
    else:
        cols = _gpu_columns(xp, x, ks, st, pads, dil, out)
    gt = xp.ascontiguousarray(gy.reshape(N, O, L).swapaxes(0, 1)).reshape(G, Og, N * L)
    return xp.matmul(gt, cols.reshape(G, Cg * K, N * L).swapaxes(1, 2)).reshape(wshape)


def _gpu_col2im_adjoint(xp, gy, w, st, pad, dil, G, size):
    N, O = gy.shape[:2]
    out, ks = tuple(gy.shape[2:]), tuple(w.shape[2:])
    Cg, Og, K, nd = w.shape[1], O // G, math.prod(ks), len(ks)
    L = math.prod(out)
    gt = xp.ascontiguousarray(gy.reshape(N, O, L).swapaxes(0, 1)).reshape(G, Og, N * L)
    cols = xp.matmul(w.reshape(G, Og, Cg * K).swapaxes(1, 2), gt).reshape((Cg * G, K, N) + out)
    P = [max(size[i] + 2 * pad[i], dil[i] * (ks[i] - 1) + st[i] * (out[i] - 1) + 1) for i in range(nd)]
    acc = xp.zeros((N, Cg * G) + tuple(P), gy.dtype)
    for k, sl in enumerate(_windows(ks, st, dil, out)):
        acc[(slice(None), slice(None)) + sl] += cols[:, k].swapaxes(0, 1)
    crop = tuple(slice(pad[i], pad[i] + size[i]) for i in range(nd))
    return xp.ascontiguousarray(acc[(slice(None), slice(None)) + crop])


def _is_cl(memory_format) -> bool:
    return memory_format is not None and memory_format is not contiguous_format


def _plain_gemm(ks, st, pad) -> bool:
    """A 1×1, stride-1, unpadded convolution is one GEMM: cuBLAS beats cuDNN's legacy algorithms
    for it (bench/conv_cudnn.py), so the cuda path skips cuDNN there."""
    return all(k == 1 for k in ks) and all(s == 1 for s in st) and not any(pad)


def _low_precision(a) -> bool:
    """float16/bfloat16: cuDNN takes these as they are (float32 accumulation) for every geometry."""
    return a.dtype.itemsize == 2


def _up(*arrays):
    """The CuPy fallbacks compute in float32: half/bfloat16 operands cast up (None kept)."""
    return tuple(a if a is None or not _low_precision(a) else a.astype(np.float32) for a in arrays)


def conv_forward_arrays(xp, x, w, st, pad, dil, groups, bias=None, memory_format=None):
    """The convolution of x with w; `memory_format`: the layout the caller wants (cuDNN writes it
    directly; the other paths leave the result C-contiguous for the caller to lay out)."""
    pads = [(p, p) for p in pad]
    if not is_cupy(xp):
        return _cpu_forward(x, w, bias, st, pads, dil, groups)
    if (_low_precision(x) or not _plain_gemm(w.shape[2:], st, pad)) and \
            (r := cudnn.forward(x, w, bias, st, pad, dil, groups, channels_last=_is_cl(memory_format))) is not None:
        return r
    x, w, bias = _up(x, w, bias)
    return _gpu_forward(xp, x, w, bias, st, pads, dil, groups)


def conv_adjoint_arrays(xp, y, w, st, pad, dil, groups, size, bias=None, memory_format=None):
    """The transposed convolution: y (N, O, *out) with w (O, Cg, *k) -> (N, Cg*groups, *size). With
    stride 1 it is a forward convolution of y with the flipped, group-transposed kernel."""
    if xp is not np and (_low_precision(y) or not _plain_gemm(w.shape[2:], st, pad)) and \
            (r := cudnn.backward_data(y, w, st, pad, dil, groups, size,
                                      channels_last=_is_cl(memory_format))) is not None:
        if bias is not None:
            r += bias.reshape((-1,) + (1,) * (r.ndim - 2))
        return r
    if xp is not np:
        y, w, bias = _up(y, w, bias)
    ks, nd = tuple(w.shape[2:]), w.ndim - 2
    lo = [dil[i] * (ks[i] - 1) - pad[i] for i in range(nd)]
    pads = [(lo[i], lo[i] + size[i] - (y.shape[2 + i] + dil[i] * (ks[i] - 1) - 2 * pad[i])) for i in range(nd)]
    if all(s == 1 for s in st) and all(a >= 0 and b >= 0 for a, b in pads):
        O, Cg, G = w.shape[0], w.shape[1], groups
        wf = w.reshape((G, O // G, Cg) + ks).swapaxes(1, 2).reshape((G * Cg, O // G) + ks)
        wf = xp.ascontiguousarray(wf[(slice(None), slice(None)) + (slice(None, None, -1),) * nd])
        if xp is np:
            return _cpu_forward(y, wf, bias, st, pads, dil, groups)
        return _gpu_forward(xp, y, wf, bias, st, pads, dil, groups)
    if xp is np:
        r = _cpu_col2im_adjoint(y, w, st, pad, dil, groups, size)
    else:
        r = _gpu_col2im_adjoint(xp, y, w, st, pad, dil, groups, size)
    if bias is not None:
        r += bias.reshape((-1,) + (1,) * nd)
    return r


def conv_weight_grad_arrays(xp, x, gy, wshape, st, pad, dil, groups, memory_format=None):
    pads = [(p, p) for p in pad]
    if xp is np:
        return _cpu_weight_grad(x, gy, wshape, st, pads, dil, groups)
    if (_low_precision(x) or not _plain_gemm(wshape[2:], st, pad)) and \
            (r := cudnn.backward_filter(x, gy, wshape, st, pad, dil, groups,
                                        channels_last=_is_cl(memory_format))) is not None:
        return r
    x, gy = _up(x, gy)
    return _gpu_weight_grad(xp, x, gy, wshape, st, pads, dil, groups)


# ---- ops ---------------------------------------------------------------------------------------
@defop("convolution(Tensor input, Tensor weight, Tensor? bias, SymInt[] stride, SymInt[] padding, "
       "SymInt[] dilation, bool transposed, SymInt[] output_padding, SymInt groups) -> Tensor",
       tags=(Tag.core, Tag.extern, Tag.autocast_lower_precision))
def convolution(xp, input, weight, bias, stride, padding, dilation, transposed, output_padding, groups):
    if type(output_padding) is list or type(stride) is list or type(padding) is list or type(dilation) is list:
        stride, padding, dilation, output_padding = _key(stride), _key(padding), _key(dilation), _key(output_padding)
    try:
        key = (input.shape, input.strides, input.dtype, weight.shape, weight.strides, weight.dtype,
               None if bias is None else (bias.shape, bias.dtype), stride, padding, dilation, transposed,
               output_padding, groups, xp is np)
        call = _CALLS.get(key)
    except TypeError:                 # unhashable parameters (lists of lists, symbolic sizes)
        key = call = None
    if call is None:
        call = _conv_call(xp, input, weight, bias, stride, padding, dilation, transposed, output_padding, groups)
        if key is not None:
            if len(_CALLS) >= _MAX_CALLS:
                _CALLS.clear()
            _CALLS[key] = call
    rdt, cd, shape, st, pd, dl, mf, cast = call
    x, w, b = (_as_dtype(input, cd), _as_dtype(weight, cd), _as_dtype(bias, cd)) if cast else (input, weight, bias)
    if transposed:
        r = conv_adjoint_arrays(xp, x, w, st, pd, dl, groups, shape[2:], b, memory_format=mf)
    else:
        r = conv_forward_arrays(xp, x, w, st, pd, dl, groups, b, memory_format=mf)
    return as_format(xp, r if r.dtype is rdt else r.astype(rdt, copy=False), mf)


def _as_dtype(a, dtype):
    """`a.astype(dtype, copy=False)` without the call when `a` has that dtype already (the cuda path's
    usual case: CuPy's astype costs about a microsecond even when it returns `a`)."""
    if a is None or a.dtype is dtype:
        return a
    return a.astype(dtype, copy=False)


@convolution.def_meta
def _(input, weight, bias, stride, padding, dilation, transposed, output_padding, groups):
    dt = _dtype_checks(input, weight, bias)
    shape = conv_output_shape(input, weight, bias, stride, padding, dilation, transposed, output_padding, groups)
    return TensorSpec(shape, dt, meta_strides(shape, conv_memory_format(input, weight,
                                                                          input.device.type == "cuda")))


def _adjoint_output_padding(size, y_spatial, ks, stride, padding, dilation):
    nd = len(ks)
    st, pd, dl = ntuple(stride, nd, "stride"), ntuple(padding, nd, "padding"), ntuple(dilation, nd, "dilation")
    return [size[i] - ((y_spatial[i] - 1) * st[i] - 2 * pd[i] + dl[i] * (ks[i] - 1) + 1) for i in range(nd)]


@convolution.def_derivative
def _convolution_derivative(grad, input, weight, bias_meta, stride, padding, dilation, transposed, groups,
                            output_mask):
    """Only the gradients `output_mask` asks for (PyTorch's convolution_backward): the first layer of a
    network computes no input gradient. The input and weight gradients take the forward's memory
    format (channels-last when the input or the weight is), whatever the incoming gradient's. When
    nothing observes dispatch (`direct_device`: a backward without create_graph), the two convolution
    kernels run on the arrays (`_direct_grads`), skipping two dispatches per layer."""
    nd = weight.ndim - 2
    mf = conv_memory_format(input, weight, input.device.type == "cuda")
    gi = gw = gb = None
    dev = direct_device(grad, input, weight)
    if dev is not None:      # nothing observes dispatch (a backward without create_graph): the kernels on the arrays
        gi, gw = _direct_grads(dev, grad, input._data, weight._data, stride, padding, dilation, transposed, groups,
                               output_mask)
    elif not transposed:
        if output_mask[0]:
            ks = tuple(weight.shape[2:])
            op = _adjoint_output_padding(input.shape[2:], grad.shape[2:], ks, stride, padding, dilation)
            gi = convolution(grad, weight, None, stride, padding, dilation, True, op, groups)
        if output_mask[1]:
            gw = _convolution_weight_grad(input, grad, tuple(weight.shape), stride, padding, dilation, groups)
    else:
        if output_mask[0]:
            gi = _crop(convolution(grad, weight, None, stride, padding, dilation, False, [0] * nd, groups), input)
        if output_mask[1]:
            gw = _convolution_weight_grad(grad, input, tuple(weight.shape), stride, padding, dilation, groups)
    if bias_meta is not None and output_mask[2]:
        gb = grad.sum([0] + list(range(2, grad.ndim)))
    if mf is not contiguous_format:        # (no copy when it already is; symbolic sizes are always contiguous)
        gi = None if gi is None else gi.contiguous(memory_format=mf)
        gw = None if gw is None else gw.contiguous(memory_format=mf)
    return gi, gw, gb


def _crop(gi, input):
    """A transposed convolution's input gradient cut to the input's size (output_padding with stride 1:
    trailing rows unused)."""
    if tuple(gi.shape[2:]) != tuple(input.shape[2:]):
        gi = gi[(slice(None), slice(None)) + tuple(slice(0, s) for s in input.shape[2:])]
    return gi


_PADDINGS: dict = {}     # (sizes, kernel, parameters) -> the input gradient's output_padding (`_direct_grads`)


def _direct_grads(dev, grad, x, w, stride, padding, dilation, transposed, groups, output_mask) -> tuple:
    """(input gradient, weight gradient) of a convolution, as asked by `output_mask`, by its kernels on
    the arrays (`direct_call`) of x, w and of Tensor `grad`: concrete sizes, the adjoint's output padding
    remembered (`_PADDINGS`) and given as a tuple, so the kernels' remembered calls (`_CALLS`) match."""
    g = grad._data
    gi = gw = None
    if not transposed:
        if output_mask[0]:
            key = (x.shape, g.shape, w.shape, stride, padding, dilation)
            try:
                op = _PADDINGS.get(key)
            except TypeError:                 # parameters given as lists
                key = op = None
            if op is None:
                op = tuple(_adjoint_output_padding(x.shape[2:], g.shape[2:], w.shape[2:], stride, padding, dilation))
                if key is not None:
                    if len(_PADDINGS) >= _MAX_CALLS:
                        _PADDINGS.clear()
                    _PADDINGS[key] = op
            gi = direct_call(convolution, dev, g, w, None, stride, padding, dilation, True, op, groups)
        if output_mask[1]:
            gw = direct_call(_convolution_weight_grad, dev, x, g, w.shape, stride, padding, dilation, groups)
    else:
        if output_mask[0]:
            gi = direct_call(convolution, dev, g, w, None, stride, padding, dilation, False, (0,) * (w.ndim - 2),
                             groups)
            gi = _crop(gi, x)
        if output_mask[1]:
            gw = direct_call(_convolution_weight_grad, dev, g, x, w.shape, stride, padding, dilation, groups)
    return gi, gw


_WEIGHT_GRAD_CALLS: dict = {}    # as `_CALLS`, for `_convolution_weight_grad`


@defop("_convolution_weight_grad(Tensor input, Tensor grad_output, SymInt[] weight_size, SymInt[] stride, "
       "SymInt[] padding, SymInt[] dilation, SymInt groups) -> Tensor", function=False, tags=(Tag.core, Tag.extern))
def _convolution_weight_grad(xp, input, grad_output, weight_size, stride, padding, dilation, groups):
    if type(weight_size) is list or type(stride) is list or type(padding) is list or type(dilation) is list:
        weight_size, stride, padding, dilation = _key(weight_size), _key(stride), _key(padding), _key(dilation)
    try:
        key = (input.shape, input.strides, input.dtype, grad_output.shape, grad_output.strides, grad_output.dtype,
               weight_size, stride, padding, dilation, groups, xp is np)
        call = _WEIGHT_GRAD_CALLS.get(key)
    except TypeError:                 # unhashable parameters
        key = call = None
    if call is None:
        nd = len(weight_size) - 2
        dt = D.FROM_NP[input.dtype]
        cd = opmath(dt) if xp is np else dt.np
        # channels-last activations: a channels-last gradient
        call = (dt.np, cd, tuple(weight_size), ntuple(stride, nd, "stride"), ntuple(padding, nd, "padding"),
                ntuple(dilation, nd, "dilation"), conv_memory_format(input, grad_output, xp is not np))
        if key is not None:
            if len(_WEIGHT_GRAD_CALLS) >= _MAX_CALLS:
                _WEIGHT_GRAD_CALLS.clear()
            _WEIGHT_GRAD_CALLS[key] = call
    rdt, cd, wsize, st, pd, dl, mf = call
    r = conv_weight_grad_arrays(xp, _as_dtype(input, cd), _as_dtype(grad_output, cd), wsize, st, pd, dl, groups,
                                memory_format=mf)
    return as_format(xp, r if r.dtype is rdt else r.astype(rdt, copy=False), mf)


@_convolution_weight_grad.def_meta
def _(input, grad_output, weight_size, stride, padding, dilation, groups):
    mf = conv_memory_format(input, grad_output, input.device.type == "cuda")
    return TensorSpec(tuple(weight_size), input.dtype, meta_strides(tuple(weight_size), mf))


@_convolution_weight_grad.def_derivative
def _(grad, input, grad_output, stride, padding, dilation, groups):
    ks = tuple(grad.shape[2:])
    nd = len(ks)
    op = _adjoint_output_padding(input.shape[2:], grad_output.shape[2:], ks, stride, padding, dilation)
    gi = convolution(grad_output, grad, None, stride, padding, dilation, True, op, groups)
    gg = convolution(input, grad, None, stride, padding, dilation, False, [0] * nd, groups)
    return gi, gg


# ---- nn.functional composites ----------------------------------------------------------------------
def _conv_nd(nd: int, name: str):
    def conv(input, weight, bias=None, stride=1, padding=0, dilation=1, groups=1):
        if input.dim() not in (nd + 1, nd + 2):
            raise RuntimeError(f"Expected {nd + 1}D (unbatched) or {nd + 2}D (batched) input to {name}, but got "
                               f"input of size: {list(input.shape)}")
        batched = input.dim() == nd + 2
        x = input if batched else input.unsqueeze(0)
        st, dl = ntuple(stride, nd, "stride"), ntuple(dilation, nd, "dilation")
        if isinstance(padding, str):
            if padding == "valid":
                pad = (0,) * nd
            elif padding == "same":
                if any(s != 1 for s in st):
                    raise RuntimeError("padding='same' is not supported for strided convolutions")
                ks = weight.shape[2:]
                total = [dl[i] * (ks[i] - 1) for i in range(nd)]
                pad = tuple(t // 2 for t in total)
                extra = [t - 2 * p for t, p in zip(total, pad)]
                if any(extra):
                    spec = []
                    for e in reversed(extra):
                        spec += [0, e]
                    x = constant_pad_nd(x, spec, 0)
            else:
                raise RuntimeError(f"Invalid padding string: '{padding}'")
        else:
            pad = ntuple(padding, nd, "padding")
        r = convolution(x, weight, bias, st, pad, dl, False, (0,) * nd, groups)
        return r if batched else r.squeeze(0)
    conv.__name__ = name
    return conv


def _conv_transpose_nd(nd: int, name: str):
    def conv_t(input, weight, bias=None, stride=1, padding=0, output_padding=0, groups=1, dilation=1):
        if input.dim() not in (nd + 1, nd + 2):
            raise RuntimeError(f"Expected {nd + 1}D (unbatched) or {nd + 2}D (batched) input to {name}, but got "
                               f"input of size: {list(input.shape)}")
        batched = input.dim() == nd + 2
        x = input if batched else input.unsqueeze(0)
        r = convolution(x, weight, bias, ntuple(stride, nd, "stride"), ntuple(padding, nd, "padding"),
                        ntuple(dilation, nd, "dilation"), True, ntuple(output_padding, nd, "output_padding"), groups)
        return r if batched else r.squeeze(0)
    conv_t.__name__ = name
    return conv_t


for _nd in (1, 2, 3):
    # on cpu PyTorch lists conv1d..conv_transpose3d (lower precision), not `convolution` itself
    export(f"conv{_nd}d", namespace="nn.functional", tags=(Tag.cpu_autocast_lower_precision,))(
        _conv_nd(_nd, f"conv{_nd}d"))
    export(f"conv_transpose{_nd}d", namespace="nn.functional", tags=(Tag.cpu_autocast_lower_precision,))(
        _conv_transpose_nd(_nd, f"conv_transpose{_nd}d"))


# ---- unfold / fold (im2col / col2im) ------------------------------------------------------------------
def _fold_args(kernel_size, dilation, padding, stride):
    return (ntuple(kernel_size, 2, "kernel_size"), ntuple(dilation, 2, "dilation"),
            ntuple(padding, 2, "padding"), ntuple(stride, 2, "stride"))


def _im2col_shape(shape, kernel_size, dilation, padding, stride):
    ks, dl, pd, st = _fold_args(kernel_size, dilation, padding, stride)
    if len(shape) not in (3, 4) or (len(shape) == 4 and 0 in shape[1:]) or (len(shape) == 3 and 0 in shape):
        raise RuntimeError(f"Expected 3D or 4D (batch mode) tensor with optional 0 dim batch size for input, but "
                           f"got: [{', '.join(map(str, shape))}]")
    if any(k <= 0 for k in ks) or any(s <= 0 for s in st) or any(d <= 0 for d in dl) or any(p < 0 for p in pd):
        raise RuntimeError(f"im2col: kernel size, stride and dilation should be greater than zero and padding "
                           f"non-negative, but got kernel_size={ks}, stride={st}, dilation={dl}, padding={pd}")
    S = shape[-2:]
    out = [out_size(S[i], ks[i], st[i], pd[i], dl[i]) for i in range(2)]
    if any(o < 1 for o in out):
        raise RuntimeError(f"Given input with spatial size ({S[0]}, {S[1]}), kernel_size=({ks[0]}, {ks[1]}), "
                           f"dilation=({dl[0]}, {dl[1]}), padding=({pd[0]}, {pd[1]}), calculated shape of the array "
                           f"of sliding blocks as ({out[0]}, {out[1]}), but its components must be at least one.")
    return tuple(shape[:-3]) + (shape[-3] * ks[0] * ks[1], out[0] * out[1])


@defop("im2col(Tensor self, int[2] kernel_size, int[2] dilation, int[2] padding, int[2] stride) -> Tensor",
       function=False, tags=(Tag.core, Tag.extern))
def im2col(xp, self, kernel_size, dilation, padding, stride):
    shape = _im2col_shape(self.shape, kernel_size, dilation, padding, stride)
    ks, dl, pd, st = _fold_args(kernel_size, dilation, padding, stride)
    x = self if self.ndim == 4 else self[None]
    return im2col_arrays(xp, x, ks, st, pd, dl).reshape(shape)


@im2col.def_meta
def _(self, kernel_size, dilation, padding, stride):
    return TensorSpec(_im2col_shape(tuple(self.shape), kernel_size, dilation, padding, stride), self.dtype)


@im2col.def_derivative
def _(grad, self_meta, kernel_size, dilation, padding, stride):
    return col2im(grad, tuple(self_meta.shape[-2:]), kernel_size, dilation, padding, stride)


def _col2im_shape(shape, output_size, kernel_size, dilation, padding, stride):
    ks, dl, pd, st = _fold_args(kernel_size, dilation, padding, stride)
    osz = ntuple(output_size, 2, "output_size")
    if len(shape) not in (2, 3) or 0 in shape[-2:]:
        raise RuntimeError(f"Expected 2D or 3D (batch mode) tensor for input with possibly 0 batch size and non-zero "
                           f"dimensions for input, but got: [{', '.join(map(str, shape))}]")
    K = ks[0] * ks[1]
    if shape[-2] % K:
        raise RuntimeError(f"Expected size of input's dimension 1 to be divisible by the product of kernel_size, but "
                           f"got input.size(1)={shape[-2]} and kernel_size=({ks[0]}, {ks[1]})")
    blocks = [out_size(osz[i], ks[i], st[i], pd[i], dl[i]) for i in range(2)]
    if blocks[0] * blocks[1] != shape[-1]:
        raise RuntimeError(f"Given output_size=({osz[0]}, {osz[1]}), kernel_size=({ks[0]}, {ks[1]}), dilation=({dl[0]}, "
                           f"{dl[1]}), padding=({pd[0]}, {pd[1]}), stride=({st[0]}, {st[1]}), expected size of input's "
                           f"dimension 2 to match the calculated number of sliding blocks {blocks[0]} * {blocks[1]} = "
                           f"{blocks[0] * blocks[1]}, but got input.size(2)={shape[-1]}.")
    return tuple(shape[:-2]) + (shape[-2] // K,) + osz, blocks


@defop("col2im(Tensor self, SymInt[2] output_size, int[2] kernel_size, int[2] dilation, int[2] padding, "
       "int[2] stride) -> Tensor", function=False, tags=(Tag.core, Tag.extern))
def col2im(xp, self, output_size, kernel_size, dilation, padding, stride):
    shape, blocks = _col2im_shape(self.shape, output_size, kernel_size, dilation, padding, stride)
    ks, dl, pd, st = _fold_args(kernel_size, dilation, padding, stride)
    x = self if self.ndim == 3 else self[None]
    dt = D.FROM_NP[self.dtype]
    cols = x.astype(opmath(dt), copy=False).reshape((x.shape[0], shape[-3], ks[0] * ks[1]) + tuple(blocks))
    r = col2im_arrays(xp, cols, shape[-2:], ks, st, pd, dl)
    return r.reshape(shape).astype(dt.np, copy=False)


@col2im.def_meta
def _(self, output_size, kernel_size, dilation, padding, stride):
    return TensorSpec(_col2im_shape(tuple(self.shape), output_size, kernel_size, dilation, padding, stride)[0],
                      self.dtype)


@col2im.def_derivative
def _(grad, kernel_size, dilation, padding, stride):
    return im2col(grad, kernel_size, dilation, padding, stride)


@export("unfold", namespace="nn.functional", function=False)
def unfold(input, kernel_size, dilation=1, padding=0, stride=1):
    return im2col(input, ntuple(kernel_size, 2, "kernel_size"), ntuple(dilation, 2, "dilation"),
                  ntuple(padding, 2, "padding"), ntuple(stride, 2, "stride"))


@export("fold", namespace="nn.functional", function=False)
def fold(input, output_size, kernel_size, dilation=1, padding=0, stride=1):
    return col2im(input, ntuple(output_size, 2, "output_size"), ntuple(kernel_size, 2, "kernel_size"),
                  ntuple(dilation, 2, "dilation"), ntuple(padding, 2, "padding"), ntuple(stride, 2, "stride"))


# ---- vmap batching rule -----------------------------------------------------------------------------
@convolution.def_batching_rule
def _convolution_batching(in_dims, input, weight, bias, stride, padding, dilation, transposed, output_padding,
                          groups):
    di, dw, db = in_dims[:3]
    nd = weight.dim() - (dw is not None)               # the weight's logical rank: input has it with a minibatch
    if dw is None and db is None:
        x = _batching.front(input, di)
        if x.dim() - 1 != nd:                          # an unbatched input: the vmap batch is the minibatch
            return convolution(x, weight, bias, stride, padding, dilation, transposed, output_padding, groups), 0
        size, n = x.shape[0], x.shape[1]
        y = convolution(x.reshape((size * n,) + tuple(x.shape[2:])), weight, bias, stride, padding, dilation,
                        transposed, output_padding, groups)
        return y.reshape((size, n) + tuple(y.shape[1:])), 0
    if transposed:
        return NotImplemented
    size = _batching.batch_size((input, weight, bias), in_dims)
    w = _batching.materialize(weight, dw, size)        # [B, O, C/g, *k]
    x = _batching.materialize(input, di, size)         # [B, N, C, *s] or [B, C, *s]
    minibatch = x.dim() - 1 == nd
    if not minibatch:
        x = x.unsqueeze(1)
    n = x.shape[1]
    x = x.movedim(0, 1).reshape((n, size * x.shape[2]) + tuple(x.shape[3:]))
    wf = w.reshape((size * w.shape[1],) + tuple(w.shape[2:]))
    b = None if bias is None else _batching.materialize(bias, db, size).reshape(-1)
    y = convolution(x, wf, b, stride, padding, dilation, transposed, output_padding, groups * size)
    y = y.reshape((n, size, w.shape[1]) + tuple(y.shape[2:]))
    return (y, 1) if minibatch else (y[0], 0)
