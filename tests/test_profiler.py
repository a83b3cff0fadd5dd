"""flambeau.profiler against PyTorch's torch.profiler: the schedule's action at every step, which steps an
active stretch records and hands to on_trace_ready, the operators and record_function ranges recorded with
their counts, nesting (self time = total less the direct children), input shapes and matrix-product flops,
the Chrome trace written atomically, the legacy torch.autograd.profiler API, and the options refused."""
from __future__ import annotations

import json
import os

import numpy as np
import pytest
import torch

import flambeau as fl
import flambeau.autograd.profiler as fl_legacy
from flambeau import profiler as P

SCHEDULES = [dict(wait=1, warmup=1, active=2), dict(wait=0, warmup=1, active=1, repeat=2),
             dict(wait=2, warmup=1, active=3, repeat=1, skip_first=3), dict(wait=2, warmup=1, active=1, skip_first_wait=1)]


@pytest.mark.parametrize("kw", SCHEDULES, ids=lambda k: ",".join(f"{a}={b}" for a, b in k.items()))
def test_schedule_actions_equal_pytorchs(kw):
    ours, theirs = P.schedule(**kw), torch.profiler.schedule(**kw)
    assert [ours(s).name for s in range(30)] == [theirs(s).name for s in range(30)]


def _labelled_steps(mod, prof_cls, kw, steps=9):
    """The step labels each saved trace holds, profiling `steps` labelled steps under schedule(**kw) (or
    a schedule function given as kw)."""
    traces = []

    def ready(prof):
        traces.append(sorted({e.name for e in prof.events() if e.name.startswith("step")}))
    with prof_cls(activities=[mod.profiler.ProfilerActivity.CPU], on_trace_ready=ready,
                  schedule=kw if callable(kw) else mod.profiler.schedule(**kw)) as prof:
        for i in range(steps):
            with mod.profiler.record_function(f"step{i}"):
                mod.ones(2) + 1
            prof.step()
    return traces


@pytest.mark.parametrize("kw", SCHEDULES[:3], ids=lambda k: ",".join(f"{a}={b}" for a, b in k.items()))
def test_scheduled_steps_recorded_and_saved_as_pytorch(kw):
    assert _labelled_steps(fl, P.profile, kw) == _labelled_steps(torch, torch.profiler.profile, kw)


def test_a_recording_cut_off_by_a_custom_schedule_is_not_saved_as_pytorch():
    """A schedule function going from RECORD to NONE (no RECORD_AND_SAVE): PyTorch stops that recording
    without handing it to on_trace_ready; a recording still open at exit is handed over."""
    def custom(mod):
        a = mod.profiler.ProfilerAction
        seq = [a.RECORD, a.RECORD, a.NONE, a.WARMUP, a.RECORD, a.RECORD_AND_SAVE, a.NONE, a.RECORD, a.RECORD]
        return lambda s: seq[s] if s < len(seq) else a.RECORD
    ours = _labelled_steps(fl, P.profile, custom(fl))
    assert ours == _labelled_steps(torch, torch.profiler.profile, custom(torch))
    assert ours == [["step4", "step5"], ["step7", "step8"]]


def test_operators_ranges_counts_and_nesting():
    a, b = fl.randn(2, 3), fl.randn(3, 4)
    with P.profile(record_shapes=True, with_flops=True) as prof:
        with P.record_function("outer"):
            for _ in range(3):
                fl.mm(a, b)
            with P.record_function("inner"):
                a + 1
                a + 2
    avg = {r.key: r for r in prof.key_averages()}
    assert avg["aten::mm"].count == 3 and avg["aten::add"].count == 2 and avg["outer"].count == 1
    events = {e.name: e for e in prof.events()}
    outer, inner = events["outer"], events["inner"]
    children = [e for e in prof.events() if e.depth == 1]
    assert {e.name for e in children} == {"aten::mm", "inner"}
    assert abs(outer.self_cpu_time_total - (outer.cpu_time_total - sum(e.cpu_time_total for e in children))) < 1e-6
    assert 0 <= inner.self_cpu_time_total <= inner.cpu_time_total <= outer.cpu_time_total
    mm = events["aten::mm"]
    ta, tb = torch.randn(2, 3), torch.randn(3, 4)
    with torch.profiler.profile(record_shapes=True, with_flops=True) as ref:
        torch.mm(ta, tb)
    ref_mm = next(e for e in ref.events() if e.name == "aten::mm")
    assert mm.input_shapes == ref_mm.input_shapes == [[2, 3], [3, 4]]
    assert mm.flops == ref_mm.flops == 2 * 2 * 3 * 4
    table = prof.key_averages().table(sort_by="cpu_time_total", row_limit=5)
    assert "aten::mm" in table and "# of Calls" in table and "Self CPU time total" in table


def test_backward_operators_are_recorded():
    x = fl.randn(3, 3, requires_grad=True)
    with P.profile() as prof:
        (x.relu() * 2).sum().backward()
    names = {e.name for e in prof.events()}
    assert {"aten::relu", "aten::relu_backward"} <= names
    with pytest.raises(ValueError, match="sort_by"):
        prof.key_averages().table(sort_by="wall")


def test_chrome_trace_is_written_atomically(tmp_path):
    with P.profile() as prof:
        with P.record_function("label"):
            fl.ones(3) * 2
    path = tmp_path / "trace.json"
    prof.export_chrome_trace(str(path))
    trace = json.loads(path.read_text())
    names = [e["name"] for e in trace["traceEvents"]]
    assert "label" in names and "aten::mul" in names
    assert all(e["ph"] == "X" and e["dur"] >= 0 for e in trace["traceEvents"])
    assert os.listdir(tmp_path) == ["trace.json"]
    handler = P.tensorboard_trace_handler(str(tmp_path / "tb"), worker_name="w", use_gzip=True)
    handler(prof)
    (saved,) = os.listdir(tmp_path / "tb")
    assert saved.startswith("w.") and saved.endswith(".pt.trace.json.gz")


def test_legacy_autograd_profiler_and_disabled():
    with fl_legacy.profile() as prof:
        fl.ones(2) + fl.ones(2)
    assert [e.key for e in prof.key_averages()].count("aten::add") == 1
    with fl_legacy.profile(enabled=False) as off:
        fl.ones(2) + 1
    assert len(off.function_events) == 0
    assert np.isfinite(prof.self_cpu_time_total())


def test_options_that_are_not_recorded_raise():
    for kw in (dict(profile_memory=True), dict(with_stack=True), dict(with_modules=True)):
        with pytest.raises(NotImplementedError, match=next(iter(kw))):
            P.profile(**kw)
    with pytest.raises(ValueError, match="unsupported activities"):
        P.profile(activities=[P.ProfilerActivity.XPU])
    with pytest.warns(UserWarning, match="device kernel times are not collected"):
        P._warned.clear()
        P.profile(activities=[P.ProfilerActivity.CPU, P.ProfilerActivity.CUDA])
