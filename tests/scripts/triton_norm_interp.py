"""Run flambeau's Triton LayerNorm kernels (flambeau/_backends/triton_norm.py) under Triton's
interpreter (TRITON_INTERPRET=1, set by the caller) on float32 CPU tensors and compare forward and
backward with float64 PyTorch. Prints one line per case and exits non-zero on a mismatch. Used by
tests/test_norm_fused.py."""
import sys

import torch
import interp_numpy2  # noqa: F401  (before any kernel runs)
from interp_numpy2 import report

from flambeau._backends import triton_norm as N


CASES = ((5, 7, True, True), (9, 32, True, False), (4, 33, False, False), (13, 20, True, True))
PROGRAMS = 3        # backward programs: rows split unevenly among them


def run(rows, cols, has_w, has_b, eps=1e-5):
    g = torch.Generator().manual_seed(rows * 100 + cols)
    x = torch.randn(rows, cols, generator=g) * 3 + 1
    w = torch.randn(cols, generator=g) if has_w else None
    b = torch.randn(cols, generator=g) if has_b else None
    dy = torch.randn(rows, cols, generator=g)
    y, mean, rstd = torch.empty(rows, cols), torch.empty(rows), torch.empty(rows)
    dummy = torch.zeros(1)
    block = N.block_cols(cols)
    N._ln_fwd[(rows,)](x, w if has_w else dummy, b if has_b else dummy, y, mean, rstd, cols, eps, HAS_W=has_w,
                       HAS_B=has_b, BLOCK_N=block)
    per = -(-rows // PROGRAMS)
    programs = -(-rows // per)
    dx, part = torch.empty(rows, cols), torch.empty(programs, 2, cols)
    N._ln_bwd[(programs,)](dy, x, w if has_w else dummy, mean, rstd, dx, part, rows, cols, per, HAS_W=has_w,
                           BLOCK_N=block)
    leaves = [t.double().requires_grad_() if t is not None else None for t in (x, w, b)]
    ref = torch.nn.functional.layer_norm(leaves[0], (cols,), leaves[1], leaves[2], eps)
    ref.backward(dy.double())
    part = part.sum(0)
    errs = [(y - ref.detach()).abs().max(), (mean.double() - leaves[0].detach().mean(-1)).abs().max(),
            (dx - leaves[0].grad).abs().max()]
    if has_w:
        errs.append((part[0] - leaves[1].grad).abs().max())
    if has_b:
        errs.append((part[1] - leaves[2].grad).abs().max())
    return max(float(e) for e in errs)


def main() -> int:
    return report(CASES, run, "rows, cols, weight, bias", 1e-4)


if __name__ == "__main__":
    sys.exit(main())
