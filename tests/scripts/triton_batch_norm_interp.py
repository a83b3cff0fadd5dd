"""Run flambeau's Triton BatchNorm kernels (flambeau/_backends/triton_batch_norm.py) under Triton's
interpreter (TRITON_INTERPRET=1, set by the caller) on float32 CPU tensors and compare the output,
running statistics and the three gradients with float64 PyTorch (training mode). Prints one line
per case and exits non-zero on a mismatch. Used by tests/test_batch_norm_cuda.py."""
import sys

import torch
import interp_numpy2  # noqa: F401  (before any kernel runs)
from interp_numpy2 import report

from flambeau._backends import triton_batch_norm as BN

# (shape, weight, bias, running stats, multiprocessors): the multiprocessor count sets the split of
# each channel into chunks (S > 1 exercises the merge of partial statistics)
CASES = (((3, 4, 25, 40), True, True, True, 2), ((5000, 3), True, False, True, 1), ((2, 5, 7), False, True, False, 8),
         ((4, 2, 3, 3), True, True, True, 64))
MOMENTUM, EPS = 0.1, 1e-5


def run(shape, has_w, has_b, has_run, sms):
    g = torch.Generator().manual_seed(sum(shape))
    C = shape[1]
    x = torch.randn(shape, generator=g) * 3 + 5       # an offset mean: no cancellation in the variance
    w = torch.randn(C, generator=g) if has_w else None
    b = torch.randn(C, generator=g) if has_b else None
    rm, rv = (torch.randn(C, generator=g), torch.rand(C, generator=g) + 0.5) if has_run else (None, None)
    dy = torch.randn(shape, generator=g)
    M = x.numel() // C
    HW = M // shape[0]
    S, chunk = BN.splits(C, M, sms)
    dummy = torch.zeros(1)
    part = torch.empty(S, 3, C)
    BN._bn_stats[(C, S)](x, part, C, HW, M, chunk, BLOCK=BN.BLOCK)
    mean, rstd, coef = torch.empty(C), torch.empty(C), torch.empty(2, C)
    rm_k = rm.clone() if has_run else dummy
    rv_k = rv.clone() if has_run else dummy
    BN._bn_finalize[(-(-C // BN.BLOCK_C),)](part, S, C, mean, rstd, coef, w if has_w else dummy,
                                            b if has_b else dummy, rm_k, rv_k, MOMENTUM, EPS, HAS_W=has_w,
                                            HAS_B=has_b, HAS_RUN=has_run, BLOCK_C=BN.BLOCK_C)
    y = torch.empty(shape)
    BN._bn_apply[(-(-x.numel() // BN.BLOCK),)](x, y, mean, coef, C, HW, x.numel(), BLOCK=BN.BLOCK)
    bpart = torch.empty(S, 2, C)
    BN._bn_bwd_reduce[(C, S)](dy, x, mean, bpart, C, HW, M, chunk, BLOCK=BN.BLOCK)
    gw, gb, bcoef = torch.empty(C), torch.empty(C), torch.empty(3, C)
    BN._bn_bwd_finalize[(-(-C // BN.BLOCK_C),)](bpart, S, C, float(M), rstd, w if has_w else dummy, bcoef, gw, gb,
                                                HAS_W=has_w, HAS_B=has_b, BLOCK_C=BN.BLOCK_C)
    dx = torch.empty(shape)
    BN._bn_bwd_apply[(-(-x.numel() // BN.BLOCK),)](dy, x, mean, bcoef, dx, C, HW, x.numel(), BLOCK=BN.BLOCK)

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


def main() -> int:
    return report(CASES, run, "shape, weight, bias, running, sms", 1e-4)


if __name__ == "__main__":
    sys.exit(main())
