"""Checkpoints: round trips, safety (no code execution), atomicity, corruption, PyTorch interop,
bounds checks of crafted `.pt` files, safetensors files, memory mapping."""
import collections
import io
import json
import os
import pickle
import signal
import struct
import subprocess
import sys
import time
import warnings
import zipfile

import numpy as np
import pytest
import safetensors
import safetensors.numpy
import safetensors.torch
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
    assert os.listdir(tmp_path) == ["ck.pt"]


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


# ---- crafted .pt files: every tensor is checked against its storage, as PyTorch checks it ----------
class _Crafted:
    """Pickles as torch's own _rebuild_tensor_v2 call with arguments of our choosing."""

    def __init__(self, storage, offset, size, stride):
        self.args = (storage, offset, size, stride, False, collections.OrderedDict())

    def __reduce_ex__(self, proto):
        return (torch._utils._rebuild_tensor_v2, self.args)


def _crafted_pt(path, offset, size, stride, numel=4):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")           # TypedStorage is deprecated, still what torch.save writes
        storage = torch.arange(numel, dtype=torch.float32).storage()
    torch.save({"t": _Crafted(storage, offset, size, stride)}, path)


def _outcome(fn):
    try:
        t = fn()["t"]
    except Exception as e:
        return type(e).__name__, str(e).split("\n")[0][:90]
    return "ok", tuple(t.shape), tuple(t.stride()), np.asarray(t.detach()).tolist()


_VIEWS = {
    "size_past_end": (0, (1000000,), (1,)),       # a 16-byte storage as a (1000000,) tensor
    "offset_past_end": (100, (1,), (1,)),
    "negative_stride": (0, (2,), (-100000,)),
    "negative_stride_lower": (3, (4,), (-1,)),     # stays inside the storage: PyTorch refuses it too
    "negative_offset": (-1, (1,), (1,)),
    "negative_size": (0, (-1,), (1,)),
    "numel_overflow": (0, (2 ** 62, 4), (4, 1)),
    "byte_size_overflow": (0, (2 ** 63 - 1,), (1,)),
    "stride_overflow": (0, (2,), (2 ** 63 - 1,)),
    "strides_2d_past_end": (0, (2, 3), (2, 1)),
    "zero_stride": (0, (1000,), (0,)),
    "valid_view": (1, (3,), (1,)),
    "valid_transposed": (0, (2, 2), (1, 2)),
    "empty_past_end": (5, (0,), (1,)),
}


@pytest.mark.parametrize("case", sorted(_VIEWS))
def test_crafted_pt_views_match_torch(tmp_path, case):
    p = tmp_path / "c.pt"
    _crafted_pt(p, *_VIEWS[case])
    theirs = _outcome(lambda: torch.load(p, weights_only=True))
    ours = _outcome(lambda: flambeau.load(p))
    assert ours == theirs


def _rewrite_zip(src, dst, fn):
    zin = zipfile.ZipFile(src)
    with zipfile.ZipFile(dst, "w", zipfile.ZIP_STORED) as z:
        for n in zin.namelist():
            b = fn(n, zin.read(n))
            if b is not None:
                z.writestr(n, b)


@pytest.mark.parametrize("change", ["short", "long"])
def test_pt_storage_record_must_hold_its_bytes(tmp_path, change):
    torch.save({"a": torch.arange(8, dtype=torch.float32)}, tmp_path / "ok.pt")
    edit = (lambda b: b[:16]) if change == "short" else (lambda b: b + bytes(8))
    _rewrite_zip(tmp_path / "ok.pt", tmp_path / "m.pt", lambda n, b: edit(b) if n.endswith("data/0") else b)
    with pytest.raises(RuntimeError) as theirs:
        torch.load(tmp_path / "m.pt", weights_only=True)
    with pytest.raises(RuntimeError, match="record size") as ours:
        flambeau.load(tmp_path / "m.pt")
    assert str(theirs.value).startswith("record size") and str(ours.value).startswith("record size")


def _torch_error(path):
    try:
        torch.load(path, weights_only=True)
    except Exception as e:
        return type(e)
    return None


def _same_family(ours, theirs):
    return issubclass(ours, theirs) or (issubclass(ours, pickle.UnpicklingError) and
                                        issubclass(theirs, pickle.UnpicklingError))


@pytest.mark.parametrize("kind", ["empty", "truncated_pt", "truncated_native", "random_bytes"])
def test_error_types_match_torch(tmp_path, kind):
    rng = np.random.default_rng(0)
    if kind == "empty":
        data = b""
    elif kind == "truncated_pt":
        torch.save({"a": torch.ones(100)}, tmp_path / "ok.pt")
        data = (tmp_path / "ok.pt").read_bytes()[:400]
    elif kind == "truncated_native":
        flambeau.save({"a": flambeau.ones(100)}, tmp_path / "ok.pt")
        data = (tmp_path / "ok.pt").read_bytes()[:-40]
        torch.save({"a": torch.ones(100)}, tmp_path / "ref.pt")     # torch can't read ours: compare with
        (tmp_path / "ref.pt").write_bytes((tmp_path / "ref.pt").read_bytes()[:-40])  # its own truncation
    else:
        data = rng.bytes(1000)
    p = tmp_path / "bad.pt"
    p.write_bytes(data)
    theirs = _torch_error(tmp_path / "ref.pt" if kind == "truncated_native" else p)
    with pytest.raises(Exception) as ours:
        flambeau.load(p)
    assert theirs is not None and _same_family(ours.type, theirs), (ours.type, theirs)


# ---- safetensors: the native format's tensor part, plain .safetensors files, mmap ---------------------
def test_native_file_is_safetensors_and_keeps_dtypes(tmp_path):
    import ml_dtypes
    p = tmp_path / "ck.pt"
    bf = np.array([1.5, -2.25, 3e38, 1e-40], dtype=ml_dtypes.bfloat16)
    obj = {"bf": flambeau.tensor(bf.astype(np.float32)).to(flambeau.bfloat16),
           "c": flambeau.tensor(np.array([1 + 2j, -3.5j], dtype=np.complex128)),
           "f8": flambeau.tensor([0.5, -2.0]).to(flambeau.float8_e4m3fn)}
    flambeau.save(obj, p)
    raw = safetensors.safe_open(p, framework="np")            # any safetensors reader opens it
    assert raw.metadata()["format"] == "flambeau-checkpoint-v2"
    out = flambeau.load(p)
    assert out["bf"].dtype is flambeau.bfloat16 and out["bf"]._host().tobytes() == bf.tobytes()
    assert out["c"].dtype is flambeau.complex128 and out["c"]._host().tolist() == [1 + 2j, -3.5j]
    assert out["f8"].dtype is flambeau.float8_e4m3fn and out["f8"].float().tolist() == [0.5, -2.0]


def _mapped_from(t, path):
    """Whether the tensor's first byte lies in a mapping of `path` (read from /proc/self/maps)."""
    addr = t._data.ctypes.data
    real = os.path.realpath(path)
    for line in open("/proc/self/maps"):
        parts = line.split()
        lo, hi = (int(v, 16) for v in parts[0].split("-"))
        if lo <= addr < hi:
            return len(parts) >= 6 and parts[5] == real
    return False


@pytest.mark.parametrize("kind", ["native", "plain", "torch_pt"])
def test_mmap_maps_the_file(tmp_path, kind):
    big = np.arange(1 << 16, dtype=np.float32)
    if kind == "native":
        p = tmp_path / "ck.pt"
        flambeau.save({"w": flambeau.tensor(big)}, p)
    elif kind == "plain":
        p = tmp_path / "w.safetensors"
        safetensors.numpy.save_file({"w": big}, p)
    else:
        p = tmp_path / "t.pt"
        torch.save({"w": torch.from_numpy(big)}, p)
    before = p.read_bytes()
    mapped = flambeau.load(p, mmap=True)["w"]
    read = flambeau.load(p)["w"]
    assert _mapped_from(mapped, p) and not _mapped_from(read, p)
    assert np.array_equal(mapped._host(), big) and np.array_equal(read._host(), big)
    mapped.add_(1)                                   # copy-on-write: the file does not change
    assert p.read_bytes() == before and float(mapped[0]) == 1.0


def test_mmap_needs_a_path():
    buf = io.BytesIO()
    flambeau.save({"a": flambeau.ones(2)}, buf)
    buf.seek(0)
    with pytest.raises(ValueError, match="file path"):
        flambeau.load(buf, mmap=True)


def test_plain_safetensors_interop_with_torch(tmp_path):
    sd = _sd(flambeau)
    p = tmp_path / "model.safetensors"
    flambeau.save(sd, p)
    theirs = safetensors.torch.load_file(p)
    assert sorted(theirs) == sorted(sd)
    for k in sd:
        _eq(sd[k], theirs[k])
    q = tmp_path / "torch.safetensors"
    safetensors.torch.save_file(dict(_sd(torch)), q)
    out = flambeau.load(q)
    assert isinstance(out, dict) and sorted(out) == sorted(sd)
    ref = _sd(torch)
    for k in ref:
        _eq(out[k], ref[k])
    with pytest.raises(TypeError, match="dict of str -> Tensor"):
        flambeau.save({"a": 1}, tmp_path / "bad.safetensors")


def _st_file(path, header: dict, data: bytes):
    h = json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(h)) + h + data)


@pytest.mark.parametrize("header", [
    {"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}, "b": {"dtype": "F32", "shape": [2], "data_offsets": [4, 12]}},
    {"a": {"dtype": "F32", "shape": [4], "data_offsets": [0, 16]}},
    {"a": {"dtype": "F32", "shape": [3], "data_offsets": [0, 8]}},
    {"a": {"dtype": "F32", "shape": [2], "data_offsets": [-8, 0]}},
    {"a": {"dtype": "F32", "shape": [2 ** 62, 8], "data_offsets": [0, 8]}},
    {"a": {"dtype": "Q99", "shape": [2], "data_offsets": [0, 8]}},
], ids=["overlap", "past_end", "shape_mismatch", "negative", "huge_shape", "bad_dtype"])
def test_crafted_safetensors_headers_raise_runtime_error(tmp_path, header):
    p = tmp_path / "x.safetensors"
    _st_file(p, header, bytes(12))
    with pytest.raises(RuntimeError, match="safetensors|dtype"):
        flambeau.load(p)
    with pytest.raises(RuntimeError):
        flambeau.load(io.BytesIO(p.read_bytes()))


def test_version_1_checkpoints_still_load(tmp_path):
    """A file in the previous native format (a zip of structure.json + tensors.safetensors)."""
    structure = {"__dict__": [["w", {"__tensor__": "0", "requires_grad": False, "device": "cpu", "param": True}],
                              ["step", 3]], "ordered": True}
    w = np.arange(6, dtype=np.float32).reshape(2, 3)
    p = tmp_path / "v1.pt"
    with zipfile.ZipFile(p, "w", zipfile.ZIP_STORED) as z:
        z.writestr("format", "flambeau-checkpoint-v1")
        z.writestr("structure.json", json.dumps(structure))
        z.writestr("tensors.safetensors", safetensors.numpy.save({"0": w}))
    out = flambeau.load(p)
    assert list(out) == ["w", "step"] and out["step"] == 3
    assert type(out["w"]).__name__ == "Parameter" and np.array_equal(out["w"].detach()._host(), w)
    with pytest.raises(RuntimeError, match="v2 format"):
        flambeau.load(p, mmap=True)


def test_version_1_complex128_loads(tmp_path):
    """v1 wrote complex128 as dtype C128, which safetensors does not know."""
    c = np.array([[1 + 2j, -3.5j]], dtype=np.complex128)
    header = {"0": {"dtype": "C128", "shape": [1, 2], "data_offsets": [0, 32]},
              "1": {"dtype": "I64", "shape": [1], "data_offsets": [32, 40]}}
    h = json.dumps(header).encode()
    blob = struct.pack("<Q", len(h)) + h + c.tobytes() + np.array([7]).tobytes()
    structure = {"__dict__": [["c", {"__tensor__": "0"}], ["i", {"__tensor__": "1"}]], "ordered": False}
    p = tmp_path / "v1c.pt"
    with zipfile.ZipFile(p, "w", zipfile.ZIP_STORED) as z:
        z.writestr("format", "flambeau-checkpoint-v1")
        z.writestr("structure.json", json.dumps(structure))
        z.writestr("tensors.safetensors", blob)
    out = flambeau.load(p)
    assert out["c"].dtype is flambeau.complex128 and out["c"]._host().tolist() == c.tolist()
    assert out["i"].tolist() == [7]


def test_deep_nesting_is_an_error_not_a_crash(tmp_path):
    deep = []
    for _ in range(5000):
        deep = [deep]
    with pytest.raises(RuntimeError, match="nests deeper"):
        flambeau.save(deep, tmp_path / "d.pt")
    text = "[" * 100000 + "]" * 100000                       # crafted: deeper than json can recurse
    h = {"__metadata__": {"format": "flambeau-checkpoint-v2", "structure": text}}
    _st_file(tmp_path / "n.pt", h, b"")
    with pytest.raises(RuntimeError, match="structure is corrupt"):
        flambeau.load(tmp_path / "n.pt")
    n = 100000                                   # pickle opcodes nest without recursion: n lists, n-1 APPENDs
    with zipfile.ZipFile(tmp_path / "deep.pt", "w") as z:
        z.writestr("archive/data.pkl", b"\x80\x02" + b"]" * n + b"a" * (n - 1) + b".")
    out = flambeau.load(tmp_path / "deep.pt", map_location="meta")
    for _ in range(n - 1):
        out = out[0]
    assert out == []


# ---- crash safety: temporary files are removed on every path this process can see ----------------
_REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_SAVER = """
import os, signal, sys, time
import flambeau, safetensors
path, mode = sys.argv[1], sys.argv[2]
if mode == "loop":                                  # save forever; the parent kills it
    i = 0
    while True:
        flambeau.save({"w": flambeau.full((4 << 20,), float(i))}, path)
        print(i, flush=True)
        i += 1
import flambeau._atomic as atomic
# the dispositions of a Python started from a terminal: a child inherits SIG_IGN for SIGINT from a
# parent started in the background (`pytest ... &`), and Python then leaves SIGINT ignored
signal.signal(signal.SIGINT, signal.default_int_handler)
signal.signal(signal.SIGTERM, signal.SIG_DFL)
real = atomic.os.fsync
def fsync_then_signal(fd):                          # the signal arrives while the temp file exists
    real(fd)
    os.kill(os.getpid(), getattr(signal, mode))     # handled at the next bytecode after kill returns
    time.sleep(5)
    print("the signal was not handled", flush=True)
atomic.os = type(os)("os_with_signal")
atomic.os.__dict__.update(os.__dict__, fsync=fsync_then_signal)
flambeau.save({"w": flambeau.ones(10)}, path)
"""


def _saver(path, mode):
    env = dict(os.environ, PYTHONPATH=_REPO)
    return subprocess.Popen([sys.executable, "-c", _SAVER, str(path), mode], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)


def _temps(folder):
    return [n for n in os.listdir(folder) if ".flambeau-tmp-" in n]


def test_exception_mid_write_removes_temp_and_keeps_file(tmp_path, monkeypatch):
    p = tmp_path / "ck.pt"
    flambeau.save({"a": flambeau.ones(2)}, p)
    before = p.read_bytes()

    def fsync_fails(fd):
        assert _temps(tmp_path)                      # the data went to a temporary file
        raise OSError("disk full")
    monkeypatch.setattr(os, "fsync", fsync_fails)
    with pytest.raises(OSError, match="disk full"):
        flambeau.save({"a": flambeau.zeros(2)}, p)
    assert p.read_bytes() == before and os.listdir(tmp_path) == ["ck.pt"]


@pytest.mark.parametrize("sig", ["SIGTERM", "SIGINT"])
def test_signal_mid_save_removes_temp(tmp_path, sig):
    p = tmp_path / "ck.pt"
    flambeau.save({"a": flambeau.ones(2)}, p)
    before = p.read_bytes()
    proc = _saver(p, sig)
    out, _ = proc.communicate(timeout=120)
    assert out == "" and proc.returncode != 0
    if sig == "SIGTERM":
        assert proc.returncode == -signal.SIGTERM         # it still dies of the signal
    assert p.read_bytes() == before and os.listdir(tmp_path) == ["ck.pt"]


def test_sigkill_mid_save_keeps_previous_file_and_next_save_cleans_up(tmp_path):
    p = tmp_path / "ck.pt"
    rng = np.random.default_rng(0)
    for _ in range(4):
        proc = _saver(p, "loop")
        proc.stdout.readline()                              # one save has completed
        time.sleep(float(rng.uniform(0.0, 0.4)))
        proc.kill()
        proc.wait()
        assert not [n for n in os.listdir(tmp_path) if n.startswith(".tmp")]   # no writer's own temporaries
        w = flambeau.load(p)["w"]._host()                   # a complete file from one iteration
        assert w.shape == (4 << 20,) and (w == w[0]).all()
    flambeau.save({"w": flambeau.zeros(3)}, p)
    assert os.listdir(tmp_path) == ["ck.pt"]


def test_stale_temps_of_dead_processes_only_are_removed(tmp_path):
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    stale = tmp_path / f".ck.pt.flambeau-tmp-{dead.pid}-0123abcd"
    live = tmp_path / f".ck.pt.flambeau-tmp-{os.getpid()}-4567cdef"        # a save in progress here
    other = tmp_path / f".other.pt.flambeau-tmp-{dead.pid}-89abcdef"       # another target's
    for f in (stale, live, other):
        f.write_bytes(b"partial")
    flambeau.save({"a": flambeau.ones(1)}, tmp_path / "ck.pt", format="pt")
    assert sorted(os.listdir(tmp_path)) == sorted(["ck.pt", live.name, other.name])


def test_mmap_of_unaligned_records_gives_aligned_tensors(tmp_path):
    """flambeau's own .pt writer does not pad records as torch's does: a misaligned record is copied."""
    p = tmp_path / "ours.pt"
    sd = {"b": flambeau.tensor([True, False, True]), "w": flambeau.arange(5.0, dtype=flambeau.float64),
          "v": flambeau.arange(7, dtype=flambeau.int32)}
    flambeau.save(sd, p, format="pt")
    out = flambeau.load(p, mmap=True)
    for k, t in sd.items():
        assert out[k]._data.flags.aligned and out[k].tolist() == t.tolist()


def test_whole_pytorch_modules_load_under_their_allowlisted_flambeau_classes(tmp_path):
    """torch.save(model) of PyTorch modules (pickle protocol 2: `__builtin__.set` for their buffer-name sets),
    loaded as pytorch/examples' word_language_model/generate.py does: `safe_globals` naming the classes
    by their torch paths, which under `flambeau.run` are flambeau's. Outputs vs PyTorch's model."""
    torch.manual_seed(0)
    tm = torch.nn.ModuleList([torch.nn.Sequential(torch.nn.Embedding(10, 6), torch.nn.Dropout(0.2)),
                              torch.nn.LSTM(6, 5, 1), torch.nn.Linear(5, 3)]).eval()
    path = tmp_path / "model.pt"
    with open(path, "wb") as f:
        torch.save(tm, f)
    nn = flambeau.nn
    allow = [nn.modules.container.ModuleList, nn.modules.container.Sequential, nn.modules.sparse.Embedding,
             nn.modules.dropout.Dropout, nn.modules.rnn.LSTM, nn.modules.linear.Linear]
    with pytest.raises(pickle.UnpicklingError, match="torch.nn.modules.container.ModuleList"):
        flambeau.load(str(path))
    with flambeau.serialization.safe_globals(allow):
        fm = flambeau.load(str(path))
    assert type(fm) is nn.ModuleList and type(fm[1]) is nn.LSTM and not fm.training
    ids = [[1, 4], [7, 2], [3, 3]]

    def run(lib, m):
        with lib.no_grad():
            h, _ = m[1](m[0](lib.tensor(ids)))
            return m[2](h).numpy()
    np.testing.assert_allclose(run(flambeau, fm), run(torch, tm), rtol=1e-5, atol=1e-6)
