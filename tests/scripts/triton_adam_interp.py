"""Run flambeau's fused Adam kernel (flambeau/_backends/triton_adam.py) under Triton's interpreter
(TRITON_INTERPRET=1, set by the caller) on float32 CPU tensors of uneven sizes, several steps, and
compare with the update computed in float64 NumPy (the gradients found through their own address row). Prints one line per case and exits non-zero on a
mismatch. Used by tests/test_optim_fused.py."""
import itertools
import sys

import numpy as np
import torch
import interp_numpy2  # noqa: F401  (before any kernel runs)

from flambeau._backends import triton_adam as A


CHUNK, BLOCK = 64, 16           # small, so that tensors span several chunks and end mid-block
SIZES = (1, 15, 64, 100, 129, 300)
STEPS = 3


def reference(p, g, m, v, vmax, lr, b1, b2, eps, wd, t, amsgrad, maximize, decoupled):
    g = -g if maximize else g
    if decoupled:
        p = p - lr * wd * p
    else:
        g = g + wd * p
    m = b1 * m + (1 - b1) * g
    v = b2 * v + (1 - b2) * g * g
    vmax = np.maximum(vmax, v)
    denom = np.sqrt(vmax if amsgrad else v) / np.sqrt(1 - b2 ** t) + eps
    return p - lr / (1 - b1 ** t) * m / denom, m, v, vmax


def run(amsgrad, maximize, decoupled, lr_on_device, seed=0):
    rng = np.random.default_rng(seed)
    lr, b1, b2, eps, wd = 0.05, 0.8, 0.9, 1e-3, 0.3
    ps = [torch.tensor(rng.standard_normal(n), dtype=torch.float32) for n in SIZES]
    ms, vs, vx = ([torch.zeros(n) for n in SIZES] for _ in range(3))
    ref = [[p.double().numpy(), np.zeros(n), np.zeros(n), np.zeros(n)] for p, n in zip(ps, SIZES)]
    lr_t = torch.tensor([lr], dtype=torch.float32)
    for t in range(1, STEPS + 1):
        gs = [torch.tensor(rng.standard_normal(n), dtype=torch.float32) for n in SIZES]
        addresses = [[a.data_ptr() for a in arrays] for arrays in (ps, ms, vs, vx)]
        grads = torch.tensor([g.data_ptr() for g in gs], dtype=torch.int64)
        tab = torch.from_numpy(A.table(addresses, list(SIZES), CHUNK))
        n_chunks = A.chunk_count(tab.numpy(), len(SIZES))
        o = A.table_offsets(len(SIZES), n_chunks)
        views = [tab[o[i]:(o[i + 1] if i < 3 else None)] for i in range(4)]
        A._adam_chunks[(n_chunks,)](views[0], grads, *views[1:], lr_t, 0.0 if lr_on_device else lr, b1, b2, eps, wd, 1 - b1 ** t,
                                    (1 - b2 ** t) ** 0.5, len(SIZES), CHUNK=CHUNK, BLOCK=BLOCK, AMSGRAD=amsgrad,
                                    MAXIMIZE=maximize, DECOUPLED=decoupled, LR_ON_DEVICE=lr_on_device, ALIGNED=True)
        for r, g in zip(ref, gs):
            r[:] = reference(r[0], g.double().numpy(), *r[1:], lr, b1, b2, eps, wd, t, amsgrad, maximize, decoupled)
    worst = max(float(np.max(np.abs(p.double().numpy() - r[0]) / (1e-6 + np.abs(r[0])))) for p, r in zip(ps, ref))
    worst_m = max(float(np.max(np.abs(m.double().numpy() - r[1]))) for m, r in zip(ms, ref))
    return worst, worst_m


def main() -> int:
    bad = 0
    for amsgrad, maximize, decoupled in itertools.product((False, True), repeat=3):
        lr_dev = amsgrad != maximize        # the learning rate read from memory in half the cases
        worst, worst_m = run(amsgrad, maximize, decoupled, lr_dev)
        ok = worst < 1e-4 and worst_m < 1e-5
        bad += not ok
        print(f"amsgrad={amsgrad} maximize={maximize} decoupled={decoupled} lr_on_device={lr_dev}: "
              f"param rel err {worst:.2e}, exp_avg abs err {worst_m:.2e} {'ok' if ok else 'MISMATCH'}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
