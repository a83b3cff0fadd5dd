"""Run flambeau's Triton cross-entropy kernels (flambeau/_backends/triton_cross_entropy.py) under Triton's
interpreter (TRITON_INTERPRET=1, set by the caller) and compare them with float64 PyTorch:

- the row kernels on float32 CPU tensors: per-row losses and the input gradient (classes ending mid-block, a
  row of large negative logits, an ignored row);
- the wrappers `forward`/`backward` on NumPy arrays (HostCupy, HostLauncher stand in for CuPy and the
  launcher): reductions none/mean/sum in float32/bfloat16/float16, ignored targets, every target ignored
  (mean: NaN, sum: 0, gradient 0, as PyTorch), a strided and a stride-0 (expanded) incoming gradient for
  'none' (the strided case with a column-major input), a bfloat16 incoming gradient; the kernels each launches
  (mean: the row kernel and one reduction program forward, one scaling program and the row kernel backward;
  none of CuPy's reductions);
- the forward's bounds check: a target outside [0, C) (not ignore_index) recorded with the check's code in the
  error buffer `device_checks.error_slot` gives (stubbed), the other rows' losses right;
- flambeau's F.cross_entropy forward and backward with the cuda dispatch taken through them, and weighted /
  label-smoothed calls, which must not take them (the NumPy path, as before).

Prints one line per case (its error, or number of mismatching checks) and exits non-zero on a mismatch. Used
by tests/test_norm_fused.py."""
import sys

import ml_dtypes
import numpy as np
import torch
import interp_numpy2  # noqa: F401  (before any kernel runs)
from interp_numpy2 import HostCupy, HostLauncher, report

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
    err = torch.zeros(2, dtype=torch.uint64)
    X._ce_fwd[(rows,)](x, t, loss, err, classes, IGNORE, 5, BLOCK_C=block)
    if err.tolist() != [0, 0]:
        return float("inf")
    X._ce_bwd[(rows,)](x, t, gr, dx, classes, IGNORE, 1, BLOCK_C=block)
    xd = x.double().requires_grad_()
    ref = torch.nn.functional.cross_entropy(xd, t, reduction="none", ignore_index=IGNORE)
    ref.backward(gr.double())
    return max(float((loss - ref.detach()).abs().max()), float((dx - xd.grad).abs().max()))


NP = {"float32": np.dtype(np.float32), "bfloat16": np.dtype(ml_dtypes.bfloat16), "float16": np.dtype(np.float16)}
RED = {"none": X.NONE, "mean": X.MEAN, "sum": X.SUM}
LAUNCHES = {"none": (["_ce_fwd"], ["_ce_bwd"]), "mean": (["_ce_fwd", "_ce_reduce"], ["_ce_scale", "_ce_bwd"]),
            "sum": (["_ce_fwd", "_ce_reduce"], ["_ce_bwd"])}
# (rows, classes, dtype, reduction, ignored rows ("all": every one), incoming gradient: "contiguous", "strided",
#  "expanded" (stride 0, 'none' only) or "bf16")
WRAPPER_CASES = (
    (64, 256, "float32", "mean", (3, 17), "contiguous"),          # the MLP bench's loss, two targets ignored
    (64, 256, "float32", "sum", (), "contiguous"),
    (64, 256, "float32", "none", (5,), "strided"),
    (7, 3000, "float32", "mean", (0, 6), "contiguous"),           # classes over one block (2048)
    (1100, 5, "float32", "mean", (1, 1099), "contiguous"),        # rows over one reduction step (1024)
    (1100, 5, "float32", "sum", (2,), "bf16"),
    (9, 33, "bfloat16", "mean", (4,), "contiguous"),
    (9, 33, "float16", "none", (), "expanded"),
    (9, 33, "bfloat16", "sum", (), "contiguous"),
    (6, 11, "float32", "mean", "all", "contiguous"),              # every target ignored: NaN, gradient 0
    (6, 11, "float32", "sum", "all", "contiguous"),
)
TOL = {"float32": 2e-5, "bfloat16": 2e-2, "float16": 2e-3}


class Checks:
    """`device_checks.error_slot` on the host: one uint64[2] buffer per call, kept in `made`."""
    made: list = []

    @classmethod
    def error_slot(cls, xp, dev, exc, message):
        assert (exc, message) == (IndexError, "Target {} is out of bounds.")
        cls.made.append(np.zeros(2, np.uint64))
        return cls.made[-1], 9


# (rows, classes, reduction, targets): the error buffer holds (code, first bad value) or stays (0, 0)
BOUNDS_CASES = ((5, 7, "mean", (1, 7, 3, -100, 0)), (5, 7, "none", (-100, -3, 3, 6, 0)),
                (4, 7, "sum", (-100, 0, 2, 6)), (3, 7, "mean", (-100, 2, 1)), (4, 7, "none", (6, 7, -1, 8)))


def run_bounds(rows, classes, reduction, targets):
    """The forward row kernel records a target outside [0, C) other than ignore_index (the first such
    value, with the check's code) and computes the good rows' losses; the number of mismatching checks."""
    x = np.random.default_rng(rows).standard_normal((rows, classes)).astype(np.float32)
    t = np.array(targets, np.int64)
    out = X.forward(x, t, IGNORE, RED[reduction])
    bad_t = [v for v in targets if v != IGNORE and not 0 <= v < classes]
    want = [9, int(np.array(bad_t[0]).astype(np.uint64))] if bad_t else [0, 0]
    bad = int(Checks.made[-1].tolist() != want)
    if reduction == "none":
        ok = np.array([v == IGNORE or 0 <= v < classes for v in targets])
        ref = torch.nn.functional.cross_entropy(torch.tensor(x[ok]), torch.tensor(t[ok]), reduction="none",
                                                ignore_index=IGNORE)
        bad += int(not np.allclose(out[ok], ref.numpy(), rtol=1e-5, atol=1e-6))
    return float(bad)


def run_wrapper(rows, classes, dtype, reduction, ignored, grad_kind):
    """forward and backward of the wrappers against float64 PyTorch; the number of mismatching checks."""
    rng = np.random.default_rng(rows * 7 + classes)
    x64 = rng.standard_normal((rows, classes)) * 3
    x = x64.astype(NP[dtype])
    t = rng.integers(0, classes, rows)
    t[list(range(rows)) if ignored == "all" else list(ignored)] = IGNORE
    xd = torch.tensor(x.astype(np.float64), requires_grad=True)
    ref = torch.nn.functional.cross_entropy(xd, torch.tensor(t), reduction=reduction, ignore_index=IGNORE)
    if reduction == "none":
        g64 = rng.standard_normal(rows)
        if grad_kind == "strided":
            g = rng.standard_normal(2 * rows).astype(np.float32)[::2]
            g64 = g.astype(np.float64)
        elif grad_kind == "expanded":
            g = np.broadcast_to(np.float16(1.25), (rows,))
            g64 = np.full(rows, 1.25)
        else:
            g = g64.astype(NP[dtype])
            g64 = g.astype(np.float64)
    else:
        g = np.array(1.5, NP["bfloat16"] if grad_kind == "bf16" else NP[dtype])
        g64 = np.float64(g.astype(np.float32))
    ref.backward(torch.tensor(g64))
    if grad_kind == "strided":
        x = np.asfortranarray(x)                    # a column-major input: copied to rows first
    before = len(HostLauncher.launches)
    out = X.forward(x, t, IGNORE, RED[reduction])
    mid = len(HostLauncher.launches)
    dx = X.backward(g, x, t, IGNORE, RED[reduction])
    fwd, bwd = HostLauncher.launches[before:mid], HostLauncher.launches[mid:]
    bad = int((fwd, bwd) != LAUNCHES[reduction])
    bad += int(out.dtype != x.dtype or out.shape != tuple(ref.shape) or dx.dtype != x.dtype or dx.shape != x.shape)
    want, got = ref.detach().numpy(), out.astype(np.float64)
    if ignored == "all" and reduction == "mean":
        bad += int(not np.isnan(got).all() or not np.isnan(want).all())
    else:
        bad += int(not np.allclose(got, want, rtol=TOL[dtype], atol=TOL[dtype]))
    gw = xd.grad.numpy()
    bad += int(not np.allclose(dx.astype(np.float64), gw, rtol=TOL[dtype], atol=TOL[dtype] * max(1.0, abs(gw).max())))
    if ignored == "all":
        bad += int(np.any(dx.astype(np.float64) != 0))
    return float(bad)


# ---- through flambeau's ops: the cuda dispatch with the host stand-ins ------------------------------
# (reduction, ignored rows, weight, label_smoothing): the last two must not take the kernels
GLUE_CASES = (("mean", (2,), False, 0.0), ("sum", (), False, 0.0), ("none", (0, 3), False, 0.0),
              ("mean", "all", False, 0.0), ("mean", (2,), True, 0.0), ("mean", (1,), False, 0.1))


def run_glue(reduction, ignored, weighted, smoothing):
    import flambeau
    rng = np.random.default_rng(len(str(ignored)) + int(weighted))
    x = (rng.standard_normal((8, 13)) * 2).astype(np.float32)
    t = rng.integers(0, 13, 8)
    t[list(range(8)) if ignored == "all" else list(ignored)] = IGNORE
    w = rng.random(13).astype(np.float32) + 0.5 if weighted else None
    g = rng.standard_normal(8).astype(np.float32) if reduction == "none" else np.float32(0.75)
    res = []
    before = len(HostLauncher.launches)
    for lib in (torch, flambeau):
        xl = lib.tensor(x, requires_grad=True)
        loss = lib.nn.functional.cross_entropy(xl, lib.tensor(t), weight=None if w is None else lib.tensor(w),
                                               ignore_index=IGNORE, reduction=reduction, label_smoothing=smoothing)
        loss.backward(lib.tensor(g))
        res.append((loss.detach().numpy(), xl.grad.numpy()))
    took = HostLauncher.launches[before:]
    fused = not weighted and not smoothing
    want = LAUNCHES[reduction][0] + LAUNCHES[reduction][1] if fused else []
    bad = int(took != want)
    for f, r in zip(res[1], res[0]):
        bad += int(f.shape != r.shape or f.dtype != r.dtype)
        bad += int(not np.allclose(f, r, rtol=1e-5, atol=1e-6, equal_nan=True))
    return float(bad)


def main() -> int:
    status = report(CASES, run, "rows, classes, block", 1e-4)
    X.TL, X.cupy, X.device_checks = HostLauncher, HostCupy, Checks
    status |= report(WRAPPER_CASES, run_wrapper, "wrappers: rows, classes, dtype, reduction, ignored, grad", 0.5)
    status |= report(BOUNDS_CASES, run_bounds, "target bounds: rows, classes, reduction, targets", 0.5)
    from flambeau._ops import loss
    loss._cuda_ce = lambda xp, x, t, w, ls: X if X.supported(x, t, w, ls) else None
    return status | report(GLUE_CASES, run_glue, "through flambeau: reduction, ignored, weight, smoothing", 0.5)


if __name__ == "__main__":
    sys.exit(main())
