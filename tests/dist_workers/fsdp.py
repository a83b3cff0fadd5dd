"""FSDP2 on every rank (float64): a 2-block model sharded per block and at the root trains on this rank's
slice of each batch (data parallel), with reshard_after_forward True and False, with gradient sync
skipped on a first micro-batch, and in mixed precision (bfloat16 compute, float32 reduction); losses,
final weights and what the forward saw to <out>/rank<R>.npz. A PyTorch script run on flambeau."""
import os
import sys

import numpy as np
import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import FSDPModule, MixedPrecisionPolicy, fully_shard
from torch.distributed.tensor import DTensor

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from tp_models import B, STEPS, TIED_GPT, build_model, fsdp_batch, tied_batch  # noqa: E402
from training import step_and_mean_loss  # noqa: E402
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

out_dir = sys.argv[1]
if sys.argv[2:] == ["batched"]:     # the cuda path's batched copies, on host arrays
    import host_batched
    host_batched.install()
dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
mesh = init_device_mesh("cpu", (world,))
res = {}


Model = build_model(torch)


def data(step):
    x, y = fsdp_batch(torch, step, world)
    return x[rank * B:(rank + 1) * B], y[rank * B:(rank + 1) * B]


def train(tag, reshard, mp=None, dtype=torch.float64, accumulate=False, unused=False):
    torch.manual_seed(0)
    model = Model().to(dtype)
    if unused:                       # a root parameter that never gets a gradient
        model.extra = torch.nn.Linear(3, 2).to(dtype)
    for k, v in model.state_dict().items():
        res[f"{tag}/init/{k}"] = v.float().numpy().astype(np.float64) if dtype != torch.float64 else v.numpy().copy()
    kw = {"mp_policy": mp} if mp is not None else {}
    for b in model.blocks:
        fully_shard(b, mesh=mesh, reshard_after_forward=reshard, **kw)
    fully_shard(model, mesh=mesh, reshard_after_forward=reshard, **kw)
    res[f"{tag}/sharded"] = np.array(all(isinstance(p, DTensor) for p in model.parameters()))
    res[f"{tag}/is_fsdp"] = np.array(isinstance(model, FSDPModule) and isinstance(model.blocks[0], FSDPModule))
    seen = []
    model.blocks[0].q.register_forward_hook(lambda m, a, o: seen.append((str(m.weight.dtype), type(m.weight).__name__,
                                                                         tuple(m.weight.shape))))
    opt = torch.optim.AdamW(model.parameters(), lr=0.01)
    losses = []
    for step in range(STEPS):
        x, y = data(step)
        if accumulate:
            model.set_requires_gradient_sync(False)
            half = B // 2
            ((model(x[:half]) - y[:half]) ** 2).mean().mul(0.5).backward()
            model.set_requires_gradient_sync(True)
            out, yy = model(x[half:]), y[half:]
            loss = ((out - yy) ** 2).mean().mul(0.5)
        else:
            out = model(x)
            loss = ((out - y) ** 2).mean()
        opt.zero_grad() if not accumulate else None
        loss.backward()
        res[f"{tag}/grad_layout"] = np.array(str(model.head.weight.grad.placements))
        res[f"{tag}/dtypes"] = np.array(f"{model.head.weight.dtype},{model.head.weight.grad.dtype}")
        opt.step()
        if accumulate:
            opt.zero_grad()
        total = loss.detach().double().clone()
        dist.all_reduce(total, op=dist.ReduceOp.AVG)
        losses.append(total.item())
    res[f"{tag}/losses"] = np.array(losses)
    res[f"{tag}/seen"] = np.array([",".join(map(str, s)) for s in seen[:1]])
    for k, p in model.named_parameters():
        res[f"{tag}/final/{k}"] = p.full_tensor().detach().double().numpy()


timeline = []


def record_reduce_scatter(real):
    def reduce_scatter(*args, **kwargs):
        work = real(*args, **kwargs)
        timeline.append("reduce_scatter started")
        wait = work.wait

        def recorded_wait(*a, **k):
            timeline.append("reduce_scatter waited")
            return wait(*a, **k)
        work.wait = recorded_wait
        return work
    return reduce_scatter


def overlap():
    """The order of events in one step: all-gathers, reduce-scatters started, the input's gradient computed
    (the last node of backward), reduce-scatters waited for."""
    fs = torch.distributed.fsdp._fully_shard
    real, real_gather = fs.reduce_scatter_tensor, fs.all_gather_into_tensor
    fs.reduce_scatter_tensor = record_reduce_scatter(real)
    fs.all_gather_into_tensor = lambda *a, **k: timeline.append("all_gather") or real_gather(*a, **k)
    try:
        torch.manual_seed(0)
        model = Model().double()
        for b in model.blocks:
            fully_shard(b, mesh=mesh)
        fully_shard(model, mesh=mesh)
        x, y = data(0)
        x = x.clone().requires_grad_()
        x.register_hook(lambda g: timeline.append("input gradient"))
        ((model(x) - y) ** 2).mean().backward()
    finally:
        fs.reduce_scatter_tensor, fs.all_gather_into_tensor = real, real_gather
    res["overlap/timeline"] = np.array(timeline)


def tied():
    """The small GPT (lm_head's weight is wte's) sharded per block and at the root: the tie must hold."""
    from bench import gpu_models
    torch.manual_seed(0)
    model = gpu_models.gpt(torch, **TIED_GPT).double()
    for k, v in model.state_dict().items():
        res[f"tied/init/{k}"] = v.numpy().copy()
    for b in model.h:
        fully_shard(b, mesh=mesh)
    fully_shard(model, mesh=mesh)
    res["tied/still_tied"] = np.array(model.lm_head.weight is model.wte.weight)
    opt = torch.optim.AdamW(model.parameters(), lr=0.01)
    losses = []
    for step in range(STEPS):
        idx, tgt = (torch.from_numpy(a[rank * B:(rank + 1) * B]) for a in tied_batch(step, world))
        losses.append(step_and_mean_loss(model(idx, tgt), opt, dist))
    res["tied/losses"] = np.array(losses)


train("reshard", True)
train("unused", True, unused=True)
tied()
overlap()
train("keep", False)
train("accumulate", True, accumulate=True)
train("mixed", True, mp=MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32),
      dtype=torch.float32)
np.savez(os.path.join(out_dir, f"rank{rank}.npz"), **res)
dist.destroy_process_group()
