"""Run flambeau's Triton GELU/SiLU kernels (flambeau/_backends/triton_pointwise.py) under Triton's
interpreter (TRITON_INTERPRET=1, set by the caller) on float32 CPU tensors and compare forward and
backward with float64 PyTorch. Prints one line per case and exits non-zero on a mismatch. Used by
tests/test_norm_fused.py."""
import sys

import torch
from interp_numpy2 import report

from flambeau._backends import triton_pointwise as P

N = 3000            # not a multiple of the block: the last program is masked


def reference(kind, x):
    if kind == P.GELU_ERF:
        return torch.nn.functional.gelu(x)
    if kind == P.GELU_TANH:
        return torch.nn.functional.gelu(x, approximate="tanh")
    return torch.nn.functional.silu(x)


def run(kind):
    g = torch.Generator().manual_seed(kind)
    x = torch.randn(N, generator=g) * 4
    x[:4] = torch.tensor([-30.0, 30.0, 0.0, -1e-3])
    dy = torch.randn(N, generator=g)
    y, dx = torch.empty(N), torch.empty(N)
    grid = (-(-N // P.BLOCK),)
    P._act_fwd[grid](x, y, N, KIND=kind, BLOCK=P.BLOCK)
    P._act_bwd[grid](dy, x, dx, N, KIND=kind, BLOCK=P.BLOCK)
    xd = x.double().requires_grad_()
    ref = reference(kind, xd)
    ref.backward(dy.double())
    return max(float((y - ref.detach()).abs().max()), float((dx - xd.grad).abs().max()))


def main() -> int:
    return report([(k,) for k in (P.GELU_ERF, P.GELU_TANH, P.SILU)], run, "kind", 1e-5)


if __name__ == "__main__":
    sys.exit(main())
