"""Random number generation: `Generator`, the default generator, `manual_seed`, RNG state.

A Generator wraps a NumPy PCG64 bit generator (cpu) and keeps the seed so CuPy's generator can
be seeded from it on cuda. Bit-equality with PyTorch's Philox/MT streams is not a goal.

RNG state is a uint8 tensor, as PyTorch's (no pickle: a checkpoint loaded with weights_only=True
restores it): `_STATE` packs a tag, the seed, PCG64's 128-bit state and increment and its cached
half-word. A cuda generator draws each call from a fresh CuPy Philox generator seeded from its
host PCG64 stream (PyTorch's cuda state is Philox seed + offset, host-side too), so the host state
alone fixes every later cuda draw: taking a state changes nothing (`fork_rng` with no cuda draw
inside leaves the draws after it as they were), setting one replays the draws that followed it,
in this process or another. CuPy seeds a generator with 32 bits, so two of ~2**16 draws may share
a stream (PyTorch's offsets never repeat).
"""
from __future__ import annotations

import contextlib
import struct
import warnings
from typing import Iterable, Iterator

import numpy as np
from . import _backends
from ._backends import is_cupy
from ._device import canonical, cuda_index, device as Device
from ._tensor import Tensor
from . import _dtype as D
from ._ops.creation import tensor

_STATE_TAG = b"flbrng01"
_STATE = struct.Struct("<8sQQQQQII")   # tag, seed, state lo/hi, inc lo/hi, has_uint32, uinteger
_U64 = 2 ** 64
_CUDA_SEED_LIMIT = 2 ** 63 - 1      # CuPy's raw kernels mishandle seeds with the 64th bit set


class Generator:
    def __init__(self, device="cpu"):
        self.device = canonical(device)
        self._seed = 67280421310721
        self._np = np.random.Generator(np.random.PCG64(self._seed))

    def manual_seed(self, seed: int) -> "Generator":
        seed = int(seed)
        if seed < 0:
            seed &= 0xFFFFFFFFFFFFFFFF
        self._seed = seed
        self._np = np.random.Generator(np.random.PCG64(seed))
        return self

    def seed(self) -> int:
        s = int(np.random.SeedSequence().entropy) & 0xFFFFFFFFFFFFFFFF
        self.manual_seed(s)
        return s

    def initial_seed(self) -> int:
        return self._seed

    def get_state(self):
        """The generator's state as a uint8 cpu tensor of `_STATE.size` bytes."""
        st = self._np.bit_generator.state
        s, inc = st["state"]["state"], st["state"]["inc"]
        raw = _STATE.pack(_STATE_TAG, self._seed, s % _U64, s // _U64, inc % _U64, inc // _U64,
                          st["has_uint32"], st["uinteger"])
        return tensor(np.frombuffer(raw, dtype=np.uint8).copy())

    def set_state(self, new_state) -> "Generator":
        if not isinstance(new_state, Tensor):
            raise TypeError(f"expected a torch.ByteTensor, but got {type(new_state).__name__}")
        if new_state.dtype is not D.uint8:
            raise TypeError("RNG state must be a torch.ByteTensor")
        raw = np.asarray(new_state.detach().cpu()._host()).tobytes()
        if len(raw) != _STATE.size:
            raise RuntimeError(f"Expected a flambeau generator state of size {_STATE.size} but found the input "
                               f"RNG state size to be {len(raw)}")
        tag, seed, s_lo, s_hi, i_lo, i_hi, has_uint32, uinteger = _STATE.unpack(raw)
        inc = i_hi * _U64 + i_lo
        if tag != _STATE_TAG or inc % 2 == 0 or has_uint32 > 1:
            raise RuntimeError("RNG state is not a flambeau generator state (bad tag or PCG64 increment)")
        bit = np.random.PCG64()
        bit.state = {"bit_generator": "PCG64", "state": {"state": s_hi * _U64 + s_lo, "inc": inc},
                     "has_uint32": has_uint32, "uinteger": uinteger}
        self._seed = seed
        self._np = np.random.Generator(bit)
        return self

    def xp_generator(self, xp):
        """The generator that draws for this device: NumPy's, or a CuPy generator for one call,
        seeded from the host stream (see the module docstring)."""
        if not is_cupy(xp):      # cpu, and third-party devices: NumPy's stream, copied by their namespace
            return self._np
        seed = int(self._np.integers(0, _CUDA_SEED_LIMIT))
        philox = getattr(xp.random, "Philox4x3210", None)      # cheap to initialise, unlike XORWOW
        return xp.random.Generator(philox(seed)) if philox is not None else xp.random.default_rng(seed)


default_generator = Generator()
_cuda_generators: dict = {}


def generator_for(device, generator=None) -> Generator:
    if generator is not None:
        return generator
    if device is not None and getattr(device, "type", "cpu") == "cuda":
        g = _cuda_generators.get(device.index or 0)
        if g is None:
            g = _cuda_generators[device.index or 0] = Generator(device)
            g.manual_seed(default_generator._seed)
        return g
    return default_generator


def manual_seed(seed) -> Generator:
    default_generator.manual_seed(seed)
    for g in _cuda_generators.values():
        g.manual_seed(seed)
    return default_generator


def seed() -> int:
    return default_generator.seed()


def initial_seed() -> int:
    return default_generator.initial_seed()


def get_rng_state():
    """The default cpu generator's state, a uint8 tensor."""
    return default_generator.get_state()


def set_rng_state(new_state) -> None:
    default_generator.set_state(new_state)


_fork_rng_warned = False


@contextlib.contextmanager
def fork_rng(devices: Iterable[int] | None = None, enabled: bool = True, _caller: str = "fork_rng",
             _devices_kw: str = "devices", device_type: str | None = None) -> Iterator[None]:
    """Restore the cpu RNG and the `device_type` (default cuda) RNGs of `devices` on exit."""
    global _fork_rng_warned
    if device_type == "meta" or not enabled:
        yield
        return
    if (device_type or "cuda") != "cuda":
        raise RuntimeError(f"flambeau has no module of `{device_type}`; fork_rng supports cpu and cuda")
    if devices is None:
        count = _backends.cuda_device_count()
        if count > 1 and not _fork_rng_warned:
            warnings.warn(f"CUDA reports that you have {count} available devices, and you have used {_caller} "
                          f"without explicitly specifying which devices are being used; every device is forked. "
                          f"Pass the '{_devices_kw}' keyword argument to fork only those you use.", stacklevel=3)
            _fork_rng_warned = True
        devices = range(count)
    cpu_state = get_rng_state()
    devices = [Device("cuda", cuda_index(d)) for d in devices]
    device_states = [generator_for(d).get_state() for d in devices]
    try:
        yield
    finally:
        set_rng_state(cpu_state)
        for d, st in zip(devices, device_states):
            generator_for(d).set_state(st)
