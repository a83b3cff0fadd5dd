"""Every collective on this rank's deterministic inputs; results saved to <out>/rank<R>.npz (see inputs.py).

    collectives.py OUT [BACKEND [DEVICE]]     BACKEND: gloo (default), nccl, cpu:gloo,cuda:nccl; DEVICE: cpu, cuda

On cuda each rank uses the GPU of its LOCAL_RANK; operations NCCL lacks (bitwise reductions, receive from
any source) are left out there, and plain send/recv with one rank (a send to oneself would wait forever).
"""
import os
import sys

import numpy as np
import torch
import torch.distributed as dist

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from inputs import DTYPES, make, ops_for, stored  # noqa: E402

out_dir = sys.argv[1]
backend = sys.argv[2] if len(sys.argv) > 2 else "gloo"
device = sys.argv[3] if len(sys.argv) > 3 else "cpu"
if device == "cuda":
    torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
dist.init_process_group(backend)
rank, world = dist.get_rank(), dist.get_world_size()
res = {}
if backend == "cpu:gloo,cuda:nccl":        # routing: cpu tensors on MPI, cuda tensors on NCCL
    assert type(dist.group.WORLD.engine_for("cpu")).__name__ == "MPIBackend"
    assert type(dist.group.WORLD.engine_for("cuda")).__name__ == "NCCLBackend"


def T(a):
    return torch.from_numpy(np.array(a)).to(device)


def empty(*shape, dtype=torch.float32):
    return torch.empty(*shape, dtype=dtype, device=device)


def save(key, t):
    res[key] = stored(np.array(t.cpu().numpy()))


for name in DTYPES:
    dt = getattr(torch, name)
    for op in ops_for(name, backend if device == "cuda" else "gloo"):
        t = T(make(rank, f"ar/{name}/{op}", (5, 3), name))
        dist.all_reduce(t, op=getattr(dist.ReduceOp, op))
        assert t.dtype == dt
        save(f"all_reduce/{name}/{op}", t)
    t = T(make(rank, f"bc/{name}", (7,), name))
    dist.broadcast(t, src=world - 1)
    save(f"broadcast/{name}", t)
    x = T(make(rank, f"ag/{name}", (rank + 1,), name))
    outs = [torch.zeros(r + 1, dtype=dt, device=device) for r in range(world)]
    dist.all_gather(outs, x)
    for r, o in enumerate(outs):
        save(f"all_gather/{name}/{r}", o)

# NCCL's grouped in-place average (DDP's reducer on the gradients themselves): arrays of several sizes and dtypes
if backend == "nccl":
    many = [T(make(rank, f"arm/{i}", shape, name)) for i, (shape, name) in
            enumerate((((3,), "float32"), ((1000,), "float32"), ((5, 7), "float64"), ((2, 3), "float32")))]
    dist.group.WORLD.engine_for("cuda").all_reduce_many([t._data for t in many], "AVG").wait()
    torch.cuda.synchronize()
    for i, t in enumerate(many):
        save(f"all_reduce_many/{i}", t)

# async work handles: several in flight, completed out of order of starting
ts = [T(make(rank, f"async/{i}", (1000,), "float32")) for i in range(3)]
works = [dist.all_reduce(t, async_op=True) for t in ts]
assert all(w is not None for w in works)
for w in reversed(works):
    assert w.wait() is True
if device == "cuda":
    torch.cuda.synchronize()       # NCCL's wait() orders the current stream; the host sees completion after a sync
assert all(w.is_completed() for w in works)
for i, t in enumerate(ts):
    save(f"async/{i}", t)
fut = dist.all_reduce(T(make(rank, "fut", (4,), "float64")), async_op=True).get_future()
res["future"] = fut.then(lambda f: f.value()[0] * 2).wait().cpu().numpy()

for name, op in (("float32", "SUM"), ("int64", "MAX"), ("float64", "AVG")):
    t = T(make(rank, f"red/{name}", (6,), name))
    dist.reduce(t, dst=world - 1, op=getattr(dist.ReduceOp, op))
    if rank == world - 1:
        save(f"reduce/{name}/{op}", t)

x = T(make(rank, "agit", (2, 3), "float32"))
o = empty(2 * world, 3)
dist.all_gather_into_tensor(o, x)
save("all_gather_into_tensor", o)

inputs = [T(make(rank, f"rs/{i}", (i + 2,), "float32")) for i in range(world)]
o = empty(rank + 2)
dist.reduce_scatter(o, inputs, op=dist.ReduceOp.SUM)
save("reduce_scatter", o)
x = T(make(rank, "rst", (world * 3, 2), "float64"))
o = empty(3, 2, dtype=torch.float64)
dist.reduce_scatter_tensor(o, x, op=dist.ReduceOp.AVG)
save("reduce_scatter_tensor", o)

ins = [T(make(rank, f"a2a/{j}", (rank + j + 1,), "int64")) for j in range(world)]
outs = [empty(j + rank + 1, dtype=torch.int64) for j in range(world)]
dist.all_to_all(outs, ins)
for j, o in enumerate(outs):
    save(f"all_to_all/{j}", o)
in_splits = [j + 1 for j in range(world)]
x = T(make(rank, "a2as", (sum(in_splits), 2), "float32"))
o = empty(world * (rank + 1), 2)
dist.all_to_all_single(o, x, output_split_sizes=[rank + 1] * world, input_split_sizes=in_splits)
save("all_to_all_single", o)
x = T(make(rank, "a2ae", (world * 2,), "bfloat16"))
o = empty(world * 2, dtype=torch.bfloat16)
dist.all_to_all_single(o, x)
save("all_to_all_single_even", o)

x = T(make(rank, "gather", (4,), "float32"))
gl = [empty(4) for _ in range(world)] if rank == 0 else None
dist.gather(x, gl, dst=0)
if rank == 0:
    for r, g in enumerate(gl):
        save(f"gather/{r}", g)
o = empty(3, dtype=torch.int32)
src = min(1, world - 1)
sl = [T(make(src, f"scatter/{r}", (3,), "int32")) for r in range(world)] if rank == src else None
dist.scatter(o, sl, src=src)
save("scatter", o)

right, left = (rank + 1) % world, (rank - 1) % world
x = T(make(rank, "p2p", (5,), "float32"))
o = empty(5)
any_source = None if device == "cpu" else left     # NCCL receives from a named peer only
if world > 1:
    if rank % 2 == 0:
        dist.send(x, dst=right)
        src = dist.recv(o, src=any_source)        # any source (MPI): returns the sender
    else:
        src = dist.recv(o, src=any_source)
        dist.send(x, dst=right)
    res["recv_src"] = np.array(src)
    dist.barrier()       # no later message may race the any-source receive above
    save("send_recv", o)
a, b = T(make(rank, "batch/r", (6,), "float64")), empty(6, dtype=torch.float64)
c, d = T(make(rank, "batch/l", (2,), "float64")), empty(2, dtype=torch.float64)
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

members = sorted({0, world - 1})
g = dist.new_group(members)
t = T(make(rank, "group", (3,), "float32"))
w = dist.all_reduce(t, group=g)
if rank in members:
    assert dist.get_rank(g) == members.index(rank) and dist.get_world_size(g) == len(members)
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
