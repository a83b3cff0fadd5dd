"""flambeau.distributed.checkpoint: save at one world size and sharding, load at another, crash safety, files.

Launches (tests/dist_workers/dcp.py, each bounded by the launcher timeout): a save at world 4 (plus an
async_save), a load of it at world 2 with every tensor sharded another way, and a save at world 2 whose
rank 1 is SIGKILLed mid-save. Loads at world 1 and 3 run here, in this process, one rank's pieces at a time
(`no_dist`). Every loaded value is compared with the global reference the worker built the pieces from.
"""
from __future__ import annotations

import json
import os

import numpy as np
import pytest
import safetensors
import torch

import flambeau
import flambeau.distributed.checkpoint as dcp
from tests.dist_helpers import launch
from tests.dist_workers.dcp import LOAD_SPLIT, SHAPES, VALUES, reference, region, state

NUMPY_READABLE = [k for k, (_, dt) in SHAPES.items() if dt != "bfloat16"]   # NumPy has no bfloat16


def _expected(key: str, version: int, offsets, sizes) -> np.ndarray:
    window = tuple(slice(o, o + s) for o, s in zip(offsets, sizes))
    dtype = getattr(torch, SHAPES[key][1])
    return torch.from_numpy(np.asarray(reference(key, version)[window])).to(dtype).double().numpy()


@pytest.fixture(scope="module")
def saved4(tmp_path_factory):
    folder = tmp_path_factory.mktemp("dcp4")
    rc, so, se = launch("dcp.py", 4, "save", str(folder), str(folder))
    assert rc == 0, f"workers failed (rc {rc}):\n{so}\n{se}"
    return folder


@pytest.fixture(scope="module")
def loaded2(saved4, tmp_path_factory):
    out = tmp_path_factory.mktemp("dcp_load2")
    rc, so, se = launch("dcp.py", 2, "load", str(saved4), str(out))
    assert rc == 0, f"workers failed (rc {rc}):\n{so}\n{se}"
    return [dict(np.load(os.path.join(out, f"rank{r}.npz"))) for r in range(2)]


def _load_as_ranks(folder, world: int, version: int) -> None:
    """Load `folder` as each rank of `world` would (pieces sharded by LOAD_SPLIT) and check every piece."""
    for rank in range(world):
        sd = state(rank, world, 0, LOAD_SPLIT, fill=False)
        dcp.load(sd, checkpoint_id=folder, no_dist=True)
        for name, leaf in sd["model"].items():
            key = f"model.{name}"
            piece = leaf.tensor if isinstance(leaf, dcp.LocalChunk) else leaf
            offsets, sizes = region(key, LOAD_SPLIT[key], rank, world)
            np.testing.assert_array_equal(piece.double().numpy(), _expected(key, version, offsets, sizes), key)
        assert sd["extra"]["step"] == VALUES["step"] and sd["extra"]["name"] == VALUES["name"]
        assert sd["extra"]["betas"] == VALUES["betas"]                     # a tuple again
        np.testing.assert_array_equal(sd["extra"]["mixed"][0].numpy(), [float(version)] * 3)
        assert sd["extra"]["mixed"][1] == version


def test_saved_at_world_4_loads_resharded_at_world_2(loaded2):
    for rank, got in enumerate(loaded2):
        for key in SHAPES:
            offsets, sizes = region(key, LOAD_SPLIT[key], rank, 2)
            assert tuple(got[f"{key}/offsets"]) == offsets
            np.testing.assert_array_equal(got[key], _expected(key, 1, offsets, sizes), key)
        assert int(got["extra.step"]) == 7 and str(got["extra.name"]) == "run"
        np.testing.assert_array_equal(got["extra.betas"], VALUES["betas"])


@pytest.mark.parametrize("world", [1, 3])
def test_saved_at_world_4_loads_resharded_at_world_1_and_3(saved4, world):
    _load_as_ranks(saved4 / "ckpt", world, 1)


def test_files_are_safetensors_and_json_with_replicated_tensors_written_once(saved4):
    folder = saved4 / "ckpt"
    meta = json.loads((folder / "metadata.json").read_text())
    entries = meta["state_dict_metadata"]
    shards = sorted(p.name for p in folder.iterdir() if p.name != "metadata.json")
    assert len(shards) == 4 and all(s.endswith(".safetensors") for s in shards)    # one file per rank
    for key in NUMPY_READABLE:
        shape = SHAPES[key][0]
        whole = np.full(shape, np.nan)
        for c in entries[key]["chunks"]:
            window = tuple(slice(o, o + s) for o, s in zip(c["offsets"], c["sizes"]))
            with safetensors.safe_open(folder / c["file"], "np") as f:
                whole[window] = f.get_tensor(c["name"])
        np.testing.assert_array_equal(whole, _expected(key, 1, (0,) * len(shape), shape), key)
    assert len(entries["model.rep"]["chunks"]) == 1 and len(entries["model.scalar"]["chunks"]) == 1
    assert len(entries["model.rows"]["chunks"]) == 4 and len(entries["model.grid"]["chunks"]) == 4
    assert entries["extra.step"] == {"type": "value", "value": 7}
    assert entries["model.half"]["dtype"] == "bfloat16"


def test_async_save_writes_the_state_as_it_was_when_it_returned(saved4):
    _load_as_ranks(saved4 / "async", 2, 2)


def test_a_writer_killed_mid_save_leaves_the_previous_checkpoint_loadable(tmp_path):
    rc, so, se = launch("dcp.py", 2, "kill", str(tmp_path), str(tmp_path))
    assert rc != 0 and "FAILED" in se, se
    folder = tmp_path / "ckpt"
    committed = json.loads((folder / "metadata.json").read_text())["save_id"]
    orphans = [p.name for p in folder.glob("__1_*.safetensors") if committed not in p.name]
    assert orphans, "rank 1 was killed before writing its shard: the test no longer kills mid-save"
    _load_as_ranks(folder, 1, 1)
    dcp.save(state(0, 1, 3, LOAD_SPLIT), checkpoint_id=folder)          # the next save clears the orphans
    assert not [p for p in folder.glob("__*") if p.name.startswith("__1_")]
    _load_as_ranks(folder, 2, 3)


def _fresh(tmp_path):
    folder = tmp_path / "c"
    dcp.save({"w": flambeau.arange(6.0).reshape(2, 3), "n": 1}, checkpoint_id=folder)
    return folder


@pytest.mark.parametrize("damage,error,message", [
    ("no_folder", FileNotFoundError, "no checkpoint folder"),
    ("no_metadata", FileNotFoundError, "metadata.json is missing"),
    ("garbage_metadata", ValueError, "is corrupt \\(not JSON"),
    ("foreign_json", ValueError, "is not a flambeau-dcp metadata file"),
    ("bad_chunk", ValueError, "lies outside"),
    ("no_shard", FileNotFoundError, "named by the metadata is missing"),
    ("truncated_shard", ValueError, "is corrupt"),
])
def test_missing_or_corrupt_checkpoints_are_refused(tmp_path, damage, error, message):
    folder = _fresh(tmp_path)
    meta = folder / "metadata.json"
    shard = next(folder.glob("__*.safetensors"))
    if damage == "no_folder":
        folder = tmp_path / "nowhere"
    elif damage == "no_metadata":
        meta.unlink()
    elif damage == "garbage_metadata":
        meta.write_bytes(b"\x80garbage")
    elif damage == "foreign_json":
        meta.write_text('{"hello": 1}')
    elif damage == "bad_chunk":
        doc = json.loads(meta.read_text())
        doc["state_dict_metadata"]["w"]["chunks"][0]["sizes"] = [5, 3]
        meta.write_text(json.dumps(doc))
    elif damage == "no_shard":
        shard.unlink()
    elif damage == "truncated_shard":
        shard.write_bytes(shard.read_bytes()[:-5])
    target = {"w": flambeau.zeros(2, 3), "n": 0}
    with pytest.raises(dcp.CheckpointException) as info:
        dcp.load(target, checkpoint_id=folder)
    (err,) = info.value.failures.values()
    assert isinstance(err, error) and __import__("re").search(message, str(err)), str(err)


@pytest.mark.filterwarnings("ignore:torch.distributed is disabled")
def test_state_dict_errors_as_pytorch(tmp_path):
    import torch.distributed.checkpoint as tdcp
    folder = _fresh(tmp_path)
    tdcp.save({"w": torch.arange(6.0).reshape(2, 3), "n": 1}, checkpoint_id=tmp_path / "t", no_dist=True)
    for key, shape in (("zz", (1,)), ("w", (3, 2))):
        with pytest.raises(tdcp.api.CheckpointException) as theirs:
            tdcp.load({key: torch.zeros(shape)}, checkpoint_id=tmp_path / "t", no_dist=True)
        with pytest.raises(dcp.CheckpointException) as ours:
            dcp.load({key: flambeau.zeros(shape)}, checkpoint_id=folder)
        (want, _), = theirs.value.failures.values()
        (got,) = ours.value.failures.values()
        assert type(got) is type(want) and str(got) == str(want), (got, want)
    with pytest.raises(dcp.CheckpointException, match="neither a tensor nor a JSON value"):
        dcp.save({"o": object()}, checkpoint_id=tmp_path / "o")
    assert not (tmp_path / "o" / "metadata.json").exists()


@pytest.mark.filterwarnings("ignore:torch.distributed is disabled")
def test_flattened_keys_equal_pytorchs(tmp_path):
    import torch.distributed.checkpoint as tdcp
    def nested(lib):
        return {"a": [1, [2, 3]], "nest": {"b": [lib.ones(2), 5], "c": {"d": lib.zeros(1)}, "empty": {}}, "s": "x",
                "groups": [{"lr": 0.1, "params": ["w", "b"]}, {"lr": 0.2, "params": []}], "t": (1, 2.5)}
    theirs = tdcp.save(nested(torch), checkpoint_id=tmp_path / "t", no_dist=True)
    ours = dcp.save(nested(flambeau), checkpoint_id=tmp_path / "f")
    assert sorted(ours.state_dict_metadata) == sorted(theirs.state_dict_metadata)
