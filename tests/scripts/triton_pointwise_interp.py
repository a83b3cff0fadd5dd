"""Run flambeau's Triton GELU/SiLU/ReLU kernels (flambeau/_backends/triton_pointwise.py) under Triton's
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
    if kind == P.RELU:
        return torch.nn.functional.relu(x)
    return torch.nn.functional.silu(x)


def run(kind):
    g = torch.Generator().manual_seed(kind)
    x = torch.randn(N, generator=g) * 4
    x[:5] = torch.tensor([-30.0, 30.0, 0.0, -1e-3, 1e-3])
    dy = torch.randn(N, generator=g)
    y, dx = torch.empty(N), torch.empty(N)
    grid = (-(-N // P.BLOCK),)
    P._act_fwd[grid](x, y, N, KIND=kind, BLOCK=P.BLOCK)
    P._act_bwd[grid](dy, x, dx, N, KIND=kind, BLOCK=P.BLOCK)
    xd = x.double().requires_grad_()
    ref = reference(kind, xd)
    ref.backward(dy.double())
    return max(float((y - ref.detach()).abs().max()), float((dx - xd.grad).abs().max()))


REFERENCE_BINARY = {"add": torch.add, "sub": torch.sub, "mul": torch.mul, "div": torch.div}


def run_binary(op, a_scalar, b_scalar, b_dtype=torch.float32):
    """`_binary` of two arrays or an array and a number (b in `b_dtype`: a float32 array with a
    bfloat16 one), relative error vs float64."""
    g = torch.Generator().manual_seed(P.BINARY_OPS[op])
    a, b = torch.randn(N, generator=g), (torch.randn(N, generator=g) + 3).to(b_dtype)
    sa, sb = 1.75, -2.5
    y = torch.empty(N)
    dummy = torch.zeros(1)
    P._binary[(-(-N // P.BLOCK),)](dummy if a_scalar else a, dummy if b_scalar else b, y, sa, sb, N,
                                   OP=P.BINARY_OPS[op], A_SCALAR=a_scalar, B_SCALAR=b_scalar, BLOCK=P.BLOCK)
    ref = REFERENCE_BINARY[op](sa if a_scalar else a.double(), sb if b_scalar else b.double())
    return float(((y - ref).abs() / ref.abs().clamp_min(1)).max())


def main() -> int:
    bad = report([(k,) for k in (P.GELU_ERF, P.GELU_TANH, P.SILU, P.RELU)], run, "kind", 1e-5)
    cases = [(op, sa, sb) for op in P.BINARY_OPS for sa, sb in ((False, False), (True, False), (False, True))]
    cases += [(op, False, False, torch.bfloat16) for op in P.BINARY_OPS]
    return bad | report(cases, run_binary, "binary op, a scalar, b scalar(, b dtype)", 1e-6)


if __name__ == "__main__":
    sys.exit(main())
