"""Run flambeau's Triton column sum (flambeau/_backends/triton_sum.py) under Triton's interpreter
(TRITON_INTERPRET=1, set by the caller) on float32 CPU tensors and compare with float64 PyTorch.
Prints one line per case and exits non-zero on a mismatch. Used by tests/test_batch_norm_cuda.py."""
import sys

import torch
import interp_numpy2  # noqa: F401  (before any kernel runs)
from interp_numpy2 import report

from flambeau._backends import triton_sum as T

# (rows, columns, multiprocessors): the multiprocessor count sets the split of the rows into chunks
CASES = ((100, 7, 1), (1000, 300, 2), (64, 128, 64), (333, 129, 4))


def run(M, N, sms):
    g = torch.Generator().manual_seed(M + N)
    x = torch.randn(M, N, generator=g) + 2
    S, rows_per = T.splits(M, N, sms)
    part, y = torch.empty(S, N), torch.empty(N)
    T._colsum_partial[(-(-N // T.BLOCK_N), S)](x, part, M, N, rows_per, BLOCK_M=T.BLOCK_M, BLOCK_N=T.BLOCK_N)
    T._colsum_final[(-(-N // T.BLOCK_N),)](part, y, S, N, BLOCK_N=T.BLOCK_N)
    ref = x.double().sum(0)
    return float(((y - ref).abs() / ref.abs().clamp_min(1)).max())


def main() -> int:
    return report(CASES, run, "rows, columns, sms", 1e-6)


if __name__ == "__main__":
    sys.exit(main())
