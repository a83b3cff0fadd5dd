"""torch.multiprocessing (flambeau/multiprocessing): `spawn` runs `fn(i, *args)` in new processes and
reports a child's failure as PyTorch's does (checked against PyTorch's own `spawn` on the same functions);
`share_memory_()` / `Module.share_memory()` put host tensors in memory that forked and spawned children
write in place (hogwild: two children's SGD steps all land in the parent's model); under `flambeau.run` a
spawned child's `import torch` is flambeau too."""
from __future__ import annotations

import os
import pickle
import subprocess
import sys
import textwrap

import numpy as np
import pytest
import torch

import flambeau
import flambeau.multiprocessing as fmp
from tests import mp_helpers

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_the_module_is_pythons_multiprocessing_with_pytorchs_additions():
    import multiprocessing
    for name in ("Process", "Queue", "SimpleQueue", "get_context", "set_start_method", "cpu_count", "Pool"):
        assert getattr(fmp, name) is getattr(multiprocessing, name), name
    for name in ("spawn", "start_processes", "ProcessContext", "ProcessRaisedException", "ProcessExitedException",
                 "get_all_sharing_strategies", "set_sharing_strategy", "get_sharing_strategy"):
        assert hasattr(torch.multiprocessing, name) and hasattr(fmp, name), name
    assert fmp.get_all_sharing_strategies() == torch.multiprocessing.get_all_sharing_strategies()
    fmp.set_sharing_strategy("file_system")
    assert fmp.get_sharing_strategy() == "file_system"
    fmp.set_sharing_strategy("file_descriptor")
    with pytest.raises(ValueError, match="invalid sharing strategy"):
        fmp.set_sharing_strategy("carrier_pigeon")


def test_spawn_runs_every_rank(tmp_path):
    assert fmp.spawn(mp_helpers.write_rank, args=(str(tmp_path), "hello"), nprocs=3) is None
    assert sorted(p.read_text() for p in tmp_path.iterdir()) == ["hello 0", "hello 1", "hello 2"]
    ctx = fmp.spawn(mp_helpers.write_rank, args=(str(tmp_path), "again"), nprocs=2, join=False)
    assert len(ctx.pids()) == 2
    while not ctx.join():
        pass
    assert (tmp_path / "1.txt").read_text() == "again 1"


@pytest.mark.parametrize("lib", ["flambeau", "torch"])
def test_a_raising_child_is_reported_with_its_traceback(lib):
    spawn = (fmp if lib == "flambeau" else torch.multiprocessing).spawn
    exc = fmp.ProcessRaisedException if lib == "flambeau" else torch.multiprocessing.ProcessRaisedException
    with pytest.raises(exc) as info:
        spawn(mp_helpers.fail_on_one, nprocs=2)
    msg = str(info.value)
    assert msg.startswith("\n\n-- Process 1 terminated with the following error:\nTraceback")
    assert "ValueError: rank one refuses" in msg and info.value.error_index == 1


@pytest.mark.parametrize("lib", ["flambeau", "torch"])
def test_a_child_exiting_non_zero_is_reported_with_its_code(lib):
    spawn = (fmp if lib == "flambeau" else torch.multiprocessing).spawn
    exc = fmp.ProcessExitedException if lib == "flambeau" else torch.multiprocessing.ProcessExitedException
    with pytest.raises(exc, match="process 1 terminated with exit code 3") as info:
        spawn(mp_helpers.exit_three_on_one, nprocs=2)
    assert info.value.exit_code == 3 and info.value.error_index == 1


def test_share_memory_keeps_values_and_pickles_by_mapping():
    from multiprocessing.reduction import ForkingPickler
    t = flambeau.tensor(np.arange(6, dtype=np.float32).reshape(2, 3))
    assert not t.is_shared()
    assert t.share_memory_() is t and t.is_shared()
    np.testing.assert_array_equal(t.numpy(), np.arange(6, dtype=np.float32).reshape(2, 3))
    other = pickle.loads(ForkingPickler.dumps(t))           # what a spawned child rebuilds
    other[1, 2] = 50.0
    assert float(t[1, 2]) == 50.0                          # the same memory
    plain = pickle.loads(ForkingPickler.dumps(flambeau.ones(2)))
    assert not plain.is_shared()                           # a tensor not shared travels by value
    with pytest.raises(RuntimeError, match="is a view of another one"):
        flambeau.zeros(4)[1:].share_memory_()
    p = flambeau.nn.Linear(2, 2).share_memory()
    assert all(q.is_shared() for q in p.parameters())
    back = pickle.loads(ForkingPickler.dumps(p.weight))
    assert isinstance(back, flambeau.nn.Parameter) and back.requires_grad


HOGWILD = """
import sys
import torch
import torch.multiprocessing as mp
sys.path.insert(0, {root!r})
from tests.mp_helpers import sgd_steps

if __name__ == "__main__":
    assert torch.__name__ == "flambeau", torch.__name__
    torch.manual_seed(0)
    model = torch.nn.Linear(3, 1)
    model.share_memory()
    start = model.bias.item()
    mp.set_start_method({method!r}, force=True)
    ps = [mp.Process(target=sgd_steps, args=(r, model, 5, "torch")) for r in range(2)]
    for p in ps:
        p.start()
    for p in ps:
        p.join()
    mp.spawn(sgd_steps, args=(model, 3, "torch"), nprocs=2)
    print(start, model.bias.item(), [p.exitcode for p in ps])
"""


@pytest.mark.parametrize("method", ["spawn", "fork"])
def test_hogwild_children_step_the_parents_shared_model(tmp_path, method):
    """Under `flambeau.run`: 2 children x 5 SGD steps (lr 0.1, d(sum)/d(bias) = 1) by mp.Process, then 2 x 3
    by mp.spawn, all on the parent's shared model: its bias moves by 0.1 * 16 (each child's `import torch`
    was flambeau: torch's optimizer would refuse flambeau's parameters)."""
    script = tmp_path / "hogwild.py"
    script.write_text(textwrap.dedent(HOGWILD.format(root=ROOT, method=method)))
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    out = subprocess.run([sys.executable, "-m", "flambeau.run", str(script)], capture_output=True, text=True,
                         env=env, timeout=240)
    assert out.returncode == 0, out.stderr
    start, end, codes = out.stdout.split(" ", 2)
    assert codes.strip() == "[0, 0]"
    assert float(end) == pytest.approx(float(start) - 1.6, abs=1e-5)
