"""The garbage collector's load from an eager or compiled training step, on cpu (issue 11: the host-bound
GPU step paid 7-8 ms a GPT-2 step in Python's cyclic collector).

    PYTHONPATH=TREE python3 bench/gc_step.py [--only mlp,gpt,cnn] [--modes eager,compiled] [--layers 12]
                                             [--heap 100000] [--steps 50] [--systems flambeau,torch] [--freeze] [--gc-report N]

One JSON line per workload, system and mode (each in this process, one after the other):
- `alive_per_node`: objects the collector tracks that a forward leaves alive (after a collection, which
  also untracks tuples of atomic values), per autograd graph node (flambeau) or per op (PyTorch: its graph is
  C++, so its figure is the output tensors the Python code holds);
- `garbage_after_step`: what `gc.collect()` finds after one warm step run with the collector off (objects
  in reference cycles: 0 when refcounting frees everything);
- `kept_by_first_steps`: tracked objects the first three steps leave alive (compiled: what the compiled
  callables keep, plus modules the first compile imports, on top of what eager keeps: optimizer state,
  gradients), `full_collection_ms`: a `gc.collect()` then (thread CPU time, median of 5), `tracked_objects` at the end;
- over `--steps` steps with the collector on: `gc_ms_per_step`, collections per generation and
  `steps_per_full_collection`; then over as many steps again, `promoted_per_step`: objects moved into the
  oldest generation by the middle generation's collections (counted in gc.callbacks). A full collection
  walks every tracked object, and it comes once the objects promoted since the last one exceed a quarter
  of those it last kept, so a GPU process holding H tracked objects (CuPy, Triton, cuDNN: 100-330k there)
  runs one about every H / 4 / promoted_per_step steps. `--heap N` keeps N extra tracked objects alive to
  see that pacing here. `--freeze`: the objects alive after importing the systems are moved out of the
  collector's reach first (`gc.freeze()`), as `python -m flambeau.run` does before a user's script.
Model sizes are the cpu-sized ones of the layouts of bench/gpu_models.py (GPT: d 64, 4 heads, T 32, B 4);
`cnn` is bench/small_cnn.py (16 channels, `--layers` residual blocks, 8 images of 32x32).
"""
from __future__ import annotations

import argparse
import gc
import importlib
import json
import os
import sys
import time

import numpy as np

sys.path.append(os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))  # after PYTHONPATH: A/B of trees

from bench import gpu_models  # noqa: E402
from bench import measure as measure_mod  # noqa: E402
from bench.measure import GcMeter  # noqa: E402
from bench.small_cnn import small_cnn  # noqa: E402


def build(m, name: str, layers: int):
    m.manual_seed(0)
    rng = np.random.default_rng(0)
    if name == "cnn":
        model = small_cnn(m, channels=16, blocks=layers)
        return (model, m.tensor(rng.standard_normal((8, 3, 32, 32)).astype(np.float32)),
                m.tensor(rng.integers(0, 5, 8)))
    if name == "gpt":
        model = gpu_models.gpt(m, vocab=256, block=32, d=64, layers=layers, heads=4)
        return model, m.tensor(rng.integers(0, 256, (4, 32))), m.tensor(rng.integers(0, 256, (4, 32)))
    model = gpu_models.mlp(m, width=64, depth=4)
    return model, m.tensor(rng.standard_normal((16, 64)).astype(np.float32)), m.tensor(rng.integers(0, 64, 16))


def graph_nodes(root) -> int:
    seen, stack = set(), [root]
    while stack:
        n = stack.pop()
        if n is None or id(n) in seen:
            continue
        seen.add(id(n))
        stack.extend(f for f, _ in n.next_functions)
    return len(seen)


class Promotions:
    """Objects the middle generation's collections move into the oldest one inside the block: what CPython
    adds to its count of objects pending a full collection."""

    def __init__(self):
        self.count, self._old = 0, 0

    def _hook(self, phase, info):
        if info["generation"] != 1:
            return
        if phase == "start":
            self._old = len(gc.get_objects(generation=2))
        else:
            self.count += len(gc.get_objects(generation=2)) - self._old

    def __enter__(self):
        gc.callbacks.append(self._hook)
        return self

    def __exit__(self, *exc):
        gc.callbacks.remove(self._hook)


def measure(lib: str, name: str, mode: str, a) -> dict:
    m = importlib.import_module(lib)
    model, x, y = build(m, name, a.layers)
    opt = m.optim.AdamW(model.parameters(), lr=1e-4, weight_decay=0.1)
    fwd = m.compile(model) if mode == "compiled" else model

    def step():
        loss = fwd(x, y)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    gc.collect()
    untrained = len(gc.get_objects())
    for _ in range(3):
        step()
    gc.collect()
    kept_by_compile = len(gc.get_objects()) - untrained
    full_ms = sorted(_timed_collection() for _ in range(5))[2]
    before = len(gc.get_objects())
    loss = fwd(x, y)
    gc.collect()
    alive = len(gc.get_objects()) - before
    nodes = graph_nodes(loss.grad_fn) if lib == "flambeau" else None
    loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)
    del loss
    gc.collect()
    gc.disable()
    step()
    garbage = gc.collect()
    gc.enable()
    gc.collect()
    with GcMeter() as meter:
        t0 = time.perf_counter()
        for _ in range(a.steps):
            step()
        wall = time.perf_counter() - t0
    with Promotions() as promoted:
        for _ in range(a.steps):
            step()
    full = meter.collections[2]
    return {"workload": name, "system": lib, "mode": mode, "layers": a.layers if name in ("gpt", "cnn") else None,
            "alive_after_forward": alive, "graph_nodes": nodes,
            "alive_per_node": round(alive / nodes, 2) if nodes else None,
            "garbage_after_step": garbage, "ms_per_step": round(wall * 1e3 / a.steps, 2),
            "gc_ms_per_step": round(meter.seconds * 1e3 / a.steps, 3), "collections": meter.collections,
            "steps_per_full_collection": round(a.steps / full, 1) if full else None,
            "promoted_per_step": round(promoted.count / a.steps),
            "tracked_objects": len(gc.get_objects()), "kept_by_first_steps": kept_by_compile,
            "full_collection_ms": round(full_ms, 2)} | (
                {"gc_report": measure_mod.heap_report(a.gc_report)} if a.gc_report else {})


def _timed_collection() -> float:
    """ms of this thread's CPU time one full collection takes (CPU time: a loaded box's waits left out)."""
    t0 = time.thread_time()
    gc.collect()
    return (time.thread_time() - t0) * 1e3


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("--only", default="mlp,gpt,cnn")
    ap.add_argument("--modes", default="eager,compiled")
    ap.add_argument("--systems", default="flambeau")
    ap.add_argument("--layers", type=int, default=12)
    ap.add_argument("--heap", type=int, default=0, help="extra tracked objects kept alive (see docstring)")
    ap.add_argument("--steps", type=int, default=50)
    ap.add_argument("--gc-report", type=int, default=0,
                    help="at the end: a timed full collection, the N types with the most references, the N biggest containers")
    ap.add_argument("--freeze", action="store_true",
                    help="gc.freeze() after importing the systems (as python -m flambeau.run does)")
    a = ap.parse_args(argv)
    if a.freeze:
        for lib in a.systems.split(","):
            importlib.import_module(lib)
        gc.collect()
        gc.freeze()
    heap = [[] for _ in range(a.heap)]
    for lib in a.systems.split(","):
        for name in a.only.split(","):
            for mode in a.modes.split(","):
                print(json.dumps(measure(lib, name, mode, a)), flush=True)
    assert len(heap) == a.heap


if __name__ == "__main__":
    main()
