"""Where a GPU step's device time goes, stream by stream: record a few steps under PyTorch's profiler
(CUPTI sees every kernel of the process: CuPy's, cuBLAS's, Triton's and NCCL's too), keep the device
events and CUDA API calls, and report them.

    record(step, steps, path, device_index)   in a worker: writes path (gzipped JSON of the kept events)
    python bench/stream_timeline.py TRACE.json.gz [...] [--rows 25] [--diff BASE.json.gz]

The report of a trace, per device and stream: kernels per step, busy time per step (the union of its
kernel and copy intervals), the idle gaps of the busiest stream (the compute stream: where it waited for
the host or for another stream) and the top kernels by device time; then the CUDA API calls per step
(launches, event records and waits, synchronisations, allocations). `--diff BASE` sets each kernel name's
ms per step beside BASE's (say a 1-GPU step beside a DDP rank's): what the extra device time is made of.
Plain text meant to be read, not parsed.
"""
from __future__ import annotations

import argparse
import collections
import gzip
import json
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from bench import measure  # noqa: E402

DEVICE_CATS = ("kernel", "gpu_memcpy", "gpu_memset")
API_CATS = ("cuda_runtime", "cuda_driver")
STEP_PREFIX = "timeline_step"
NAME_WIDTH = 100
GAP_US = 50.0            # idle stretches of the compute stream shorter than this are launch spacing, not waits


def record(step, steps: int, path: str, device_index: int) -> None:
    """Run `step()` `steps` times under PyTorch's profiler; keep the device events, CUDA API calls and
    the step annotations in `path`. Imports the real PyTorch: in a `flambeau.run` process call
    `flambeau.compat.disable()` first."""
    import torch
    from torch.profiler import ProfilerActivity, profile, record_function
    torch.cuda.set_device(device_index)
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for i in range(steps):
            with record_function(f"{STEP_PREFIX}{i}"):
                step()
        torch.cuda.synchronize()
    events = measure.trace_events(prof)
    kept = [e for e in events if e.get("cat") in DEVICE_CATS + API_CATS
            or str(e.get("name", "")).startswith(STEP_PREFIX)]
    with gzip.open(path, "wt") as f:
        json.dump({"steps": steps, "events": kept}, f)


def _kernels(events: list) -> list:
    return [e for e in events if e.get("cat") in DEVICE_CATS and "dur" in e]


def by_name(events: list, steps: int) -> dict:
    """kernel name -> (count per step, ms per step)."""
    out = collections.defaultdict(lambda: [0.0, 0.0])
    for e in _kernels(events):
        row = out[e["name"][:NAME_WIDTH]]
        row[0] += 1 / steps
        row[1] += e["dur"] / steps / 1e3
    return out


def report(path: str, rows: int, base: str | None = None) -> None:
    with gzip.open(path, "rt") as f:
        data = json.load(f)
    events, steps = data["events"], data["steps"]
    print(f"== {os.path.basename(path)}: {steps} steps")
    marks = [e for e in events if str(e.get("name", "")).startswith(STEP_PREFIX) and "dur" in e]
    if marks:
        print(f"  host time per step (annotation): {sum(e['dur'] for e in marks) / len(marks) / 1e3:.2f} ms")
    kernels = _kernels(events)
    if not kernels:
        print("  no device events")
        return
    streams = collections.defaultdict(list)
    for e in kernels:
        args = e.get("args", {})
        streams[(args.get("device"), args.get("stream"))].append(e)
    t0 = min(e["ts"] for e in kernels)
    t1 = max(e["ts"] + e["dur"] for e in kernels)
    print(f"  device span {(t1 - t0) / steps / 1e3:.2f} ms/step, busy (all streams) "
          f"{measure.union_us([(e['ts'], e['ts'] + e['dur']) for e in kernels]) / steps / 1e3:.2f} ms/step")
    for (dev, stream), evs in sorted(streams.items(), key=lambda kv: -len(kv[1])):
        busy = measure.union_us([(e["ts"], e["ts"] + e["dur"]) for e in evs])
        print(f"  device {dev} stream {stream}: {len(evs) / steps:.0f} kernels+copies/step, "
              f"busy {busy / steps / 1e3:.2f} ms/step, summed {sum(e['dur'] for e in evs) / steps / 1e3:.2f}")
    compute = max(streams.values(), key=len)
    _gaps(compute, steps)
    table = by_name(events, steps)
    print(f"  top kernels (ms/step, count/step, mean us):")
    for name, (n, ms) in sorted(table.items(), key=lambda kv: -kv[1][1])[:rows]:
        print(f"    {ms:8.3f} {n:7.1f} {ms * 1e3 / max(n, 1e-9):9.1f}  {name}")
    api = collections.Counter()
    api_us = collections.Counter()
    for e in events:
        if e.get("cat") in API_CATS:
            api[e["name"]] += 1
            api_us[e["name"]] += e.get("dur", 0)
    print("  CUDA API calls per step (count, ms):")
    for name, n in api.most_common(rows):
        print(f"    {n / steps:8.1f} {api_us[name] / steps / 1e3:8.3f}  {name}")
    if base:
        with gzip.open(base, "rt") as f:
            ref = json.load(f)
        _diff(table, by_name(ref["events"], ref["steps"]), os.path.basename(base), rows)


def _gaps(evs: list, steps: int) -> None:
    """Idle stretches of one stream (between the end of a kernel and the start of the next)."""
    evs = sorted(evs, key=lambda e: e["ts"])
    gaps, end, prev = [], None, None
    for e in evs:
        if end is not None and e["ts"] - end > GAP_US:
            gaps.append((e["ts"] - end, prev["name"][:60], e["name"][:60]))
        if end is None or e["ts"] + e["dur"] > end:
            end, prev = e["ts"] + e["dur"], e
    total = sum(g[0] for g in gaps)
    print(f"  busiest stream idle in gaps > {GAP_US:.0f} us: {total / steps / 1e3:.2f} ms/step "
          f"({len(gaps) / steps:.1f} gaps/step); largest:")
    for us, before, after in sorted(gaps, reverse=True)[:8]:
        print(f"    {us / 1e3:8.3f} ms  after {before}  before {after}")


def _diff(table: dict, ref: dict, ref_name: str, rows: int) -> None:
    names = set(table) | set(ref)
    delta = sorted(names, key=lambda n: -abs(table.get(n, (0, 0))[1] - ref.get(n, (0, 0))[1]))
    total = sum(v[1] for v in table.values()) - sum(v[1] for v in ref.values())
    print(f"  vs {ref_name}: summed kernel time {total:+.2f} ms/step; largest differences (ms/step, count/step):")
    for n in delta[:rows]:
        a, b = table.get(n, (0, 0)), ref.get(n, (0, 0))
        print(f"    {a[1] - b[1]:+8.3f}  {a[1]:8.3f} vs {b[1]:8.3f}  {a[0]:6.1f} vs {b[0]:6.1f}  {n}")


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("traces", nargs="+")
    ap.add_argument("--rows", type=int, default=25)
    ap.add_argument("--diff", default=None, help="a trace to set each kernel name's time beside")
    a = ap.parse_args(argv)
    for path in a.traces:
        report(path, a.rows, a.diff)


if __name__ == "__main__":
    main()
