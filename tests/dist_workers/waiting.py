"""How a rank waits for a late peer, with every rank pinned to the first core (oversubscribed) or not.

    waiting.py OUT pinned|free

Rank 1 sleeps LATE_S before each collective, so rank 0 waits in a synchronous all_reduce, then in an async
one (`Work.wait` with no timeout: the engine's own wait). The sleeps of the waits (`time.sleep` in the
engine and the process group modules, counted by a wrapper) and the results go to OUT/rank<R>.json.
"""
import json
import os
import sys
import time

import flambeau
import flambeau.distributed as dist
from flambeau.distributed import _mpi_backend, distributed_c10d

LATE_S = 0.2
out_dir, mode = sys.argv[1], sys.argv[2]
if mode == "pinned":
    os.sched_setaffinity(0, {min(os.sched_getaffinity(0))})
dist.init_process_group("gloo")
rank = dist.get_rank()
sleeps = []
real_sleep = time.sleep


class CountingTime:
    """`time` as the engine sees it, recording each sleep's length."""

    def __getattr__(self, name):
        return getattr(time, name)

    @staticmethod
    def sleep(seconds):
        sleeps.append(seconds)
        real_sleep(seconds)


_mpi_backend.time = distributed_c10d.time = CountingTime()
res = {"idle_sleep_s": _mpi_backend.Request([]).idle_sleep_s}
for kind in ("sync", "async"):
    t = flambeau.full((1000,), float(rank + 1))
    if rank == 1:
        real_sleep(LATE_S)
    del sleeps[:]
    if kind == "sync":
        dist.all_reduce(t)
    else:
        dist.all_reduce(t, async_op=True).wait()
    res[kind] = {"sleeps": list(sleeps), "values": sorted(set(t.tolist()))}
with open(os.path.join(out_dir, f"rank{rank}.json"), "w") as f:
    json.dump(res, f)
dist.destroy_process_group()
