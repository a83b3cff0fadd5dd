"""Pooling and interpolation: max_pool1d/2d/3d (with PyTorch's per-plane flat indices),
avg_pool1d/2d/3d, adaptive_avg/max_pool1d/2d/3d, max_unpool1d/2d/3d, interpolate/upsample
(nearest, nearest-exact, linear, bilinear, trilinear, bicubic, area).

Max pooling on cuda (float dtypes) is one Triton kernel each way (`_backends/triton_max_pool.py`; the
backward, `_max_pool_backward`, a gather over the windows covering each input element). On NumPy,
with every window inside the plane, it takes a running max over one strided view per kernel
position (a C++ pass for float32 2-D); with padding, the same on planes padded with the lowest
value (`_padded_window_max`). Elsewhere it gathers every window of every plane into one array (a
flat index table built on the host: window positions outside the input point at a -inf sentinel)
and takes an argmax; its backward is `_plane_scatter_add`. Everything linear and separable (average pooling, adaptive
average pooling, interpolation) builds per-dim index/weight tables with PyTorch's exact
coordinate conventions and runs `_taps_gather` (nn_resample.py).
"""
from __future__ import annotations

import itertools
import math

import numpy as np

from .. import _dtype as D
from .. import _state
from .._device import canonical
from ._registry import defop, export, autocast_policy, TensorSpec, Tag
from ._helpers import opmath
from .memory_format import as_format, contiguous_format, meta_strides, suggest_memory_format
from .nn_conv import ntuple
from .nn_resample import _taps_gather, _plane_scatter_add, _plane_gather
from .._dispatch import type_name
from .._backends import cpu_kernels, triton_launch
from .creation import tensor
from . import _batching


def _pool_args(nd, kernel_size, stride, padding, dilation):
    ks = ntuple(kernel_size, nd, "kernel_size")
    st = ks if stride is None or (isinstance(stride, (list, tuple)) and len(stride) == 0) else \
        ntuple(stride, nd, "stride")
    return ks, st, ntuple(padding, nd, "padding"), ntuple(dilation, nd, "dilation")


def pool_out(S, k, s, p, d, ceil):
    o = (S + 2 * p - d * (k - 1) - 1 + (s - 1 if ceil else 0)) // s + 1
    if ceil and (o - 1) * s >= S + p:
        o -= 1
    return o


def _pool_shape(name, shape, nd, ks, st, pd, dl, ceil, effective=True):
    if len(shape) not in (nd + 1, nd + 2) or any(s == 0 for s in shape[-nd - 1:]):
        if nd == 1:
            raise RuntimeError(f"{name}: Expected 2D or 3D (batch mode) tensor with optional 0 dim batch size for "
                               f"input, but got:{list(shape)}")
        raise RuntimeError(f"non-empty {nd + 1}D or {nd + 2}D (batch mode) tensor expected for input")
    if any(s == 0 for s in st):
        raise RuntimeError("stride should not be zero")
    if any(k <= 0 for k in ks):
        raise RuntimeError(f"kernel_size must be greater than zero, but got {ks}")
    for k, p, d in zip(ks, pd, dl):
        if p > ((k - 1) * d + 1) // 2 if effective else p > k // 2:
            raise RuntimeError(f"pad should be at most half of effective kernel size, but got pad={p}, kernel_size={k} "
                               f"and dilation={d}")
    S = shape[-nd:]
    out = tuple(pool_out(S[i], ks[i], st[i], pd[i], dl[i], ceil) for i in range(nd))
    if any(o <= 0 for o in out):
        C = shape[-nd - 1]
        raise RuntimeError(f"Given input size: ({'x'.join(map(str, (C,) + tuple(S)))}). Calculated output size: "
                           f"({'x'.join(map(str, (C,) + out))}). Output size is too small")
    return tuple(shape[:-nd]) + out


def _flat_windows(S, pos, valid):
    """Per-dim window positions -> flat plane index table (prod(out), prod(k)); invalid -> prod(S)."""
    nd = len(S)
    P = math.prod(S)
    flat = np.zeros([1] * (2 * nd), np.int64)
    ok = np.ones([1] * (2 * nd), bool)
    for i in range(nd):
        shp = [1] * (2 * nd)
        shp[i], shp[nd + i] = pos[i].shape
        flat = flat + pos[i].reshape(shp) * math.prod(S[i + 1:])
        ok = ok & valid[i].reshape(shp)
    flat = np.where(ok, flat, P)
    nout = math.prod(p.shape[0] for p in pos)
    return flat.reshape(nout, -1)


def _window_max(xp, x, nd, table):
    """x (..., *S); table (O, K) of flat positions (prod(S) = sentinel) -> values, indices (..., O)."""
    lead = x.shape[:-nd]
    R, P = math.prod(lead), math.prod(x.shape[-nd:])
    dt = D.FROM_NP[x.dtype]
    cd = opmath(dt) if dt.category >= D.FLOATING else x.dtype
    xf = x.astype(cd, copy=False).reshape(R, P)
    low = -np.inf if np.dtype(cd).kind == "f" else np.iinfo(cd).min
    xf = xp.concatenate([xf, xp.full((R, 1), low, dtype=cd)], axis=1)
    t = xp.asarray(table)
    g = xf[:, t]
    am = xp.argmax(g, axis=-1)
    if np.dtype(cd).kind == "f":              # a NaN takes the place, so the last NaN wins (ATen's CPU loop)
        nan = xp.isnan(g)
        am = xp.where(nan.any(-1), g.shape[-1] - 1 - xp.argmax(nan[..., ::-1], axis=-1), am)
    vals = xp.take_along_axis(g, am[..., None], axis=-1)[..., 0]
    idx = t[xp.arange(t.shape[0])[None, :], am]
    return vals.astype(x.dtype, copy=False), idx


def _inside(S, out, ks, st, pd, dl) -> bool:
    """Every window lies inside the plane (no padding, no ceil_mode window past the edge)."""
    return not any(pd) and all((o - 1) * s + (k - 1) * d < n for n, o, k, s, d in zip(S, out, ks, st, dl))


def _disjoint(ks, st, dl) -> bool:
    """No two windows share an input position (each stride at least its window's extent), so each
    input position receives at most one gradient."""
    return all(s >= (k - 1) * d + 1 for k, s, d in zip(ks, st, dl))


def _strided_window_max(x, nd, out, ks, st, dl):
    """NumPy max pooling of windows inside the plane: one strided view of the input per kernel
    position, a running max and its flat index (ATen's CPU loop: a larger value or a NaN takes the
    place, so ties keep the first position and a NaN the last) -> values, indices (..., *out)."""
    S = x.shape[-nd:]
    dt = D.FROM_NP[x.dtype]
    xc = x.astype(opmath(dt) if dt.category >= D.FLOATING else x.dtype, copy=False)
    floating = xc.dtype.kind == "f"
    lead = (slice(None),) * (x.ndim - nd)
    base = np.zeros(out, np.int64)                       # flat index of each window's first element
    for i in range(nd):
        base = base + (np.arange(out[i]) * st[i] * math.prod(S[i + 1:])).reshape((-1,) + (1,) * (nd - 1 - i))
    vals = idx = None
    for pos in itertools.product(*[range(k) for k in ks]):
        win = xc[lead + tuple(slice(p * d, p * d + s * (o - 1) + 1, s) for p, d, s, o in zip(pos, dl, st, out))]
        offset = sum(p * d * math.prod(S[i + 1:]) for i, (p, d) in enumerate(zip(pos, dl)))
        if vals is None:
            vals = win.copy()
            idx = np.broadcast_to(base + offset, vals.shape).copy()
            continue
        take = win > vals
        if floating:
            take |= np.isnan(win)
        np.copyto(vals, win, where=take)
        np.copyto(idx, base + offset, where=take)
    return vals.astype(x.dtype, copy=False), idx


def _padded_window_max(x, nd, S, out, ks, st, pd, dl):
    """Max pooling with padding (or ceil_mode windows past the edge) on the CPU: the planes padded with
    the lowest value (-inf; an integer dtype's minimum) so every window lies inside, pooled there
    (`cpu_kernels.max_pool2d` / `_strided_window_max`), indices mapped back to the plane. A padded
    position wins only where no element of its window is larger, i.e. the window starts in the padding
    and holds nothing above the lowest value: ATen's loop then keeps the window's first position inside
    the plane, the padded one moved on by whole dilations."""
    after = [max(0, (o - 1) * s + (k - 1) * d + 1 - n - p) for n, o, k, s, d, p in zip(S, out, ks, st, dl, pd)]
    low = np.iinfo(x.dtype).min if x.dtype.kind in "iu" else -np.inf
    xp_ = np.pad(x, [(0, 0)] * (x.ndim - nd) + list(zip(pd, after)), constant_values=low)
    r = cpu_kernels.max_pool2d(xp_, out, ks, st, dl) if nd == 2 else None
    vals, idx = r if r is not None else _strided_window_max(xp_, nd, out, ks, st, dl)
    if nd == 2:                                         # one integer pass; windows at the lowest value again
        Wp = xp_.shape[-1]
        r = idx // Wp
        out = (r - pd[0]) * S[1] + (idx - r * Wp - pd[1])
        at_low = vals == low
        if at_low.any():
            coords = [c - p for c, p in zip(np.unravel_index(idx[at_low], xp_.shape[-nd:]), pd)]
            out[at_low] = np.ravel_multi_index(tuple(np.where(c < 0, np.mod(c, d), c) for c, d in zip(coords, dl)), S)
        return vals, out
    coords = [c - p for c, p in zip(np.unravel_index(idx, xp_.shape[-nd:]), pd)]
    first_inside = [np.where(c < 0, np.mod(c, d), c) for c, d in zip(coords, dl)]     # ATen: start += dilation
    return vals, np.ravel_multi_index(tuple(first_inside), S)


_TABLE_CACHE_LIMIT = 64      # pooling geometries whose index/weight tables are kept (on their device)
_tables: dict = {}


def _cached_table(xp, key: tuple, make):
    """A constant table of a pooling geometry, made once per device (on cuda: no host-to-device copy
    per call); `make()` builds it."""
    dev = "cpu" if xp is np else ("cuda", xp.cuda.runtime.getDevice())
    return _remembered(key + (dev,), make)


def _remembered(full: tuple, make):
    """`_tables[full]`, made by `make()` on a miss; the oldest entry goes when the cache is full."""
    hit = _tables.get(full)
    if hit is None:
        if len(_tables) >= _TABLE_CACHE_LIMIT:
            _tables.pop(next(iter(_tables)))
        hit = _tables[full] = make()
    return hit


def _max_pool_tables(S, out, ks, st, pd, dl):
    pos = [np.arange(out[i])[:, None] * st[i] - pd[i] + np.arange(ks[i])[None, :] * dl[i] for i in range(len(S))]
    valid = [(p >= 0) & (p < S[i]) for i, p in enumerate(pos)]
    return _flat_windows(S, pos, valid)


def _triton_max_pool(xp):
    """`_backends.triton_max_pool` on cuda when Triton can be loaded, else None."""
    if getattr(xp, "__name__", "") != "cupy" or not triton_launch.available():
        return None
    from .._backends import triton_max_pool  # deferred: imports Triton, optional (cuda only)
    return triton_max_pool


@defop("_max_pool_backward(Tensor grad_output, Tensor indices, SymInt[] self_size, int[] kernel_size, int[] stride, "
       "int[] padding, int[] dilation) -> Tensor", function=False, tags=(Tag.core, Tag.extern))
def _max_pool_backward(xp, grad_output, indices, self_size, kernel_size, stride, padding, dilation):
    """The input gradient of max pooling over `len(kernel_size)` spatial dims from its output gradient
    and saved indices: on cuda one Triton gather (each input element adds the gradients of the
    windows that chose it, in float32, as ATen's max_pool_backward), else `_plane_scatter_add`
    (an indexed assignment when the windows are disjoint)."""
    nd, size = len(kernel_size), tuple(self_size)
    fused = _triton_max_pool(xp)
    if fused and fused.backward_supported(grad_output, indices, size, nd):
        mf = suggest_memory_format(indices)                    # the input's format, as the indices'
        return as_format(xp, fused.backward(grad_output, indices, size, nd, kernel_size, stride, padding, dilation,
                                            channels_last=mf is not contiguous_format), mf)
    return _plane_scatter_add.kernel(xp, grad_output, indices, size, nd, _disjoint(kernel_size, stride, dilation))


@_max_pool_backward.def_meta
def _max_pool_backward_meta(grad_output, indices, self_size, kernel_size, stride, padding, dilation):
    return TensorSpec(tuple(self_size), grad_output.dtype,
                      meta_strides(tuple(self_size), suggest_memory_format(indices)))


@_max_pool_backward.def_derivative
def _max_pool_backward_derivative(grad, indices, kernel_size):
    return _plane_gather(grad, indices, len(kernel_size)), None


@_max_pool_backward.def_batching_rule
def _max_pool_backward_batching(in_dims, grad_output, indices, self_size, kernel_size, stride, padding, dilation):
    """vmap: the batch joins the planes (the indices address one plane, so they are unchanged)."""
    nd = len(kernel_size)
    B = _batching.batch_size((grad_output, indices), in_dims[:2])
    g, i = (_batching.materialize(t, d, B) for t, d in zip((grad_output, indices), in_dims[:2]))
    out, lead = tuple(g.shape[-nd:]), len(self_size) - nd
    planes = (B * math.prod(self_size[:lead]),) + tuple(self_size[lead:])
    r = _max_pool_backward(g.reshape((-1,) + out), i.reshape((-1,) + out), planes, kernel_size, stride, padding,
                           dilation)
    return r.reshape((B,) + tuple(self_size)), 0


def _planes_batching(op, nd):
    """vmap of a pooling op over planes (its last `nd` dimensions, each pooled alone): the batch joins
    the leading dimensions (indices address one plane, so they are unchanged)."""
    def rule(in_dims, self, *params):
        if any(d is not None for d in in_dims[1:]):
            return NotImplemented
        x = _batching.front(self, in_dims[0])
        lead = tuple(x.shape[:-nd - 1])
        vals, idx = op(x.reshape((-1,) + tuple(x.shape[-nd - 1:])), *params)
        return (vals.reshape(lead + tuple(vals.shape[1:])), idx.reshape(lead + tuple(idx.shape[1:]))), (0, 0)
    rule.__name__ = f"_{op.__name__}_batching"
    return rule


def _def_max_pool(nd):
    name = f"max_pool{nd}d_with_indices"

    @defop(f"{name}(Tensor self, int[{nd}] kernel_size, int[{nd}] stride=[], int[{nd}] padding=0, "
           f"int[{nd}] dilation=1, bool ceil_mode=False) -> (Tensor output, Tensor indices)", function=False,
           tags=(Tag.core, Tag.extern, Tag.optional_output_grads))
    def op(xp, self, kernel_size, stride=(), padding=0, dilation=1, ceil_mode=False):
        ks, st, pd, dl = _pool_args(nd, kernel_size, stride, padding, dilation)
        shape = _pool_shape(f"max_pool{nd}d", self.shape, nd, ks, st, pd, dl, ceil_mode)
        geometry = (tuple(self.shape[-nd:]), tuple(shape[-nd:]), ks, st, pd, dl)
        mf = suggest_memory_format(self, (nd + 2,))      # values and indices in the input's format, as PyTorch's
        fused = _triton_max_pool(xp)
        if fused and fused.supported(self, nd, geometry[1]):
            vals, idx = fused.forward(self, nd, geometry[1], ks, st, pd, dl, channels_last=mf is not contiguous_format)
            return as_format(xp, vals, mf), as_format(xp, idx, mf)
        if xp is np and _inside(*geometry):
            r = cpu_kernels.max_pool2d(self, geometry[1], ks, st, dl) if nd == 2 else None
            r = r if r is not None else _strided_window_max(self, nd, geometry[1], ks, st, dl)
            return as_format(xp, r[0], mf), as_format(xp, r[1], mf)
        if xp is np:
            vals, idx = _padded_window_max(self, nd, *geometry)
            return as_format(xp, vals, mf), as_format(xp, idx, mf)
        table = _cached_table(xp, ("max",) + geometry, lambda: xp.asarray(_max_pool_tables(*geometry)))
        vals, idx = _window_max(xp, self, nd, table)
        return as_format(xp, vals.reshape(shape), mf), as_format(xp, idx.reshape(shape), mf)

    @op.def_meta
    def _(self, kernel_size, stride=(), padding=0, dilation=1, ceil_mode=False):
        ks, st, pd, dl = _pool_args(nd, kernel_size, stride, padding, dilation)
        shape = _pool_shape(f"max_pool{nd}d", tuple(self.shape), nd, ks, st, pd, dl, ceil_mode)
        strides = meta_strides(shape, suggest_memory_format(self, (nd + 2,)))
        return TensorSpec(shape, self.dtype, strides), TensorSpec(shape, D.int64, strides)

    @op.def_derivative
    def _(grad, self_meta, result, kernel_size, stride, padding, dilation):
        return _max_pool_backward(grad[0], result[1], tuple(self_meta.shape),
                                  *_pool_args(nd, kernel_size, stride, padding, dilation))

    op.def_batching_rule(_planes_batching(op, nd))

    def pool(input, kernel_size, stride, padding, dilation, ceil_mode):
        return op(input, ntuple(kernel_size, nd, "kernel_size"), () if stride is None else stride, padding, dilation,
                  ceil_mode)
    # PyTorch's cpu fp32 list has max_pool3d (values only) but not max_pool3d_with_indices
    values_only = autocast_policy(f"max_pool{nd}d", (Tag.cpu_autocast_fp32,))(pool) if nd == 3 else pool

    def max_pool(input, kernel_size, stride=None, padding=0, dilation=1, ceil_mode=False, return_indices=False):
        if return_indices:
            return pool(input, kernel_size, stride, padding, dilation, ceil_mode)
        return values_only(input, kernel_size, stride, padding, dilation, ceil_mode)[0]
    max_pool.__name__ = f"max_pool{nd}d"
    export(f"max_pool{nd}d", namespace="nn.functional")(max_pool)
    export(f"max_pool{nd}d_with_indices", namespace="nn.functional", function=False)(
        lambda input, kernel_size, stride=None, padding=0, dilation=1, ceil_mode=False, return_indices=True:
        max_pool(input, kernel_size, stride, padding, dilation, ceil_mode, True))
    return op


MAX_POOL_OPS = [_def_max_pool(nd) for nd in (1, 2, 3)]


# ---- average pooling -----------------------------------------------------------------------------
def _device_tables(key: tuple, device, make):
    """Index/weight tensors of a pooling geometry made by `make()`; on cuda, outside any dispatch mode,
    kept per geometry and device (no host-to-device copies per call)."""
    dev = canonical(device)
    if dev.type != "cuda" or _state.tls.modes:
        return make()
    return _remembered(key + (dev,), make)


def _avg_tables(S, out, ks, st, pd, count_include_pad, divisor_override, dtype, device):
    """Per spatial dim, the gather positions and weights of each output (as tensors on `device`)."""
    return _device_tables(("avg", tuple(S), tuple(out), ks, st, pd, count_include_pad, divisor_override, dtype),
                          device, lambda: _make_avg_tables(S, out, ks, st, pd, count_include_pad, divisor_override,
                                                           dtype, device))


def _make_avg_tables(S, out, ks, st, pd, count_include_pad, divisor_override, dtype, device):
    idx_t, w_t = [], []
    for i in range(len(S)):
        start = np.arange(out[i]) * st[i] - pd[i]
        end = np.minimum(start + ks[i], S[i] + pd[i])
        size = end - start
        pos = start[:, None] + np.arange(ks[i])[None, :]
        valid = (pos >= 0) & (pos < S[i]) & (pos < end[:, None])
        cnt = size if count_include_pad else valid.sum(1)
        w = valid / np.maximum(cnt, 1)[:, None]
        if divisor_override:
            w = valid / (float(divisor_override) if i == 0 else 1.0)
        idx_t.append(_dev(np.clip(pos, 0, S[i] - 1), device))
        w_t.append(_dev(w, device, dtype))
    return idx_t, w_t


def _tname(dt):
    return type_name(dt)


def _dev(a, device, dtype=None):
    return tensor(np.ascontiguousarray(a), device=device, dtype=dtype)


def _table_dtype(dt):
    return D.float64 if dt is D.float64 else D.float32


def _def_avg_pool(nd):
    def avg_pool(input, kernel_size, stride=None, padding=0, ceil_mode=False, count_include_pad=True,
                 divisor_override=None):
        ks, st, pd, _ = _pool_args(nd, kernel_size, stride, padding, 1)
        if input.dim() < nd + 1:
            n = max(input.dim(), 1)
            raise IndexError(f"Dimension out of range (expected to be in range of [{-n}, {n - 1}], but got {-nd - 1})")
        if nd == 3 and input.dtype in (D.float16, D.bfloat16) and input.device.type == "cpu":   # cuda has them
            raise NotImplementedError(f"\"avg_pool3d_out_frame\" not implemented for '{_tname(input.dtype)}'")
        for k, p in zip(ks, pd):
            if p > k // 2:
                raise RuntimeError(f"pad should be at most half of effective kernel size, but got pad={p}, "
                                   f"kernel_size={k} and dilation=1")
        if divisor_override is not None and divisor_override == 0:
            raise RuntimeError("divisor must be not zero")
        shape = _pool_shape(f"avg_pool{nd}d", tuple(input.shape), nd, ks, st, pd, (1,) * nd, ceil_mode)
        if not input.dtype.is_floating_point:
            raise NotImplementedError(f'"avg_pool{nd}d" not implemented for \'{input.dtype}\' in flambeau')
        idx, w = _avg_tables(input.shape[-nd:], shape[-nd:], ks, st, pd, count_include_pad, divisor_override,
                             _table_dtype(input.dtype), input.device)
        return _taps_gather(input, idx, w)
    avg_pool.__name__ = f"avg_pool{nd}d"
    return avg_pool


for _nd in (1, 2, 3):
    export(f"avg_pool{_nd}d", namespace="nn.functional", function=_nd == 1,
           tags=(Tag.cpu_autocast_fp32,) if _nd == 3 else ())(_def_avg_pool(_nd))


# ---- adaptive pooling ----------------------------------------------------------------------------
def _adaptive_windows(n_in, n_out):
    o = np.arange(n_out)
    start = (o * n_in) // n_out
    end = -((-(o + 1) * n_in) // n_out)
    T = int((end - start).max()) if n_out else 1
    pos = start[:, None] + np.arange(T)[None, :]
    valid = pos < end[:, None]
    return np.minimum(pos, n_in - 1), valid, end - start


def _adaptive_sizes(name, input, nd, output_size):
    if input.dim() not in (nd + 1, nd + 2) or any(s == 0 for s in input.shape[-nd - 1:][1:]):
        sep = ": " if "max" in name else " "
        raise RuntimeError(f"{name}(): Expected {nd + 1}D or {nd + 2}D tensor, but got{sep}{list(input.shape)}")
    osz = list(output_size) if isinstance(output_size, (list, tuple)) else [output_size] * nd
    if len(osz) != nd:
        raise RuntimeError(f"{name}: internal error: output_size.size() must be {nd}")
    return [input.shape[-nd + i] if o is None else int(o) for i, o in enumerate(osz)]


def _adaptive_avg_tables(sizes, osz, tdt, device):
    idx, w = [], []
    for n_in, n_out in zip(sizes, osz):
        pos, valid, cnt = _adaptive_windows(n_in, n_out)
        idx.append(_dev(pos, device))
        w.append(_dev(valid / np.maximum(cnt, 1)[:, None], device, tdt))
    return idx, w


def _global_avg(input, nd: int):
    """adaptive_avg_pool{nd}d to size 1: `mean` over the pooled dims, as PyTorch computes it, with its
    strides: a channels-last input's (N, C, 1, 1) result gets channels-last strides (C, 1, C, C)."""
    out = input.mean(tuple(range(-nd, 0)), keepdim=True)
    if input.dim() == nd + 2 and suggest_memory_format(input) is not contiguous_format:
        c = input.shape[1]
        out = out.as_strided(tuple(out.shape), (c, 1) + (c,) * nd)
    return out


def _def_adaptive_avg(nd):
    def adaptive_avg_pool(input, output_size):
        osz = _adaptive_sizes(f"adaptive_avg_pool{nd}d", input, nd, output_size)
        if not input.dtype.is_floating_point:
            raise NotImplementedError(f'"adaptive_avg_pool{nd}d" not implemented for \'{input.dtype}\'')
        if all(o == 1 for o in osz):        # PyTorch's shortcut: the mean over the pooled dims (a reduction)
            return _global_avg(input, nd)
        tdt = _table_dtype(input.dtype)
        sizes = tuple(input.shape[-nd:])
        idx, w = _device_tables(("adaptive_avg", sizes, tuple(osz), tdt), input.device,
                                lambda: _adaptive_avg_tables(sizes, osz, tdt, input.device))
        return _taps_gather(input, idx, w)
    adaptive_avg_pool.__name__ = f"adaptive_avg_pool{nd}d"
    return adaptive_avg_pool


def _def_adaptive_max(nd):
    name = f"adaptive_max_pool{nd}d"

    def _shape(self, output_size):
        return tuple(self.shape[:-nd]) + tuple(output_size)

    @defop(f"{name}(Tensor self, int[{nd}] output_size) -> (Tensor, Tensor)", function=False,
           tags=(Tag.core, Tag.extern) + ((Tag.cpu_autocast_fp32,) if nd == 3 else ()))
    def op(xp, self, output_size):
        S = self.shape[-nd:]
        pos, valid = [], []
        for i in range(nd):
            p, v, _ = _adaptive_windows(S[i], output_size[i])
            pos.append(p)
            valid.append(v)
        vals, idx = _window_max(xp, self, nd, _flat_windows(S, pos, valid))
        shape = _shape(self, output_size)
        mf = suggest_memory_format(self, (4,) if nd == 2 else ())
        return as_format(xp, vals.reshape(shape), mf), as_format(xp, idx.reshape(shape), mf)

    @op.def_meta
    def _(self, output_size):
        shape = _shape(self, output_size)
        strides = meta_strides(shape, suggest_memory_format(self, (4,) if nd == 2 else ()))
        return TensorSpec(shape, self.dtype, strides), TensorSpec(shape, D.int64, strides)

    @op.def_derivative
    def _(grad, self_meta, result):
        return _plane_scatter_add(grad[0], result[1], tuple(self_meta.shape), nd)

    op.def_batching_rule(_planes_batching(op, nd))

    def adaptive_max_pool(input, output_size, return_indices=False):
        osz = _adaptive_sizes(name, input, nd, output_size)
        r = op(input, osz)
        return r if return_indices else r[0]
    adaptive_max_pool.__name__ = name
    return op, adaptive_max_pool


ADAPTIVE_MAX_OPS = []
for _nd in (1, 2, 3):
    export(f"adaptive_avg_pool{_nd}d", namespace="nn.functional", function=_nd == 1,
           tags=(Tag.cpu_autocast_fp32,) if _nd == 3 else ())(_def_adaptive_avg(_nd))
    _op, _fn = _def_adaptive_max(_nd)
    ADAPTIVE_MAX_OPS.append(_op)
    export(f"adaptive_max_pool{_nd}d", namespace="nn.functional", function=_nd == 1)(_fn)
    export(f"adaptive_max_pool{_nd}d_with_indices", namespace="nn.functional", function=False)(
        lambda input, output_size, return_indices=True, _f=_fn: _f(input, output_size, True))


def _def_max_unpool(nd):
    def max_unpool(input, indices, kernel_size, stride=None, padding=0, output_size=None):
        ks, st, pd, _ = _pool_args(nd, kernel_size, stride, padding, 1)
        default = [(input.shape[-nd + i] - 1) * st[i] - 2 * pd[i] + ks[i] for i in range(nd)]
        if output_size is None:
            osz = default
        else:
            osz = list(output_size)[-nd:]
        if tuple(indices.shape) != tuple(input.shape):
            raise RuntimeError(f"Expected shape of indices to be same as that of the input tensor ({list(input.shape)}) "
                               f"but got indices tensor with shape: {list(indices.shape)}")
        return _plane_scatter_add(input, indices, tuple(input.shape[:-nd]) + tuple(osz), nd)
    max_unpool.__name__ = f"max_unpool{nd}d"
    return max_unpool


for _nd in (1, 2, 3):
    export(f"max_unpool{_nd}d", namespace="nn.functional", function=False,
           tags=(Tag.cpu_autocast_fp32,) if _nd > 1 else ())(_def_max_unpool(_nd))


# ---- interpolate -----------------------------------------------------------------------------------
_A = -0.75


def _cubic1(x):
    return ((_A + 2) * x - (_A + 3)) * x * x + 1


def _cubic2(x):
    return ((_A * x - 5 * _A) * x + 8 * _A) * x - 4 * _A


def _interp_table(mode, n_in, n_out, scale, align_corners, acc):
    """Index/weight table (n_out, taps) for one dim, computed in the accumulation dtype `acc` as PyTorch."""
    o = np.arange(n_out, dtype=acc)
    if mode in ("nearest", "nearest-exact"):
        s = acc(1.0 / scale) if scale is not None and scale > 0 else acc(n_in) / acc(n_out)
        s = np.float32(s)
        if mode == "nearest" and n_out == n_in:
            return np.arange(n_out, dtype=np.int64)[:, None], None
        if mode == "nearest" and n_out == 2 * n_in:
            return (np.arange(n_out, dtype=np.int64) >> 1)[:, None], None
        src = np.floor((o.astype(np.float32) + np.float32(0.5 if mode == "nearest-exact" else 0.0)) * s)
        return np.minimum(src.astype(np.int64), n_in - 1)[:, None], None
    if align_corners:
        s = acc(n_in - 1) / acc(n_out - 1) if n_out > 1 else acc(0)
        src = o * s
    else:
        s = acc(1.0 / scale) if scale is not None and scale > 0 else acc(n_in) / acc(n_out)
        src = s * (o + acc(0.5)) - acc(0.5)
        if mode == "linear":
            src = np.maximum(src, acc(0))
    if mode == "linear":
        i0 = src.astype(np.int64)
        i1 = i0 + (i0 < n_in - 1)
        l1 = src - i0.astype(acc)
        return np.stack([i0, i1], 1), np.stack([acc(1) - l1, l1], 1)
    i = np.floor(src)
    t = src - i
    i = i.astype(np.int64)
    w = np.stack([_cubic2(t + 1), _cubic1(t), _cubic1(1 - t), _cubic2(2 - t)], 1).astype(acc)
    idx = np.clip(i[:, None] + np.arange(-1, 3)[None, :], 0, n_in - 1)
    return idx, w


_MODES_ND = {"linear": 1, "bilinear": 2, "trilinear": 3, "bicubic": 2}


@export("interpolate", namespace="nn.functional", function=False)
def interpolate(input, size=None, scale_factor=None, mode="nearest", align_corners=None,
                recompute_scale_factor=None, antialias=False):
    # PyTorch's cuda fp32 list has every upsample_* op; "area" runs adaptive_avg_pool (not listed)
    run = _interpolate if mode == "area" else _interpolate_fp32_on_cuda
    return run(input, size, scale_factor, mode, align_corners, recompute_scale_factor, antialias)


def _interpolate(input, size, scale_factor, mode, align_corners, recompute_scale_factor, antialias):
    if mode in ("nearest", "area", "nearest-exact"):
        if align_corners is not None:
            raise ValueError("align_corners option can only be set with the interpolating modes: "
                             "linear | bilinear | bicubic | trilinear")
    elif mode not in _MODES_ND:
        raise NotImplementedError(f"Input Error: Only 3D, 4D and 5D input Tensors supported (got {input.dim()}D) for "
                                  "the modes: nearest | linear | bilinear | bicubic | trilinear | lanczos | area | "
                                  f"nearest-exact (got {mode})")
    if align_corners is None:
        align_corners = False
    if antialias:
        raise NotImplementedError("interpolate(antialias=True) is not supported by flambeau")
    nd = input.dim() - 2
    if nd < 1:
        raise ValueError(f"Input dimension should be at least 3")
    if size is not None and scale_factor is not None:
        raise ValueError("only one of size or scale_factor should be defined")
    if size is None and scale_factor is None:
        raise ValueError("either size or scale_factor should be defined")
    if size is not None:
        osz = list(size) if isinstance(size, (list, tuple)) else [size] * nd
        if len(osz) != nd:
            raise ValueError(f"Input and output must have the same number of spatial dimensions, but got input with "
                             f"spatial dimensions of {list(input.shape[2:])} and output size of {size}. Please provide "
                             "input tensor in (N, C, d1, d2, ...,dK) format and output size in (o1, o2, ...,oK) format.")
        scales = [None] * nd
    else:
        scales = list(scale_factor) if isinstance(scale_factor, (list, tuple)) else [scale_factor] * nd
        if len(scales) != nd:
            raise ValueError(f"Input and scale_factor must have the same number of spatial dimensions, but got input "
                             f"with spatial dimensions of {list(input.shape[2:])} and scale_factor of shape "
                             f"{scale_factor}. Please provide input tensor in (N, C, d1, d2, ...,dK) format and "
                             "scale_factor in (s1, s2, ...,sK) format.")
        osz = [int(math.floor(float(input.shape[2 + i]) * scales[i])) for i in range(nd)]
        if recompute_scale_factor:
            scales = [None] * nd
    if mode in _MODES_ND and _MODES_ND[mode] != nd:
        raise NotImplementedError(f"Got {input.dim()}D input, but {mode} mode needs {_MODES_ND[mode] + 2}D input")
    if nd > 3:
        raise NotImplementedError(f"Input Error: Only 3D, 4D and 5D input Tensors supported (got {input.dim()}D) for "
                                  "the modes: nearest | linear | bilinear | bicubic | trilinear | lanczos | area | "
                                  f"nearest-exact (got {mode})")
    if mode == "area":
        return EXPORT_ADAPTIVE_AVG[nd](input, osz)
    if any(o <= 0 for o in osz):
        raise RuntimeError(f"Input and output sizes should be greater than 0, but got input ({_x(input.shape[2:])}) "
                           f"and output ({_x(osz)})")
    kind = mode if mode in ("nearest", "nearest-exact", "bicubic") else "linear"
    acc = np.float64 if input.dtype is D.float64 else np.float32
    if kind != "nearest" and kind != "nearest-exact" and not input.dtype.is_floating_point:
        raise NotImplementedError(f'"upsample_{mode}" not implemented for \'{input.dtype}\' in flambeau')
    idx, w = [], []
    for i in range(nd):
        it, wt = _interp_table(kind, input.shape[2 + i], osz[i], scales[i], align_corners, acc)
        idx.append(_dev(it, input.device))
        if wt is not None:
            w.append(_dev(wt, input.device, D.float64 if acc is np.float64 else D.float32))
    return _taps_gather(input, idx, w)


def _x(s):
    return ", ".join(map(str, s))


EXPORT_ADAPTIVE_AVG = {nd: _def_adaptive_avg(nd) for nd in (1, 2, 3)}


_interpolate_fp32_on_cuda = autocast_policy("upsample", (Tag.autocast_fp32,))(_interpolate)


@export("upsample", namespace="nn.functional", function=False)
def upsample(input, size=None, scale_factor=None, mode="nearest", align_corners=None):
    return interpolate(input, size, scale_factor, mode, align_corners)


@export("upsample_nearest", namespace="nn.functional", function=False)
def upsample_nearest(input, size=None, scale_factor=None):
    return interpolate(input, size, scale_factor, mode="nearest")


@export("upsample_bilinear", namespace="nn.functional", function=False)
def upsample_bilinear(input, size=None, scale_factor=None):
    return interpolate(input, size, scale_factor, mode="bilinear", align_corners=True)
