"""`nn.init` draws through either NumPy's or CuPy's generator interface. CuPy's `Generator` has `random` and
`standard_normal` but no `uniform` / `normal`: on cuda every initialiser that draws (a Linear or Embedding
made on the device, `reset_parameters` of an FSDP2 model moved off the meta device) raised AttributeError.
Checked on the cpu with a generator that offers only CuPy's methods; the cpu values stay NumPy's own."""
from __future__ import annotations

import numpy as np
import pytest

import flambeau
from flambeau import random as R


class _CupyLike:
    """NumPy's generator behind CuPy's Generator methods alone."""

    def __init__(self, g):
        self._g = g

    def random(self, size=None, dtype=np.float64):
        return self._g.random(size, dtype=dtype)

    def standard_normal(self, size=None, dtype=np.float64):
        return self._g.standard_normal(size, dtype=dtype)


INITS = [
    ("uniform_", lambda t: flambeau.nn.init.uniform_(t, -2, 3)),
    ("normal_", lambda t: flambeau.nn.init.normal_(t, 1.0, 0.5)),
    ("trunc_normal_", lambda t: flambeau.nn.init.trunc_normal_(t, std=0.02)),
    ("xavier_uniform_", flambeau.nn.init.xavier_uniform_),
    ("xavier_normal_", flambeau.nn.init.xavier_normal_),
    ("kaiming_uniform_", flambeau.nn.init.kaiming_uniform_),
    ("kaiming_normal_", flambeau.nn.init.kaiming_normal_),
    ("orthogonal_", flambeau.nn.init.orthogonal_),
    ("sparse_", lambda t: flambeau.nn.init.sparse_(t, 0.5)),
]


@pytest.mark.parametrize("name, init", INITS, ids=[n for n, _ in INITS])
def test_initialisers_draw_through_cupys_generator_methods(name, init, monkeypatch):
    flambeau.manual_seed(0)
    want = init(flambeau.empty(6, 4)).numpy().copy()
    monkeypatch.setattr(R.Generator, "xp_generator", lambda self, xp: _CupyLike(self._np))
    flambeau.manual_seed(0)
    got = init(flambeau.empty(6, 4)).numpy()
    np.testing.assert_array_equal(got, want)          # the same draws, by CuPy's methods


def test_cpu_draws_are_numpys():
    flambeau.manual_seed(7)
    seed_state = R.default_generator._np.bit_generator.state
    t = flambeau.nn.init.normal_(flambeau.empty(5, 3, dtype=flambeau.float64), 2.0, 0.25)
    g = np.random.Generator(type(R.default_generator._np.bit_generator)())
    g.bit_generator.state = seed_state
    np.testing.assert_array_equal(t.numpy(), g.normal(2.0, 0.25, size=(5, 3)))
    u = flambeau.nn.init.uniform_(flambeau.empty(4, dtype=flambeau.float64), -1.0, 4.0)
    np.testing.assert_array_equal(u.numpy(), g.uniform(-1.0, 4.0, size=(4,)))


def test_rrelu_training_draws_through_cupys_generator_methods(monkeypatch):
    monkeypatch.setattr(R.Generator, "xp_generator", lambda self, xp: _CupyLike(self._np))
    x = -flambeau.ones(1000)
    y = flambeau.nn.functional.rrelu(x, 0.1, 0.3, training=True)
    slopes = -y.numpy()
    assert 0.1 <= slopes.min() and slopes.max() < 0.3 and slopes.std() > 0.03
