"""Bandwidth of one generated-style pointwise kernel (BatchNorm apply + ReLU over a channels-last bf16
activation, 64x56x56x64) in the block forms a Triton code generator can print: [XBLOCK, 1] (a 2-d block
with a unit column, as flambeau's rows/flat kernels) vs [XBLOCK] (1-d), at a few XBLOCK / num_warps.
PyTorch only allocates and times (CUDA events). `python3 bench/triton_pointwise_forms.py`

Session 14, one H100: both forms stream at 1.7-2.2 TB/s (2-d XBLOCK 1024, 8 warps: 26.1 us; 1-d: 23.6 us), so
the 2-d block is not why a generated pointwise kernel would be slow."""
import torch
import triton
import triton.language as tl


@triton.jit
def kernel(X, M, R, W, B, Y, n, C: tl.constexpr, XBLOCK: tl.constexpr, TWO_D: tl.constexpr):
    if TWO_D:
        xindex = tl.program_id(0) * XBLOCK + tl.arange(0, XBLOCK)[:, None]
    else:
        xindex = tl.program_id(0) * XBLOCK + tl.arange(0, XBLOCK)
    xmask = xindex < n
    x0 = xindex // C
    x1 = xindex % C
    t = tl.load(X + (x1 + C * x0), mask=xmask, other=0).to(tl.float32)
    t = (t - tl.load(M + x1, mask=xmask, other=0)) * tl.load(R + x1, mask=xmask, other=0)
    t = t * tl.load(W + x1, mask=xmask, other=0) + tl.load(B + x1, mask=xmask, other=0)
    t = tl.where(t < 0, 0.0, t)
    tl.store(Y + (C * x0 + x1), t.to(tl.bfloat16), mask=xmask)


def main():
    C = 64
    n = 64 * 56 * 56 * C
    x = torch.randn(n, device="cuda").bfloat16()
    y = torch.empty_like(x)
    m, r, w, b = (torch.randn(C, device="cuda") for _ in range(4))
    ref = torch.relu((x.float().view(-1, C) - m) * r * w + b).bfloat16().view(-1)
    for name, two_d in (("2d [XBLOCK,1]", True), ("1d [XBLOCK]", False)):
        for xb, warps in ((1024, 4), (1024, 8), (2048, 8), (4096, 8)):
            grid = (triton.cdiv(n, xb),)
            kernel[grid](x, m, r, w, b, y, n, C=C, XBLOCK=xb, TWO_D=two_d, num_warps=warps)
            torch.cuda.synchronize()
            ok = torch.equal(y, ref) or (y.float() - ref.float()).abs().max().item() < 0.05
            s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            s.record()
            for _ in range(20):
                kernel[grid](x, m, r, w, b, y, n, C=C, XBLOCK=xb, TWO_D=two_d, num_warps=warps)
            e.record()
            e.synchronize()
            ms = s.elapsed_time(e) / 20
            print(f"{name:14s} XBLOCK {xb:5d} warps {warps}: {ms * 1e3:7.1f} us  {4 * n / ms / 1e6:7.0f} GB/s  ok={ok}")
    s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    s.record()
    for _ in range(20):
        torch.relu((x.view(-1, C) * r + b))
    e.record()
    e.synchronize()
    print(f"torch eager x*r+b, relu: {s.elapsed_time(e) / 20 * 1e3:.1f} us (3 kernels)")


if __name__ == "__main__":
    main()
