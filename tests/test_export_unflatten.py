"""`flambeau.export.unflatten` vs `torch.export.unflatten`: the module hierarchy rebuilt from an
ExportedProgram (submodule FQNs, parameter and buffer names, state_dict keys as the original module's
and PyTorch's) and outputs equal to the eager module, with dynamic batch, tied weights, buffer updates,
a module called twice, strict export and save/load."""
from __future__ import annotations

import numpy as np
import pytest
import torch

import flambeau as fl
from bench.small_gpt import small_gpt
from flambeau.export import Dim, export, load, save, unflatten


def cnn(lib):
    nn = lib.nn

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.features = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8))
            self.act = nn.ReLU()
            self.head = nn.Sequential(nn.Flatten(), nn.Linear(8 * 6 * 6, 5))
            self.register_buffer("calls", lib.zeros(()))

        def forward(self, x):
            self.calls.add_(1)
            y = self.act(self.features(x))
            return self.head(self.act(y - 0.5)), y.mean()
    return Net()


def _models(lib, name):
    if name == "gpt":
        return small_gpt(lib, vocab=50, d=32, heads=4, layers=2, block=16, tied_head=True).eval()
    return cnn(lib).train()


def _pair(name):
    fl.manual_seed(0)
    fm = _models(fl, name)
    tm = _models(torch, name)
    tm.load_state_dict({k: torch.tensor(v.detach().numpy()) for k, v in fm.state_dict().items()})
    return fm, tm


def _inputs(lib, name, batch):
    rng = np.random.default_rng(batch)
    if name == "gpt":
        return (lib.tensor(rng.integers(0, 50, (batch, 16))),)
    return (lib.tensor(rng.standard_normal((batch, 3, 6, 6)).astype(np.float32)),)


def _dims(name):
    key = "idx" if name == "gpt" else "x"
    return lambda D: {key: {0: D("batch", min=2, max=16)}}


def _names(m) -> tuple:
    """Module and parameter FQNs in order; buffers as a set (PyTorch's strict export orders them its way)."""
    mods = [n for n, _ in m.named_modules() if "@" not in n]
    return mods, [n for n, _ in m.named_parameters()], sorted(n for n, _ in m.named_buffers()), sorted(m.state_dict())


def _numpy(out):
    return [o.detach().numpy() for o in (out if isinstance(out, tuple) else (out,))]


@pytest.mark.parametrize("strict", [False, True])
@pytest.mark.parametrize("name", ["gpt", "cnn"])
def test_unflatten_rebuilds_the_hierarchy_as_pytorch(name, strict):
    fm, tm = _pair(name)
    tep = torch.export.export(tm, _inputs(torch, name, 4), dynamic_shapes=_dims(name)(torch.export.Dim),
                              strict=strict)
    fep = export(fm, _inputs(fl, name, 4), dynamic_shapes=_dims(name)(Dim), strict=strict)
    tu, fu = torch.export.unflatten(tep), unflatten(fep)
    assert _names(fu) == _names(tu) == _names(fm)
    # every submodule runs its own code: the root calls its children by name, as PyTorch's (the CNN's
    # ReLU twice: both calls run the same graph)
    assert _calls(fu) == _calls(tu), fu.code
    for batch in (3, 9):
        want = _numpy(tm(*_inputs(torch, name, batch)))
        got = _numpy(fu(*_inputs(fl, name, batch)))
        for g, w in zip(got, want):
            np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-5)
    if name == "cnn":           # buffer updates land in the unflattened module's buffers, as in PyTorch's
        for k in ("features.1.running_mean", "features.1.running_var", "calls"):
            np.testing.assert_allclose(fu.state_dict()[k].numpy(), tm.state_dict()[k].numpy(), rtol=1e-5,
                                       atol=1e-6, err_msg=k)


def _all_calls(m) -> dict:
    return {name: _calls(sub) for name, sub in m.named_modules() if hasattr(sub, "graph")}


@pytest.mark.parametrize("name", ["gpt", "cnn"])
def test_unflatten_after_run_decompositions_as_pytorch(name):
    """run_decompositions keeps each node's module stack on the nodes it decomposes into, so the
    decomposed program unflattens into the same hierarchy as PyTorch's decomposed program: names,
    every module's call_module targets, outputs, buffer updates."""
    fm, tm = _pair(name)
    tep = torch.export.export(tm, _inputs(torch, name, 4), dynamic_shapes=_dims(name)(torch.export.Dim))
    fep = export(fm, _inputs(fl, name, 4), dynamic_shapes=_dims(name)(Dim)).run_decompositions()
    tu, fu = torch.export.unflatten(tep.run_decompositions()), unflatten(fep)
    assert _names(fu) == _names(tu) == _names(fm)
    assert _all_calls(fu) == _all_calls(tu), fu.code
    for batch in (3, 9):
        for g, w in zip(_numpy(fu(*_inputs(fl, name, batch))), _numpy(tm(*_inputs(torch, name, batch)))):
            np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-5)
    if name == "cnn":
        for k in ("features.1.running_mean", "features.1.running_var", "calls"):
            np.testing.assert_allclose(fu.state_dict()[k].numpy(), tm.state_dict()[k].numpy(), rtol=1e-5,
                                       atol=1e-6, err_msg=k)


def test_unflatten_of_a_loaded_program_and_its_guards(tmp_path):
    fm, _ = _pair("gpt")
    ep = export(fm, _inputs(fl, "gpt", 4), dynamic_shapes=_dims("gpt")(Dim))
    save(ep, tmp_path / "gpt.pt2")
    fu = unflatten(load(tmp_path / "gpt.pt2"))
    assert "self.blocks(" in fu.code and "self.qkv(" in fu.blocks.get_submodule("0").code
    x = _inputs(fl, "gpt", 5)
    np.testing.assert_allclose(fu(*x).detach().numpy(), fm(*x).detach().numpy(), rtol=1e-5, atol=1e-5)
    with pytest.raises(AssertionError, match="the Dim batch ranges over"):
        fu(*_inputs(fl, "gpt", 17))
    with pytest.raises(TypeError, match="ExportedProgram"):
        unflatten(fm)


def twice(lib):
    """A block called twice with different code (`blk@1` in PyTorch) whose inner Linear runs the same
    graph both times (shared, called again), and a ReLU called twice the same way."""
    nn = lib.nn

    class Blk(nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = nn.Linear(4, 4)
            self.register_buffer("scale", lib.full((4,), 2.0))

        def forward(self, x, scaled=False):
            y = self.lin(x)
            return y * self.scale if scaled else y

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.blk = Blk()
            self.act = nn.ReLU()
            self.out = nn.Linear(4, 2)

        def forward(self, x):
            y = self.act(self.blk(x))
            return self.out(self.act(self.blk(y, True)))
    return Net()


def _calls(m) -> list:
    return [str(n.target) for n in m.graph.nodes if n.op == "call_module"]


@pytest.mark.parametrize("strict", [False, True])
def test_unflatten_of_a_module_called_twice_as_pytorch(strict):
    fl.manual_seed(0)
    fm = twice(fl)
    tm = twice(torch)
    tm.load_state_dict({k: torch.tensor(v.detach().numpy()) for k, v in fm.state_dict().items()})
    x = np.random.default_rng(0).standard_normal((3, 4)).astype(np.float32)
    tu = torch.export.unflatten(torch.export.export(tm, (torch.tensor(x),), strict=strict))
    fu = unflatten(export(fm, (fl.tensor(x),), strict=strict))
    for dup in (True, False):
        assert [n for n, _ in fu.named_modules(remove_duplicate=dup)] == \
            [n for n, _ in tu.named_modules(remove_duplicate=dup)]
    assert [n for n, _ in fu.named_parameters()] == [n for n, _ in tu.named_parameters()]
    assert list(fu.state_dict()) == list(tu.state_dict())       # blk@1.lin.weight, blk@1.scale too
    for m in ("", "blk", "blk@1"):
        assert _calls(fu.get_submodule(m)) == _calls(tu.get_submodule(m)), (m, fu.get_submodule(m).code)
    copy = fu.get_submodule("blk@1")
    assert copy.lin is fu.blk.lin and copy.scale is fu.blk.scale
    np.testing.assert_allclose(fu(fl.tensor(x)).detach().numpy(), tm(torch.tensor(x)).detach().numpy(),
                               rtol=1e-6, atol=1e-6)


def with_cond(lib, twice: bool):
    """`cond` inside a submodule, one branch using the submodule's child; `twice`: the submodule called
    again with another constant (a `blk@1` copy with its own branches)."""
    nn = lib.nn

    class Blk(nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = nn.Linear(4, 4)

        def forward(self, x, k=2.0):
            return lib.cond(x.sum() > 0, lambda x: self.lin(x) * k, lambda x: x - k, (x,))

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.blk = Blk()
            self.out = nn.Linear(4, 2)

        def forward(self, x):
            y = self.blk(x)
            return self.out(self.blk(y, 3.0) if twice else y)
    return Net()


@pytest.mark.parametrize("twice", [False, True])
@pytest.mark.parametrize("strict", [False, True])
def test_unflatten_puts_cond_subgraphs_in_the_calling_module_as_pytorch(strict, twice):
    fl.manual_seed(0)
    fm = with_cond(fl, twice)
    tm = with_cond(torch, twice)
    tm.load_state_dict({k: torch.tensor(v.detach().numpy()) for k, v in fm.state_dict().items()})
    x = np.random.default_rng(1).standard_normal((3, 4)).astype(np.float32)
    tu = torch.export.unflatten(torch.export.export(tm, (torch.tensor(x),), strict=strict))
    fu = unflatten(export(fm, (fl.tensor(x),), strict=strict))
    # PyTorch registers the branches in its own order (false_graph_0 first): compare as sets
    for dup in (True, False):
        assert sorted(n for n, _ in fu.named_modules(remove_duplicate=dup)) == \
            sorted(n for n, _ in tu.named_modules(remove_duplicate=dup))
    assert list(fu.state_dict()) == list(tu.state_dict())
    for m in ("", "blk") + (("blk@1",) if twice else ()):
        assert _calls(fu.get_submodule(m)) == _calls(tu.get_submodule(m)), (m, fu.get_submodule(m).code)
        subgraphs = [n.target for n in fu.get_submodule(m).graph.find_nodes(op="get_attr") if "graph" in n.target]
        assert sorted(subgraphs) == sorted(n.target for n in tu.get_submodule(m).graph.find_nodes(op="get_attr")
                                           if "graph" in n.target), fu.get_submodule(m).code
    for sign in (1, -1):                     # both branches
        xs = sign * np.abs(x)
        np.testing.assert_allclose(fu(fl.tensor(xs)).detach().numpy(), tm(torch.tensor(xs)).detach().numpy(),
                                   rtol=1e-6, atol=1e-6)


def adder(lib):
    class Add(lib.nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = lib.nn.Linear(4, 3)

        def forward(self, x, y):
            return self.lin(x) + y
    return Add()


def test_flat_args_adapter_as_pytorch(capsys):
    """A call with an extra input: without an adapter PyTorch's TypeError; with one that keeps the
    first two flat inputs, the outputs of PyTorch's unflattened module; an adapter returning too few
    inputs, PyTorch's TypeError. The adapter sees the same target/input specs' leaf counts as PyTorch's."""
    fl.manual_seed(0)
    fm, tm = adder(fl), adder(torch)
    tm.load_state_dict({k: torch.tensor(v.detach().numpy()) for k, v in fm.state_dict().items()})
    rng = np.random.default_rng(0)
    x, y, z = (rng.standard_normal(s).astype(np.float32) for s in ((2, 4), (2, 3), (5,)))
    seen = []

    def adapter(lib, keep):
        class Keep(getattr(lib.export, "FlatArgsAdapter")):
            def adapt(self, target_spec, input_spec, input_args, metadata=None, obj=None):
                seen.append((lib.__name__, target_spec.num_leaves, input_spec.num_leaves, len(input_args)))
                return input_args[:keep]
        return Keep()

    outs = {}
    for lib in (torch, fl):
        ep = lib.export.export(fm if lib is fl else tm, (lib.tensor(x), lib.tensor(y)))
        u = lib.export.unflatten(ep)
        with pytest.raises(TypeError, match="There is no flat args adapter specified"):
            u(lib.tensor(x), lib.tensor(y), lib.tensor(z))
        u = lib.export.unflatten(ep, flat_args_adapter=adapter(lib, 2))
        outs[lib.__name__] = u(lib.tensor(x), lib.tensor(y), lib.tensor(z)).detach().numpy()
        with pytest.raises(TypeError, match="Flat args adaption failed, number of args mismatch"):
            lib.export.unflatten(ep, flat_args_adapter=adapter(lib, 1))(lib.tensor(x), lib.tensor(y), lib.tensor(z))
    np.testing.assert_allclose(outs["flambeau"], outs["torch"], rtol=1e-6, atol=1e-6)
    by_lib = {}
    for name, *counts in seen:
        by_lib.setdefault(name, []).append(counts)
    assert by_lib["flambeau"] == by_lib["torch"] == [[2, 3, 3], [2, 3, 3]]
    assert capsys.readouterr().out.count("Adapting flat arg to match exported module's treespec") == 6
