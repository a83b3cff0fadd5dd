"""Run flambeau's Triton BatchNorm kernels (flambeau/_backends/triton_batch_norm.py) under Triton's
interpreter (TRITON_INTERPRET=1, set by the caller) on float32 CPU tensors and compare the output,
running statistics and the three gradients with float64 PyTorch (training mode), the split kernels
(NCHW and channels-last: `_bn_stats_cl`, `_bn_bwd_reduce_cl`, CL apply kernels) and the
one-program-per-channel pair (`_bn_fwd_onchip`, `_bn_bwd_onchip`); then the module's
`forward`/`backward` wrappers on NumPy arrays (interp_numpy2.HostCupy/HostLauncher) with their
launch counts, NCHW and channels-last (outputs channels-last, no copies). Prints one line per case and exits non-zero on a mismatch. Used by tests/test_batch_norm_cuda.py."""
import sys

import torch
import interp_numpy2  # noqa: F401  (before any kernel runs)
from interp_numpy2 import HostCupy, HostLauncher, report

from flambeau._backends import triton_batch_norm as BN

# (shape, weight, bias, running stats, multiprocessors, channels-last): the multiprocessor count sets the
# split of each channel into chunks (S > 1 exercises the merge of partial statistics); channels-last cases
# have C above and below the tile's BLOCK_CL
CASES = (((3, 4, 25, 40), True, True, True, 2, False), ((5000, 3), True, False, True, 1, False),
         ((2, 5, 7), False, True, False, 8, False), ((4, 2, 3, 3), True, True, True, 64, False),
         ((3, 4, 25, 40), True, True, True, 2, True), ((2, 40, 9, 11), True, False, True, 64, True),
         ((2, 37, 3, 4, 5), False, True, False, 8, True))
MOMENTUM, EPS = 0.1, 1e-5


def run(shape, has_w, has_b, has_run, sms, cl):
    g = torch.Generator().manual_seed(sum(shape))
    C = shape[1]
    x = torch.randn(shape, generator=g) * 3 + 5       # an offset mean: no cancellation in the variance
    if cl:
        x = x.contiguous(memory_format=torch.channels_last if x.dim() == 4 else torch.channels_last_3d)
    w = torch.randn(C, generator=g) if has_w else None
    b = torch.randn(C, generator=g) if has_b else None
    rm, rv = (torch.randn(C, generator=g), torch.rand(C, generator=g) + 0.5) if has_run else (None, None)
    dy = torch.empty_like(x).copy_(torch.randn(shape, generator=g))
    M = x.numel() // C
    HW = M // shape[0]
    S, chunk = BN.splits(-(-C // BN.BLOCK_CL), M, sms, BN.BLOCK_M) if cl else BN.splits(C, M, sms)
    dummy = torch.zeros(1)
    part = torch.empty(S, 3, C)
    if cl:
        BN._bn_stats_cl[(-(-C // BN.BLOCK_CL), S)](x, part, C, M, chunk, BLOCK_M=BN.BLOCK_M, BLOCK_CL=BN.BLOCK_CL)
    else:
        BN._bn_stats[(C, S)](x, part, C, HW, M, chunk, BLOCK=BN.BLOCK)
    mean, rstd, coef = torch.empty(C), torch.empty(C), torch.empty(2, C)
    rm_k = rm.clone() if has_run else dummy
    rv_k = rv.clone() if has_run else dummy
    BN._bn_finalize[(-(-C // BN.BLOCK_C),)](part, S, C, mean, rstd, coef, w if has_w else dummy,
                                            b if has_b else dummy, rm_k, rv_k, MOMENTUM, EPS, HAS_W=has_w,
                                            HAS_B=has_b, HAS_RUN=has_run, BLOCK_C=BN.BLOCK_C)
    y = torch.empty_like(x)
    BN._bn_apply[(-(-x.numel() // BN.BLOCK),)](x, y, mean, coef, C, HW, x.numel(), CL=cl, BLOCK=BN.BLOCK)
    bpart = torch.empty(S, 2, C)
    if cl:
        BN._bn_bwd_reduce_cl[(-(-C // BN.BLOCK_CL), S)](dy, x, mean, bpart, C, M, chunk, BLOCK_M=BN.BLOCK_M,
                                                        BLOCK_CL=BN.BLOCK_CL)
    else:
        BN._bn_bwd_reduce[(C, S)](dy, x, mean, bpart, C, HW, M, chunk, BLOCK=BN.BLOCK)
    gw, gb, bcoef = torch.empty(C), torch.empty(C), torch.empty(3, C)
    BN._bn_bwd_finalize[(-(-C // BN.BLOCK_C),)](bpart, S, C, float(M), rstd, w if has_w else dummy, bcoef, gw, gb,
                                                HAS_W=has_w, HAS_B=has_b, BLOCK_C=BN.BLOCK_C)
    dx = torch.empty_like(x)
    BN._bn_bwd_apply[(-(-x.numel() // BN.BLOCK),)](dy, x, mean, bcoef, dx, C, HW, x.numel(), CL=cl, BLOCK=BN.BLOCK)

    leaves = [t.double().requires_grad_() if t is not None else None for t in (x, w, b)]
    rm64 = rm.double() if has_run else None
    rv64 = rv.double() if has_run else None
    ref = torch.nn.functional.batch_norm(leaves[0], rm64, rv64, leaves[1], leaves[2], True, MOMENTUM, EPS)
    ref.backward(dy.double())
    x64 = x.double()
    dims = [0] + list(range(2, x.dim()))
    errs = [(y - ref.detach()).abs().max(), (dx - leaves[0].grad).abs().max(),
            (mean.double() - x64.mean(dims)).abs().max(),
            (rstd.double() - 1 / (x64.var(dims, unbiased=False) + EPS).sqrt()).abs().max()]
    if has_run:
        errs += [(rm_k - rm64).abs().max(), (rv_k - rv64).abs().max()]
    if has_w:
        errs.append((gw - leaves[1].grad).abs().max() / max(1.0, float(leaves[1].grad.abs().max())))
    if has_b:
        errs.append((gb - leaves[2].grad).abs().max() / max(1.0, float(leaves[2].grad.abs().max())))
    return max(float(e) for e in errs)


# channels of at most ONCHIP_MAX elements: one program per channel each way (shape, weight, bias, running)
ONCHIP_CASES = (((3, 4, 25, 40), True, True, True), ((64, 3), True, False, True), ((2, 5, 7), False, True, False),
                ((4, 2, 3, 3), True, True, True), ((2, 3, 1), True, True, True), ((2, 3, 64, 128), True, True, True))


def run_onchip(shape, has_w, has_b, has_run):
    g = torch.Generator().manual_seed(sum(shape) + 1)
    C = shape[1]
    x = torch.randn(shape, generator=g) * 3 + 5
    w = torch.randn(C, generator=g) if has_w else None
    b = torch.randn(C, generator=g) if has_b else None
    rm, rv = (torch.randn(C, generator=g), torch.rand(C, generator=g) + 0.5) if has_run else (None, None)
    dy = torch.randn(shape, generator=g)
    M = x.numel() // C
    HW = M // shape[0]
    block = BN.onchip_block(M)
    assert M <= BN.ONCHIP_MAX and block >= M
    dummy = torch.zeros(1)
    rm_k = rm.clone() if has_run else dummy
    rv_k = rv.clone() if has_run else dummy
    y, mean, rstd = torch.empty(shape), torch.empty(C), torch.empty(C)
    BN._bn_fwd_onchip[(C,)](x, y, mean, rstd, w if has_w else dummy, b if has_b else dummy, rm_k, rv_k, C, HW, M,
                            MOMENTUM, EPS, HAS_W=has_w, HAS_B=has_b, HAS_RUN=has_run, BLOCK_M=block)
    dx, gw, gb = torch.empty(shape), torch.empty(C), torch.empty(C)
    BN._bn_bwd_onchip[(C,)](dy, x, mean, rstd, w if has_w else dummy, dx, gw, gb, C, HW, M, HAS_W=has_w, HAS_B=has_b,
                            BLOCK_M=block)
    leaves = [t.double().requires_grad_() if t is not None else None for t in (x, w, b)]
    rm64 = rm.double() if has_run else None
    rv64 = rv.double() if has_run else None
    ref = torch.nn.functional.batch_norm(leaves[0], rm64, rv64, leaves[1], leaves[2], True, MOMENTUM, EPS)
    ref.backward(dy.double())
    dims = [0] + list(range(2, x.dim()))
    x64 = x.double()
    errs = [(y - ref.detach()).abs().max(), (dx - leaves[0].grad).abs().max(), (mean.double() - x64.mean(dims)).abs().max(),
            (rstd.double() - 1 / (x64.var(dims, unbiased=False) + EPS).sqrt()).abs().max()]
    if has_run:
        errs += [(rm_k - rm64).abs().max(), (rv_k - rv64).abs().max()]
    if has_w:
        errs.append((gw - leaves[1].grad).abs().max() / max(1.0, float(leaves[1].grad.abs().max())))
    if has_b:
        errs.append((gb - leaves[2].grad).abs().max() / max(1.0, float(leaves[2].grad.abs().max())))
    return max(float(e) for e in errs)


# through the wrappers `forward`/`backward` (NumPy standing in for CuPy): (shape, weight, bias, running,
# launches each way)
# (HostLauncher reports 8 multiprocessors: fewer channels take the split kernels)
WRAPPER_CASES = (((3, 8, 25, 40), True, True, True, 1), ((4, 3, 70, 70), True, True, True, 3),
                 ((2, 9, 7), False, False, False, 1), ((2, 2, 150, 60), False, True, False, 3),
                 ((3, 4, 5, 5), True, True, True, 3))


def run_wrappers(shape, has_w, has_b, has_run, launches):
    """`forward` and `backward` as `native_batch_norm` calls them on cuda; the launches each way must
    be `launches` (1: one program per channel; 3: the split kernels)."""
    import numpy as np
    g = torch.Generator().manual_seed(sum(shape) + 2)
    C = shape[1]
    x = torch.randn(shape, generator=g) * 3 + 5
    w = torch.randn(C, generator=g) if has_w else None
    b = torch.randn(C, generator=g) if has_b else None
    rm, rv = (torch.randn(C, generator=g), torch.rand(C, generator=g) + 0.5) if has_run else (None, None)
    dy = torch.randn(shape, generator=g)
    arr = [None if t is None else t.numpy().copy() for t in (x, w, b, rm, rv, dy)]
    before = len(HostLauncher.launches)
    y, mean, rstd = BN.forward(*arr[:5], MOMENTUM, EPS)
    dx, gw, gb = BN.backward(arr[5], arr[0], arr[1], arr[2], mean, rstd)
    ran = HostLauncher.launches[before:]
    leaves = [t.double().requires_grad_() if t is not None else None for t in (x, w, b)]
    ref = torch.nn.functional.batch_norm(leaves[0], None if rm is None else rm.double(),
                                         None if rv is None else rv.double(), leaves[1], leaves[2], True, MOMENTUM, EPS)
    ref.backward(dy.double())
    errs = [np.abs(y - ref.detach().numpy()).max(), np.abs(dx - leaves[0].grad.numpy()).max()]
    if has_run:
        ref_rm = (1 - MOMENTUM) * rm.double() + MOMENTUM * x.double().mean([0] + list(range(2, x.dim())))
        errs.append(np.abs(arr[3] - ref_rm.numpy()).max())
    for got, leaf in ((gw, leaves[1]), (gb, leaves[2])):
        if leaf is not None:
            errs.append(np.abs(got - leaf.grad.numpy()).max() / max(1.0, float(leaf.grad.abs().max())))
    return max(float(e) for e in errs) + (0.0 if len(ran) == 2 * launches else 1.0)


# channels-last through the wrappers: (shape, weight, bias, running); the split kernels, 3 launches each way
CL_WRAPPER_CASES = (((3, 8, 25, 40), True, True, True), ((2, 40, 9, 11), False, True, False))


def run_wrappers_cl(shape, has_w, has_b, has_run):
    """`forward`/`backward` of channels-last arrays: the channels-last kernels, outputs channels-last,
    no operand copied (`BN.copies`)."""
    import numpy as np
    g = torch.Generator().manual_seed(sum(shape) + 3)
    C = shape[1]
    x = (torch.randn(shape, generator=g) * 3 + 5).contiguous(memory_format=torch.channels_last)
    w = torch.randn(C, generator=g) if has_w else None
    b = torch.randn(C, generator=g) if has_b else None
    rm, rv = (torch.randn(C, generator=g), torch.rand(C, generator=g) + 0.5) if has_run else (None, None)
    dy = torch.randn(shape, generator=g).contiguous(memory_format=torch.channels_last)

    def cl(t):                                   # the NumPy array with t's channels-last strides
        return np.ascontiguousarray(t.permute(0, 2, 3, 1).numpy()).transpose(0, 3, 1, 2)
    arr = [None if t is None else t.numpy().copy() for t in (w, b, rm, rv)]
    xa, dya = cl(x), cl(dy)
    copies, before = dict(BN.copies), len(HostLauncher.launches)
    y, mean, rstd = BN.forward(xa, *arr, MOMENTUM, EPS)
    dx, gw, gb = BN.backward(dya, xa, arr[0], arr[1], mean, rstd)
    bad = (len(HostLauncher.launches) - before != 6) + (BN.copies != copies) + \
        (y.strides != xa.strides) + (dx.strides != xa.strides)
    leaves = [t.double().requires_grad_() if t is not None else None for t in (x, w, b)]
    ref = torch.nn.functional.batch_norm(leaves[0], None if rm is None else rm.double(),
                                         None if rv is None else rv.double(), leaves[1], leaves[2], True, MOMENTUM, EPS)
    ref.backward(dy.double())
    errs = [np.abs(y - ref.detach().numpy()).max(), np.abs(dx - leaves[0].grad.numpy()).max()]
    for got, leaf in ((gw, leaves[1]), (gb, leaves[2])):
        if leaf is not None:
            errs.append(np.abs(got - leaf.grad.numpy()).max() / max(1.0, float(leaf.grad.abs().max())))
    return max(float(e) for e in errs) + bad


def main() -> int:
    status = report(CASES, run, "shape, weight, bias, running, sms, channels-last", 1e-4) | \
        report(ONCHIP_CASES, run_onchip, "one program per channel: shape, weight, bias, running", 1e-4)
    BN.TL, BN.cupy = HostLauncher, HostCupy
    status |= report(WRAPPER_CASES, run_wrappers, "wrappers: shape, weight, bias, running, launches", 1e-4)
    return status | report(CL_WRAPPER_CASES, run_wrappers_cl, "channels-last wrappers: shape, weight, bias, running",
                           1e-4)


if __name__ == "__main__":
    sys.exit(main())
