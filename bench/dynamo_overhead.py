"""Per-call overhead of compiled code: guard evaluation + cache lookup + entry, graph excluded.

A 100-parameter module (50 Linear layers of 1x1 with bias, plus ReLUs) is compiled with a backend
whose compiled graph does nothing (returns a fixed output), so a call costs only the front end:
argument binding, the guard function, the cache lookup and the generated entry. The same is
measured for PyTorch's torch.compile in the same run. One JSON object per line.
"""
from __future__ import annotations

import json
import sys
import time


def make(m, inlined: bool):
    if not inlined:
        layers = []
        for _ in range(50):
            layers += [m.nn.Linear(1, 1), m.nn.ReLU()]
        return m.nn.Sequential(*layers)
    F = m.nn.functional

    class Net(m.nn.Module):
        """Parameters read in a user forward (each one a guarded graph attribute)."""

        def __init__(self):
            super().__init__()
            self.layers = m.nn.ModuleList([m.nn.Linear(1, 1) for _ in range(50)])

        def forward(self, x):
            for lin in self.layers:
                x = F.relu(F.linear(x, lin.weight, lin.bias))
            return x
    return Net()


def measure(m, system: str, inlined: bool, n: int = 2000) -> dict:
    m._dynamo.reset()
    model = make(m, inlined)
    assert sum(1 for _ in model.parameters()) == 100
    x = m.randn(2, 1)
    fixed = [m.zeros(2, 1)]

    def backend(gm, example_inputs):
        return lambda *args: fixed
    t0 = time.perf_counter()
    cm = m._dynamo.optimize(backend)(model)
    cm(x)
    first = time.perf_counter() - t0
    for _ in range(200):
        cm(x)
    best = float("inf")
    for _ in range(5):
        t0 = time.perf_counter()
        for _ in range(n):
            cm(x)
        best = min(best, (time.perf_counter() - t0) / n)
    workload = "dynamo_overhead_100_params" + ("_user_forward" if inlined else "_sequential")
    return {"workload": workload, "system": system, "step_time_us": round(best * 1e6, 2),
            "first_call_s": round(first, 4)}


def capture_time_gpt() -> dict:
    import flambeau
    from flambeau import demo
    import flambeau._dynamo as dyn
    dyn.reset()
    flambeau.manual_seed(0)
    model = demo.GPT()
    idx = flambeau.randint(0, demo.VOCAB, (4, demo.T - 1))
    t0 = time.perf_counter()
    e = dyn.explain(model)(idx)
    return {"workload": "capture_small_gpt_forward", "system": "flambeau-compile",
            "first_call_s": round(time.perf_counter() - t0, 4), "graphs": e.graph_count,
            "graph_breaks": e.graph_break_count}


def main() -> None:
    import flambeau
    import flambeau._dynamo  # noqa: F401
    try:
        import torch
        import torch._dynamo  # noqa: F401
    except ImportError:
        torch = None
    rows = []
    for inlined in (False, True):
        ours = measure(flambeau, "flambeau-compile", inlined)
        rows.append(ours)
        if torch is not None:
            theirs = measure(torch, "torch-compile", inlined)
            ours["ratio_vs_torch"] = round(ours["step_time_us"] / theirs["step_time_us"], 2)
            rows.append(theirs)
    rows.append(capture_time_gpt())
    for r in rows:
        print(json.dumps(r))
    sys.stdout.flush()


if __name__ == "__main__":
    main()
