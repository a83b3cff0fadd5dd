"""Host cost of the autograd engine's own loop (`autograd/engine.py: execute`), measured on CPU.

The graph is a ResNet-50 training step's (bench/gpu_models.resnet50, B 2, 3 x 32 x 32, float32 on cpu: the
same ops and edges as the cuda step's); every node's `apply` is replaced by one that returns the gradients
the real backward computed for it (recorded once), so what is timed is the engine: ordering, buffers,
metadata checks, gradient sums and the leaves' accumulation (`.grad` set to None before each run, as
`zero_grad(set_to_none=True)`). One JSON line: `us_per_backward` (median of `--repeats`, CPU time of the process), the graph's node
count and `us_per_node`.

Compare two checkouts by running this same script against each, alternating (the box is loaded):

    PYTHONPATH=/path/to/tree python3 bench/engine_host.py
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
import timeit

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import flambeau as fl                                   # noqa: E402
from flambeau.autograd import graph                     # noqa: E402

import gpu_models                                       # noqa: E402


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeats", type=int, default=9)
    ap.add_argument("--number", type=int, default=5)
    args = ap.parse_args()
    fl.manual_seed(0)
    model = gpu_models.resnet50(fl, num_classes=10)
    x, y = fl.randn(2, 3, 32, 32), fl.tensor([1, 3])
    loss = model(x, y)
    recorded = {}
    real = graph.OpNode.apply

    def record(self, grads):
        out = real(self, grads)
        recorded[self] = list(out)
        return out
    graph.OpNode.apply = record
    try:
        loss.backward(retain_graph=True)
    finally:
        graph.OpNode.apply = real
    graph.OpNode.apply = lambda self, grads: list(recorded[self])
    params = list(model.parameters())

    def step():
        for p in params:
            p.grad = None
        loss.backward(retain_graph=True)
    step()
    n = len(recorded) + len(params)
    timer = timeit.Timer(step, timer=time.process_time)         # CPU time: the box is shared
    us = sorted(timer.repeat(number=args.number, repeat=args.repeats))[args.repeats // 2] / args.number * 1e6
    print(json.dumps({"bench": "engine", "nodes": n, "op_nodes": len(recorded), "us_per_backward": round(us, 1),
                      "us_per_node": round(us / n, 3)}))


if __name__ == "__main__":
    main()
