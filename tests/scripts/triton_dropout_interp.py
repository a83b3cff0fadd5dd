"""Run flambeau's Triton dropout kernels (flambeau/_backends/triton_pointwise.py `_dropout_fwd` /
`_dropout_bwd`) under Triton's interpreter (TRITON_INTERPRET=1, set by the caller) on CPU tensors and
check them against what dropout must give: the output is x / (1 - p) where the mask keeps and 0
elsewhere (float32 products as PyTorch computes them, rounded once to the storage dtype; bfloat16 within
one unit in the last place: the interpreter's conversion truncates where the GPU rounds), the kept
fraction is 1 - p within 5 standard deviations overall and per block of the grid, one seed gives one
mask, two seeds give different masks, and the backward is grad * mask / (1 - p). Prints one line per
case, exits non-zero on a failure. Used by tests/test_dropout_cuda.py."""
import math
import sys

import torch
from interp_numpy2 import report

from flambeau._backends import triton_pointwise as P

N = 5000            # not a multiple of the block: the last program is masked


def forward(x, p, seed):
    y, mask = torch.empty_like(x), torch.empty(x.shape, dtype=torch.bool)
    P._dropout_fwd[(-(-N // P.BLOCK),)](x, y, mask, N, 1.0 - p, 1.0 / (1.0 - p), seed, BLOCK=P.BLOCK)
    return y, mask


def run(dtype, p):
    """Largest violation (0 when every property holds)."""
    g = torch.Generator().manual_seed(int(p * 100))
    x = (torch.randn(N, generator=g) * 3).to(dtype)
    y, mask = forward(x, p, 1234)
    scale = torch.tensor(1.0 / (1.0 - p), dtype=torch.float32)
    want = torch.where(mask, x.float() * scale, torch.zeros(())).to(dtype)
    ulp = 2.0 ** -7 if dtype == torch.bfloat16 else 0.0       # the interpreter's bf16 conversion truncates
    err = float(((y.float() - want.float()).abs() - want.float().abs() * ulp).clamp_min(0).max())
    kept, q = float(mask.float().mean()), 1.0 - p
    sd = math.sqrt(p * q / N)
    err += max(0.0, abs(kept - q) - 5 * sd)
    for b in range(0, N - P.BLOCK, P.BLOCK):            # every full block draws from its own offsets
        frac = float(mask[b:b + P.BLOCK].float().mean())
        err += max(0.0, abs(frac - q) - 5 * math.sqrt(p * q / P.BLOCK))
    y2, mask2 = forward(x, p, 1234)
    err += float((mask2 != mask).sum()) + float((y2.float() - y.float()).abs().max())
    _, mask3 = forward(x, p, 99)
    err += 1.0 if bool((mask3 == mask).all()) else 0.0        # another seed, another mask
    grad = torch.randn(N, generator=g).to(dtype)
    dx = torch.empty_like(grad)
    P._dropout_bwd[(-(-N // P.BLOCK),)](grad, mask, dx, N, 1.0 / (1.0 - p), BLOCK=P.BLOCK)
    want = torch.where(mask, grad.float() * scale, torch.zeros(())).to(dtype).float()
    err += float(((dx.float() - want).abs() - want.abs() * ulp).clamp_min(0).max())
    return err


def main() -> int:
    return report([(d, p) for d in (torch.float32, torch.bfloat16, torch.float16) for p in (0.1, 0.5, 0.9)],
                  run, "dtype, p", 1e-12)


if __name__ == "__main__":
    sys.exit(main())
