"""flambeau.cuda: device queries, synchronisation, RNG seeding, memory statistics, streams and
events, over CuPy. Everything answers sensibly (False, 0) on a machine without a GPU.

Memory statistics come from an allocator installed on CuPy's default memory pool that records
the peak of bytes in use (PyTorch's caching allocator reports the same two numbers); the allocator
belongs to the cuda backend (`flambeau._backends`), the current device index to `flambeau._state`.
The synchronising calls raise what device-side checks recorded (`_backends.device_checks`).
"""
from __future__ import annotations

import gc
import sys


from .. import _backends, _state
from .._backends.cuda_graphs import CupyGraphs
from .._backends import (OutOfMemoryError, cupy_available, device_checks, extra_bytes,  # noqa: F401
                         install_cuda_allocator, peak_bytes, reset_peak_bytes)
from .._device import cuda_index as _index, device as _Device, device as Device
from ..random import generator_for
from .._tensor_types import CUDA_TYPES

globals().update(CUDA_TYPES)       # torch.cuda.FloatTensor, torch.cuda.LongTensor, ...


def _cupy():
    try:
        import cupy  # deferred: optional dependency, present only where cuda is used
    except ImportError as e:
        raise RuntimeError("Torch not compiled with CUDA enabled (flambeau needs CuPy for cuda)") from e
    return cupy


def is_available() -> bool:
    return cupy_available()


def device_count() -> int:
    return _backends.cuda_device_count()


def current_device() -> int:
    return _state.cuda_device


def set_device(device) -> None:
    _state.cuda_device = _index(device)
    _state.cuda_device_chosen = True
    _cupy().cuda.Device(_state.cuda_device).use()


class device:
    """`with flambeau.cuda.device(1):` selects the current cuda device."""

    def __init__(self, device):
        self.idx = _index(device)

    def __enter__(self):
        self.prev = _state.cuda_device
        set_device(self.idx)

    def __exit__(self, *a):
        set_device(self.prev)


def get_device_name(device=None) -> str:
    props = _cupy().cuda.runtime.getDeviceProperties(_index(device))
    name = props["name"]
    return name.decode() if isinstance(name, bytes) else name


def get_device_capability(device=None) -> tuple:
    props = _cupy().cuda.runtime.getDeviceProperties(_index(device))
    return (props["major"], props["minor"])


def synchronize(device=None) -> None:
    if not is_available():
        return
    cp = _cupy()
    with cp.cuda.Device(_index(device)):
        cp.cuda.Device().synchronize()
    device_checks.raise_pending()


def manual_seed(seed: int) -> None:
    generator_for(_Device("cuda", _state.cuda_device)).manual_seed(seed)


def manual_seed_all(seed: int) -> None:
    for i in range(max(device_count(), 1)):
        generator_for(_Device("cuda", i)).manual_seed(seed)


def _generator(device):
    return generator_for(Device("cuda", _index(device)))


def get_rng_state(device="cuda"):
    """The cuda generator's state as a uint8 cpu tensor (works without a GPU: the state is host-side)."""
    return _generator(device).get_state()


def set_rng_state(new_state, device="cuda") -> None:
    _generator(device).set_state(new_state)


def get_rng_state_all() -> list:
    return [get_rng_state(i) for i in range(device_count())]


def set_rng_state_all(new_states) -> None:
    for i, state in enumerate(new_states):
        set_rng_state(state, i)


def memory_allocated(device=None) -> int:
    if not is_available():
        return 0
    install_cuda_allocator()
    cp = _cupy()
    with cp.cuda.Device(_index(device)):
        return int(cp.get_default_memory_pool().used_bytes()) + extra_bytes.get(_index(device), 0)


def max_memory_allocated(device=None) -> int:
    if not is_available():
        return 0
    install_cuda_allocator()
    return int(max(peak_bytes.get(_index(device), 0), memory_allocated(device)))


def reset_peak_memory_stats(device=None) -> None:
    reset_peak_bytes(_index(device), memory_allocated(device))


def memory_reserved(device=None) -> int:
    if not is_available():
        return 0
    cp = _cupy()
    with cp.cuda.Device(_index(device)):
        return int(cp.get_default_memory_pool().total_bytes()) + extra_bytes.get(_index(device), 0)


def empty_cache() -> None:
    """Release the pool's cached blocks (and kept workspaces) to the driver, after a collection of cyclic
    garbage, which flambeau's raised collector threshold (`flambeau._gc`) lets live longer."""
    if is_available():
        gc.collect()
        cudnn = sys.modules.get("flambeau._backends.cudnn")    # (not loaded: no convolution kept a workspace)
        if cudnn is not None:
            cudnn.release_workspaces()        # the kept large convolution workspaces, then the pool's free blocks
        bn = sys.modules.get("flambeau._backends.triton_batch_norm")
        if bn is not None:
            bn.release_scratch()              # the BatchNorm calls' kept partial-statistics buffers
        _cupy().get_default_memory_pool().free_all_blocks()


class Stream:
    """A CUDA stream; ops issued inside `with flambeau.cuda.stream(s)` are queued on it."""

    def __init__(self, device=None, priority=0, _cp=None):
        cp = _cupy()
        with cp.cuda.Device(_index(device)):
            self._s = _cp if _cp is not None else cp.cuda.Stream(non_blocking=True)
        self.device_index = _index(device)

    def synchronize(self) -> None:
        self._s.synchronize()
        device_checks.raise_pending()

    def query(self) -> bool:
        return self._s.done

    def wait_event(self, event) -> None:
        self._s.wait_event(event._e)

    def wait_stream(self, stream) -> None:
        self.wait_event(stream.record_event())

    def record_event(self, event=None):
        event = event or Event()
        event.record(self)
        return event

    @property
    def cuda_stream(self) -> int:
        return self._s.ptr

    def __enter__(self):
        self._s.__enter__()
        return self

    def __exit__(self, *a):
        self._s.__exit__(*a)


class StreamContext:
    """`with StreamContext(s)`: ops inside are queued on stream `s` (no-op for None)."""

    def __init__(self, stream: Stream | None) -> None:
        self.stream = stream

    def __enter__(self) -> Stream | None:
        if self.stream is not None:
            self.stream.__enter__()
        return self.stream

    def __exit__(self, *exc) -> None:
        if self.stream is not None:
            self.stream.__exit__(*exc)


def stream(s: Stream | None) -> StreamContext:
    return StreamContext(s)


def current_stream(device=None) -> Stream:
    return Stream(device, _cp=_cupy().cuda.get_current_stream())


def default_stream(device=None) -> Stream:
    return Stream(device, _cp=_cupy().cuda.Stream.null)


class Event:
    def __init__(self, enable_timing=False, blocking=False, interprocess=False):
        self._e = _cupy().cuda.Event(block=blocking, disable_timing=not enable_timing)

    def record(self, stream=None) -> None:
        self._e.record(stream._s if stream is not None else None)

    def synchronize(self) -> None:
        self._e.synchronize()
        device_checks.raise_pending()

    def query(self) -> bool:
        return self._e.done

    def wait(self, stream=None) -> None:
        (stream or current_stream()).wait_event(self)

    def elapsed_time(self, end) -> float:
        return float(_cupy().cuda.get_elapsed_time(self._e, end._e))


def is_initialized() -> bool:
    """Whether this process has used cuda through flambeau yet (a device chosen, or memory taken): PyTorch's
    lazy initialisation, which a DeviceMesh reads to decide whether to pick the process's device itself."""
    return _state.cuda_device_chosen or bool(_backends._allocator_installed)


def init() -> None:
    if is_available():
        install_cuda_allocator()


class CUDAGraph:
    """torch.cuda.CUDAGraph: work queued between `capture_begin()` and `capture_end()` is recorded
    (not run) and `replay()` runs it again on the current stream. Memory allocated while capturing
    comes from the graph's private pool (`pool()`, which another capture may share) and keeps its
    address: write new inputs into tensors made before or during the capture, read results from
    tensors made during it. Built on `flambeau._backends.cuda_graphs` (CuPy stream capture, relaxed
    mode: `capture_error_mode` is accepted and not used)."""

    def __init__(self, keep_graph: bool = False) -> None:
        self._graph = None
        self._backend = None

    def capture_begin(self, pool=None, capture_error_mode: str = "global") -> None:
        self._backend = pool if pool is not None else CupyGraphs(Device("cuda", current_device()))
        self._backend.begin([])

    def capture_end(self) -> None:
        self._graph = self._backend.end()

    def _abandon(self) -> None:
        self._backend.end(failed=True)

    def replay(self) -> None:
        if self._graph is None:
            raise RuntimeError("CUDAGraph.replay: nothing was captured (capture_begin() ... capture_end() first)")
        self._backend.launch(self._graph)

    def reset(self) -> None:
        self._graph = None

    def pool(self):
        """The memory pool handle: pass it as `pool=` to share this graph's memory with another capture."""
        return self._backend


def graph_pool_handle():
    """A new memory pool for captures to share (`graph(..., pool=graph_pool_handle())`)."""
    return CupyGraphs(Device("cuda", current_device()))


class graph:
    """`with flambeau.cuda.graph(g):` captures the block into CUDAGraph `g` (synchronises the device
    first, as PyTorch). `stream=` is accepted; capture runs on the pool's own stream."""

    def __init__(self, cuda_graph: CUDAGraph, pool=None, stream=None, capture_error_mode: str = "global") -> None:
        self.cuda_graph = cuda_graph
        self.pool = pool
        self.capture_error_mode = capture_error_mode

    def __enter__(self) -> None:
        synchronize()
        self.cuda_graph.capture_begin(self.pool, self.capture_error_mode)

    def __exit__(self, exc_type, *exc) -> None:
        if exc_type is None:
            self.cuda_graph.capture_end()
        else:
            self.cuda_graph._abandon()


def is_current_stream_capturing() -> bool:
    """Whether work on the current stream is being captured into a CUDA graph."""
    return is_available() and bool(_cupy().cuda.get_current_stream().is_capturing())


_BF16_MIN_CAPABILITY = (8, 0)      # Ampere: the first GPUs with bfloat16 tensor cores (PyTorch's test)


def is_bf16_supported(including_emulation: bool = True) -> bool:
    """Whether cuda bfloat16 works here: a GPU of compute capability 8.0 or newer (False without cuda)."""
    return is_available() and get_device_capability() >= _BF16_MIN_CAPABILITY


def is_tf32_supported() -> bool:
    """Whether cuda matmuls can use TF32: the same Ampere-or-newer test (False without cuda)."""
    return is_available() and get_device_capability() >= _BF16_MIN_CAPABILITY
