"""Run flambeau's Triton cross-entropy kernels (flambeau/_backends/triton_cross_entropy.py) under
Triton's interpreter (TRITON_INTERPRET=1, set by the caller) on float32 CPU tensors and compare the
per-row losses and the input gradient with float64 PyTorch. Exits non-zero on a mismatch. Used by
tests/test_norm_fused.py."""
import sys

import torch
import interp_numpy2  # noqa: F401  (before any kernel runs)
from interp_numpy2 import report

from flambeau._backends import triton_cross_entropy as X


CASES = ((6, 37, 16), (5, 300, 64), (4, 9, 8))     # rows, classes, block (classes end mid-block)
IGNORE = -100


def run(rows, classes, block):
    g = torch.Generator().manual_seed(classes)
    x = torch.randn(rows, classes, generator=g) * 3
    x[0, :] -= 60                                    # a row of large negative logits
    t = torch.randint(0, classes, (rows,), generator=g)
    t[1] = IGNORE
    gr = torch.randn(rows, generator=g)
    loss, dx = torch.empty(rows), torch.empty(rows, classes)
    X._ce_fwd[(rows,)](x, t, loss, classes, IGNORE, BLOCK_C=block)
    X._ce_bwd[(rows,)](x, t, gr, dx, classes, IGNORE, 1, BLOCK_C=block)
    xd = x.double().requires_grad_()
    ref = torch.nn.functional.cross_entropy(xd, t, reduction="none", ignore_index=IGNORE)
    ref.backward(gr.double())
    return max(float((loss - ref.detach()).abs().max()), float((dx - xd.grad).abs().max()))


def main() -> int:
    return report(CASES, run, "rows, classes, block", 1e-4)


if __name__ == "__main__":
    sys.exit(main())
