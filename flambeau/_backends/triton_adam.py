"""The Adam/AdamW step for many cuda tensors as one Triton kernel launch (PyTorch's `fused=True`).

Like PyTorch's multi-tensor apply, the tensors are cut into chunks of `CHUNK` elements and each
program of the grid updates one chunk of one tensor. The program finds its tensor through a table in
device memory: the addresses of every tensor's parameter, first and second moments (and the amsgrad
maximum), its element count, and per chunk the tensor index and the chunk's index in the tensor; and
through a row of the gradients' addresses. The table depends only on arrays that stay from step to
step, so it is uploaded once per `Arrays`; the gradient row is uploaded when the gradients come at
other addresses (a compiled backward's may, every step): 8 bytes a tensor, not the whole table.

The update is PyTorch's fused one, in float32: maximize negates the gradient; weight decay scales
the parameter by (1 - lr * wd) (AdamW) or adds wd * p to the gradient (Adam); m = b1 m + (1-b1) g,
v = b2 v + (1-b2) g^2, (amsgrad: vmax = max(vmax, v), used for v), and
p -= (lr / bc1) * m / (sqrt(v) / sqrt(bc2) + eps) with the bias corrections bc = 1 - b^step.
`lr` is a float or read from a device scalar (a learning rate held in a cuda tensor).
"""
from __future__ import annotations

import numpy as np
import triton
import triton.language as tl

from . import multi_tensor, triton_launch as TL
from .triton_pointwise import same_dense_layout

CHUNK = 65536           # elements per program (as PyTorch's multi-tensor apply)
BLOCK = 2048            # elements per inner iteration of a program
NUM_WARPS = 8
ALIGN_BYTES = 16        # pointers promised 16-byte aligned when every tensor's address is
ROWS = 4                # table rows of addresses: param, exp_avg, exp_avg_sq, max_exp_avg_sq
_grad_rows: dict = {}   # (device, gradient addresses) -> (their device row, its pinned staging buffer, aligned)


@triton.jit
def _address(TABLE, row, t, N_TENSORS, dtype: tl.constexpr, ALIGNED: tl.constexpr):
    """The pointer of tensor `t` in table row `row`."""
    a = tl.load(TABLE + row * N_TENSORS + t)
    if ALIGNED:
        a = tl.multiple_of(a, 16)
    return a.to(tl.pointer_type(dtype))


@triton.jit
def _adam_block(P, G, M, V, VMAX, idx, n, lr, beta1, beta2, eps, weight_decay, step_size, bc2_sqrt,
                MASKED: tl.constexpr, AMSGRAD: tl.constexpr, MAXIMIZE: tl.constexpr, DECOUPLED: tl.constexpr):
    """One block of the update, in place; MASKED guards the indices past `n`."""
    mask = idx < n if MASKED else None
    p = tl.load(P + idx, mask=mask).to(tl.float32)
    g = tl.load(G + idx, mask=mask).to(tl.float32)
    m = tl.load(M + idx, mask=mask)
    v = tl.load(V + idx, mask=mask)
    if MAXIMIZE:
        g = -g
    if DECOUPLED:
        p = p - lr * weight_decay * p
    else:
        g = g + weight_decay * p
    m = beta1 * m + (1.0 - beta1) * g
    v = beta2 * v + (1.0 - beta2) * g * g
    if AMSGRAD:
        vmax = tl.maximum(tl.load(VMAX + idx, mask=mask), v)
        tl.store(VMAX + idx, vmax, mask=mask)
        denom = tl.sqrt(vmax) / bc2_sqrt + eps
    else:
        denom = tl.sqrt(v) / bc2_sqrt + eps
    p = p - step_size * m / denom
    tl.store(M + idx, m, mask=mask)
    tl.store(V + idx, v, mask=mask)
    tl.store(P + idx, p.to(P.dtype.element_ty), mask=mask)


@triton.jit
def _adam_chunks(TABLE, GRADS, NUMEL, CHUNK_T, CHUNK_I, LR, lr, beta1, beta2, eps, weight_decay, bc1, bc2_sqrt,
                 N_TENSORS, CHUNK: tl.constexpr, BLOCK: tl.constexpr, AMSGRAD: tl.constexpr,
                 MAXIMIZE: tl.constexpr, DECOUPLED: tl.constexpr, LR_ON_DEVICE: tl.constexpr,
                 ALIGNED: tl.constexpr):
    c = tl.program_id(0)
    t = tl.load(CHUNK_T + c)
    start = tl.load(CHUNK_I + c) * CHUNK
    n = tl.load(NUMEL + t)
    P = _address(TABLE, 0, t, N_TENSORS, tl.float32, ALIGNED)
    G = _address(GRADS, 0, t, N_TENSORS, tl.float32, ALIGNED)
    M = _address(TABLE, 1, t, N_TENSORS, tl.float32, ALIGNED)
    V = _address(TABLE, 2, t, N_TENSORS, tl.float32, ALIGNED)
    VMAX = _address(TABLE, 3, t, N_TENSORS, tl.float32, ALIGNED)
    if LR_ON_DEVICE:
        rate = tl.load(LR).to(tl.float32)
    else:
        rate = lr
    step_size = rate / bc1
    if start + CHUNK <= n:
        for off in range(0, CHUNK, BLOCK):
            idx = start + off + tl.arange(0, BLOCK)
            _adam_block(P, G, M, V, VMAX, idx, n, rate, beta1, beta2, eps, weight_decay, step_size, bc2_sqrt,
                        False, AMSGRAD, MAXIMIZE, DECOUPLED)
    else:
        for off in range(0, CHUNK, BLOCK):
            idx = start + off + tl.arange(0, BLOCK)
            _adam_block(P, G, M, V, VMAX, idx, n, rate, beta1, beta2, eps, weight_decay, step_size, bc2_sqrt,
                        True, AMSGRAD, MAXIMIZE, DECOUPLED)


def table(addresses: list, numels: list, chunk: int = CHUNK) -> np.ndarray:
    """The int64 table the kernel reads (`multi_tensor.table`: ROWS address rows)."""
    return multi_tensor.table(addresses, numels, chunk)


def chunk_count(host_table: np.ndarray, n_tensors: int) -> int:
    """The number of chunks (programs) a table describes."""
    return multi_tensor.chunk_count(host_table, n_tensors, ROWS)


def table_offsets(n_tensors: int, n_chunks: int) -> tuple:
    """Element offsets of (addresses, numels, chunk tensor, chunk index) in a table."""
    return multi_tensor.offsets(n_tensors, n_chunks, ROWS)


def supported(p, g, *states) -> bool:
    """Whether one (parameter, gradient) pair of CuPy arrays, with its optimizer states, can go through
    the kernel: float32, all C-contiguous or all of one dense layout (a channels-last convolution
    weight, its gradient and its `zeros_like` states); the kernel walks memory."""
    return (p.dtype == np.float32 and g.dtype == np.float32 and p.shape == g.shape and 0 < p.size < 2 ** 31
            and same_dense_layout((p, g) + states))


class Arrays:
    """What a step needs of the arrays that stay from step to step (parameters, moments, amsgrad maxima):
    their address rows, element counts and alignment, read once (a CuPy array's memory never moves), the
    kernels compiled per variant and the device table per device. `launch` adds each step's gradient
    addresses."""
    __slots__ = ("rows", "numels", "aligned", "kernels", "tables")

    def __init__(self, params, exp_avgs, exp_avg_sqs, vmaxs):
        self.rows = [tuple(a.data.ptr for a in arrays) for arrays in (params, exp_avgs, exp_avg_sqs, vmaxs)]
        self.numels = tuple(int(p.size) for p in params)
        self.aligned = all(a % ALIGN_BYTES == 0 for row in self.rows for a in row)
        self.kernels: dict = {}
        self.tables: dict = {}      # device id -> (device table, its pinned staging buffer, chunk count)


def step(params, grads, exp_avgs, exp_avg_sqs, max_exp_avg_sqs, *, lr, beta1: float, beta2: float,
         eps: float, weight_decay: float, step: float, amsgrad: bool, maximize: bool, decoupled: bool) -> None:
    """Update float32 CuPy arrays in place (see `supported`, each gradient shaped as its parameter).
    `lr` is a float or a CuPy float scalar array; `step` the step count of every tensor."""
    launch(Arrays(params, exp_avgs, exp_avg_sqs, max_exp_avg_sqs if amsgrad else exp_avgs),
           [g.data.ptr for g in grads], lr=lr, beta1=beta1, beta2=beta2, eps=eps, weight_decay=weight_decay,
           step=step, amsgrad=amsgrad, maximize=maximize, decoupled=decoupled)


def launch(arrays: Arrays, grad_ptrs: list, *, lr, beta1: float, beta2: float, eps: float, weight_decay: float,
           step: float, amsgrad: bool, maximize: bool, decoupled: bool) -> None:
    """`step` on the arrays `arrays` describes and gradients at `grad_ptrs` (one a parameter)."""
    import cupy  # deferred: optional dependency, present only where cuda is used
    numels = arrays.numels
    device = cupy.cuda.Device().id
    tab = arrays.tables.get(device)
    if tab is None:
        host = table(arrays.rows, numels)
        tab = arrays.tables[device] = (*multi_tensor.upload(cupy, host), chunk_count(host, len(numels)))
    dev, _, n_chunks = tab
    key = (device, tuple(grad_ptrs))
    row = _grad_rows.get(key)
    if row is None:
        host = np.asarray(grad_ptrs, dtype=np.int64)
        if len(_grad_rows) >= multi_tensor.TABLE_CACHE_LIMIT:
            _grad_rows.pop(next(iter(_grad_rows)))
        row = _grad_rows[key] = (*multi_tensor.upload(cupy, host), not (host % ALIGN_BYTES).any())
    grads, _, grads_aligned = row
    aligned = arrays.aligned and grads_aligned
    on_device = isinstance(lr, cupy.ndarray)
    variant = (bool(amsgrad), bool(maximize), bool(decoupled), on_device, aligned, device)
    kern = arrays.kernels.get(variant)
    if kern is None:
        kern = arrays.kernels[variant] = TL.compile_kernel(
            _adam_chunks, SIGNATURE, dict(CHUNK=CHUNK, BLOCK=BLOCK, AMSGRAD=variant[0], MAXIMIZE=variant[1],
                                          DECOUPLED=variant[2], LR_ON_DEVICE=on_device, ALIGNED=aligned),
            num_warps=NUM_WARPS, num_stages=1)
    T = len(numels)
    base = dev.data.ptr
    rows, num, ct, ci = (TL.Ptr(base + 8 * o) for o in table_offsets(T, n_chunks))
    lr_ptr = TL.Ptr(lr.astype(np.float32, copy=False).data.ptr) if on_device else TL.Ptr(0)
    TL.launch(kern, (n_chunks,), rows, TL.Ptr(grads.data.ptr), num, ct, ci, lr_ptr,
              0.0 if on_device else float(lr), beta1, beta2, eps, weight_decay, 1.0 - beta1 ** step,
              (1.0 - beta2 ** step) ** 0.5, T)


SIGNATURE = {"TABLE": "*i64", "GRADS": "*i64", "NUMEL": "*i64", "CHUNK_T": "*i64", "CHUNK_I": "*i64", "LR": "*fp32",
             "lr": "fp32", "beta1": "fp32", "beta2": "fp32", "eps": "fp32", "weight_decay": "fp32", "bc1": "fp32",
             "bc2_sqrt": "fp32", "N_TENSORS": "i32", **dict.fromkeys(
                 ("CHUNK", "BLOCK", "AMSGRAD", "MAXIMIZE", "DECOUPLED", "LR_ON_DEVICE", "ALIGNED"), "constexpr")}
