"""`python -m flambeau.demo`: its GPT trains as the same code does on PyTorch, its loss falls, the
compiled run follows the eager one, and the command writes its report and loss curve.

The demo is written against the PyTorch API (`import flambeau as torch`), so its own source, with
those imports pointed at PyTorch, is the reference model.
"""
import os
import struct
import sys
import types

import numpy as np
import pytest
import torch

import flambeau
from flambeau import demo

STEPS_COMPARED = 3        # training steps compared with PyTorch and between eager and compiled
STEPS_LEARNING = 30       # enough for the loss to fall clearly from its initial ~log(11)
LOSS_DROP = 0.5           # the mean of the last 5 losses is at least this much below the first


def _demo_on_torch():
    """The demo module's source run with `torch` as the framework."""
    with open(demo.__file__) as f:
        src = f.read()
    for ours, theirs in (("import flambeau as torch", "import torch"),
                         ("import flambeau.nn as nn", "import torch.nn as nn"),
                         ("import flambeau.nn.functional as F", "import torch.nn.functional as F")):
        assert ours in src
        src = src.replace(ours, theirs)
    mod = types.ModuleType("demo_on_torch")
    exec(compile(src, "demo_on_torch", "exec"), mod.__dict__)
    return mod


def test_demo_training_matches_pytorch(capsys):
    ref = _demo_on_torch()
    flambeau.manual_seed(0)
    ours = demo.GPT()
    theirs = ref.GPT()
    theirs.load_state_dict({k: torch.tensor(v.detach().numpy()) for k, v in ours.state_dict().items()})
    assert theirs.head.weight is theirs.tok.weight and ours.head.weight is ours.tok.weight
    l_ours, _ = demo.train(ours, STEPS_COMPARED, "cpu", np.random.default_rng(5), "eager")
    l_ref, _ = ref.train(theirs, STEPS_COMPARED, "cpu", np.random.default_rng(5), "eager")
    capsys.readouterr()
    np.testing.assert_allclose(l_ours, l_ref, rtol=1e-3)


def test_demo_loss_falls_and_compiled_follows_eager(capsys):
    flambeau.manual_seed(0)
    losses, _ = demo.train(demo.GPT(), STEPS_LEARNING, "cpu", np.random.default_rng(0), "eager")
    assert np.mean(losses[-5:]) < losses[0] - LOSS_DROP, losses
    flambeau.manual_seed(0)
    eager, _ = demo.train(demo.GPT(), STEPS_COMPARED, "cpu", np.random.default_rng(1), "eager")
    flambeau.manual_seed(0)
    model = demo.GPT()
    compiled, _ = demo.train(model, STEPS_COMPARED, "cpu", np.random.default_rng(1), "compiled",
                             step_fn=flambeau.compile(model))
    capsys.readouterr()
    np.testing.assert_allclose(compiled, eager, rtol=1e-4)


def test_demo_command_reports_and_writes_the_curve(tmp_path, capsys):
    acc = demo.main(["--steps", "2", "--no-compile", "--out", str(tmp_path)])
    out = capsys.readouterr().out
    assert 0.0 <= acc <= 1.0
    assert "held-out accuracy" in out and "GPT with" in out
    with open(os.path.join(tmp_path, "loss.png"), "rb") as f:
        assert f.read(8) == b"\x89PNG\r\n\x1a\n"


def test_loss_chart_through_matplotlib(tmp_path):
    """With matplotlib: a chart with labelled axes, a log-scale loss axis and a legend of the runs,
    its lines holding the losses; the PNG has the figure's size."""
    pytest.importorskip("matplotlib")
    from PIL import Image
    series = {"eager": [2.4, 1.1, 0.5], "compiled": [2.4, 1.0, 0.6]}
    path = str(tmp_path / "loss.png")
    fig = demo.plot_losses(series, path)
    (ax,) = fig.axes
    assert ax.get_xlabel() == "training step" and "loss" in ax.get_ylabel() and ax.get_yscale() == "log"
    assert [t.get_text() for t in ax.get_legend().get_texts()] == ["eager", "compiled"]
    assert [list(line.get_ydata()) for line in ax.get_lines()] == list(series.values())
    assert [list(line.get_xdata()) for line in ax.get_lines()] == [[1, 2, 3]] * 2
    w, h = fig.get_size_inches() * fig.dpi
    assert Image.open(path).size == (round(w), round(h))


def test_loss_curve_falls_back_to_the_png_writer(tmp_path, monkeypatch):
    monkeypatch.setattr(demo, "Figure", None)
    path = str(tmp_path / "loss.png")
    assert demo.plot_losses({"eager": [2.0, 1.0]}, path) is None
    with open(path, "rb") as f:
        head = f.read(24)
    assert head[:8] == b"\x89PNG\r\n\x1a\n" and struct.unpack(">II", head[16:24]) == (640, 360)


def test_progress_through_tqdm_on_a_terminal(capsys, monkeypatch):
    pytest.importorskip("tqdm")
    flambeau.manual_seed(0)
    monkeypatch.setattr(sys.stdout, "isatty", lambda: True)
    demo.train(demo.GPT(), 2, "cpu", np.random.default_rng(0), "eager")
    err = capsys.readouterr().err
    assert "eager: 100%" in err and "2/2" in err and "loss=" in err
    monkeypatch.setattr(sys.stdout, "isatty", lambda: False)
    demo.train(demo.GPT(), 2, "cpu", np.random.default_rng(0), "eager")
    out = capsys.readouterr()
    assert "2/2 loss" in out.out and "100%" not in out.err
