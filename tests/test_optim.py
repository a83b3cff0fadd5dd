"""Optimizers and LR schedulers vs PyTorch: training losses from identical weights, foreach vs loop
identity, optimizer state_dict structure and round trip, scheduler learning-rate sequences."""
from collections import OrderedDict

import numpy as np
import pytest
import torch

import flambeau as fl
import flambeau.nn as fnn


def F_(t):
    return fl.tensor(t.detach().numpy())


def N(x):
    return x.detach().numpy()


def mlp(nn):
    return nn.Sequential(nn.Linear(6, 10), nn.Tanh(), nn.Linear(10, 3))


def cnn(nn):
    return nn.Sequential(nn.Conv2d(1, 3, 3), nn.BatchNorm2d(3), nn.ReLU(), nn.Flatten(), nn.Linear(3 * 4 * 4, 3))


def twin(arch):
    torch.manual_seed(0)
    tm, fm = arch(torch.nn).double(), arch(fnn).double()
    fm.load_state_dict(OrderedDict((k, F_(v)) for k, v in tm.state_dict().items()))
    return tm, fm


OPTIMS = [
    ("SGD", dict(lr=0.1)),
    ("SGD", dict(lr=0.05, momentum=0.9, dampening=0.1, weight_decay=0.01)),
    ("SGD", dict(lr=0.05, momentum=0.9, nesterov=True, maximize=False)),
    ("Adam", dict(lr=0.01)),
    ("Adam", dict(lr=0.01, amsgrad=True, weight_decay=0.1)),
    ("Adam", dict(lr=0.01, maximize=True)),
    ("AdamW", dict(lr=0.01)),
    ("AdamW", dict(lr=0.01, amsgrad=True, weight_decay=0.5)),
    ("RMSprop", dict(lr=0.01)),
    ("RMSprop", dict(lr=0.01, centered=True, momentum=0.5, weight_decay=0.1)),
    ("Adagrad", dict(lr=0.1, lr_decay=0.01, initial_accumulator_value=0.1, weight_decay=0.01)),
    ("Adadelta", dict()),
    ("Adadelta", dict(lr=0.5, rho=0.8, eps=1e-5, weight_decay=0.1, maximize=True)),
    ("Adamax", dict(lr=0.02, weight_decay=0.01)),
    ("NAdam", dict(lr=0.01)),
    ("NAdam", dict(lr=0.01, weight_decay=0.1, decoupled_weight_decay=True)),
    ("RAdam", dict(lr=0.01)),
    ("RAdam", dict(lr=0.01, weight_decay=0.1, decoupled_weight_decay=True)),
]
IDS = [f"{n}{i}" for i, (n, _) in enumerate(OPTIMS)]


def train(lib, nn, model, opt, steps=8, arch=mlp):
    g = np.random.default_rng(1)
    losses = []
    for _ in range(steps):
        if arch is mlp:
            x, y = g.standard_normal((16, 6)), g.integers(0, 3, 16)
        else:
            x, y = g.standard_normal((8, 1, 6, 6)), g.integers(0, 3, 8)
        x, y = lib.tensor(x), lib.tensor(y)
        opt.zero_grad()
        loss = nn.functional.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        losses.append(float(loss))
    return losses


@pytest.mark.parametrize("name,kw", OPTIMS, ids=IDS)
@pytest.mark.parametrize("arch", [mlp, cnn], ids=["mlp", "cnn"])
def test_training_matches_pytorch_and_foreach_matches_loop(name, kw, arch):
    tm, fm = twin(arch)
    _, fm2 = twin(arch)
    tl = train(torch, torch.nn, tm, getattr(torch.optim, name)(tm.parameters(), **kw), arch=arch)
    fl1 = train(fl, fnn, fm, getattr(fl.optim, name)(fm.parameters(), foreach=True, **kw), arch=arch)
    fl2 = train(fl, fnn, fm2, getattr(fl.optim, name)(fm2.parameters(), foreach=False, **kw), arch=arch)
    np.testing.assert_allclose(fl1, tl, rtol=1e-3)
    np.testing.assert_allclose(fl1, tl, rtol=1e-8)        # float64: far tighter than required
    assert fl1 == fl2
    for p1, p2 in zip(fm.parameters(), fm2.parameters()):
        assert np.array_equal(N(p1), N(p2))
    for tp, fp in zip(tm.parameters(), fm.parameters()):
        np.testing.assert_allclose(N(fp), N(tp), rtol=1e-7, atol=1e-9)


def _structure(sd):
    return {"state": {k: sorted(v) for k, v in sd["state"].items()},
            "param_groups": [sorted(g) for g in sd["param_groups"]],
            "params": [g["params"] for g in sd["param_groups"]]}


@pytest.mark.parametrize("name,kw", OPTIMS, ids=IDS)
def test_optimizer_state_dict_structure(name, kw):
    tm, fm = twin(mlp)
    to = getattr(torch.optim, name)(tm.parameters(), **kw)
    fo = getattr(fl.optim, name)(fm.parameters(), **kw)
    assert _structure(fo.state_dict()) == _structure(to.state_dict())
    train(torch, torch.nn, tm, to, steps=2)
    train(fl, fnn, fm, fo, steps=2)
    tsd, fsd = to.state_dict(), fo.state_dict()
    assert _structure(fsd) == _structure(tsd)
    assert list(fsd["param_groups"][0]) == list(tsd["param_groups"][0])
    assert fsd["param_groups"] == tsd["param_groups"]
    for i, st in tsd["state"].items():
        for k, v in st.items():
            fv = fsd["state"][i][k]
            assert isinstance(fv, fl.Tensor) and fv.shape == v.shape and fv.dtype.name == str(v.dtype).split(".")[1]
            np.testing.assert_allclose(fv.numpy(), v.numpy(), rtol=1e-6, atol=1e-9)


@pytest.mark.parametrize("foreach", [True, False])
def test_optimizer_load_state_dict_resumes(foreach):
    _, fa = twin(mlp)
    _, fb = twin(mlp)
    oa = fl.optim.Adam(fa.parameters(), lr=0.01, foreach=foreach)
    train(fl, fnn, fa, oa, steps=3)
    fb.load_state_dict(fa.state_dict())
    ob = fl.optim.Adam(fb.parameters(), lr=0.01, foreach=foreach)
    ob.load_state_dict(oa.state_dict())
    assert train(fl, fnn, fa, oa, steps=3) == train(fl, fnn, fb, ob, steps=3)
    with pytest.raises(ValueError, match="different number of parameter groups"):
        ob.load_state_dict({"state": {}, "param_groups": []})


def test_param_groups_zero_grad_hooks_closure():
    _, fm = twin(mlp)
    ps = list(fm.parameters())
    opt = fl.optim.SGD([{"params": ps[:2]}, {"params": ps[2:], "lr": 0.5}], lr=0.1, momentum=0.9)
    assert [g["lr"] for g in opt.param_groups] == [0.1, 0.5]
    with pytest.raises(ValueError, match="some parameters appear in more than one parameter group"):
        opt.add_param_group({"params": ps[:1]})
    with pytest.raises(ValueError, match="optimizer got an empty parameter list"):
        fl.optim.SGD([], lr=0.1)
    with pytest.raises(TypeError):
        fl.optim.SGD(ps[0], lr=0.1)
    log = []
    opt.register_step_pre_hook(lambda o, a, k: log.append("pre"))
    h = opt.register_step_post_hook(lambda o, a, k: log.append("post"))

    def closure():
        opt.zero_grad()
        loss = fm(fl.ones(2, 6, dtype=fl.float64)).sum()
        loss.backward()
        return loss

    loss = opt.step(closure)
    assert isinstance(loss, fl.Tensor) and log == ["pre", "post"]
    h.remove()
    opt.step(closure)
    assert log == ["pre", "post", "pre"]
    opt.zero_grad()
    assert all(p.grad is None for p in ps)
    closure()
    opt.zero_grad(set_to_none=False)
    assert all(float(p.grad.abs().sum()) == 0 for p in ps)
    assert "Parameter Group 1" in repr(opt)


# ---- schedulers -----------------------------------------------------------------------------------
def _sgd(lib):
    p = (torch.nn.Parameter(torch.zeros(1)) if lib is torch else fnn.Parameter(fl.zeros(1)))
    return lib.optim.SGD([p], lr=0.1, momentum=0.9)


SCHEDS = [
    ("StepLR", lambda L, o: L.StepLR(o, 4, gamma=0.5)),
    ("MultiStepLR", lambda L, o: L.MultiStepLR(o, [3, 7, 7, 20], gamma=0.3)),
    ("ExponentialLR", lambda L, o: L.ExponentialLR(o, 0.9)),
    ("CosineAnnealingLR", lambda L, o: L.CosineAnnealingLR(o, T_max=7, eta_min=0.01)),
    ("CosineAnnealingWarmRestarts", lambda L, o: L.CosineAnnealingWarmRestarts(o, T_0=4, T_mult=2, eta_min=0.001)),
    ("LambdaLR", lambda L, o: L.LambdaLR(o, lambda e: 0.95 ** e)),
    ("MultiplicativeLR", lambda L, o: L.MultiplicativeLR(o, lambda e: 0.97)),
    ("LinearLR", lambda L, o: L.LinearLR(o, start_factor=0.2, total_iters=10)),
    ("ConstantLR", lambda L, o: L.ConstantLR(o, factor=0.5, total_iters=6)),
    ("PolynomialLR", lambda L, o: L.PolynomialLR(o, total_iters=20, power=2.0)),
    ("OneCycleLR", lambda L, o: L.OneCycleLR(o, max_lr=1.0, total_steps=31)),
    ("OneCycleLR3", lambda L, o: L.OneCycleLR(o, max_lr=1.0, total_steps=31, three_phase=True,
                                             anneal_strategy="linear")),
    ("CyclicLR", lambda L, o: L.CyclicLR(o, 0.01, 0.1, step_size_up=4, mode="triangular2")),
    ("SequentialLR", lambda L, o: L.SequentialLR(o, [L.LinearLR(o, 0.1, total_iters=5),
                                                     L.ExponentialLR(o, 0.9)], milestones=[5])),
    ("ChainedScheduler", lambda L, o: L.ChainedScheduler([L.ConstantLR(o, 0.5, total_iters=4),
                                                          L.ExponentialLR(o, 0.95)])),
]


@pytest.mark.parametrize("name,make", SCHEDS, ids=[s[0] for s in SCHEDS])
def test_scheduler_lr_sequence_matches(name, make):
    seqs = []
    for lib in (torch, fl):
        opt = _sgd(lib)
        sch = make(lib.optim.lr_scheduler, opt)
        seq = [sch.get_last_lr()[0]]
        for _ in range(30):
            opt.step()
            sch.step()
            seq.append(sch.get_last_lr()[0])
            assert opt.param_groups[0]["lr"] == seq[-1]
        seqs.append((seq, opt.param_groups[0].get("momentum")))
    np.testing.assert_allclose(seqs[1][0], seqs[0][0], rtol=1e-12, atol=1e-15)
    assert seqs[1][1] == pytest.approx(seqs[0][1], rel=1e-12)


def test_scheduler_state_dict_roundtrip():
    for lib in (torch, fl):
        opt = _sgd(lib)
        s = lib.optim.lr_scheduler.StepLR(opt, 3)
        for _ in range(4):
            s.step()
        sd = s.state_dict()
        if lib is torch:
            tkeys = sorted(sd)
        else:
            assert sorted(sd) == tkeys
            s2 = lib.optim.lr_scheduler.StepLR(_sgd(lib), 3)
            s2.load_state_dict(sd)
            assert s2.last_epoch == 4 and s2.get_last_lr() == s.get_last_lr()


def test_reduce_lr_on_plateau_matches():
    metrics = [1.0, 0.9, 0.95, 0.96, 0.97, 0.94, 0.99, 1.0, 0.85, 0.9, 0.9, 0.9, 0.9, 0.9, 0.9, 0.8]
    seqs = []
    for lib in (torch, fl):
        opt = _sgd(lib)
        s = lib.optim.lr_scheduler.ReduceLROnPlateau(opt, patience=2, factor=0.5, cooldown=1, min_lr=0.01)
        seq = []
        for m in metrics:
            s.step(m)
            seq.append(opt.param_groups[0]["lr"])
        seqs.append(seq)
    assert seqs[0] == seqs[1]


@pytest.mark.cuda
@pytest.mark.parametrize("name,kw", OPTIMS, ids=IDS)
def test_cuda_foreach_matches_loop_and_cpu(name, kw):
    losses = []
    for dev, foreach in [("cuda", True), ("cuda", False), ("cpu", True)]:
        _, fm = twin(mlp)
        fm.to(dev)
        opt = getattr(fl.optim, name)(fm.parameters(), foreach=foreach, **kw)
        g = np.random.default_rng(1)
        run = []
        for _ in range(4):
            x = fl.tensor(g.standard_normal((16, 6)), device=dev)
            y = fl.tensor(g.integers(0, 3, 16), device=dev)
            opt.zero_grad()
            loss = fnn.functional.cross_entropy(fm(x), y)
            loss.backward()
            opt.step()
            run.append(float(loss))
        losses.append(run)
    assert losses[0] == losses[1]
    np.testing.assert_allclose(losses[0], losses[2], rtol=1e-9)


def test_a_parameter_class_with_its_own_grad_property_is_stepped_and_zeroed_through_it():
    """The optimizer reads and clears `.grad` without Tensor's property when the parameter's class keeps it
    (`optimizer._TENSOR_GRAD`); a class defining its own `grad` is read and cleared through that one."""
    import flambeau

    class Shadow(flambeau.nn.Parameter):
        @property
        def grad(self):
            return self.__dict__.get("_shadow")

        @grad.setter
        def grad(self, g):
            self.__dict__["_shadow"] = g
    p = Shadow(flambeau.tensor([1.0, 2.0]))
    q = flambeau.nn.Parameter(flambeau.tensor([1.0, 2.0]))
    opt = flambeau.optim.AdamW([p, q], lr=0.5, weight_decay=0.0)
    p.grad = flambeau.tensor([1.0, -1.0])
    q.grad = flambeau.tensor([1.0, -1.0])
    opt.step()
    assert p.tolist() == q.tolist() != [1.0, 2.0]
    opt.zero_grad()
    assert p.grad is None and q.grad is None and "_shadow" in p.__dict__
