"""flambeau.utils.tensorboard.SummaryWriter against PyTorch's: the same calls on each, both event
directories read back with TensorBoard's own EventAccumulator and compared entry by entry."""
import io
import os
import subprocess
import sys

import numpy as np
import pytest
import torch

import flambeau

pytest.importorskip("tensorboard")
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator  # noqa: E402
from tensorboard.plugins.hparams import plugin_data_pb2  # noqa: E402
from torch.utils.tensorboard import SummaryWriter as TorchWriter  # noqa: E402

from flambeau.utils.tensorboard import SummaryWriter  # noqa: E402

KEEP_ALL = {"scalars": 0, "images": 0, "histograms": 0, "tensors": 0, "compressedHistograms": 0}


def _write(tmp_path, calls):
    """Run `calls(writer, mod)` on PyTorch's writer and ours; return both log dirs."""
    dirs = {}
    for mod, cls in ((torch, TorchWriter), (flambeau, SummaryWriter)):
        d = str(tmp_path / mod.__name__)
        with cls(log_dir=d) as w:
            calls(w, mod)
        dirs[mod] = d
    return dirs


def _acc(path):
    return EventAccumulator(path, size_guidance=KEEP_ALL).Reload()


def test_scalars_match_torch(tmp_path):
    def calls(w, mod):
        for step in range(5):
            w.add_scalar("loss/train", mod.tensor(1.0 / (step + 1)), step)
            w.add_scalar("lr", 0.1 * step, step)
            w.add_scalar("int", 3, step, new_style=True)
        w.add_scalars("run/x", {"a": mod.tensor(1.5), "b": 2.0}, 7)
    d = _write(tmp_path, calls)
    got = {m: _acc(p) for m, p in d.items()}
    for tag in ("loss/train", "lr"):
        assert [(e.step, e.value) for e in got[flambeau].Scalars(tag)] == \
            [(e.step, e.value) for e in got[torch].Scalars(tag)]
    assert got[flambeau].Tags()["tensors"] == got[torch].Tags()["tensors"] == ["int"]
    assert [e.tensor_proto.float_val for e in got[flambeau].Tensors("int")] == \
        [e.tensor_proto.float_val for e in got[torch].Tensors("int")]
    subs = {m: sorted(x for x in os.listdir(p) if os.path.isdir(os.path.join(p, x))) for m, p in d.items()}
    assert subs[flambeau] == subs[torch] == ["run_x_a", "run_x_b"]
    for sub in subs[torch]:
        ours, ref = (_acc(os.path.join(d[m], sub)).Scalars("run/x") for m in (flambeau, torch))
        assert [(e.step, e.value) for e in ours] == [(e.step, e.value) for e in ref]


HIST_VALUES = np.random.default_rng(0).normal(size=1000).astype(np.float32)


@pytest.mark.parametrize("bins,max_bins", [("tensorflow", None), (10, None), ("auto", None), (64, 7)])
def test_histograms_match_torch(tmp_path, bins, max_bins):
    def calls(w, mod):
        w.add_histogram("w", mod.tensor(HIST_VALUES), 1, bins=bins, max_bins=max_bins)
        w.add_histogram("w", mod.tensor(HIST_VALUES[:10] * 3), 2, bins=bins, max_bins=max_bins)
    d = _write(tmp_path, calls)
    ours, ref = (_acc(d[m]).Histograms("w") for m in (flambeau, torch))
    assert len(ours) == len(ref) == 2
    for a, b in zip(ours, ref):
        assert a.step == b.step
        np.testing.assert_allclose(a.histogram_value.bucket_limit, b.histogram_value.bucket_limit, rtol=1e-12)
        assert list(a.histogram_value.bucket) == list(b.histogram_value.bucket)
        for f in ("min", "max", "num", "sum", "sum_squares"):
            np.testing.assert_allclose(getattr(a.histogram_value, f), getattr(b.histogram_value, f), rtol=1e-6)


def _pixels(event):
    from PIL import Image
    return np.asarray(Image.open(io.BytesIO(event.encoded_image_string)))


def test_images_match_torch(tmp_path):
    rng = np.random.default_rng(1)
    chw = rng.random((3, 8, 5)).astype(np.float32)
    hwc8 = rng.integers(0, 256, (6, 4, 3), dtype=np.uint8)
    batch = rng.random((10, 1, 4, 3)).astype(np.float32)
    gray = rng.random((7, 9)).astype(np.float32)

    def calls(w, mod):
        w.add_image("chw", mod.tensor(chw), 0)
        w.add_image("hwc", hwc8, 0, dataformats="HWC")
        w.add_images("batch", mod.tensor(batch), 3)
        w.add_image("gray", mod.tensor(gray), 0, dataformats="HW")
    d = _write(tmp_path, calls)
    got = {m: _acc(p) for m, p in d.items()}
    assert sorted(got[flambeau].Tags()["images"]) == sorted(got[torch].Tags()["images"]) == \
        ["batch", "chw", "gray", "hwc"]
    for tag in ("chw", "hwc", "batch", "gray"):
        (a,), (b,) = got[flambeau].Images(tag), got[torch].Images(tag)
        assert (a.step, a.width, a.height) == (b.step, b.width, b.height)
        np.testing.assert_array_equal(_pixels(a), _pixels(b))


def test_text_and_tensor_match_torch(tmp_path):
    def calls(w, mod):
        w.add_text("notes", "héllo **world**", 4)
        w.add_text("notes", "second", 5)
    d = _write(tmp_path, calls)
    ours, ref = (_acc(d[m]).Tensors("notes/text_summary") for m in (flambeau, torch))
    assert [(e.step, list(e.tensor_proto.string_val)) for e in ours] == \
        [(e.step, list(e.tensor_proto.string_val)) for e in ref]
    assert ours[0].tensor_proto.string_val[0].decode() == "héllo **world**"


def _hparams_content(run_dir):
    acc = _acc(run_dir)
    content = acc.PluginTagToContent("hparams")
    out = {}
    for tag, raw in content.items():
        data = plugin_data_pb2.HParamsPluginData.FromString(raw)
        if data.WhichOneof("data") == "session_start_info":
            data.session_start_info.start_time_secs = 0       # the wall time of the run
        out[tag] = data
    return out, {t: [(e.step, e.value) for e in acc.Scalars(t)] for t in acc.Tags()["scalars"]}


def test_hparams_match_torch(tmp_path):
    def calls(w, mod):
        w.add_hparams({"lr": 0.01, "bs": 32, "opt": "adam", "wd": mod.tensor([0.5]), "skip": None, "flag": True},
                      {"hparam/acc": 0.9, "hparam/loss": mod.tensor(0.25)},
                      hparam_domain_discrete={"opt": ["adam", "sgd"]}, run_name="trial")
    d = _write(tmp_path, calls)
    ours, ref = (_hparams_content(os.path.join(d[m], "trial")) for m in (flambeau, torch))
    assert ours[0] == ref[0] and set(ref[0]) == {"_hparams_/experiment", "_hparams_/session_start_info",
                                                 "_hparams_/session_end_info"}
    assert ours[1] == ref[1]
    with pytest.raises(TypeError, match="hparam_dict and metric_dict should be dictionary."):
        SummaryWriter(str(tmp_path / "x")).add_hparams([], {})


def _scope_edges(graph_def):
    """Edges between module scopes (TensorBoard's boxes), parameter reads left out."""
    def scope(name):
        return name.split("/")[0] if name.startswith(("input/", "output/")) else name.rsplit("/", 1)[0]
    ops = {n.name: n.op for n in graph_def.node}
    return sorted({(scope(i), scope(n.name)) for n in graph_def.node for i in n.input
                   if ops.get(i) != "prim::GetAttr" and n.op != "prim::GetAttr" and scope(i) != scope(n.name)})


def _io_shapes(graph_def):
    return {n.name.split("/")[0]: [[d.size for d in s.dim] for s in n.attr["_output_shapes"].list.shape]
            for n in graph_def.node if n.op == "IO Node"}


def test_graph_has_torchs_module_structure(tmp_path):
    def calls(w, mod):
        m = mod.nn.Sequential(mod.nn.Linear(3, 4), mod.nn.ReLU(), mod.nn.Linear(4, 2))
        w.add_graph(m, mod.zeros(5, 3))
    d = _write(tmp_path, calls)
    ours, ref = (_acc(d[m]).Graph() for m in (flambeau, torch))
    assert _scope_edges(ours) == _scope_edges(ref) == [
        ("Sequential/Linear[0]", "Sequential/ReLU[1]"), ("Sequential/Linear[2]", "output"),
        ("Sequential/ReLU[1]", "Sequential/Linear[2]"), ("input", "Sequential/Linear[0]")]
    assert _io_shapes(ours) == _io_shapes(ref) == {"input": [[5, 3]], "output": [[5, 2]]}


def test_flush_close_and_reopen_like_torch(tmp_path):
    counts = {}
    for mod, cls in ((torch, TorchWriter), (flambeau, SummaryWriter)):
        d = str(tmp_path / mod.__name__)
        w = cls(log_dir=d, flush_secs=10_000)
        w.add_scalar("a", 1.0, 0)
        w.flush()
        flushed = [(e.step, e.value) for e in _acc(d).Scalars("a")]
        w.close()
        w.add_scalar("a", 2.0, 1)                 # a closed writer opens a new event file
        w.close()
        w.close()
        counts[mod] = (flushed, len(os.listdir(d)), [(e.step, e.value) for e in _acc(d).Scalars("a")])
    assert counts[flambeau] == counts[torch] == ([(0, 1.0)], 2, [(0, 1.0), (1, 2.0)])


def test_default_logdir_like_torch(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    w = SummaryWriter(comment="_exp")
    w.close()
    assert w.get_logdir().startswith("runs" + os.sep) and w.get_logdir().endswith("_exp")
    assert os.path.isdir(w.get_logdir())


_IMPORT_WITHOUT_TENSORBOARD = """
import sys
sys.modules['tensorboard'] = None
try:
    import {mod}.utils.tensorboard
except BaseException as e:
    print(type(e).__name__, '|', e)
"""


def test_import_without_the_package_fails_like_torch():
    out = {}
    for mod in ("torch", "flambeau"):
        r = subprocess.run([sys.executable, "-c", _IMPORT_WITHOUT_TENSORBOARD.format(mod=mod)],
                           capture_output=True, text=True, env={**os.environ, "PYTHONPATH": os.getcwd()})
        out[mod] = r.stdout.strip()
    assert out["flambeau"] == out["torch"] and out["torch"].startswith("ModuleNotFoundError")
