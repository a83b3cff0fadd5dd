"""Launcher behaviour: `launcher.py MODE OUT`. A PyTorch script (runs on flambeau through the aliasing).

env:      every rank writes its torchrun environment to OUT/env<R>.json; on restart attempt 0 rank 1 raises
          before init_process_group while rank 0 waits for it (the launcher must stop rank 0 and restart).
kill:     rank 1 kills itself (SIGKILL) after init while rank 0 waits in a barrier.
raise:    rank 0 raises after init while rank 1 waits in an all_reduce.
monitored: rank 1 reaches monitored_barrier 5 s late; rank 0 waits 1 s and must name it.
hang:     after init every rank writes OUT/started<R>; rank 1 then sleeps forever while rank 0 spins in a
          barrier (only a kill of the whole group ends it).
After init every rank writes OUT/shm<R>.txt: the /dev/shm files it maps (MPI's shared memory).
The entry point carries `@record`, as torchrun scripts write it.
"""
import datetime
import gc
import json
import os
import signal
import sys
import time

import torch
import torch.distributed as dist
from torch.distributed.elastic.multiprocessing.errors import record

mode, out = sys.argv[1], sys.argv[2]


@record
def main():
    rank = int(os.environ["RANK"])
    attempt = int(os.environ["TORCHELASTIC_RESTART_COUNT"])
    if mode == "env" and attempt == 0 and rank == 1:
        raise ValueError("rank 1 fails on attempt 0")
    dist.init_process_group("gloo")
    with open("/proc/self/maps") as fh, open(os.path.join(out, f"shm{rank}.txt"), "w") as note:
        note.write("\n".join(sorted({line.split()[-1] for line in fh if "/dev/shm/" in line})))
    if mode == "env":
        keys = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT",
                "TORCHELASTIC_RUN_ID", "TORCHELASTIC_RESTART_COUNT", "TORCHELASTIC_MAX_RESTARTS")
        found = {k: os.environ.get(k) for k in keys}
        cycle = []
        cycle.append(cycle)                  # the script's own garbage is still collected
        del cycle
        found.update(torch=torch.__name__, rank=dist.get_rank(), world=dist.get_world_size(), args=sys.argv[3:],
                      launched=dist.is_torchelastic_launched(), frozen=gc.get_freeze_count(),
                      collected=gc.collect())
        with open(os.path.join(out, f"env{rank}.json"), "w") as fh:
            json.dump(found, fh)
    elif mode == "kill" and rank == 1:
        os.kill(os.getpid(), signal.SIGKILL)
    elif mode == "raise" and rank == 0:
        raise KeyError("rank 0 raised on purpose")
    elif mode == "hang":
        open(os.path.join(out, f"started{rank}"), "w").close()
        while rank == 1:
            time.sleep(1)
    elif mode == "monitored":
        if rank == 1:
            time.sleep(5)                    # late: rank 0's monitored_barrier must name it
        dist.monitored_barrier(timeout=datetime.timedelta(seconds=1))
    t = torch.ones(2)
    dist.all_reduce(t)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
