"""bench/stream_timeline.py, the reader of the device timelines behind issue 18's DDP figures, on a made-up
trace whose answers are known: busy time per stream is the union of its intervals, the compute stream's
idle gaps are found with their neighbours, and the per-kernel diff against a base trace is exact."""
from __future__ import annotations

import gzip
import json

from bench import stream_timeline as st

STEPS = 2


def _trace(path, with_nccl: bool) -> str:
    events = []
    for s in range(STEPS):
        t = s * 1000.0
        events.append({"name": f"{st.STEP_PREFIX}{s}", "cat": "user_annotation", "ts": t, "dur": 900.0})
        events.append({"name": "gemm", "cat": "kernel", "ts": t, "dur": 100.0, "args": {"device": 0, "stream": 7}})
        events.append({"name": "gemm", "cat": "kernel", "ts": t + 50, "dur": 100.0, "args": {"device": 0, "stream": 7}})
        events.append({"name": "copy", "cat": "gpu_memcpy", "ts": t + 400, "dur": 100.0,
                       "args": {"device": 0, "stream": 7}})                 # 250 us idle before it
        if with_nccl:
            events.append({"name": "ncclAllReduce", "cat": "kernel", "ts": t + 100, "dur": 300.0,
                           "args": {"device": 0, "stream": 20}})
        events.append({"name": "cudaLaunchKernel", "cat": "cuda_runtime", "ts": t, "dur": 4.0})
    with gzip.open(path, "wt") as f:
        json.dump({"steps": STEPS, "events": events}, f)
    return str(path)


def test_report_reads_streams_gaps_and_differences(tmp_path, capsys):
    ddp = _trace(tmp_path / "ddp.json.gz", True)
    single = _trace(tmp_path / "single.json.gz", False)
    st.report(ddp, rows=10, base=single)
    out = capsys.readouterr().out
    assert "device 0 stream 7: 3 kernels+copies/step, busy 0.25 ms/step, summed 0.30" in out   # overlap merged
    assert "device 0 stream 20: 1 kernels+copies/step, busy 0.30 ms/step" in out
    assert "busy (all streams) 0.50 ms/step" in out
    assert "idle in gaps > 50 us: 0.50 ms/step (1.5 gaps/step)" in out      # 250 us in each step, 500 between
    assert "0.500 ms  after copy  before gemm" in out and "0.250 ms  after gemm  before copy" in out
    assert "summed kernel time +0.30 ms/step" in out
    assert "+0.300     0.300 vs    0.000     1.0 vs    0.0  ncclAllReduce" in out
    assert "2.0 vs    2.0  gemm" in out
    assert "1.0    0.004  cudaLaunchKernel" in out
