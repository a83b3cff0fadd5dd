"""bench/distributed_train.py's rounds (`--repeat`) against known answers: a round's hosts are even only
when every process's calibration is within EVEN_HOSTS of the fastest's, and the medians over the rounds
take each round's value once, the even rounds' apart."""
from __future__ import annotations

from bench import distributed_train as D


def _run(system, mode, cal):
    return {"system": system, "mode": mode, "config": "ddp", "host_calibration_ms_per_rank": cal}


def test_even_hosts_compares_every_process_of_the_mode():
    rows = [_run("flambeau", "eager", [90, 95]), _run("torch", "eager", [100, 92]), _run("torch", "compiled", [200])]
    assert D._even_hosts(rows, "eager")                 # 100 <= 1.25 * 90; the compiled run's 200 is another mode
    rows.append(_run("flambeau", "eager", [120]))       # 120 > 1.25 * 90
    assert not D._even_hosts(rows, "eager")
    assert not D._even_hosts(rows, "nothing")


def test_across_rounds_medians_over_all_and_even_rounds():
    summaries = [{"summary": "flambeau-vs-torch", "mode": "eager", "ratio": r, "round": i, "even_hosts": e}
                 for i, (r, e) in enumerate([(1.6, False), (1.0, True), (1.4, False), (1.04, True)])]
    summaries.append({"summary": "ddp-vs-one-process", "system": "flambeau", "mode": "eager", "round": 0,
                      "even_hosts": False, "scaling_efficiency": 0.8})
    rows = {(r["summary"], r["value"]): r for r in D.across_rounds(summaries)}
    ratio = rows[("flambeau-vs-torch-across-rounds", "ratio")]
    assert ratio["rounds"] == [1.6, 1.0, 1.4, 1.04] and ratio["even_rounds"] == 2
    assert abs(ratio["median"] - 1.22) < 1e-12 and abs(ratio["median_even_hosts"] - 1.02) < 1e-12
    scaling = rows[("ddp-vs-one-process-across-rounds", "scaling_efficiency")]
    assert scaling["median"] == 0.8 and scaling["median_even_hosts"] is None


def test_phases_cut_a_step_at_its_marks_and_the_last_gradient():
    """`--phases` (cpu: host clock marks): every phase of a small GPT's step measured, the backward cut at
    the last post-accumulate hook: its compute part is positive, and the phases sum to the steps' time."""
    import time

    import flambeau as torch
    from bench import gpu_models
    torch.manual_seed(0)
    model = gpu_models.gpt(torch, vocab=64, block=16, d=16, layers=1, heads=2)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    batch = (torch.randint(0, 64, (2, 16)), torch.randint(0, 64, (2, 16)))
    start = time.perf_counter()
    phases = D._phases(torch, model, opt, batch, None, False)
    total = (time.perf_counter() - start) * 1e3
    assert list(phases) == ["forward", "backward_compute", "backward_wait", "optimizer", "zero_grad_and_gap"]
    assert phases["forward"] > 0 and phases["backward_compute"] > 0 and phases["optimizer"] > 0
    assert min(phases.values()) >= 0
    assert sum(phases.values()) * D.PHASE_STEPS <= total


def test_fastest_cpus_are_distinct_cpus_of_the_affinity_and_leave_it_as_it_was():
    import os
    allowed = os.sched_getaffinity(0)
    chosen = D.fastest_cpus(2, work=2_000)
    assert os.sched_getaffinity(0) == allowed
    cpus = [c for c, _ in chosen]
    assert len(cpus) == min(2, len(allowed)) == len(set(cpus)) and set(cpus) <= allowed
    assert all(ms > 0 for _, ms in chosen)


def test_batch_seq_and_layers_override_the_models_sizes_and_zero_keeps_them():
    import types
    args = types.SimpleNamespace(small=False, layers=0, batch=1, seq=64)
    assert D._config(args) == dict(D.GPT2, batch=1, seq=64)
    args = types.SimpleNamespace(small=True, layers=3, batch=0, seq=0)
    assert D._config(args) == dict(D.SMALL, layers=3)
    assert D.GPT2["batch"] == 8 and D.GPT2["seq"] == 1024         # the defaults themselves untouched
