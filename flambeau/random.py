"""Random number generation: `Generator`, the default generator, `manual_seed`, RNG state.

A Generator wraps a NumPy PCG64 bit generator (cpu) and keeps the seed so CuPy's generator can
be seeded from it on cuda. Bit-equality with PyTorch's Philox/MT streams is not a goal.
"""
from __future__ import annotations

import numpy as np


class Generator:
    def __init__(self, device="cpu"):
        from ._device import canonical
        self.device = canonical(device)
        self._seed = 67280421310721
        self._np = np.random.Generator(np.random.PCG64(self._seed))
        self._cp = None

    def manual_seed(self, seed: int) -> "Generator":
        seed = int(seed)
        if seed < 0:
            seed &= 0xFFFFFFFFFFFFFFFF
        self._seed = seed
        self._np = np.random.Generator(np.random.PCG64(seed))
        self._cp = None
        return self

    def seed(self) -> int:
        s = int(np.random.SeedSequence().entropy) & 0xFFFFFFFFFFFFFFFF
        self.manual_seed(s)
        return s

    def initial_seed(self) -> int:
        return self._seed

    def get_state(self):
        import pickle
        from ._ops.creation import tensor
        raw = pickle.dumps((self._seed, self._np.bit_generator.state))
        return tensor(np.frombuffer(raw, dtype=np.uint8).copy())

    def set_state(self, state) -> "Generator":
        import pickle
        seed, st = pickle.loads(state.numpy().tobytes())
        self._seed = seed
        self._np = np.random.Generator(np.random.PCG64())
        self._np.bit_generator.state = st
        return self

    def xp_generator(self, xp):
        """The NumPy or CuPy generator that draws for this device."""
        if xp is np:
            return self._np
        if self._cp is None:
            self._cp = xp.random.default_rng(int(self._np.integers(0, 2**63 - 1)))
        return self._cp


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
    return default_generator.get_state()


def set_rng_state(state) -> None:
    default_generator.set_state(state)


class fork_rng:
    def __init__(self, devices=None, enabled=True, device_type="cuda"):
        self.enabled = enabled

    def __enter__(self):
        if self.enabled:
            self._state = get_rng_state()

    def __exit__(self, *a):
        if self.enabled:
            set_rng_state(self._state)
