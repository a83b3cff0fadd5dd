"""Running one step of a checkpoint on every rank and agreeing on its outcome (PyTorch's `_DistWrapper`).

Each rank runs its part of a step; the results (or the exception) are all-gathered, so a failure on any
rank raises `CheckpointException` on every rank instead of leaving the others waiting in a collective.
Without an initialized process group (or with `no_dist=True`) the step runs alone as rank 0 of 1.
"""
from __future__ import annotations

import pickle
from typing import Callable

from .. import collectives as C
from .. import distributed_c10d as c10d
from .metadata import CheckpointException


class DistWrapper:
    """The ranks taking part in a save or load: `rank`, `world_size`, `is_coordinator` (rank 0)."""

    def __init__(self, process_group=None, no_dist: bool = False) -> None:
        self.use_dist = not no_dist and c10d.is_initialized()
        self.group = process_group
        self.rank = c10d.get_rank(process_group) if self.use_dist else 0
        self.world_size = c10d.get_world_size(process_group) if self.use_dist else 1
        self.is_coordinator = self.rank == 0

    def all_gather(self, step: str, fn: Callable[[], object]) -> list:
        """Every rank's `fn()`; CheckpointException(step, failures) on every rank if any rank raised."""
        try:
            mine = ("ok", fn())
        except Exception as e:  # noqa: BLE001  reported to every rank, then raised there
            mine = ("error", _portable(e))
        if self.use_dist:
            gathered: list = [None] * self.world_size
            C.all_gather_object(gathered, mine, group=self.group)
        else:
            gathered = [mine]
        failures = {r: v for r, (tag, v) in enumerate(gathered) if tag == "error"}
        if failures:
            raise CheckpointException(step, failures)
        return [v for _, v in gathered]


def _portable(e: Exception) -> Exception:
    """The exception itself when it pickles (to travel to the other ranks), else a RuntimeError naming it."""
    try:
        pickle.loads(pickle.dumps(e))
        return e
    except Exception:  # noqa: BLE001  anything unpicklable is described instead
        return RuntimeError(f"{type(e).__name__}: {e}")
