"""Pipelining workers: `pipeline.py OUT` under the launcher, any world size W.

The model (`build`, also used by the test to rebuild it in PyTorch) is cut by `pipeline()` into W stages for
ScheduleGPipe and Schedule1F1B and into 2W for ScheduleInterleaved1F1B (stage s on rank s % W), plus W
stages made by hand (`PipelineStage` on slices of an nn.Sequential) for GPipe. Each schedule runs one step
of N_MICROBATCHES microbatches from the same weights; every rank writes the gradients it got, the last
rank its per-microbatch losses and merged output, to OUT/<schedule>_rank<R>.npz; rank 0 writes the weights.
"""
import os
import sys

import numpy as np

import flambeau
import flambeau.distributed as dist
from flambeau.distributed.pipelining import (PipelineStage, Schedule1F1B, ScheduleGPipe, ScheduleInterleaved1F1B,
                                             SplitPoint, pipe_split, pipeline)

N_BLOCKS, WIDTH, N_MICROBATCHES, BATCH = 8, 6, 4, 10


def data():
    g = np.random.default_rng(7)
    return g.standard_normal((BATCH, 3)).astype(np.float32), g.standard_normal((BATCH, 2)).astype(np.float32)


def build(nn, F):
    """The test model for the library `nn`/`F` (flambeau or torch): a skip connection crosses every cut."""

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = nn.Linear(WIDTH, WIDTH)

        def forward(self, x):
            return F.tanh(self.lin(x)) + x

    class Model(nn.Module):
        def __init__(self, split=lambda: None):
            super().__init__()
            self.emb = nn.Linear(3, WIDTH)
            self.layers = nn.ModuleList([Block() for _ in range(N_BLOCKS)])
            self.head = nn.Linear(WIDTH, 2)
            self.split = split

        def forward(self, x):
            first = self.emb(x)
            h = first
            for i, layer in enumerate(self.layers):
                h = layer(h)
                if i == 0:
                    self.split()                 # a pipe_split() marker: the first cut is after block 0
            return self.head(h * first)
    return Model


def _split_spec(stages: int) -> dict:
    """Cuts after block 0 (pipe_split) and before evenly spaced blocks, `stages` stages in all."""
    starts = [1 + round(i * (N_BLOCKS - 1) / (stages - 1)) for i in range(1, stages - 1)]
    return {f"layers.{b}": SplitPoint.BEGINNING for b in starts}


def loss_fn(out, target):
    return ((out - target) ** 2).mean()


def run(out_dir, name, stages, schedule, model):
    x, y = (flambeau.from_numpy(a) for a in data())
    model.zero_grad()
    rank = dist.get_rank()
    losses = []
    first, last = any(s.is_first for s in stages), any(s.is_last for s in stages)
    if first and last:
        result = schedule.step(x, target=y, losses=losses)
    elif first:
        result = schedule.step(x)
    elif last:
        result = schedule.step(target=y, losses=losses)
    else:
        result = schedule.step()
    res = {f"grad/{k}": p.grad.numpy() for k, p in model.named_parameters() if p.grad is not None}
    if losses:
        res["losses"] = np.array([float(v) for v in losses])
        res["output"] = result.numpy()
    np.savez(os.path.join(out_dir, f"{name}_rank{rank}.npz"), **res)


def main(out_dir):
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    model_cls = build(flambeau.nn, flambeau)
    flambeau.manual_seed(0)
    model = model_cls(pipe_split)
    if rank == 0:
        np.savez(os.path.join(out_dir, "weights.npz"), **{k: v.numpy() for k, v in model.state_dict().items()})
    x, _ = data()
    for name, cls in (("gpipe", ScheduleGPipe), ("1f1b", Schedule1F1B)):
        pipe = pipeline(model, (flambeau.from_numpy(x[:2]),), split_spec=_split_spec(world))
        assert pipe.num_stages == world, pipe.num_stages
        stage = pipe.build_stage(rank)
        run(out_dir, name, [stage], cls(stage, N_MICROBATCHES, loss_fn=loss_fn), model)
    pipe = pipeline(model, (flambeau.from_numpy(x[:2]),), split_spec=_split_spec(2 * world))
    assert pipe.num_stages == 2 * world, pipe.num_stages
    stages = [pipe.build_stage(s) for s in (rank, rank + world)]
    run(out_dir, "interleaved", stages, ScheduleInterleaved1F1B(stages, N_MICROBATCHES, loss_fn=loss_fn), model)
    if world == 2:                               # by hand: the same model as a Sequential split in two
        seq = flambeau.nn.Sequential(model.emb, *model.layers, flambeau.nn.Linear(WIDTH, 2))
        seq[-1].load_state_dict(model.head.state_dict())
        part = seq[:5] if rank == 0 else seq[5:]
        stage = PipelineStage(part, rank, world, flambeau.device("cpu"))
        run(out_dir, "manual", [stage], ScheduleGPipe(stage, N_MICROBATCHES, loss_fn=loss_fn), seq)
    dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1])
