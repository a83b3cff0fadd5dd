"""`python -m flambeau.demo`: its GPT trains as the same code does on PyTorch, its loss falls, the
compiled run follows the eager one, and the command writes its report and loss curve.

The demo is written against the PyTorch API (`import flambeau as torch`), so its own source, with
those imports pointed at PyTorch, is the reference model.
"""
import os
import types

import numpy as np
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
