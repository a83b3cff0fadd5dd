"""Pipeline schedules (PyTorch's `torch.distributed.pipelining.schedules`): the order in which each rank runs
the forward (F) and backward (B) of each microbatch on each of its stages.

`step(*args, target=None, losses=None)`: the first stage gets the whole batch and splits it into
`n_microbatches` along dim 0 (as `tensor_split`); the last stage gets the target, split the same way, applies
`loss_fn` to each microbatch's output and returns the outputs concatenated; `losses` receives the
per-microbatch losses. Gradients accumulate in the parameters' `.grad`; with `scale_grads` (the default) each
microbatch's loss is divided by `n_microbatches` before its backward, so a mean loss gives the gradients of
the unsplit batch. Without `loss_fn` only the forwards run.

Each schedule is a list of actions per rank; one executor runs them: an F receives its inputs (blocking)
and sends its outputs (non-blocking), a B receives its output gradients and sends its input gradients.
Sends never block, so any order consistent with the dependencies is deadlock-free.
- GPipe: all forwards, then all backwards.
- 1F1B: (stages after this one) forwards to fill the pipe, then one forward and one backward alternately,
  then the remaining backwards: at most num_stages activations alive per stage.
- Interleaved 1F1B: several stages per rank (stage s on rank s % world); Megatron's order, as PyTorch writes
  it: warmup forwards round by round over the local stages, then 1F1B, then the remaining backwards.
"""
from __future__ import annotations

from typing import Callable

from ..._ops.shape import cat
from ..._tensor import Tensor
from .stage import PipelineStage

FORWARD, BACKWARD = "F", "B"


def _split(x, n: int) -> list:
    if isinstance(x, Tensor):
        if x.shape[0] < n:
            raise ValueError(f"pipeline schedule: a batch of {x.shape[0]} rows cannot make {n} microbatches")
        return list(x.tensor_split(n, 0))
    return [x] * n


def _merge(outputs: list):
    first = outputs[0]
    if isinstance(first, Tensor):
        return cat([o.detach() for o in outputs], 0)
    if isinstance(first, tuple):
        return tuple(_merge([o[i] for o in outputs]) for i in range(len(first)))
    return outputs


class _Schedule:
    def __init__(self, stages: list, n_microbatches: int, loss_fn: Callable | None, scale_grads: bool) -> None:
        if n_microbatches < 1:
            raise ValueError(f"pipeline schedule: n_microbatches must be positive, got {n_microbatches}")
        self._stages = {s.stage_index: s for s in stages}
        self._n_microbatches, self._loss_fn, self.scale_grads = n_microbatches, loss_fn, scale_grads
        self._num_stages = stages[0].num_stages
        self._group_size, self._rank = stages[0].group_size, stages[0].group_rank

    def _actions(self) -> list:
        raise NotImplementedError

    def step(self, *args, target=None, losses: list | None = None, **kwargs):
        n = self._n_microbatches
        first, last = self._stages.get(0), self._stages.get(self._num_stages - 1)
        arg_chunks = list(zip(*[_split(a, n) for a in args])) if first is not None and args else [()] * n
        if last is not None and self._loss_fn is not None and target is None:
            raise RuntimeError("pipeline schedule: the last stage needs target= to compute the loss")
        targets = _split(target, n) if target is not None else [None] * n
        mb_losses: dict = {}
        actions = self._actions() if self._loss_fn is not None else \
            [a for a in self._actions() if a[0] == FORWARD]
        for kind, stage_index, mb in actions:
            stage = self._stages[stage_index]
            if kind == FORWARD:
                out = stage.forward_one_chunk(mb, arg_chunks[mb] if stage.is_first else ())
                if stage.is_last and self._loss_fn is not None:
                    mb_losses[mb] = self._loss_fn(out, targets[mb])
            else:
                loss = mb_losses.get(mb) if stage.is_last else None
                stage.backward_one_chunk(mb, loss / n if loss is not None and self.scale_grads else loss)
        for stage in self._stages.values():
            stage.finish_step()
        if losses is not None and last is not None:
            losses.extend(mb_losses[mb].detach() for mb in range(n) if mb in mb_losses)
        if last is not None:
            outputs = [last.outputs.pop(mb) for mb in range(n)]
            return _merge(outputs)
        return None


class PipelineScheduleSingle(_Schedule):
    """A schedule of one stage per rank."""

    def __init__(self, stage: PipelineStage, n_microbatches: int, loss_fn: Callable | None = None,
                 args_chunk_spec=None, kwargs_chunk_spec=None, output_merge_spec=None,
                 scale_grads: bool = True) -> None:
        if stage.num_stages != stage.group_size:
            raise ValueError(f"{type(self).__name__}: {stage.num_stages} stages need {stage.num_stages} ranks, "
                             f"the group has {stage.group_size} (ScheduleInterleaved1F1B runs several per rank)")
        super().__init__([stage], n_microbatches, loss_fn, scale_grads)
        self._stage = stage


class ScheduleGPipe(PipelineScheduleSingle):
    """All forwards, then all backwards."""

    def _actions(self) -> list:
        s, n = self._stage.stage_index, self._n_microbatches
        return [(FORWARD, s, mb) for mb in range(n)] + [(BACKWARD, s, mb) for mb in range(n)]


class Schedule1F1B(PipelineScheduleSingle):
    """Fill the pipe, then alternate one forward and one backward, then drain."""

    def _actions(self) -> list:
        s, n = self._stage.stage_index, self._n_microbatches
        warmup = min(n, self._num_stages - 1 - s)
        actions = [(FORWARD, s, mb) for mb in range(warmup)]
        for i in range(n - warmup):
            actions += [(FORWARD, s, warmup + i), (BACKWARD, s, i)]
        return actions + [(BACKWARD, s, mb) for mb in range(n - warmup, n)]


class ScheduleInterleaved1F1B(_Schedule):
    """Several stages per rank (stage s on rank s % world), Megatron's interleaved 1F1B order."""

    def __init__(self, stages: list, n_microbatches: int, loss_fn: Callable | None = None,
                 args_chunk_spec=None, kwargs_chunk_spec=None, output_merge_spec=None,
                 scale_grads: bool = True) -> None:
        stages = list(stages)
        if not stages:
            raise ValueError("ScheduleInterleaved1F1B: give this rank's stages")
        super().__init__(stages, n_microbatches, loss_fn, scale_grads)
        self._n_local = len(stages)
        if self._num_stages != self._n_local * self._group_size:
            raise ValueError(f"ScheduleInterleaved1F1B: {self._num_stages} stages over {self._group_size} ranks "
                             f"need {self._num_stages // self._group_size} stages on every rank, this one has "
                             f"{self._n_local}")
        if n_microbatches % self._group_size:
            raise ValueError(f"ScheduleInterleaved1F1B: n_microbatches ({n_microbatches}) must be a multiple of "
                             f"the number of ranks ({self._group_size})")

    def _actions(self) -> list:
        world, rank, n, local = self._group_size, self._rank, self._n_microbatches, self._n_local
        total = n * local
        warmup = min(total, (local - 1) * world + 2 * (world - 1 - rank))
        steady = total - warmup

        def forward_stage(step: int) -> int:
            return ((step // world) % local) * world + rank

        def backward_stage(step: int) -> int:
            return (local - 1 - ((step - warmup) // world) % local) * world + rank

        next_f: dict = {}
        next_b: dict = {}
        actions = []

        def add(kind, stage, counters):
            counters[stage] = counters.get(stage, 0) + 1
            actions.append((kind, stage, counters[stage] - 1))

        for step in range(warmup):
            add(FORWARD, forward_stage(step), next_f)
        for i in range(steady):
            add(FORWARD, forward_stage(warmup + i), next_f)
            add(BACKWARD, backward_stage(warmup + i), next_b)
        for i in range(warmup):
            add(BACKWARD, backward_stage(warmup + steady + i), next_b)
        return actions
