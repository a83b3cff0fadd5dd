"""Functional collectives and distributed.nn.functional, eager and compiled; results to <out>/rank<R>.npz.

    functional.py OUT [BACKEND [DEVICE]]

Written as a PyTorch script (run on flambeau by the launcher). The compiled runs use a backend that
records the graphs' call targets (saved as "graph_targets") and fullgraph=True, so a graph break fails.
"""
import os
import sys

import numpy as np
import torch
import torch.distributed as dist
import torch.distributed._functional_collectives as funcol
import torch.distributed.nn.functional as dnn

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from inputs import make  # noqa: E402

out_dir = sys.argv[1]
backend = sys.argv[2] if len(sys.argv) > 2 else "gloo"
device = sys.argv[3] if len(sys.argv) > 3 else "cpu"
if device == "cuda":
    torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
dist.init_process_group(backend)
rank, world = dist.get_rank(), dist.get_world_size()
WORLD = dist.group.WORLD
IN_SPLITS = [1] * (world - 1) + [4 - (world - 1)]          # uneven pieces of dim 0 (4 rows)
res, targets = {}, []


def T(a):
    return torch.from_numpy(np.array(a)).to(device)


def collectives(x):
    a = funcol.all_reduce(x * 2, "sum", WORLD)
    b = funcol.all_gather_tensor(x, 1, WORLD)
    c = funcol.reduce_scatter_tensor(x, "sum", 0, WORLD)
    d = funcol.all_to_all_single(x, [IN_SPLITS[rank]] * world, IN_SPLITS, WORLD)
    e = funcol.broadcast(x + 1, world - 1, WORLD)
    return tuple(funcol.wait_tensor(t) for t in (a, b, c, d, e))


def recording_backend(gm, example_inputs):
    targets.extend(getattr(n.target, "qualname", str(n.target)) for n in gm.graph.nodes if n.op == "call_function")
    return gm.forward


x = T(make(rank, "fx", (4, 6), "float32"))
eager = collectives(x)
act = funcol.all_reduce(x, "sum", WORLD)
assert type(act).__name__ == "AsyncCollectiveTensor" and type(funcol.wait_tensor(act)) is torch.Tensor
compiled = torch.compile(collectives, backend=recording_backend, fullgraph=True)(x)
inductor = torch.compile(collectives)(x)
for i, (e, c, k) in enumerate(zip(eager, compiled, inductor)):
    res[f"eager/{i}"] = e.cpu().numpy()
    res[f"compiled/{i}"] = c.cpu().numpy()
    res[f"inductor/{i}"] = k.cpu().numpy()


def train(x, w, cs):
    y = dnn.all_reduce(x * w)
    gathered = dnn.all_gather(y)
    loss = sum((g * c).sum() for g, c in zip(gathered, cs))
    loss.backward()
    return loss


w = T(make(rank, "fw", (4, 6), "float32"))
cs = [T(make(j, "fc", (4, 6), "float32")) for j in range(world)]
for mode, fn in (("eager", train), ("compiled", torch.compile(train, backend=recording_backend)),
                 ("inductor", torch.compile(train))):
    xg = x.clone().requires_grad_(True)
    loss = fn(xg, w, cs)
    res[f"grad/{mode}"] = xg.grad.cpu().numpy()
    res[f"loss/{mode}"] = np.array(loss.item())
res["graph_targets"] = np.array(sorted(set(targets)))
np.savez(os.path.join(out_dir, f"rank{rank}.npz"), **res)
dist.destroy_process_group()
