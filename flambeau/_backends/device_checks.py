"""Checks of cuda tensor values that do not synchronise: the error is raised at the next synchronisation.

Reading a device value on the host (`bool(xp.any(bad))`) stalls the host until the GPU has caught up,
once per check. Instead `check_range(xp, x, lo, hi, exc, message)` launches one kernel that tests
lo <= x < hi on the device and, on the first failure, records an error code and the offending value
in a small per-device buffer. The host reads that buffer only where it synchronises anyway
(`raise_pending`, called by `Tensor.item`/`tolist`/`cpu()`, `flambeau.cuda.synchronize` and the
stream/event waits) and raises the check's own exception there, naming the value, like PyTorch's
device-side asserts but with the op's message and without poisoning the context. Out-of-range
indices must not fault meanwhile: the ops that check clamp or wrap their gathers.

On cpu (NumPy) the checks run at once, as before. Message templates take the bad value as `{}`.
"""
from __future__ import annotations

import numpy as np

_SOURCE = r"""
extern "C" __global__ void check_range(const long long* x, long long n, long long lo, long long hi,
                                       long long skip, int use_skip, unsigned long long code,
                                       unsigned long long* err) {
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n;
         i += (long long)gridDim.x * blockDim.x) {
        const long long v = x[i];
        if ((use_skip && v == skip) || (v >= lo && v < hi)) continue;
        if (atomicCAS(err, 0ULL, code) == 0ULL) err[1] = (unsigned long long)v;
        return;
    }
}
"""
THREADS = 256
MAX_BLOCKS = 1024

_module: list = []
_buffers: dict = {}         # device id -> uint64[2] (error code, value) on that device
_flags: dict = {}           # device id -> (int32[1] error flag of compiled graphs, raise(code))
_pending: set = set()       # devices with checks launched since their buffer was last read
_messages: dict = {}        # (exception type, template) -> code (1-based)
_by_code: dict = {}         # code -> (exception type, template)


def _kernel():
    import cupy  # deferred: optional dependency, present only where cuda is used
    if not _module:
        _module.append(cupy.RawModule(code=_SOURCE).get_function("check_range"))
    return _module[0]


def _code(exc, message) -> int:
    code = _messages.get((exc, message))
    if code is None:
        code = _messages[(exc, message)] = len(_messages) + 1
        _by_code[code] = (exc, message)
    return code


def check_range(xp, x, lo: int, hi: int, exc: type, message: str, skip=None) -> None:
    """Raise `exc(message.format(v))` for the first element v of integer array `x` outside [lo, hi)
    (elements equal to `skip` pass): at once on cpu, at the next synchronisation on cuda."""
    if x.size == 0:
        return
    if getattr(xp, "__name__", None) != "cupy":     # cpu and third-party devices: at once
        flat = x.reshape(-1)
        bad = (flat < lo) | (flat >= hi)
        if skip is not None:
            bad &= flat != skip
        if bad.any():
            raise exc(message.format(int(flat[bad][0])))
        return
    import cupy  # deferred: optional dependency, present only where cuda is used
    flat = cupy.ascontiguousarray(x.reshape(-1)).astype(cupy.int64, copy=False)
    dev = flat.device.id
    buf = _buffers.get(dev)
    if buf is None:
        buf = _buffers[dev] = cupy.zeros(2, dtype=cupy.uint64)
    n = flat.size
    blocks = min(MAX_BLOCKS, (n + THREADS - 1) // THREADS)
    _kernel()((blocks,), (THREADS,), (flat, cupy.int64(n), cupy.int64(lo), cupy.int64(hi),
                                       cupy.int64(0 if skip is None else skip), cupy.int32(skip is not None),
                                       cupy.uint64(_code(exc, message)), buf))
    _pending.add(dev)


def error_slot(xp, dev: int, exc: type, message: str):
    """For a kernel on cuda device `dev` that checks its values itself: (the device's uint64[2] error buffer,
    the code of `exc(message)`). On its first failure the kernel stores the code in element 0 if that is 0
    (a compare-and-swap, as `check_range`'s kernel) and then the bad value in element 1; the device is marked
    pending, so the failure is raised at the next synchronisation as `check_range`'s."""
    buf = _buffers.get(dev)
    if buf is None:
        with xp.cuda.Device(dev):
            buf = _buffers[dev] = xp.zeros(2, dtype=xp.uint64)
    _pending.add(dev)
    return buf, _code(exc, message)


def graph_error_flag(xp, dev: int, raise_code):
    """The error flag that compiled graphs' kernels on cuda device `dev` set (an int32 code, 0: no
    error), one per device, zero at rest; the graph calls `flag_pending` after its kernels, and the
    code is raised by `raise_code(code)` at the next synchronisation, as the checks above."""
    f = _flags.get(dev)
    if f is None:
        with xp.cuda.Device(dev):
            f = _flags[dev] = (xp.zeros(1, dtype=xp.int32), raise_code)
    return f[0]


def flag_pending(flag) -> None:
    _pending.add(flag.device.id)


def pending() -> bool:
    """Whether device checks were launched since the last `raise_pending`."""
    return bool(_pending)


def raise_pending() -> None:
    """Read the error buffers of devices with launched checks (a synchronisation) and raise the first
    recorded failure; the buffers are cleared either way."""
    if not _pending:
        return
    devs = sorted(_pending)
    _pending.clear()
    for dev in devs:
        flag = _flags.get(dev)
        if flag is not None:
            code = int(flag[0].get()[0])
            if code:
                flag[0].fill(0)
                flag[1](code)
        buf = _buffers.get(dev)
        if buf is None:
            continue
        code, value = (int(v) for v in buf.get())
        if code:
            buf.fill(0)
            exc, message = _by_code[code]
            raise exc(message.format(int(np.array(value, dtype=np.uint64).astype(np.int64))))
