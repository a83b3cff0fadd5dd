"""AOTInductor packages of programs that update their buffers (BUFFER_MUTATION outputs).

A package keeps each updated buffer in its runner's constants and writes the new value there after
every run, so the state carries over from run to run as in PyTorch's AOTInductor: BatchNorm's running
statistics in training mode, counters, a cache written by slices, buffers swapped. Checked against
PyTorch eager running the same module with the same weights, call by call: from Python (the runner
owning the state, and `load_constants(..., user_managed=True)` where the caller's tensors are updated
in place, PyTorch's API for it) and from the C++ program in a process without Python (the state read
through the C API after the runs).
"""
from __future__ import annotations

import numpy as np
import pytest

import flambeau as fl
from flambeau._inductor import aoti_compile_and_package, aoti_load_package, config
from flambeau._inductor.aoti_package import read_tensor_file
from flambeau.export import Dim, export
from tests.test_aoti import _run_cpp

RTOL, ATOL = 1e-5, 1e-5


def _bn_net(lib):
    nn = lib.nn

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.conv = nn.Conv2d(3, 4, 3)
            self.bn = nn.BatchNorm2d(4)
            self.register_buffer("count", lib.zeros(()))

        def forward(self, x):
            self.count.add_(1)
            return self.bn(self.conv(x)).relu() + self.count
    return Net().train()


def _cache_net(lib):
    nn = lib.nn

    class Cache(nn.Module):
        """A cache written by slices, two buffers swapped, a step counter; the output reads them all."""

        def __init__(self):
            super().__init__()
            self.lin = nn.Linear(4, 4)
            self.register_buffer("cache", lib.zeros(3, 4))
            self.register_buffer("a", lib.arange(4.0))
            self.register_buffer("b", lib.ones(4))
            self.register_buffer("step", lib.zeros((), dtype=lib.int64))

        def forward(self, x):
            self.cache[1:].copy_(self.cache[:-1].clone())
            self.cache[0] = self.lin(x).sum(0)
            tmp = self.a.clone()
            self.a.copy_(self.b)
            self.b.copy_(tmp)
            self.step.add_(1)
            return self.cache.sum(0) + self.a * self.step + x
    return Cache().train()


NETS = {"bn": (_bn_net, (2, 3, 8, 8), {"count", "bn.running_mean", "bn.running_var", "bn.num_batches_tracked"}),
        "cache": (_cache_net, (5, 4), {"cache", "a", "b", "step"})}


def _pair(name):
    import torch
    make, shape, _ = NETS[name]
    fl.manual_seed(0)
    m = make(fl)
    tm = make(torch)
    tm.load_state_dict({k: torch.tensor(v.detach().numpy()) for k, v in m.state_dict().items()})
    return m, tm, shape


@pytest.fixture
def freezing():
    saved = config.freezing
    yield
    config.freezing = saved


@pytest.mark.parametrize("frozen", [False, True], ids=["plain", "freezing"])
@pytest.mark.parametrize("managed", [False, True], ids=["runner", "user_managed"])
@pytest.mark.parametrize("name", list(NETS))
def test_aoti_buffer_updates_carry_over_like_pytorch(tmp_path, freezing, name, managed, frozen):
    import torch
    config.freezing = frozen
    m, tm, shape = _pair(name)
    pkg = aoti_compile_and_package(export(m, (fl.randn(*shape),), dynamic_shapes={"x": {0: Dim("batch", max=16)}}),
                                   package_path=str(tmp_path / "m.pt2"))
    run = aoti_load_package(pkg)
    updated = {c["fqn"] for c in run.metadata["constants"] if c["mutable"]}
    assert updated == NETS[name][2]
    state = {k: fl.tensor(tm.state_dict()[k].numpy().copy()) for k in sorted(updated)} if managed else {}
    if managed:
        run.load_constants(state, check_full_update=False, user_managed=True)
    for step in range(3):
        x = fl.randn(shape[0] + step, *shape[1:])
        want = tm(torch.tensor(x.numpy())).detach().numpy()
        np.testing.assert_allclose(run(x).numpy(), want, rtol=RTOL, atol=ATOL, err_msg=f"call {step}")
    for k, t in state.items():          # the caller's tensors were updated in place, call by call
        np.testing.assert_allclose(t.numpy(), tm.state_dict()[k].numpy(), rtol=RTOL, atol=ATOL, err_msg=k)


@pytest.mark.parametrize("name", list(NETS))
def test_aoti_buffer_updates_from_cpp_program_like_pytorch(tmp_path, name):
    """Three runs of the C++ program (no Python): the last outputs and the updated buffers read through
    fl_aoti_constant_data vs PyTorch eager after three calls on the same input."""
    import torch
    m, tm, shape = _pair(name)
    x = fl.randn(*shape)
    r, _ = _run_cpp(aoti_compile_and_package(export(m, (x,)), package_path=str(tmp_path / "m.pt2")), tmp_path, [x],
                    repeat=2)
    assert r.returncode == 0, r.stderr
    for _ in range(3):
        want = tm(torch.tensor(x.numpy())).detach().numpy()
    np.testing.assert_allclose(read_tensor_file(str(tmp_path / "output0.bin")).numpy(), want, rtol=RTOL, atol=ATOL)
    written = sorted(p.name for p in tmp_path.glob("state.*.bin"))
    assert written, "the C++ program wrote no updated buffer"
    for p in written:
        k = p[len("state."):-len(".bin")]
        np.testing.assert_allclose(read_tensor_file(str(tmp_path / p)).numpy(), tm.state_dict()[k].numpy(),
                                   rtol=RTOL, atol=ATOL, err_msg=k)


def test_aoti_load_constants_as_pytorch(tmp_path):
    """load_constants copies weights in (repacked for the products), names unknown FQNs as PyTorch
    does, and with check_full_update refuses a partial map; user_managed tensors must be contiguous."""
    import torch
    fl.manual_seed(0)
    m = fl.nn.Sequential(fl.nn.Linear(8, 8), fl.nn.ReLU(), fl.nn.Linear(8, 3)).eval()
    tm = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.ReLU(), torch.nn.Linear(8, 3)).eval()
    run = aoti_load_package(aoti_compile_and_package(export(m, (fl.randn(2, 8),)),
                                                     package_path=str(tmp_path / "m.pt2")))
    assert sorted(run.get_constant_fqns()) == sorted(tm.state_dict())
    run.load_constants({k: fl.tensor(v.detach().numpy()) for k, v in tm.state_dict().items()},
                       check_full_update=True)
    x = fl.randn(2, 8)
    with torch.no_grad():
        want = tm(torch.tensor(x.numpy())).numpy()
    np.testing.assert_allclose(run(x).numpy(), want, rtol=RTOL, atol=ATOL)
    with pytest.raises(RuntimeError, match="Constant not found: nope"):
        run.load_constants({"nope": fl.zeros(1)}, check_full_update=False)
    with pytest.raises(RuntimeError, match=r"not given: \['0.bias', '2.bias', '2.weight'\]"):
        run.load_constants({"0.weight": fl.zeros(8, 8)}, check_full_update=True)
    with pytest.raises(RuntimeError, match="0.weight must be a cpu float32 tensor of shape"):
        run.load_constants({"0.weight": fl.zeros(8, 7)}, check_full_update=False)
    with pytest.raises(RuntimeError, match="must be contiguous"):
        run.load_constants({"0.weight": fl.zeros(8, 8).t()}, check_full_update=False, user_managed=True)
