"""Checkpoints: round trips, safety (no code execution), atomicity, corruption, PyTorch interop."""
import collections
import io
import os

import numpy as np
import pytest
import torch

import flambeau


def _sd(mod):
    g = np.random.default_rng(0)
    return collections.OrderedDict(
        w=mod.tensor(g.standard_normal((3, 4)).astype(np.float32)),
        b=mod.tensor([1, 2, 3]),
        h=mod.tensor(g.standard_normal(5)).to(mod.bfloat16),
        m=mod.tensor([True, False]),
        s=mod.tensor(2.5, dtype=mod.float64),
    )


def _eq(a, b):
    a = a.detach()
    b = b.detach()
    if isinstance(b, torch.Tensor):
        b = flambeau.tensor(b.float().numpy() if b.dtype == torch.bfloat16 else b.numpy()).to(getattr(flambeau, str(b.dtype)[6:]))
    assert a.dtype == b.dtype and tuple(a.shape) == tuple(b.shape)
    assert np.array_equal(a.float()._host() if a.dtype.is_floating_point else a._host(),
                          b.float()._host() if b.dtype.is_floating_point else b._host())


def test_roundtrip_nested(tmp_path):
    obj = {"sd": _sd(flambeau), "step": 7, "lr": 0.1, "name": "x", "t": (1, [2, None]),
           "dtype": flambeau.float16, "shape": flambeau.Size([2, 3]), "inf": float("inf")}
    p = tmp_path / "ck.pt"
    flambeau.save(obj, p)
    out = flambeau.load(p)
    assert isinstance(out["sd"], collections.OrderedDict) and list(out["sd"]) == list(obj["sd"])
    for k in obj["sd"]:
        _eq(out["sd"][k], obj["sd"][k])
    assert out["step"] == 7 and out["lr"] == 0.1 and out["name"] == "x" and out["t"] == (1, [2, None])
    assert out["dtype"] is flambeau.float16 and out["shape"] == flambeau.Size([2, 3]) and out["inf"] == float("inf")


def test_file_object_and_requires_grad():
    t = flambeau.ones(3, requires_grad=True)
    buf = io.BytesIO()
    flambeau.save({"t": t}, buf)
    buf.seek(0)
    out = flambeau.load(buf)
    assert out["t"].requires_grad and out["t"].is_leaf


class _Obj:
    def __init__(self):
        self.x = 3


def test_arbitrary_objects_need_weights_only_false(tmp_path):
    p = tmp_path / "o.pt"
    flambeau.save({"o": _Obj()}, p)
    with pytest.raises(Exception, match="weights_only"):
        flambeau.load(p)
    assert flambeau.load(p, weights_only=False)["o"].x == 3


def test_malicious_torch_pickle_is_refused(tmp_path):
    marker = tmp_path / "pwned"

    class Evil:
        def __reduce__(self):
            return (os.system, (f"touch {marker}",))

    p = tmp_path / "evil.pt"
    torch.save({"e": Evil()}, p)
    with pytest.raises(Exception, match="Weights only load failed"):
        flambeau.load(p)
    assert not marker.exists()


def test_atomic_save_keeps_old_file_on_failure(tmp_path):
    p = tmp_path / "ck.pt"
    flambeau.save({"a": flambeau.ones(2)}, p)
    before = p.read_bytes()

    class Bad:
        pass

    with pytest.raises(Exception):
        flambeau.save({"a": flambeau.zeros(2), "b": Bad()}, p, format="pt")
    assert p.read_bytes() == before
    assert not [f for f in os.listdir(tmp_path) if f.startswith(".flambeau-save-")]


def test_truncated_and_corrupt_files(tmp_path):
    p = tmp_path / "ck.pt"
    flambeau.save({"a": flambeau.ones(100)}, p)
    data = p.read_bytes()
    for cut in (10, len(data) // 2, len(data) - 5):
        q = tmp_path / f"t{cut}.pt"
        q.write_bytes(data[:cut])
        with pytest.raises(RuntimeError, match="corrupt|truncated"):
            flambeau.load(q)


def test_load_pytorch_state_dict(tmp_path):
    p = tmp_path / "torch.pt"
    sd = _sd(torch)
    sd["view"] = sd["w"][:, 1:3]            # a non-contiguous view sharing storage
    torch.save({"model": sd, "param": torch.nn.Parameter(torch.ones(2)), "epoch": 3}, p)
    out = flambeau.load(p)
    for k in sd:
        _eq(out["model"][k], sd[k])
    assert type(out["param"]).__name__ == "Parameter" and out["param"].requires_grad
    assert out["epoch"] == 3


def test_save_pt_format_loads_in_pytorch(tmp_path):
    p = tmp_path / "ours.pt"
    sd = _sd(flambeau)
    flambeau.save({"model": sd, "epoch": 2, "dt": flambeau.float32}, p, format="pt")
    out = torch.load(p, weights_only=True)
    assert out["epoch"] == 2 and out["dt"] is torch.float32
    for k in sd:
        _eq(sd[k], out["model"][k])


def test_map_location_and_meta(tmp_path):
    p = tmp_path / "ck.pt"
    flambeau.save({"a": flambeau.ones(2)}, p)
    out = flambeau.load(p, map_location="meta")
    assert out["a"].device.type == "meta"
