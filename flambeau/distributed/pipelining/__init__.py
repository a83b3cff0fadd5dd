"""torch.distributed.pipelining: a model cut into stages on consecutive ranks, microbatches flowing through.

`pipeline(model, mb_args, split_spec={"layers.2": SplitPoint.BEGINNING})` (or `pipe_split()` calls in
forward) cuts a model into stages (_IR.py); `PipelineStage(submodule, stage_index, num_stages, device)`
wraps one stage, by hand or from `Pipe.build_stage` (stage.py); `ScheduleGPipe`, `Schedule1F1B` and
`ScheduleInterleaved1F1B` run the microbatches' forwards and backwards in their orders (schedules.py):
`step(x)` on the first stage, `step(target=y, losses=[])` on the last.
"""
from __future__ import annotations

from ._IR import Pipe, SplitPoint, pipe_split, pipeline
from .schedules import PipelineScheduleSingle, Schedule1F1B, ScheduleGPipe, ScheduleInterleaved1F1B
from .stage import PipelineStage

__all__ = ["pipeline", "Pipe", "SplitPoint", "pipe_split", "PipelineStage", "PipelineScheduleSingle",
           "ScheduleGPipe", "Schedule1F1B", "ScheduleInterleaved1F1B"]
