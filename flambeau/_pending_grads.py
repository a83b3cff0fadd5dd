"""Parameter gradients whose last writes may still be running when backward returns.

DistributedDataParallel averages gradients in place, bucket by bucket, while backward goes on. The buckets
that complete with the last gradients backward computes (GPT-2's: the tied embedding's) are still being
reduced when backward returns; rather than making the compute stream wait for them there, the reducer lists
their parameters here (`defer`), so that the optimizer can first update the parameters whose reductions
have finished and only then wait for the rest: its kernels overlap the last reductions.

Whatever reads, replaces or adds into a listed parameter's `.grad` settles it first (`settle`): the Tensor
`grad` property (which `zero_grad`, the optimizers and clip_grad_norm_ read), AccumulateGrad, deepcopy; a
settle runs the group's wait (on cuda the current
stream waits for the reduction's event, the host goes on) and drops every parameter of the group from the
list. Optimizers ask `partition` which of their parameters are settled already, update those, then settle
and update the others. Nothing here imports: it sits below the tensor layer, which calls it."""
from __future__ import annotations

waits: dict = {}        # id(parameter) -> the Pending group it belongs to (the group holds the parameter)


class Pending:
    """Parameters whose gradients become final once `wait()` has run; `order` ranks groups by when their
    reductions complete (lower first), so that `partition` settles them in that order."""
    __slots__ = ("params", "order", "wait", "done")

    def __init__(self, params: list, order: int, wait) -> None:
        self.params, self.order, self.wait, self.done = params, order, wait, False

    def settle(self) -> None:
        if self.done:
            return
        self.done = True
        for p in self.params:
            if waits.get(id(p)) is self:
                del waits[id(p)]
        self.wait()


def defer(group: Pending) -> None:
    """List `group`'s parameters: their gradients are final once `group.wait()` has run."""
    for p in group.params:
        old = waits.get(id(p))
        if old is not None:          # (a group never left unsettled: the reducer settles before it defers)
            old.settle()
        waits[id(p)] = group


def settle(t) -> None:
    """Make `t.grad` final (a no-op for a tensor not listed)."""
    group = waits.get(id(t))
    if group is not None:
        group.settle()


def settle_all() -> None:
    for group in sorted(set(waits.values()), key=lambda g: g.order):
        group.settle()


def partition(params: list) -> list:
    """`params` cut into the order their gradients become final: [(None, the settled ones)], then
    (group, its parameters among `params`) for each pending group by its order. Each list keeps the
    order of `params`; a caller settles each group just before using that group's gradients."""
    ready, pending = [], {}
    for p in params:
        group = waits.get(id(p))
        if group is None:
            ready.append(p)
        else:
            pending.setdefault(group, []).append(p)
    return [(None, ready)] + sorted(pending.items(), key=lambda kv: kv[0].order)
