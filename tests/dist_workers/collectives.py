"""Every collective on this rank's deterministic inputs; results saved to <out>/rank<R>.npz (see inputs.py)."""
import os
import sys

import numpy as np
import torch
import torch.distributed as dist

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from inputs import DTYPES, make, ops_for, stored  # noqa: E402

out_dir = sys.argv[1]
dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
res = {}


def T(a):
    return torch.from_numpy(np.array(a))


def save(key, t):
    res[key] = stored(np.array(t.numpy()))


for name in DTYPES:
    dt = getattr(torch, name)
    for op in ops_for(name):
        t = T(make(rank, f"ar/{name}/{op}", (5, 3), name))
        dist.all_reduce(t, op=getattr(dist.ReduceOp, op))
        assert t.dtype == dt
        save(f"all_reduce/{name}/{op}", t)
    t = T(make(rank, f"bc/{name}", (7,), name))
    dist.broadcast(t, src=world - 1)
    save(f"broadcast/{name}", t)
    x = T(make(rank, f"ag/{name}", (rank + 1,), name))
    outs = [torch.zeros(r + 1, dtype=dt) for r in range(world)]
    dist.all_gather(outs, x)
    for r, o in enumerate(outs):
        save(f"all_gather/{name}/{r}", o)

# async work handles: several in flight, completed out of order of starting
ts = [T(make(rank, f"async/{i}", (1000,), "float32")) for i in range(3)]
works = [dist.all_reduce(t, async_op=True) for t in ts]
assert all(w is not None for w in works)
for w in reversed(works):
    assert w.wait() is True
    assert w.is_completed()
for i, t in enumerate(ts):
    save(f"async/{i}", t)
fut = dist.all_reduce(T(make(rank, "fut", (4,), "float64")), async_op=True).get_future()
res["future"] = fut.then(lambda f: f.value()[0] * 2).wait().numpy()

for name, op in (("float32", "SUM"), ("int64", "MAX"), ("float64", "AVG")):
    t = T(make(rank, f"red/{name}", (6,), name))
    dist.reduce(t, dst=world - 1, op=getattr(dist.ReduceOp, op))
    if rank == world - 1:
        save(f"reduce/{name}/{op}", t)

x = T(make(rank, "agit", (2, 3), "float32"))
o = torch.empty(2 * world, 3)
dist.all_gather_into_tensor(o, x)
save("all_gather_into_tensor", o)

inputs = [T(make(rank, f"rs/{i}", (i + 2,), "float32")) for i in range(world)]
o = torch.empty(rank + 2)
dist.reduce_scatter(o, inputs, op=dist.ReduceOp.SUM)
save("reduce_scatter", o)
x = T(make(rank, "rst", (world * 3, 2), "float64"))
o = torch.empty(3, 2, dtype=torch.float64)
dist.reduce_scatter_tensor(o, x, op=dist.ReduceOp.AVG)
save("reduce_scatter_tensor", o)

ins = [T(make(rank, f"a2a/{j}", (rank + j + 1,), "int64")) for j in range(world)]
outs = [torch.empty(j + rank + 1, dtype=torch.int64) for j in range(world)]
dist.all_to_all(outs, ins)
for j, o in enumerate(outs):
    save(f"all_to_all/{j}", o)
in_splits = [j + 1 for j in range(world)]
x = T(make(rank, "a2as", (sum(in_splits), 2), "float32"))
o = torch.empty(world * (rank + 1), 2)
dist.all_to_all_single(o, x, output_split_sizes=[rank + 1] * world, input_split_sizes=in_splits)
save("all_to_all_single", o)
x = T(make(rank, "a2ae", (world * 2,), "bfloat16"))
o = torch.empty(world * 2, dtype=torch.bfloat16)
dist.all_to_all_single(o, x)
save("all_to_all_single_even", o)

x = T(make(rank, "gather", (4,), "float32"))
gl = [torch.empty(4) for _ in range(world)] if rank == 0 else None
dist.gather(x, gl, dst=0)
if rank == 0:
    for r, g in enumerate(gl):
        save(f"gather/{r}", g)
o = torch.empty(3, dtype=torch.int32)
sl = [T(make(1, f"scatter/{r}", (3,), "int32")) for r in range(world)] if rank == 1 else None
dist.scatter(o, sl, src=1)
save("scatter", o)

right, left = (rank + 1) % world, (rank - 1) % world
x = T(make(rank, "p2p", (5,), "float32"))
o = torch.empty(5)
if rank % 2 == 0:
    dist.send(x, dst=right)
    src = dist.recv(o)                   # any source: returns the sender
else:
    src = dist.recv(o)
    dist.send(x, dst=right)
res["recv_src"] = np.array(src)
dist.barrier()       # no later message may race the any-source receive above
save("send_recv", o)
a, b = T(make(rank, "batch/r", (6,), "float64")), torch.empty(6, dtype=torch.float64)
c, d = T(make(rank, "batch/l", (2,), "float64")), torch.empty(2, dtype=torch.float64)
works = dist.batch_isend_irecv([dist.P2POp(dist.irecv, b, left), dist.P2POp(dist.isend, a, right),
                                dist.P2POp(dist.isend, c, left), dist.P2POp(dist.irecv, d, right)])
for w in works:
    w.wait()
save("batch/from_left", b)
save("batch/from_right", d)

base = T(make(rank, "noncontig", (3, 4), "float32"))
view = base.t()
dist.all_reduce(view)
save("noncontig", base)

g = dist.new_group([0, world - 1])
t = T(make(rank, "group", (3,), "float32"))
w = dist.all_reduce(t, group=g)
if rank in (0, world - 1):
    assert dist.get_rank(g) == (0 if rank == 0 else 1) and dist.get_world_size(g) == 2
    save("group", t)
else:
    assert w is None and dist.get_rank(g) == -1
t = T(np.full(2, rank, dtype=np.float32))
dist.broadcast(t, src=world - 1, group=g)
if rank in (0, world - 1):
    save("group_bcast", t)

objs = [None] * world
dist.all_gather_object(objs, {"rank": rank, "name": f"r{rank}"})
assert objs == [{"rank": r, "name": f"r{r}"} for r in range(world)], objs
lst = [rank, "x"] if rank == 0 else [None, None]
dist.broadcast_object_list(lst, src=0)
assert lst == [0, "x"], lst
dist.monitored_barrier()
dist.barrier()
np.savez(os.path.join(out_dir, f"rank{rank}.npz"), **res)
dist.destroy_process_group()
