"""`python -m flambeau.run` runs unmodified PyTorch scripts; results agree with real PyTorch."""
import os
import subprocess
import sys

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)


def _run(args):
    """The fields of the last line of each tag (`RESULT ...`, `RUNTIME ...`) the program printed."""
    env = dict(os.environ, PYTHONPATH=ROOT)
    p = subprocess.run([sys.executable] + args, capture_output=True, text=True, env=env, timeout=300)
    assert p.returncode == 0, p.stderr[-3000:]
    return {l.split()[0]: l.split()[1:] for l in p.stdout.splitlines() if l[:1].isupper()}


def test_training_script_matches_pytorch():
    script = os.path.join(HERE, "scripts", "train_mlp.py")
    ours_out = _run(["-m", "flambeau.run", script])
    ref_out = _run([script])
    ours, ref = ours_out["RESULT"], ref_out["RESULT"]
    assert float(ours[0]) == pytest.approx(float(ref[0]), rel=1e-6)
    assert ours[1:] == ref[1:]
    # The script really ran on flambeau (and the reference on PyTorch): the module torch names, the
    # tensors' class and the layers' classes all come from flambeau.
    runtime = ours_out["RUNTIME"]
    assert runtime[0] == "flambeau" and all(m.startswith("flambeau") for m in runtime[1:]), runtime
    assert ref_out["RUNTIME"][0] == "torch"


def test_torch_module_aliases():
    code = ("import flambeau.compat as c; c.enable(); import torch, torch.nn as nn, torch.nn.functional as F; "
            "from torch.utils.data import DataLoader; import flambeau; "
            "assert torch is flambeau and nn is flambeau.nn and F is flambeau.nn.functional; print('RESULT ok')")
    assert _run(["-c", code])["RESULT"] == ["ok"]


FROZEN_AT_LEAST = 10000       # objects of flambeau's import that `import flambeau` freezes (~57k)


@pytest.mark.parametrize("how", ["run", "import"])
@pytest.mark.parametrize("freeze", ["1", "0"])
def test_import_objects_are_frozen_and_the_scripts_cycles_still_collected(tmp_path, freeze, how):
    """`import flambeau` (so also flambeau.run) moves flambeau's import-time objects out of the collector's
    reach (FLAMBEAU_GC_FREEZE=0: not), and a reference cycle the script drops is still freed by the collector,
    run by the allocations that follow (its finalizer runs)."""
    script = tmp_path / "cycle.py"
    script.write_text(
        ("import gc, weakref, torch\n" if how == "run" else "import gc, weakref, flambeau as torch\n") +
        "class Node:\n"
        "    pass\n"
        "a, b = Node(), Node()\n"
        "a.other, b.other = b, a\n"
        "a.t = torch.ones(3)\n"
        "freed = []\n"
        "weakref.finalize(a, freed.append, 1)\n"
        "del a, b\n"
        "junk = [[] for _ in range(50000)]\n"     # the collector runs by itself (young collections)
        "print('RESULT', gc.get_freeze_count(), len(freed))\n")
    env = dict(os.environ, PYTHONPATH=ROOT, FLAMBEAU_GC_FREEZE=freeze)
    cmd = [sys.executable, "-m", "flambeau.run", str(script)] if how == "run" else [sys.executable, str(script)]
    p = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=300)
    assert p.returncode == 0, p.stderr[-3000:]
    frozen, freed = (int(v) for v in p.stdout.split("RESULT")[1].split())
    assert freed == 1, "the script's own cycle was not collected"
    assert (frozen >= FROZEN_AT_LEAST) if freeze == "1" else (frozen == 0), frozen
