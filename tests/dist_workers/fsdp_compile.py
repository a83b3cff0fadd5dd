"""FSDP2 under flambeau.compile on 2 ranks: a model looping over its fully_shard blocks (GPT-like: the loop
breaks the graph at each block's FSDP hooks, so the model's frame runs eagerly and each block is compiled as
its own frame, its hooks run eagerly around it) trained 3 steps compiled (aot_eager) and eagerly from the
same weights on the same data; losses, final full weights and graph counts to <out>/rank<R>.npz. A flambeau
script (the compiler has no PyTorch twin here)."""
import os
import sys

import numpy as np

import flambeau as torch
import flambeau.distributed as dist
import flambeau.nn as nn
from flambeau._counters import counters
from flambeau._dynamo.backends.registry import lookup_backend
from flambeau.distributed.fsdp import fully_shard

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from training import step_and_mean_loss  # noqa: E402

out_dir = sys.argv[1]
dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
WIDTH, BLOCKS, STEPS, BATCH = 16, 3, 3, 4
res = {}


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc, self.norm = nn.Linear(WIDTH, WIDTH), nn.LayerNorm(WIDTH)

    def forward(self, x):
        return x + torch.tanh(self.fc(self.norm(x)))


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.blocks = nn.ModuleList([Block() for _ in range(BLOCKS)])
        self.head = nn.Linear(WIDTH, 2)

    def forward(self, x):
        for b in self.blocks:
            x = b(x)
        return self.head(x)


def train(tag, compiled):
    torch.manual_seed(0)
    model = Net()
    for b in model.blocks:
        fully_shard(b)
    fully_shard(model)
    graphs = []

    def counting_aot_eager(gm, example_inputs):
        graphs.append(len([n for n in gm.graph.nodes if n.op == "call_function"]))
        return lookup_backend("aot_eager")(gm, example_inputs)
    run = torch.compile(model, backend=counting_aot_eager) if compiled else model
    opt = torch.optim.AdamW(model.parameters(), lr=0.05)
    losses = []
    for step in range(STEPS):
        g = np.random.default_rng(500 + step)
        x = g.standard_normal((BATCH * world, WIDTH)).astype(np.float32)[rank * BATCH:(rank + 1) * BATCH]
        y = g.standard_normal((BATCH * world, 2)).astype(np.float32)[rank * BATCH:(rank + 1) * BATCH]
        loss = ((run(torch.from_numpy(x)) - torch.from_numpy(y)) ** 2).mean()
        losses.append(step_and_mean_loss(loss, opt, dist))
    res[f"{tag}/losses"] = np.array(losses)
    res[f"{tag}/graph_ops"] = np.array(graphs, dtype=np.int64)
    res[f"{tag}/breaks"] = np.array(sorted(counters["graph_break"]) or [""])
    counters.clear()
    for k, v in model.state_dict().items():
        res[f"{tag}/final/{k}"] = v.full_tensor().numpy().copy() if hasattr(v, "full_tensor") else v.numpy().copy()


train("eager", False)
train("compiled", True)
np.savez(os.path.join(out_dir, f"rank{rank}.npz"), **res)
dist.destroy_process_group()
