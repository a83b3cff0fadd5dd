"""flambeau.export.save / load: round trips (run, re-export, dynamic dims, cond), and refused files
(truncated, altered, unknown schema version, path-traversal and unknown entries, hostile contents)."""
from __future__ import annotations

import io
import json
import zipfile

import numpy as np
import pytest

import flambeau as fl
from flambeau.export import Dim, SerializeError, export, load, save
from tests.test_export import _Cond, _models


def _roundtrip(ep):
    buf = io.BytesIO()
    save(ep, buf)
    return load(io.BytesIO(buf.getvalue())), buf.getvalue()


def test_save_load_runs_and_reexports():
    m = _models(fl)()
    x, y = fl.randn(5, 4), fl.randn(5, 4)
    ep = export(m, (x, y))
    ep2, raw = _roundtrip(ep)
    assert b"pickle" not in raw and zipfile.ZipFile(io.BytesIO(raw)).namelist() == \
        ["archive_format", "program.json", "weights.safetensors", "constants.safetensors"]
    assert str(ep2.graph_signature) == str(ep.graph_signature)
    assert sorted(ep2.state_dict) == sorted(ep.state_dict) and sorted(ep2.constants) == sorted(ep.constants)
    for k, v in ep.state_dict.items():
        np.testing.assert_array_equal(ep2.state_dict[k].detach().numpy(), v.detach().numpy())
    fresh = _models(fl)()
    fresh.load_state_dict(m.state_dict())
    got, want = ep2.module()(x, y), fresh(x, y)
    for g, w in zip(got, want):
        np.testing.assert_allclose(g.detach().numpy(), w.detach().numpy(), rtol=1e-5, atol=1e-6)
    ep3 = export(ep2.module(), (x, y))
    assert [s.kind for s in ep3.graph_signature.output_specs] == [s.kind for s in ep.graph_signature.output_specs]
    np.testing.assert_allclose(ep3.module()(x, y)[0].detach().numpy(), want[0].detach().numpy(), rtol=1e-5,
                               atol=1e-6)


def test_save_load_keeps_dims_and_cond(tmp_path):
    class A(fl.nn.Module):
        def forward(self, x, y):
            return x.view(-1, 2) + y, x.shape[0] // 2
    b = Dim("b", min=2, max=32)
    ep = export(A(), (fl.randn(6), fl.randn(2)), dynamic_shapes=({0: 2 * b}, None))
    path = tmp_path / "a.pt2"
    save(ep, path)
    ep2 = load(path)
    assert [(r.lower, r.upper) for r in ep2.range_constraints.values()] == [(2, 32)]
    out, n = ep2.module()(fl.ones(10), fl.ones(2))
    assert tuple(out.shape) == (5, 2) and n == 5
    assert ep2.dim_names == ep.dim_names == {"s0": "b"}
    with pytest.raises(AssertionError, match=r"Guard failed: .* <= 32 \(got 33: the Dim b ranges over \[2, 32\]\)"):
        ep2.module()(fl.ones(66), fl.ones(2))
    m = _Cond()
    x = fl.randn(3, 4)
    c2, _ = _roundtrip(export(m, (x,)))
    for xx in (x.abs() + 0.1, -x.abs() - 0.1):
        np.testing.assert_allclose(c2.module()(xx).detach().numpy(), m(xx).detach().numpy(), rtol=1e-6)
    dec, _ = _roundtrip(c2.run_decompositions())
    np.testing.assert_allclose(dec.module()(x).detach().numpy(), m(x).detach().numpy(), rtol=1e-5, atol=1e-6)


def _archive(raw: bytes, edit) -> bytes:
    """The archive `raw` with its entries passed through `edit(dict) -> dict`."""
    z = zipfile.ZipFile(io.BytesIO(raw))
    entries = edit({n: z.read(n) for n in z.namelist()})
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as out:
        for n, data in entries.items():
            out.writestr(n, data)
    return buf.getvalue()


def _program(edit):
    def run(entries):
        j = json.loads(entries["program.json"])
        edit(j)
        entries["program.json"] = json.dumps(j).encode()
        return entries
    return run


@pytest.fixture(scope="module")
def raw():
    m = _models(fl)()
    _, data = _roundtrip(export(m, (fl.randn(5, 4), fl.randn(5, 4))))
    return data


def _node(j, name):
    return next(n for n in j["graph"]["nodes"] if n["op"] == "call_function")


BAD = {
    "truncated": (lambda r: r[: len(r) // 2], "truncated or corrupt"),
    "garbage": (lambda r: b"PK\x03\x04" + b"\x00" * 40, "truncated or corrupt"),
    "flipped byte": (lambda r: r[:300] + bytes([r[300] ^ 0xFF]) + r[301:], "corrupt"),
    "newer schema": (lambda r: _archive(r, _program(lambda j: j.update(schema_version=[2, 0]))), "schema version 2.0"),
    "no schema": (lambda r: _archive(r, _program(lambda j: j.pop("schema_version"))), "no schema_version"),
    "path traversal": (lambda r: _archive(r, lambda e: {**e, "../../evil.py": b"import os"}), "unexpected entry"),
    "absolute path": (lambda r: _archive(r, lambda e: {**e, "/tmp/evil": b"x"}), "unexpected entry"),
    "missing weights": (lambda r: _archive(r, lambda e: {k: v for k, v in e.items() if k != "weights.safetensors"}),
                        "lacks weights.safetensors"),
    "unknown op": (lambda r: _archive(r, _program(lambda j: _node(j, "").update(target="aten.os_system"))),
                   "unknown operator"),
    "python function": (lambda r: _archive(r, _program(lambda j: _node(j, "").update(target="builtins.eval"))),
                        "unknown function"),
    "forward reference": (lambda r: _archive(r, _program(lambda j: _node(j, "").update(args=[{"node": "zz"}]))),
                          "not an earlier node"),
    "hostile pytree": (lambda r: _archive(r, _program(lambda j: j.update(in_spec=json.dumps(
        [1, {"type": "collections.namedtuple", "context": "\"os.system\"", "children_spec": []}])))),
                       "not allowed"),
    "bad weights": (lambda r: _archive(r, lambda e: {**e, "weights.safetensors": b"\x08\x00\x00\x00\x00\x00\x00\x00{}"}),
                    "bad weights"),
}


@pytest.mark.parametrize("case", sorted(BAD))
def test_bad_files_are_refused(raw, case):
    corrupt, words = BAD[case]
    with pytest.raises(SerializeError, match=words):
        load(io.BytesIO(corrupt(raw)))
    assert issubclass(SerializeError, RuntimeError)


def test_unsavable_programs_say_why():
    with pytest.raises(TypeError, match="ExportedProgram"):
        save(object(), io.BytesIO())
