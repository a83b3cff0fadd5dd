"""Distributed checkpoint workers: `dcp.py MODE FOLDER OUT` under the launcher; the test imports the references.

save:   every rank saves its pieces of `state(version=1)` (a replicated tensor, row-, column- and block-sharded
        tensors, bfloat16, a 0-d tensor, plain values) to FOLDER/ckpt, then async_save's the same to
        FOLDER/async and changes its tensors in place before waiting for the future.
load:   every rank loads FOLDER/ckpt into pieces sharded another way (rows <-> columns, the replicated tensor
        sharded) and writes what it got, with offsets, to OUT/rank<R>.npz.
kill:   save version 1 to FOLDER/ckpt, then version 2 where rank 1 is SIGKILLed right after writing its shard.
"""
import math
import os
import signal
import sys

import numpy as np

import flambeau
import flambeau.distributed as dist
import flambeau.distributed.checkpoint as dcp

SHAPES = {"model.rep": ((5, 4), "float32"), "model.rows": ((10, 3), "float32"), "model.cols": ((4, 9), "float64"),
          "model.grid": ((6, 7), "float32"), "model.half": ((7,), "bfloat16"), "model.scalar": ((), "int64")}
SAVE_SPLIT = {"model.rep": None, "model.rows": (0,), "model.cols": (1,), "model.grid": (0, 1),
              "model.half": (0,), "model.scalar": None}
LOAD_SPLIT = {"model.rep": (0,), "model.rows": (1,), "model.cols": (0,), "model.grid": (1, 0),
              "model.half": (0,), "model.scalar": None}
VALUES = {"step": 7, "name": "run", "betas": (0.9, 0.999)}


def reference(key: str, version: int) -> np.ndarray:
    """The global tensor `key` of checkpoint `version` (float64 values exact in every dtype used)."""
    shape, _ = SHAPES[key]
    n = math.prod(shape)
    return (np.arange(n, dtype=np.float64).reshape(shape) + 100 * version + len(key)) / 4


def _bounds(n: int, parts: int, i: int) -> tuple:
    """torch.chunk's piece i of n elements in `parts` pieces: (start, stop), possibly empty."""
    size = -(-n // parts)
    return min(n, i * size), min(n, (i + 1) * size)


def grid_of(world: int, dims: tuple) -> tuple:
    """How many parts each split dimension gets: the world over one dim, or over two as a grid."""
    if len(dims) == 1:
        return (world,)
    first = 2 if world % 2 == 0 else world
    return (first, world // first)


def region(key: str, dims, rank: int, world: int) -> tuple:
    """(offsets, sizes) of `rank`'s piece of `key` when split over `dims` (None: the whole tensor)."""
    shape, _ = SHAPES[key]
    offsets, sizes = [0] * len(shape), list(shape)
    if dims:
        parts = grid_of(world, dims)
        coords = np.unravel_index(rank, parts)
        for d, p, c in zip(dims, parts, coords):
            lo, hi = _bounds(shape[d], p, int(c))
            offsets[d], sizes[d] = lo, hi - lo
    return tuple(offsets), tuple(sizes)


def state(rank: int, world: int, version: int, split: dict, fill: bool = True) -> dict:
    model = {}
    for key, (shape, dtype) in SHAPES.items():
        offsets, sizes = region(key, split[key], rank, world)
        window = tuple(slice(o, o + s) for o, s in zip(offsets, sizes))
        full = reference(key, version) if fill else np.zeros(shape)
        piece = flambeau.tensor(full[window]).to(getattr(flambeau, dtype))
        name = key.split(".")[1]
        model[name] = piece if split[key] is None else dcp.LocalChunk(piece, shape, offsets)
    extra = dict(VALUES) if fill else {"step": 0, "name": "", "betas": (0.0, 0.0)}
    extra["mixed"] = [flambeau.full((3,), float(version) if fill else 0.0), version if fill else 0]
    return {"model": model, "extra": extra}


class DyingWriter(dcp.FileSystemWriter):
    """Rank 1 dies (SIGKILL) as soon as its shard is on disk, before the save can commit."""

    def write_data(self, rank, save_id, arrays):
        name = super().write_data(rank, save_id, arrays)
        if rank == 1:
            os.kill(os.getpid(), signal.SIGKILL)
        return name


def main(mode: str, folder: str, out: str) -> None:
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    ckpt = os.path.join(folder, "ckpt")
    if mode == "save":
        dcp.save(state(rank, world, 1, SAVE_SPLIT), checkpoint_id=ckpt)
        sd = state(rank, world, 2, SAVE_SPLIT)
        future = dcp.async_save(sd, checkpoint_id=os.path.join(folder, "async"))
        with flambeau.no_grad():
            for leaf in sd["model"].values():
                (leaf.tensor if isinstance(leaf, dcp.LocalChunk) else leaf).add_(1000)
        future.result()
    elif mode == "load":
        sd = state(rank, world, 0, LOAD_SPLIT, fill=False)
        dcp.load(sd, checkpoint_id=ckpt)
        res = {}
        for name, leaf in sd["model"].items():
            piece = leaf.tensor if isinstance(leaf, dcp.LocalChunk) else leaf
            res[f"model.{name}"] = piece.to(flambeau.float64).numpy()
            res[f"model.{name}/offsets"] = np.array(leaf.offsets if isinstance(leaf, dcp.LocalChunk)
                                                    else [0] * piece.dim(), dtype=np.int64)
        res["extra.step"], res["extra.name"] = sd["extra"]["step"], sd["extra"]["name"]
        res["extra.betas"], res["extra.mixed"] = np.array(sd["extra"]["betas"]), sd["extra"]["mixed"][0].numpy()
        np.savez(os.path.join(out, f"rank{rank}.npz"), **res)
    elif mode == "kill":
        dcp.save(state(rank, world, 1, SAVE_SPLIT), checkpoint_id=ckpt)
        dcp.save(state(rank, world, 2, SAVE_SPLIT), storage_writer=DyingWriter(ckpt))
    dist.destroy_process_group()


if __name__ == "__main__":
    main(*sys.argv[1:4])
