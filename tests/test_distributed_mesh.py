"""DeviceMesh and 2-D DTensor layouts on 4 MPI ranks as a (2, 2) mesh, against what PyTorch defines:
row-major rank layout, one group per mesh dimension, mesh["tp"] slicing, torch.chunk pieces cut by
the mesh dimensions left to right (compute_local_shape_and_global_offset, which checkpoint resharding
reads), and redistribution between every pair of 2-D layouts."""
from __future__ import annotations

import os

import numpy as np
import pytest
import torch

from tests.dist_helpers import launch

WORLD = 4
LAYOUTS = {"S0S0": ("S0", "S0"), "S0S1": ("S0", "S1"), "RS0": ("R", "S0"), "S1R": ("S1", "R")}


@pytest.fixture(scope="module")
def ranks(tmp_path_factory):
    out = tmp_path_factory.mktemp("mesh")
    rc, so, se = launch("mesh.py", WORLD, str(out))
    assert rc == 0, f"workers failed (rc {rc}):\n{so}\n{se}"
    return [dict(np.load(os.path.join(out, f"rank{r}.npz"))) for r in range(WORLD)]


def test_mesh_groups_and_slicing(ranks):
    for r, res in enumerate(ranks):
        dp, tp = divmod(r, 2)
        assert res["coordinate"].tolist() == [dp, tp]
        assert res["tp_ranks"].tolist() == [2 * dp, 2 * dp + 1]
        assert res["dp_ranks"].tolist() == [tp, tp + 2]
        assert res["local_ranks"].tolist() == [dp, tp, tp]
        assert res["sizes"].tolist() == [4, 2, 2]
        assert res["tp_sum"].tolist() == [4 * dp + 1]


def _piece(full, layout, coord):
    """The local piece PyTorch's rule gives: each mesh dim, left to right, chunks the current piece."""
    t = torch.from_numpy(full)
    offset = [0, 0]
    for p, c in zip(layout, coord):
        if p.startswith("S"):
            d = int(p[1:])
            chunks = t.chunk(2, d)
            size = -(-t.shape[d] // 2)
            offset[d] += min(c * size, t.shape[d])
            t = chunks[c] if c < len(chunks) else t.narrow(d, 0, 0)
    return t.numpy(), offset


@pytest.mark.parametrize("name", list(LAYOUTS))
def test_local_shape_offset_and_redistribution_2d(ranks, name):
    full = np.arange(35, dtype=np.float64).reshape(5, 7)
    for r, res in enumerate(ranks):
        coord = divmod(r, 2)
        want, offset = _piece(full, LAYOUTS[name], coord)
        assert res[f"{name}/shape"].tolist() == list(want.shape)
        assert res[f"{name}/offset"].tolist() == offset
        np.testing.assert_array_equal(res[f"{name}/local"], want)
        np.testing.assert_array_equal(res[f"{name}/full"], full)
        for other, layout in LAYOUTS.items():
            np.testing.assert_array_equal(res[f"{name}/{other}/local"], _piece(full, layout, coord)[0])


def test_matmul_on_2d_mesh(ranks):
    full = np.arange(35, dtype=np.float64).reshape(5, 7)
    for res in ranks:
        assert str(res["mm/placements"]) == "S(0),S(1)"
        np.testing.assert_allclose(res["mm/full"], full @ full.T)
