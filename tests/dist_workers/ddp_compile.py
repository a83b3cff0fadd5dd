"""DDP under flambeau.compile on 2 ranks (the DDPOptimizer): a 4-layer MLP whose buckets hold one layer each
is trained 3 steps compiled (aot_eager, graph split at bucket boundaries: PyTorch's cut, one subgraph a
bucket, `ddp_subgraph_buckets` 1; and 2 buckets a subgraph), compiled with
`optimize_ddp=False` (one graph), with the model compiled inside DDP (`DDP(compile(model))`: split
too, as PyTorch's dynamo splits a graph captured inside an active DDP forward; whole without
optimize_ddp) and eagerly, from the same weights on the same data slices; subgraph
counts, losses, final weights and the order of the last step's bucket all-reduces and the input's gradient
to <out>/rank<R>.npz. A flambeau script (the compiler has no PyTorch twin here)."""
import os
import sys

import numpy as np

import flambeau as torch
import flambeau.distributed as dist
import flambeau.nn as nn
from flambeau._dynamo import config
from flambeau._dynamo.backends.registry import lookup_backend
from flambeau.distributed.algorithms.ddp_comm_hooks import default_hooks
from flambeau.nn.parallel import DistributedDataParallel as DDP

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from training import step_and_mean_loss  # noqa: E402

out_dir = sys.argv[1]
dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
WIDTH, LAYERS, STEPS, BATCH = 32, 4, 3, 4
LAYER_BYTES = (WIDTH * WIDTH + WIDTH) * 4           # one Linear's float32 weight and bias: one bucket each
res = {}


def batch(step):
    g = np.random.default_rng(300 + step)
    x = g.standard_normal((BATCH * world, WIDTH)).astype(np.float32)
    y = g.standard_normal((BATCH * world, WIDTH)).astype(np.float32)
    return torch.from_numpy(x[rank * BATCH:(rank + 1) * BATCH]), torch.from_numpy(y[rank * BATCH:(rank + 1) * BATCH])


def train(tag, compiled, optimize_ddp=True, inner=False, subgraph_buckets=1):
    torch.manual_seed(0)
    model = nn.Sequential(*[m for _ in range(LAYERS) for m in (nn.Linear(WIDTH, WIDTH), nn.Tanh())])
    graphs = []

    def counting_aot_eager(gm, example_inputs):
        graphs.append(gm)
        return lookup_backend("aot_eager")(gm, example_inputs)
    wrapped = torch.compile(model, backend=counting_aot_eager) if inner else model
    ddp = DDP(wrapped, bucket_cap_mb=LAYER_BYTES / 2 ** 20)
    events = []

    def recording_allreduce(state, bucket):
        events.append("bucket")
        return default_hooks.allreduce_hook(state, bucket)
    ddp.register_comm_hook(None, recording_allreduce)
    config.optimize_ddp, config.ddp_subgraph_buckets = optimize_ddp, subgraph_buckets
    try:
        run = torch.compile(ddp, backend=counting_aot_eager) if compiled and not inner else ddp
        opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
        losses = []
        for step in range(STEPS):
            x, y = batch(step)
            x.requires_grad_(True)
            x.register_hook(lambda g: events.append("input_grad"))
            events.clear()
            loss = ((run(x) - y) ** 2).mean()
            losses.append(step_and_mean_loss(loss, opt, dist))
    finally:
        config.optimize_ddp, config.ddp_subgraph_buckets = True, default_subgraph_buckets
    res[f"{tag}/graphs"] = np.array(len(graphs))
    res[f"{tag}/losses"] = np.array(losses)
    res[f"{tag}/events"] = np.array(events)
    for k, v in model.state_dict().items():
        res[f"{tag}/final/{k}"] = v.numpy().copy()


default_subgraph_buckets = config.ddp_subgraph_buckets
train("eager", False)
train("split2", True, subgraph_buckets=2)
train("split", True)
train("whole", True, optimize_ddp=False)
train("inner", True, inner=True)
train("inner_whole", True, optimize_ddp=False, inner=True)
res["active_after_training"] = np.array(DDP._get_active_ddp_module() is None)
failing = DDP(nn.Linear(WIDTH, 1))
try:
    failing(torch.zeros(2, WIDTH + 1))           # a shape error inside DDP's forward
except RuntimeError:
    pass
res["active_after_an_error"] = np.array(DDP._get_active_ddp_module() is None)
np.savez(os.path.join(out_dir, f"rank{rank}.npz"), **res)
dist.destroy_process_group()
