"""Fuzzing `flambeau.load` with mutated checkpoints: PyTorch `.pt` files, flambeau's native files and
plain safetensors files, truncated, bit-flipped, with crafted headers, huge shapes and deep nesting.

Every load must either return tensors whose bytes lie inside the buffer read or mapped for them,
or raise RuntimeError / UnpicklingError (EOFError for an empty file; TypeError where PyTorch raises
it, for a non-int64 size in the pickle). It must never run code from the file (a reduce calling
`_mark` would record itself), never raise RecursionError, MemoryError or a bare NumPy ValueError.
Seeded and bounded: a few hundred loads, seconds.
"""
import collections
import io
import json
import pickle
import struct
import zipfile

import numpy as np
import pytest
import torch

import flambeau
from flambeau._pt_format import RebuildArgumentError

try:
    from numpy.lib.array_utils import byte_bounds as _byte_bounds
except ImportError:                                   # NumPy < 2
    from numpy import byte_bounds as _byte_bounds

MARKS: list = []
ROUNDS = 120                      # mutations per seed file


def _mark(*args):
    """What a malicious reduce in a fuzzed file would call."""
    MARKS.append(args)
    return 0


_EVIL = b"c" + __name__.encode() + b"\n_mark\n(S'pwned'\ntR"      # GLOBAL, MARK, STRING, TUPLE, REDUCE


def _torch_pt() -> bytes:
    g = torch.Generator().manual_seed(0)
    w = torch.randn(4, 6, generator=g)
    sd = collections.OrderedDict(w=w, view=w[:, 1:4].t(), b=torch.arange(5), h=torch.randn(3, generator=g).bfloat16(),
                                 m=torch.tensor([True, False]))
    buf = io.BytesIO()
    torch.save({"model": sd, "p": torch.nn.Parameter(torch.ones(2)), "step": 3, "nest": [[1, (2, "x")]]}, buf)
    return buf.getvalue()


def _native() -> bytes:
    buf = io.BytesIO()
    obj = {"w": flambeau.arange(24.0).reshape(4, 6), "i": flambeau.arange(5), "s": flambeau.Size([2, 3]),
           "nest": [{"a": (1, 2.5, None)}], "dt": flambeau.float16}
    flambeau.save(obj, buf)
    return buf.getvalue()


def _flambeau_pt() -> bytes:
    buf = io.BytesIO()
    flambeau.save({"w": flambeau.arange(6.0).reshape(2, 3), "k": [1, 2]}, buf, format="pt")
    return buf.getvalue()


def _plain() -> bytes:
    import safetensors.numpy
    return safetensors.numpy.save({"a": np.arange(12, dtype=np.float32).reshape(3, 4), "b": np.arange(3, dtype=np.int64)})


# ---- checking one load ---------------------------------------------------------------------------
def _root(a: np.ndarray) -> np.ndarray:
    """The array that owns (or directly wraps) the bytes a view reads."""
    while True:
        nxt = a.base
        if isinstance(nxt, np.ndarray):
            a = nxt
        elif nxt is not None and isinstance(getattr(nxt, "base", None), np.ndarray):   # as_strided's holder
            a = nxt.base
        else:
            return a


def _tensors(x, out, depth=0):
    if isinstance(x, flambeau.Tensor):
        out.append(x)
    elif depth < 50 and isinstance(x, dict):
        for v in x.values():
            _tensors(v, out, depth + 1)
    elif depth < 50 and isinstance(x, (list, tuple)):
        for v in x:
            _tensors(v, out, depth + 1)
    return out


def _check_inside(t):
    a = t.detach()._data
    if a.size == 0:
        return
    lo, hi = _byte_bounds(a)
    rlo, rhi = _byte_bounds(_root(a))
    assert rlo <= lo and hi <= rhi, f"tensor {tuple(a.shape)} reads outside its buffer"


def _load(data: bytes, tmp_path, mmap: bool):
    if not mmap:
        return flambeau.load(io.BytesIO(data))
    p = tmp_path / "f.bin"
    p.write_bytes(data)
    return flambeau.load(p, mmap=True)


def _try(data: bytes, tmp_path, mmap=False):
    """Load; assert the outcome is allowed; return the result or None."""
    try:
        out = _load(data, tmp_path, mmap)
    except RecursionError as e:
        pytest.fail(f"RecursionError: {e}")
    except (RuntimeError, pickle.UnpicklingError, RebuildArgumentError):
        return None
    except EOFError:
        assert data == b""
        return None
    for t in _tensors(out, []):
        _check_inside(t)
    return out


# ---- mutations -----------------------------------------------------------------------------------
def _flip(rng, b: bytes, n=None) -> bytes:
    b = bytearray(b)
    for _ in range(n or int(rng.integers(1, 9))):
        if b:
            i = int(rng.integers(len(b)))
            b[i] ^= 1 << int(rng.integers(8))
    return bytes(b)


def _splice(rng, b: bytes, piece: bytes) -> bytes:
    i = int(rng.integers(len(b) + 1))
    return b[:i] + piece + b[i:]


def _rezip(data: bytes, fn) -> bytes:
    zin = zipfile.ZipFile(io.BytesIO(data))
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w", zipfile.ZIP_STORED) as z:
        for n in zin.namelist():
            z.writestr(n, fn(n, zin.read(n)))
    return out.getvalue()


def _mutate_bytes(rng, data: bytes) -> bytes:
    k = int(rng.integers(4))
    if k == 0:
        return data[:int(rng.integers(len(data)))]
    if k == 1:
        return _flip(rng, data)
    if k == 2:
        i = int(rng.integers(len(data)))
        return data[:i] + rng.bytes(int(rng.integers(1, 64))) + data[i + 64:]
    return _splice(rng, data, _EVIL)


def _mutate_pickle(rng, pkl: bytes) -> bytes:
    k = int(rng.integers(5))
    if k == 0:
        return _flip(rng, pkl)
    if k == 1:
        return pkl[:int(rng.integers(len(pkl)))]
    if k == 2:
        return _splice(rng, pkl, _EVIL)
    if k == 3:                                # the whole pickle replaced by a malicious one
        return b"\x80\x02" + _EVIL + b"."
    # huge ints where sizes, strides, offsets and numels are
    big = [2 ** 62, 2 ** 63 - 1, 2 ** 31, 10 ** 12]
    out = bytearray(pkl)
    for i in range(len(out) - 1):
        if out[i] == ord("K") and rng.random() < 0.5:        # BININT1 -> BININT (4 bytes) can't fit: LONG1
            n = int(rng.choice(big))
            enc = n.to_bytes((n.bit_length() + 8) // 8, "little", signed=True)
            return bytes(out[:i]) + b"\x8a" + bytes([len(enc)]) + enc + bytes(out[i + 2:])
    return bytes(out)


def _st_parts(data: bytes):
    (n,) = struct.unpack("<Q", data[:8])
    return json.loads(data[8:8 + n]), data[8 + n:]


def _st_join(header: dict, body: bytes) -> bytes:
    h = json.dumps(header).encode()
    return struct.pack("<Q", len(h)) + h + body


def _mutate_header(rng, data: bytes) -> bytes:
    header, body = _st_parts(data)
    names = [k for k in header if k != "__metadata__"]
    name = names[int(rng.integers(len(names)))]
    info = header[name]
    k = int(rng.integers(6))
    if k == 0:
        info["shape"] = [2 ** 62, 2 ** 62]
    elif k == 1:
        info["data_offsets"] = [int(rng.integers(-8, 64)), int(rng.integers(0, 2 ** 40))]
    elif k == 2:
        info["dtype"] = str(rng.choice(["F64", "BF16", "C64", "I8", "XX", "F8_E8M0"]))
    elif k == 3:
        info["shape"] = [int(v) for v in rng.integers(0, 4, size=int(rng.integers(0, 4)))]
    elif k == 4 and "__metadata__" in header:         # the native structure, deeply nested or corrupted
        depth = int(rng.choice([50, 300, 5000]))
        header["__metadata__"]["structure"] = "[" * depth + '{"__tensor__": "9"}' + "]" * depth
    else:
        header["__metadata__"] = {"format": "flambeau-checkpoint-v2",
                                  "structure": json.dumps({"__object__": 0, "__dict__": 5})}
    return _st_join(header, body)


@pytest.fixture(autouse=True)
def _no_marks():
    MARKS.clear()
    yield
    assert MARKS == [], "a fuzzed file ran code"


@pytest.mark.parametrize("seed_file", ["torch_pt", "flambeau_pt"])
def test_fuzz_pt_files(tmp_path, seed_file):
    data = _torch_pt() if seed_file == "torch_pt" else _flambeau_pt()
    assert _try(data, tmp_path) is not None
    rng = np.random.default_rng(1 if seed_file == "torch_pt" else 2)
    for r in range(ROUNDS):
        if r % 2:
            mutated = _mutate_bytes(rng, data)
        else:
            mutated = _rezip(data, lambda n, b: _mutate_pickle(rng, b) if n.endswith("data.pkl") else b)
        _try(mutated, tmp_path, mmap=(r % 5 == 0))


@pytest.mark.parametrize("seed_file", ["native", "plain"])
def test_fuzz_safetensors_files(tmp_path, seed_file):
    data = _native() if seed_file == "native" else _plain()
    assert _try(data, tmp_path) is not None
    rng = np.random.default_rng(3 if seed_file == "native" else 4)
    header, body = _st_parts(data)
    start = len(data) - len(body)
    for r in range(ROUNDS):
        k = r % 3
        if k == 0:
            mutated = _mutate_bytes(rng, data)
        elif k == 1:
            mutated = _mutate_header(rng, data)
        else:                                   # tensor bytes only: the load must return exactly them
            i = start + int(rng.integers(len(body)))
            mutated = data[:i] + bytes([data[i] ^ 0xFF]) + data[i + 1:]
            out = _try(mutated, tmp_path, mmap=(r % 4 == 2))
            assert out is not None
            for name, info in header.items():
                if name == "__metadata__":
                    continue
                b, e = info["data_offsets"]
                got = [t for t in _tensors(out, []) if t._data.nbytes == e - b]
                assert any(np.asarray(t.detach()._host()).tobytes() == mutated[start + b:start + e] for t in got)
            continue
        _try(mutated, tmp_path, mmap=(r % 4 == 0))


def test_fuzz_crafted_pickles(tmp_path):
    """Hand-written pickles: deep nesting, storages with huge numels, rebuilds with huge shapes."""
    def pt(pkl: bytes, records=None) -> bytes:
        out = io.BytesIO()
        with zipfile.ZipFile(out, "w") as z:
            z.writestr("archive/data.pkl", pkl)
            for k, v in (records or {}).items():
                z.writestr(f"archive/data/{k}", v)
        return out.getvalue()

    def storage_pid(numel: int) -> bytes:        # ('storage', torch.FloatStorage, '0', 'cpu', numel) BINPERSID
        return b"(X\x07\x00\x00\x00storagectorch\nFloatStorage\nX\x01\x00\x00\x000X\x03\x00\x00\x00cpu" + \
            b"\x8a\x08" + numel.to_bytes(8, "little", signed=True) + b"tQ"

    def rebuild(numel, offset, size, stride) -> bytes:
        ints = lambda vs: b"(" + b"".join(b"\x8a\x09" + v.to_bytes(9, "little", signed=True) for v in vs) + b"t"
        return (b"\x80\x02ctorch._utils\n_rebuild_tensor_v2\n(" + storage_pid(numel) +
                b"\x8a\x09" + offset.to_bytes(9, "little", signed=True) + ints(size) + ints(stride) +
                b"\x89ccollections\nOrderedDict\n)RtR.")

    four = np.arange(4, dtype=np.float32).tobytes()
    cases = [
        pt(b"\x80\x02" + b"]" * 50000 + b"a" * 49999 + b"."),
        pt(b"\x80\x02" + b"(" * 50000 + b"t" * 50000 + b"."),
        pt(rebuild(4, 0, [2 ** 40], [1]), {"0": four}),
        pt(rebuild(2 ** 60, 0, [4], [1]), {"0": four}),
        pt(rebuild(-1, 0, [4], [1]), {"0": four}),
        pt(rebuild(4, 0, [2 ** 70], [1]), {"0": four}),
        pt(rebuild(4, 0, [0, 2 ** 62], [1, 1]), {"0": four}),
        pt(rebuild(4, 2, [3, 3], [-1, 1]), {"0": four}),
        pt(rebuild(4, 0, [2, 2], [2, 1]), {"0": four}),                     # valid
        pt(b"\x80\x02" + b"r\xff\xff\xff\x7f" + b"N."),                     # LONG_BINPUT to index 2**31 - 1
        pt(b"\x80\x02ccollections\nOrderedDict\n)R}X\x01\x00\x00\x00xK\x01sb."),        # BUILD on OrderedDict
        pt(b"\x80\x02ctorch\nSize\n)\x81}b."),                              # NEWOBJ Size, then BUILD on it
        pt(b"\x80\x02cbuiltins\neval\nX\x04\x00\x00\x001+1\x85R."),
        pt(b"\x80\x02" + _EVIL + b"."),
        b"\x80\x02" + _EVIL + b".",                                         # a bare (legacy-looking) pickle
        b"",
    ]
    results = [_try(c, tmp_path) for c in cases]
    assert results[8] is not None and results[8]._host().tolist() == [[0.0, 1.0], [2.0, 3.0]]
    assert results[10] is not None and results[10].x == 1
    assert sum(r is None for r in results) >= 12


# ---- zip members that decompress to more than they should -------------------------------------------
BOMB = 64 << 20                   # bytes a crafted member expands to (deflate: ~64 KiB in the file)
PEAK_LIMIT = 8 << 20              # what a load of a file under 100 KiB may allocate at peak


def _pt_with(records: dict, numel: int, compress=zipfile.ZIP_DEFLATED, pkl_tail: bytes = b"") -> bytes:
    """A torch.save file of {"w": zeros(numel)} rewritten with every member compressed by `compress`;
    `records` replaces members by name ('data.pkl', '0'), `pkl_tail` is appended after the pickle."""
    buf = io.BytesIO()
    torch.save({"w": torch.zeros(numel)}, buf)
    zin = zipfile.ZipFile(io.BytesIO(buf.getvalue()))
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w") as z:
        for n in zin.namelist():
            data = records.get(n.rsplit("/", 1)[-1], zin.read(n))
            z.writestr(n, data + (pkl_tail if n.endswith("data.pkl") else b""), compress_type=compress)
    return out.getvalue()


def _declare(data: bytes, member: str, *, compressed=None, size=None) -> bytes:
    """Rewrite the central directory's compressed/uncompressed sizes of the member named `member`."""
    b = bytearray(data)
    i = b.find(b"PK\x01\x02")
    while i >= 0:
        name_len = struct.unpack_from("<H", b, i + 28)[0]
        if bytes(b[i + 46:i + 46 + name_len]).decode().endswith(member):
            if compressed is not None:
                struct.pack_into("<I", b, i + 20, compressed)
            if size is not None:
                struct.pack_into("<I", b, i + 24, size)
        i = b.find(b"PK\x01\x02", i + 4)
    return bytes(b)


def _peak_of_load(data: bytes):
    """(outcome, peak bytes traced while loading): outcome is the result or the exception raised."""
    import tracemalloc
    tracemalloc.start()
    try:
        out = flambeau.load(io.BytesIO(data))
    except Exception as e:                          # the caller asserts on the type
        out = e
    finally:
        peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
    return out, peak


def _claiming(pkl: bytes, numel: int) -> bytes:
    """torch.save's pickle of {"w": zeros(4)} changed to claim a storage and size of `numel` floats."""
    n = b"J" + numel.to_bytes(4, "little")
    old = b"cpuq\x06K\x04tq\x07QK\x00K\x04\x85"
    assert old in pkl
    return pkl.replace(old, b"cpuq\x06" + n + b"tq\x07QK\x00" + n + b"\x85")


def test_zip_members_cannot_expand_beyond_what_is_declared():
    """A deflated member that expands to 64 MiB, sizes in the central directory that lie, and
    compression methods PyTorch refuses: each load raises RuntimeError (as torch.load does where it
    has an opinion) having allocated a few MiB, not the member's claimed or expanded size."""
    zeros = bytes(BOMB)
    stored = _pt_with({}, 4, zipfile.ZIP_STORED)
    pkl = zipfile.ZipFile(io.BytesIO(stored)).read("archive/data.pkl")
    lie = 2 ** 32 - 16                                  # a record of 4 GiB claimed; the pickle agrees
    cases = {   # name: (file, whether torch.load raises RuntimeError too)
        # the pickle wants 16 bytes; the record decompresses to 64 MiB (torch: record size mismatch)
        "record bomb": (_pt_with({"0": zeros}, 4), True),
        # bzip2 and lzma expand far more than deflate can; PyTorch's reader refuses them
        "bzip2": (_pt_with({}, 4, zipfile.ZIP_BZIP2), True),
        "lzma": (_pt_with({}, 4, zipfile.ZIP_LZMA), True),
        # the central directory claims sizes its compressed bytes cannot hold
        "stored size lie": (_declare(_pt_with({"data.pkl": _claiming(pkl, lie // 4)}, 4, zipfile.ZIP_STORED),
                                     "data/0", size=lie), False),
        "deflated size lie": (_declare(_pt_with({"data.pkl": _claiming(pkl, lie // 4)}, 4), "data/0", size=lie),
                              False),
        "compressed past the end": (_declare(_pt_with({"data.pkl": _claiming(pkl, 2 ** 29)}, 4, zipfile.ZIP_STORED),
                                             "data/0", compressed=2 ** 31, size=2 ** 31), False),
        "record size mismatch": (_declare(stored, "data/0", size=lie), False),
        "record missing": (_rezip(stored, lambda n, b: b).replace(b"archive/data/0", b"archive/data/9"), True),
    }
    for name, (data, torch_raises) in cases.items():
        assert len(data) < 100 << 10, name
        out, peak = _peak_of_load(data)
        assert isinstance(out, RuntimeError), f"{name}: {out!r}"
        assert peak < PEAK_LIMIT, f"{name}: loading allocated {peak >> 20} MiB"
        if torch_raises:
            with pytest.raises(RuntimeError):
                torch.load(io.BytesIO(data))
    # a streamed pickle (over 16 MiB) whose BINBYTES8 claims 16 GiB: read only as far as the member
    # goes (its 64 MiB, a few copies on the way), not allocated at the claimed size
    claim = b"\x80\x02\x8e" + (2 ** 34).to_bytes(8, "little") + bytes(BOMB)
    out, peak = _peak_of_load(_pt_with({"data.pkl": claim}, 4))
    assert isinstance(out, pickle.UnpicklingError), repr(out)
    assert peak < 4 * BOMB, f"BINBYTES8 claim: loading allocated {peak >> 20} MiB"
    del claim
    # 64 MiB of zeros after the pickle's STOP in data.pkl: ignored (CRC-checked), as torch.load does
    tail = _pt_with({}, 4, pkl_tail=zeros)
    out, peak = _peak_of_load(tail)
    assert out["w"].tolist() == torch.load(io.BytesIO(tail))["w"].tolist() == [0.0] * 4
    assert peak < PEAK_LIMIT, f"pickle tail bomb: loading allocated {peak >> 20} MiB"
    # an honest deflated checkpoint loads, as torch.load loads it
    honest = _pt_with({"0": np.arange(4, dtype=np.float32).tobytes()}, 4)
    assert flambeau.load(io.BytesIO(honest))["w"].tolist() == torch.load(io.BytesIO(honest))["w"].tolist()
    assert flambeau.load(io.BytesIO(stored))["w"].tolist() == [0.0] * 4
