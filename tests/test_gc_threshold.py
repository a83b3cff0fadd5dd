"""`import flambeau` raises the garbage collector's youngest-generation threshold (flambeau/_gc.py): an eager
training step's transient objects (its graph, tensors, arrays: 2,000-4,000 tracked objects at their peak in a
GPT-2 step) no longer trigger collections, which at CPython's 700 ran ~3 times a step and moved the live
graph into the older generations, whose full collections then cost the host 1.6-2.8 ms a step of GPT-2 on
the H100. FLAMBEAU_GC_THRESHOLD sets the value (0: Python's); a program's own higher threshold stays; a bad
value raises at import naming the variable. Cyclic garbage is still collected, only later (its test in
test_run.py); a failed cuda allocation collects it first (test_cuda_oom.py)."""
from __future__ import annotations

import gc
import os
import subprocess
import sys

import numpy as np
import pytest

import flambeau
from flambeau import _gc
from bench.small_gpt import small_gpt

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _thresholds(env: dict, before: str = "") -> tuple:
    """gc's thresholds after `before` then `import flambeau`, in a fresh interpreter (the caller's
    FLAMBEAU_GC_THRESHOLD dropped unless `env` sets it)."""
    code = f"import gc\n{before}\nimport flambeau\nprint('RESULT', *gc.get_threshold())"
    base = {k: v for k, v in os.environ.items() if k != "FLAMBEAU_GC_THRESHOLD"}
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300,
                       env=dict(base, PYTHONPATH=ROOT, **env))
    assert p.returncode == 0, p.stderr[-2000:]
    return tuple(int(v) for v in p.stdout.split("RESULT")[1].split())


def test_import_raises_the_young_threshold_and_keeps_the_others():
    python = tuple(int(v) for v in subprocess.run(
        [sys.executable, "-c", "import gc; print(*gc.get_threshold())"], capture_output=True, text=True).stdout.split())
    assert _thresholds({}) == (max(_gc.YOUNG_THRESHOLD, python[0]),) + python[1:], python
    assert _thresholds({"FLAMBEAU_GC_THRESHOLD": "0"}) == python
    assert _thresholds({"FLAMBEAU_GC_THRESHOLD": "3000"})[0] == max(3000, python[0])
    # a program that set a higher threshold before importing keeps it
    assert _thresholds({}, "gc.set_threshold(50000, 7, 9)") == (50000, 7, 9)


@pytest.mark.parametrize("value", ["x", "-5", "1.5"])
def test_a_bad_threshold_raises_at_import_naming_the_variable(value):
    p = subprocess.run([sys.executable, "-c", "import flambeau"], capture_output=True, text=True, timeout=300,
                       env=dict(os.environ, PYTHONPATH=ROOT, FLAMBEAU_GC_THRESHOLD=value))
    assert p.returncode != 0
    assert f"ValueError: FLAMBEAU_GC_THRESHOLD='{value}': expected a non-negative integer" in p.stderr


@pytest.mark.parametrize("threshold", [700, _gc.YOUNG_THRESHOLD])
def test_an_eager_training_step_triggers_no_collection_at_the_raised_threshold(threshold):
    """A warm eager step of a small GPT (forward, backward, AdamW, zero_grad) that frees what it made: at
    CPython's 700 the collector runs during it, at flambeau's threshold it never does."""
    flambeau.manual_seed(0)
    rng = np.random.default_rng(0)
    net = small_gpt(flambeau, vocab=64, d=32, heads=2, layers=12, block=16, with_loss=True)
    opt = flambeau.optim.AdamW(net.parameters(), lr=1e-3)
    x, y = (flambeau.tensor(rng.integers(0, 64, (4, 16))) for _ in range(2))

    def step():
        loss = net(x, y)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
    for _ in range(3):
        step()
    runs = []
    callback = (lambda phase, info: runs.append(info["generation"]) if phase == "start" else None)
    saved = gc.get_threshold()
    gc.collect()
    gc.set_threshold(threshold, saved[1], saved[2])
    gc.callbacks.append(callback)
    try:
        for _ in range(5):
            step()
    finally:
        gc.callbacks.remove(callback)
        gc.set_threshold(*saved)
    if threshold == 700:
        assert len(runs) >= 5, runs             # the step's peak is above 700: collections every step
    else:
        assert runs == [], runs
