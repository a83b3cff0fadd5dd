"""`flambeau.autograd.profiler`: PyTorch's legacy profiler API (`profile`, `record_function`) over
`flambeau.profiler`: `with profile(record_shapes=...) as prof: ...; prof.key_averages().table()`."""
from __future__ import annotations

from ..profiler import EventList, FunctionEvent, FunctionEventAvg, ProfilerActivity, record_function  # noqa: F401
from .. import profiler as _profiler


class profile(_profiler.profile):
    """`torch.autograd.profiler.profile(enabled=True, *, use_cuda=False, record_shapes=False, ...)`: records
    from `__enter__` to `__exit__` (nothing when not `enabled`)."""

    def __init__(self, enabled: bool = True, *, use_cuda: bool = False, use_device: str | None = None,
                 record_shapes: bool = False, with_flops: bool = False, profile_memory: bool = False,
                 with_stack: bool = False, with_modules: bool = False, use_kineto: bool = False,
                 use_cpu: bool = True, experimental_config=None, acc_events: bool = False, custom_trace_id_callback=None):
        acts = ({ProfilerActivity.CPU} if use_cpu else set()) | (
            {ProfilerActivity.CUDA} if use_cuda or use_device == "cuda" else set())
        super().__init__(activities=acts, record_shapes=record_shapes, profile_memory=profile_memory,
                         with_stack=with_stack, with_flops=with_flops, with_modules=with_modules)
        self.enabled = enabled

    def __enter__(self):
        if self.enabled:
            self.start()
        return self

    def __exit__(self, *exc) -> bool:
        if self.enabled:
            self.stop()
        return False

    @property
    def function_events(self) -> EventList:
        return self.events()

    def self_cpu_time_total(self) -> float:
        return sum(e.self_cpu_time_total for e in self._saved)
