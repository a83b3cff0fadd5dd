"""Convolution: conv1d/2d/3d and conv_transpose1d/2d/3d through one `convolution` op, plus
nn.functional.unfold/fold (`im2col`/`col2im`).

A convolution is an im2col copy (one strided or shifted slice per kernel position: a loop over
the kernel's few positions, never over pixels) followed by a single batched matmul per call, the
groups being a batch dimension of that matmul. With stride 1 the copy takes contiguous shifted
slices of the flattened padded input ("shift" im2col): the matmul then computes on the padded
grid and the extra columns are cropped, which keeps the copy at memcpy speed.

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
from ._registry import defop, export, TensorSpec
from ._helpers import opmath


def ntuple(v, n: int, name: str) -> tuple:
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
    from .._dispatch import type_name
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


def _dtype_checks(inp, weight, bias):
    di, dw = D.FROM_NP[inp.dtype] if not hasattr(inp, "_dtype") else inp._dtype, \
        D.FROM_NP[weight.dtype] if not hasattr(weight, "_dtype") else weight._dtype
    if di is not dw:
        raise RuntimeError(f"expected scalar type {_tname(di)} but found {_tname(dw)}")
    if bias is not None:
        db = D.FROM_NP[bias.dtype] if not hasattr(bias, "_dtype") else bias._dtype
        if db is not di:
            raise RuntimeError(f"Input type ({_tname(di).lower()}) and bias type ({_tname(db).lower()}) should be the same")
    if di.category < 2:
        raise NotImplementedError(f'"convolution" not implemented for \'{_tname(di)}\' in flambeau')
    return di


# ---- im2col / col2im kernels -----------------------------------------------------------------
_POOL = []


def _over_batch(xp, N, size, fill):
    """Run `fill(batch_slice)` over chunks of the batch, on threads for large NumPy copies (NumPy
    releases the GIL while copying, so the im2col copy then runs at several cores' bandwidth)."""
    workers = min(os.cpu_count() or 1, N)
    if xp is not np or workers < 2 or size < (1 << 22):
        fill(slice(None))
        return
    if not _POOL:
        _POOL.append(ThreadPoolExecutor(os.cpu_count() or 1, thread_name_prefix="flambeau-im2col"))
    step = -(-N // workers)
    list(_POOL[0].map(fill, [slice(i, i + step) for i in range(0, N, step)]))


def _positions(ks):
    return enumerate(itertools.product(*[range(k) for k in ks]))


def im2col_arrays(xp, x, ks, st, pad, dil, shift=True):
    """x (N, C, *S) -> (cols (N, C, K, L), grid, out): cols' L unravels to `grid`, whose leading
    `out` corner is the convolution output (grid == out unless the shift path was taken)."""
    N, C, S = x.shape[0], x.shape[1], tuple(x.shape[2:])
    nd = len(ks)
    out = tuple(out_size(S[i], ks[i], st[i], pad[i], dil[i]) for i in range(nd))
    K = math.prod(ks)
    if shift and all(s == 1 for s in st):
        P = [S[i] + 2 * pad[i] for i in range(nd)]
        fs = [math.prod(P[i + 1:]) for i in range(nd)]
        rest = sum(dil[i] * (ks[i] - 1) * fs[i] for i in range(1, nd))
        pads = [(pad[0], pad[0] + (1 if rest else 0))] + [(p, p) for p in pad[1:]]
        xpd = xp.pad(x, [(0, 0), (0, 0)] + pads) if any(a or b for a, b in pads) else x
        xf = xpd.reshape(N, C, math.prod(xpd.shape[2:]))
        grid = (out[0],) + tuple(P[1:])
        L = math.prod(grid)
        if K == 1:
            return xf[:, :, None, :L], grid, out
        cols = xp.empty((N, C, K, L), x.dtype)
        offs = [sum(idx[i] * dil[i] * fs[i] for i in range(nd)) for _, idx in _positions(ks)]

        def fill(b):
            for k, off in enumerate(offs):
                cols[b, :, k] = xf[b, :, off:off + L]
        _over_batch(xp, N, cols.size, fill)
        return cols, grid, out
    xpd = xp.pad(x, [(0, 0), (0, 0)] + [(p, p) for p in pad]) if any(pad) else x
    cols = xp.empty((N, C, K) + out, x.dtype)
    sls = [tuple(slice(idx[i] * dil[i], idx[i] * dil[i] + st[i] * (out[i] - 1) + 1, st[i]) for i in range(nd))
           for _, idx in _positions(ks)]

    def fill(b):
        for k, sl in enumerate(sls):
            cols[b, :, k] = xpd[(b, slice(None)) + sl]
    _over_batch(xp, N, cols.size, fill)
    return cols.reshape(N, C, K, math.prod(out)), out, out


def col2im_arrays(xp, cols, size, ks, st, pad, dil):
    """Adjoint of im2col: cols (N, C, K, *out) scatter-added into (N, C, *size)."""
    N, C = cols.shape[:2]
    out = cols.shape[3:]
    nd = len(ks)
    P = [max(size[i] + 2 * pad[i], dil[i] * (ks[i] - 1) + st[i] * (out[i] - 1) + 1) for i in range(nd)]
    acc = xp.zeros((N, C) + tuple(P), cols.dtype)
    sls = [tuple(slice(idx[i] * dil[i], idx[i] * dil[i] + st[i] * (out[i] - 1) + 1, st[i]) for i in range(nd))
           for _, idx in _positions(ks)]

    def fill(b):
        for k, sl in enumerate(sls):
            acc[(b, slice(None)) + sl] += cols[b, :, k]
    _over_batch(xp, N, cols.size, fill)
    crop = tuple(slice(pad[i], pad[i] + size[i]) for i in range(nd))
    return xp.ascontiguousarray(acc[(slice(None), slice(None)) + crop])


def _crop(xp, r, grid, out):
    if tuple(grid) == tuple(out):
        return r
    return xp.ascontiguousarray(r[(slice(None), slice(None)) + tuple(slice(0, o) for o in out)])


def conv_forward_arrays(xp, x, w, st, pad, dil, groups):
    N, C = x.shape[:2]
    O, ks = w.shape[0], w.shape[2:]
    cols, grid, out = im2col_arrays(xp, x, ks, st, pad, dil)
    G, K = groups, math.prod(ks)
    L = cols.shape[-1]
    r = xp.matmul(w.reshape(G, O // G, (C // G) * K), cols.reshape(N, G, (C // G) * K, L))
    return _crop(xp, r.reshape((N, O) + tuple(grid)), grid, out)


def conv_adjoint_arrays(xp, y, w, st, pad, dil, groups, size):
    """The transposed convolution: y (N, O, *out) with w (O, Cg, *k) -> (N, Cg*groups, *size)."""
    N, O = y.shape[:2]
    out, ks = y.shape[2:], w.shape[2:]
    G, Cg, K = groups, w.shape[1], math.prod(ks)
    wm = w.reshape(G, O // G, Cg * K)
    cols = xp.matmul(wm.transpose(0, 2, 1), y.reshape(N, G, O // G, math.prod(out)))
    return col2im_arrays(xp, cols.reshape((N, G * Cg, K) + tuple(out)), size, ks, st, pad, dil)


def conv_weight_grad_arrays(xp, x, gy, wshape, st, pad, dil, groups):
    N, C = x.shape[:2]
    O, ks = wshape[0], tuple(wshape[2:])
    cols, grid, out = im2col_arrays(xp, x, ks, st, pad, dil)
    if tuple(grid) != tuple(out):
        g = xp.zeros((N, O) + tuple(grid), gy.dtype)
        g[(slice(None), slice(None)) + tuple(slice(0, o) for o in out)] = gy
        gy = g
    G, K = groups, math.prod(ks)
    L = cols.shape[-1]
    r = xp.matmul(gy.reshape(N, G, O // G, L), cols.reshape(N, G, (C // G) * K, L).transpose(0, 1, 3, 2))
    return r.sum(0).reshape(wshape)


# ---- ops ---------------------------------------------------------------------------------------
@defop("convolution(Tensor input, Tensor weight, Tensor? bias, SymInt[] stride, SymInt[] padding, "
       "SymInt[] dilation, bool transposed, SymInt[] output_padding, SymInt groups) -> Tensor")
def convolution(xp, input, weight, bias, stride, padding, dilation, transposed, output_padding, groups):
    dt = _dtype_checks(input, weight, bias)
    shape = conv_output_shape(input, weight, bias, stride, padding, dilation, transposed, output_padding, groups)
    nd = weight.ndim - 2
    st, pd, dl = ntuple(stride, nd, "stride"), ntuple(padding, nd, "padding"), ntuple(dilation, nd, "dilation")
    cd = opmath(dt)
    x, w = input.astype(cd, copy=False), weight.astype(cd, copy=False)
    if transposed:
        r = conv_adjoint_arrays(xp, x, w, st, pd, dl, groups, shape[2:])
    else:
        r = conv_forward_arrays(xp, x, w, st, pd, dl, groups)
    if bias is not None:
        r = r + bias.astype(cd, copy=False).reshape((-1,) + (1,) * nd)
    return r.astype(dt.np, copy=False)


@convolution.def_meta
def _(input, weight, bias, stride, padding, dilation, transposed, output_padding, groups):
    dt = _dtype_checks(input, weight, bias)
    return TensorSpec(conv_output_shape(input, weight, bias, stride, padding, dilation, transposed,
                                        output_padding, groups), dt)


def _adjoint_output_padding(size, y_spatial, ks, stride, padding, dilation):
    nd = len(ks)
    st, pd, dl = ntuple(stride, nd, "stride"), ntuple(padding, nd, "padding"), ntuple(dilation, nd, "dilation")
    return [size[i] - ((y_spatial[i] - 1) * st[i] - 2 * pd[i] + dl[i] * (ks[i] - 1) + 1) for i in range(nd)]


@convolution.def_derivative
def _(grad, input, weight, bias_meta, stride, padding, dilation, transposed, groups):
    nd = weight.ndim - 2
    ks = tuple(weight.shape[2:])
    if not transposed:
        op = _adjoint_output_padding(input.shape[2:], grad.shape[2:], ks, stride, padding, dilation)
        gi = convolution(grad, weight, None, stride, padding, dilation, True, op, groups)
        gw = _convolution_weight_grad(input, grad, tuple(weight.shape), stride, padding, dilation, groups)
    else:
        gi = convolution(grad, weight, None, stride, padding, dilation, False, [0] * nd, groups)
        gw = _convolution_weight_grad(grad, input, tuple(weight.shape), stride, padding, dilation, groups)
    gb = grad.sum([0] + list(range(2, grad.ndim))) if bias_meta is not None else None
    return gi, gw, gb


@defop("_convolution_weight_grad(Tensor input, Tensor grad_output, SymInt[] weight_size, SymInt[] stride, "
       "SymInt[] padding, SymInt[] dilation, SymInt groups) -> Tensor", function=False)
def _convolution_weight_grad(xp, input, grad_output, weight_size, stride, padding, dilation, groups):
    nd = len(weight_size) - 2
    st, pd, dl = ntuple(stride, nd, "stride"), ntuple(padding, nd, "padding"), ntuple(dilation, nd, "dilation")
    dt = D.FROM_NP[input.dtype]
    cd = opmath(dt)
    r = conv_weight_grad_arrays(xp, input.astype(cd, copy=False), grad_output.astype(cd, copy=False),
                                tuple(weight_size), st, pd, dl, groups)
    return r.astype(dt.np, copy=False)


@_convolution_weight_grad.def_meta
def _(input, grad_output, weight_size, stride, padding, dilation, groups):
    return TensorSpec(tuple(weight_size), input.dtype)


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
                    from .nn_pad import constant_pad_nd
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
    export(f"conv{_nd}d", namespace="nn.functional")(_conv_nd(_nd, f"conv{_nd}d"))
    export(f"conv_transpose{_nd}d", namespace="nn.functional")(_conv_transpose_nd(_nd, f"conv_transpose{_nd}d"))


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
       function=False)
def im2col(xp, self, kernel_size, dilation, padding, stride):
    shape = _im2col_shape(self.shape, kernel_size, dilation, padding, stride)
    ks, dl, pd, st = _fold_args(kernel_size, dilation, padding, stride)
    x = self if self.ndim == 4 else self[None]
    cols, _, _ = im2col_arrays(xp, x, ks, st, pd, dl, shift=False)
    return xp.ascontiguousarray(cols).reshape(shape)


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
       "int[2] stride) -> Tensor", function=False)
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
