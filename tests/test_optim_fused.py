"""Fused Adam/AdamW (`fused=True`, and the default on cuda): one Triton multi-tensor kernel per step
(flambeau/_backends/triton_adam.py).

On the CPU: the kernel's arithmetic under Triton's interpreter against float64 NumPy
(tests/scripts/triton_adam_interp.py), and PyTorch's argument errors. On the GPU (marked `cuda`):
parameters after several steps against PyTorch's own `fused=True` on cuda, with weight decay,
amsgrad, maximize, a learning rate held in a cuda tensor, uneven step counts, and the default path."""
import importlib.util
import os
import subprocess
import sys
import types

import numpy as np
import pytest
import torch

import flambeau
from tests.conftest import run_interpreted_script

SHAPES = ((70001,), (3, 5), (768,), (300, 301), (1,), (65536,))
STEPS = 4


@pytest.mark.skipif(importlib.util.find_spec("triton") is None, reason="Triton is not installed")
def test_kernel_under_the_interpreter():
    run_interpreted_script("triton_adam_interp.py")


@pytest.mark.parametrize("kw", [dict(foreach=True), dict(differentiable=True)])
@pytest.mark.parametrize("name", ["Adam", "AdamW"])
def test_fused_argument_errors_like_torch(name, kw):
    with pytest.raises(RuntimeError) as theirs:
        getattr(torch.optim, name)([torch.zeros(2, requires_grad=True)], fused=True, **kw)
    with pytest.raises(RuntimeError) as ours:
        getattr(flambeau.optim, name)([flambeau.zeros(2, requires_grad=True)], fused=True, **kw)
    assert str(ours.value) == str(theirs.value)


def _run_both(name, kw, skip=None, lr_tensor=False):
    """Parameters after STEPS steps under PyTorch (cuda, fused=True) and flambeau (cuda, `kw`)."""
    rng = np.random.default_rng(0)
    init = [rng.standard_normal(s).astype(np.float32) for s in SHAPES]
    grads = [[rng.standard_normal(s).astype(np.float32) for s in SHAPES] for _ in range(STEPS)]
    hyper = dict(lr=0.01, betas=(0.8, 0.95), eps=1e-6, weight_decay=0.1)
    tp = [torch.tensor(a, device="cuda", requires_grad=True) for a in init]
    fp = [flambeau.tensor(a, device="cuda", requires_grad=True) for a in init]
    t_lr = torch.tensor(hyper["lr"], device="cuda") if lr_tensor else hyper["lr"]
    f_lr = flambeau.tensor(hyper["lr"], device="cuda") if lr_tensor else hyper["lr"]
    topt = getattr(torch.optim, name)(tp, **dict(hyper, lr=t_lr), fused=True,
                                      **{k: v for k, v in kw.items() if k not in ("fused", "foreach")})
    fopt = getattr(flambeau.optim, name)(fp, **dict(hyper, lr=f_lr), **kw)
    for step, gs in enumerate(grads):
        for i, (t, f, g) in enumerate(zip(tp, fp, gs)):
            has = skip is None or not (i == skip and step % 2 == 0)
            t.grad = torch.tensor(g, device="cuda") if has else None
            f.grad = flambeau.tensor(g, device="cuda") if has else None
        topt.step()
        fopt.step()
    return [t.detach().cpu().numpy() for t in tp], [f.detach().cpu().numpy() for f in fp]


@pytest.mark.cuda
@pytest.mark.parametrize("maximize", [False, True])
@pytest.mark.parametrize("amsgrad", [False, True])
@pytest.mark.parametrize("name", ["Adam", "AdamW"])
def test_fused_matches_torch_fused_on_cuda(name, amsgrad, maximize, monkeypatch):
    from flambeau._backends import triton_adam
    calls = []                # kernel launches (the kept plan and the per-group path both end in `launch`)
    real = triton_adam.launch
    monkeypatch.setattr(triton_adam, "launch", lambda *a, **k: calls.append(1) or real(*a, **k))
    theirs, ours = _run_both(name, dict(fused=True, amsgrad=amsgrad, maximize=maximize))
    assert len(calls) == STEPS, "the fused kernel did not run once per step"
    for t, f in zip(theirs, ours):
        np.testing.assert_allclose(f, t, rtol=1e-5, atol=1e-6)


@pytest.mark.cuda
@pytest.mark.parametrize("case", ["default", "lr_tensor", "uneven_steps"])
def test_fused_cases_on_cuda(case, monkeypatch):
    from flambeau._backends import triton_adam
    calls = []                # kernel launches (the kept plan and the per-group path both end in `launch`)
    real = triton_adam.launch
    monkeypatch.setattr(triton_adam, "launch", lambda *a, **k: calls.append(1) or real(*a, **k))
    kw = {} if case == "default" else dict(fused=True)
    theirs, ours = _run_both("AdamW", kw, skip=1 if case == "uneven_steps" else None,
                             lr_tensor=case == "lr_tensor")
    assert calls, "the fused kernel did not run"
    for t, f in zip(theirs, ours):
        np.testing.assert_allclose(f, t, rtol=1e-5, atol=1e-6)


# ---- the fused step's bookkeeping, on cpu: fake cuda tensors, the kernel's update in NumPy ----------------
class _DevArray(np.ndarray):
    """A NumPy array with CuPy's `.data.ptr` (its address)."""

    @property
    def data(self):
        return types.SimpleNamespace(ptr=self.ctypes.data)


def _fake_kernel(monkeypatch):
    """triton_adam's launches replaced by the kernel's update in float32 NumPy on the arrays at the
    pointers they are handed; returns (launch records [(tensors, step)], `Arrays` made)."""
    from flambeau import _backends
    from flambeau._backends import triton_adam, triton_launch
    at: dict = {}
    launches, made = [], []

    def register(a):
        at[a.ctypes.data] = a
        return a

    def update(ps, gs, ms, vs, *, lr, beta1, beta2, eps, weight_decay, step, amsgrad, maximize, decoupled):
        assert decoupled and not amsgrad and not maximize
        bc1, bc2 = 1 - beta1 ** step, (1 - beta2 ** step) ** 0.5
        for p, g, m, v in zip(ps, gs, ms, vs):
            p *= np.float32(1 - lr * weight_decay)
            m[...] = beta1 * m + (1 - beta1) * g
            v[...] = beta2 * v + (1 - beta2) * g * g
            p -= (lr / bc1) * m / (np.sqrt(v) / bc2 + eps)
        launches.append((len(ps), step))

    def launch(arrays, grad_ptrs, **kw):
        p, m, v, _ = arrays.rows
        update(*([at[a] for a in row] for row in (p, grad_ptrs, m, v)), **kw)

    def step(params, grads, exp_avgs, exp_avg_sqs, vmaxs, **kw):
        update(params, grads, exp_avgs, exp_avg_sqs, **kw)

    real_arrays = triton_adam.Arrays
    monkeypatch.setattr(triton_adam, "Arrays", lambda *a: made.append(1) or real_arrays(*a))
    monkeypatch.setattr(triton_adam, "launch", launch)
    monkeypatch.setattr(triton_adam, "step", step)
    monkeypatch.setattr(triton_launch, "available", lambda: True)
    monkeypatch.setitem(_backends._backends, "cuda", _backends.Backend("cuda", np))   # the usual path: NumPy
    monkeypatch.setitem(_backends.array_namespaces, "cuda", np)
    return register, launches, made


@pytest.mark.parametrize("step_on", ["host", "device"])
def test_fused_step_keeps_its_plan_while_the_arrays_stay_and_matches_torch(monkeypatch, step_on):
    """AdamW over fake cuda tensors: each step's new gradients go through one launch, the parameters'
    and states' arrays worked out once (one `Arrays`) while they stay; a parameter given new memory makes
    a new plan; a transposed gradient sends its parameter the usual way for that step; uneven step
    counts take one launch per count; a state tensor replaced makes a new plan. Parameters as
    torch.optim.AdamW's (cpu, float32) throughout. The step counts on the host (as made: one flat array
    behind them, `_FusedPlan.advance_steps`) or on the device (as a PyTorch fused checkpoint has them)."""
    from flambeau._device import device
    from flambeau._tensor import Tensor
    register, launches, made = _fake_kernel(monkeypatch)
    cuda = device("cuda")
    rng = np.random.default_rng(0)
    shapes = ((5, 7), (7,), (3, 4))
    init = [rng.standard_normal(s).astype(np.float32) for s in shapes]

    def dev(a):
        return Tensor._make(register(np.array(a, np.float32).view(_DevArray)), cuda)
    fp = [dev(a) for a in init]
    for p in fp:
        p.requires_grad_(True)
    tp = [torch.tensor(a, requires_grad=True) for a in init]
    hyper = dict(lr=0.01, betas=(0.8, 0.95), eps=1e-6, weight_decay=0.1)
    fopt = flambeau.optim.AdamW(fp, **hyper)
    topt = torch.optim.AdamW(tp, **hyper, foreach=False)
    for p in fp:                                       # the states, made on the fake device
        fopt.state[p].update(step=flambeau.tensor(0.0) if step_on == "host" else dev(np.zeros(())),
                             exp_avg=dev(np.zeros(p.shape)),
                             exp_avg_sq=dev(np.zeros(p.shape)))

    def step(transposed=None):
        for i, (f, t) in enumerate(zip(fp, tp)):
            g = rng.standard_normal(f.shape).astype(np.float32)
            t.grad = torch.tensor(g)
            arr = register(np.array(g).view(_DevArray)) if i != transposed else \
                register(np.ascontiguousarray(g.T).view(_DevArray)).T      # the same values, column-major
            f.grad = Tensor._make(arr, cuda)
        for st in fopt.state.values():                 # (the usual path may have given a state new arrays)
            for v in st.values():
                if isinstance(v._data, _DevArray):
                    register(v._data)
        fopt.step()
        topt.step()
        for f, t in zip(fp, tp):
            np.testing.assert_allclose(np.asarray(f._data), t.detach().numpy(), rtol=1e-5, atol=1e-6)
    for _ in range(3):
        step()
    assert made == [1] and launches == [(3, 1.0), (3, 2.0), (3, 3.0)]
    new = rng.standard_normal(shapes[1]).astype(np.float32)   # new memory for one parameter
    fp[1]._data = register(new.copy().view(_DevArray))
    with torch.no_grad():
        tp[1].copy_(torch.tensor(new))
    step()
    assert made == [1, 1] and launches[-1] == (3, 4.0)
    step(transposed=0)                                  # its gradient column-major: the usual path this step
    assert made == [1, 1] and launches[-1] == (2, 5.0)
    assert float(fopt.state[fp[0]]["step"]._data) == 5.0
    fopt.state[fp[2]]["step"].fill_(9.0)                # uneven step counts
    topt.state[tp[2]]["step"].fill_(9.0)
    step()
    assert sorted(launches[-2:]) == [(1, 10.0), (2, 6.0)]
    fopt.state[fp[2]]["step"].fill_(6.0)
    topt.state[tp[2]]["step"].fill_(6.0)
    fopt.state[fp[1]]["exp_avg"] = dev(np.zeros(shapes[1]))     # a state tensor replaced: a new plan
    topt.state[tp[1]]["exp_avg"] = torch.zeros(shapes[1])
    n = len(made)
    step()
    assert len(made) == n + 1 and launches[-1] == (3, 7.0)


def test_launch_uploads_the_table_once_and_a_gradient_row_per_new_addresses(monkeypatch):
    """triton_adam.launch over a fake CuPy (host memory, cudaMemcpyAsync a memmove) and a recording launcher:
    the table of the arrays that stay (parameters, moments) is uploaded once per `Arrays`; the gradients'
    address row once per new set of addresses (a compiled backward may hand them elsewhere each step),
    not again when they come back; the kernel is handed a table whose rows hold the parameters' and moments'
    addresses and a row holding the gradients' (read back through the pointers it was given)."""
    import ctypes
    from flambeau._backends import triton_adam, triton_launch as TL
    pytest.importorskip("triton")
    uploads, launches = [], []

    class Pinned(bytearray):
        @property
        def ptr(self):
            return ctypes.addressof((ctypes.c_char * len(self)).from_buffer(self))

    def memcpy(dst, src, n, kind, stream):
        uploads.append(n)
        ctypes.memmove(dst, src, n)

    fake = types.SimpleNamespace(
        ndarray=_DevArray, empty=lambda n, dtype: np.zeros(n, dtype).view(_DevArray),
        cuda=types.SimpleNamespace(Device=lambda: types.SimpleNamespace(id=0), alloc_pinned_memory=Pinned,
                                   get_current_stream=lambda: types.SimpleNamespace(ptr=0),
                                   runtime=types.SimpleNamespace(memcpyAsync=memcpy)))
    monkeypatch.setitem(sys.modules, "cupy", fake)
    monkeypatch.setattr(triton_adam, "_grad_rows", {})
    monkeypatch.setattr(TL, "compile_kernel", lambda *a, **k: "kernel")
    monkeypatch.setattr(TL, "launch", lambda kern, grid, *args: launches.append((grid, args)))

    def read(ptr, n):
        return list(np.ctypeslib.as_array(ctypes.cast(ptr.address, ctypes.POINTER(ctypes.c_int64)), (n,)))
    sizes = (70000, 3, 65536)
    dev = [[np.zeros(n, np.float32).view(_DevArray) for n in sizes] for _ in range(4)]
    arrays = triton_adam.Arrays(*dev)
    kw = dict(lr=0.1, beta1=0.9, beta2=0.99, eps=1e-8, weight_decay=0.0, step=1.0, amsgrad=False, maximize=False,
              decoupled=True)
    grads_a = [np.zeros(n, np.float32).view(_DevArray) for n in sizes]
    grads_b = [np.zeros(n, np.float32).view(_DevArray) for n in sizes]
    for grads, new_uploads in ((grads_a, 2), (grads_a, 0), (grads_b, 1), (grads_a, 0)):
        before = len(uploads)
        triton_adam.launch(arrays, [g.data.ptr for g in grads], **kw)
        assert len(uploads) - before == new_uploads
        (n_chunks,), (rows, grad_row, numel, chunk_t, chunk_i, *_rest) = launches[-1]
        assert n_chunks == 2 + 1 + 1
        assert read(grad_row, 3) == [g.data.ptr for g in grads]
        assert read(rows, 12) == [a.data.ptr for row in (dev[0], dev[1], dev[2], dev[3]) for a in row]
        assert read(numel, 3) == list(sizes) and read(chunk_t, 4) == [0, 0, 1, 2] and read(chunk_i, 4) == [0, 1, 0, 0]


def test_default_fuses_only_a_group_all_on_cuda(monkeypatch):
    """fused unset: a group whose parameters are all on (fake) cuda takes the fused launch every step; one
    with a cpu parameter never does (the devices checked when the plan is made, `_FusedPlan.all_cuda`
    afterwards); both match torch.optim.AdamW."""
    from flambeau._device import device
    from flambeau._tensor import Tensor
    register, launches, _ = _fake_kernel(monkeypatch)
    cuda = device("cuda")
    rng = np.random.default_rng(1)
    for mixed in (False, True):
        init = [rng.standard_normal(s).astype(np.float32) for s in ((4, 3), (3,))]
        fp = [Tensor._make(register(a.copy().view(_DevArray)), cuda) for a in init]
        if mixed:
            fp[1] = flambeau.tensor(init[1])
        for p in fp:
            p.requires_grad_(True)
        tp = [torch.tensor(a, requires_grad=True) for a in init]
        fopt, topt = flambeau.optim.AdamW(fp, lr=0.01), torch.optim.AdamW(tp, lr=0.01)
        for p in fp:
            if p.device.type == "cuda":
                fopt.state[p].update(step=flambeau.tensor(0.0), exp_avg=Tensor._make(register(
                    np.zeros(p.shape, np.float32).view(_DevArray)), cuda), exp_avg_sq=Tensor._make(register(
                        np.zeros(p.shape, np.float32).view(_DevArray)), cuda))
        del launches[:]
        for _ in range(3):
            for f, t in zip(fp, tp):
                g = rng.standard_normal(f.shape).astype(np.float32)
                t.grad = torch.tensor(g)
                f.grad = Tensor._make(register(g.copy().view(_DevArray)), cuda) if f.device.type == "cuda" \
                    else flambeau.tensor(g)
            fopt.step()
            topt.step()
        assert launches == ([] if mixed else [(2, 1.0), (2, 2.0), (2, 3.0)])
        for f, t in zip(fp, tp):
            np.testing.assert_allclose(np.asarray(f._data), t.detach().numpy(), rtol=1e-5, atol=1e-6)


def test_a_cpu_adam_step_does_not_import_triton():
    """AdamW on cpu parameters (fused unset) decides from the devices before asking for Triton: importing it
    would leave ~11k more objects for every garbage collection of a cpu training loop."""
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    code = ("import sys, flambeau as fl\n"
            "m = fl.nn.Linear(2, 2)\n"
            "opt = fl.optim.AdamW(m.parameters())\n"
            "for _ in range(2):\n"
            "    m(fl.randn(3, 2)).sum().backward()\n"
            "    opt.step()\n"
            "print('triton' in sys.modules)\n")
    env = dict(os.environ, PYTHONPATH=root + os.pathsep + os.environ.get("PYTHONPATH", ""))
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout.strip().splitlines()[-1] == "False"
