"""`gradcheck` / `gradgradcheck`: compare autograd's Jacobians with finite differences.

The numerical Jacobian perturbs each element of each input that requires grad by +-eps in place
(central differences); the analytical one is built row by row with `autograd.grad` and one-hot
output cotangents. Both are laid out like PyTorch's: rows index input elements, columns output
elements. Real dtypes only (complex Wirtinger checks are not implemented).
"""
from __future__ import annotations

import warnings

import numpy as np

from .._tensor import Tensor
from .._ops.creation import tensor, zeros_like
from .engine import grad as _grad
from . import forward_ad as fwAD


class GradcheckError(RuntimeError):
    pass


def _as_tuple(x):
    return (x,) if isinstance(x, Tensor) or not isinstance(x, (tuple, list)) else tuple(x)


def _outputs(func, inputs):
    return [o for o in _as_tuple(func(*inputs)) if isinstance(o, Tensor)]


def _diff_outputs(outs):
    return [o for o in outs if o.is_floating_point() or o.is_complex()]


def _host(t: Tensor) -> np.ndarray:
    return np.array(t.detach()._host(), dtype=np.float64 if not t.is_complex() else np.complex128)


def _numerical(func, inputs, idx, eps):
    """Per differentiable input: an array (numel_in, total numel of outputs)."""
    res = []
    outs0 = _diff_outputs(_outputs(func, inputs))
    n_out = sum(o.numel() for o in outs0)
    for i in idx:
        x = inputs[i]
        arr = x._data
        jac = np.zeros((x.numel(), n_out))
        for k in range(x.numel()):
            pos = np.unravel_index(k, x.shape) if x.ndim else ()
            orig = arr[pos]
            arr[pos] = orig + eps
            plus = [_host(o).ravel() for o in _diff_outputs(_outputs(func, inputs))]
            arr[pos] = orig - eps
            minus = [_host(o).ravel() for o in _diff_outputs(_outputs(func, inputs))]
            arr[pos] = orig
            if plus:
                jac[k] = (np.concatenate(plus) - np.concatenate(minus)) / (2 * eps)
        res.append(jac)
    return res


def _analytical(func, inputs, idx, check_grad_dtypes):
    outs = _diff_outputs(_outputs(func, inputs))
    n_out = sum(o.numel() for o in outs)
    xs = [inputs[i] for i in idx]
    jacs = [np.zeros((x.numel(), n_out)) for x in xs]
    col = 0
    for o in outs:
        if not o._requires_grad:
            col += o.numel()
            continue
        for k in range(o.numel()):
            go = _one_hot(o, k)
            gs = _grad(o, xs, grad_outputs=go, retain_graph=True, allow_unused=True)
            for j, (x, g) in enumerate(zip(xs, gs)):
                if g is None:
                    continue
                if check_grad_dtypes and (g.dtype is not x.dtype or g.shape != x.shape):
                    raise GradcheckError("Gradient has dtype mismatch" if g.dtype is not x.dtype
                                         else "Gradient has shape mismatch")
                jacs[j][:, col + k] = _host(g).ravel()
        col += o.numel()
    return jacs


def _one_hot(like: Tensor, k: int) -> Tensor:
    a = np.zeros(like.numel())
    a[k] = 1
    return tensor(a.reshape(like.shape), dtype=like.dtype, device=like.device)


def _fmt(jac, dtype):
    return repr(tensor(jac, dtype=dtype))


def gradcheck(func, inputs, *, eps: float = 1e-6, atol: float = 1e-5, rtol: float = 1e-3,
              raise_exception: bool = True, nondet_tol: float = 0.0, check_undefined_grad: bool = True,
              check_grad_dtypes: bool = False, check_batched_grad: bool = False,
              check_batched_forward_grad: bool = False, check_forward_ad: bool = False,
              check_backward_ad: bool = True, fast_mode: bool = False, masked=None) -> bool:
    """True when analytical and numerical Jacobians of `func` at `inputs` agree."""
    inputs = _as_tuple(inputs)
    idx = [i for i, x in enumerate(inputs) if isinstance(x, Tensor) and x._requires_grad]
    if not idx:
        raise ValueError("gradcheck expects at least one input tensor to require gradient, but none of "
                         "them have requires_grad=True.")
    for i in idx:
        if inputs[i].dtype.name not in ("float64", "complex128"):
            warnings.warn(f"Input #{i} requires gradient and is not a double precision floating point or "
                          "complex. This check will likely fail if all the inputs are not of double "
                          "precision floating point or complex. ", UserWarning, stacklevel=2)
    try:
        _check(func, inputs, idx, eps, atol, rtol, check_undefined_grad, check_grad_dtypes, check_backward_ad)
        if check_forward_ad:
            _check_forward(func, inputs, idx, eps, atol, rtol)
    except GradcheckError:
        if raise_exception:
            raise
        return False
    return True


def _check(func, inputs, idx, eps, atol, rtol, check_undefined_grad, check_grad_dtypes, check_backward_ad):
    outs = _diff_outputs(_outputs(func, inputs))
    num = _numerical(func, inputs, idx, eps)
    if not check_backward_ad:
        return
    ana = _analytical(func, inputs, idx, check_grad_dtypes)
    for k, o in enumerate(outs):
        lo = sum(x.numel() for x in outs[:k])
        hi = lo + o.numel()
        for j, i in enumerate(idx):
            n, a = num[j][:, lo:hi], ana[j][:, lo:hi]
            if not np.allclose(a, n, rtol=rtol, atol=atol):
                raise GradcheckError(f"Jacobian mismatch for output {k} with respect to input {i},\n"
                                     f"numerical:{_fmt(n, inputs[i].dtype)}\n"
                                     f"analytical:{_fmt(a, inputs[i].dtype)}\n")
    if check_undefined_grad:
        _check_undefined(func, inputs, idx)


def _check_undefined(func, inputs, idx):
    """Backward with all-zero cotangents must give zero (or no) gradients and not fail."""
    outs = [o for o in _diff_outputs(_outputs(func, inputs)) if o._requires_grad]
    if not outs:
        return
    try:
        gs = _grad(outs, [inputs[i] for i in idx], grad_outputs=[zeros_like(o) for o in outs],
                   allow_unused=True)
    except RuntimeError as e:
        raise GradcheckError("Expected backward function to handle undefined output grads. Please look "
                             f"at 'Notes about undefined output gradients' in tools/autograd/derivatives.yaml: {e}")
    for g in gs:
        if g is not None and np.any(_host(g) != 0):
            raise GradcheckError("Expected all input grads to be undefined or zero when all output grads "
                                 "are undefined or zero.")


def _check_forward(func, inputs, idx, eps, atol, rtol):
    """Forward-mode: the JVP with each one-hot tangent equals the numerical Jacobian's row."""
    num = _numerical(func, inputs, idx, eps)
    for j, i in enumerate(idx):
        x = inputs[i]
        rows = []
        for k in range(x.numel()):
            t = _one_hot(x, k)
            with fwAD.dual_level():
                args = list(inputs)
                args[i] = fwAD.make_dual(x.detach(), t)
                outs = _diff_outputs(_outputs(func, args))
                rows.append(np.concatenate([
                    _host(fwAD.unpack_dual(o).tangent).ravel() if fwAD.unpack_dual(o).tangent is not None
                    else np.zeros(o.numel()) for o in outs]) if outs else np.zeros(0))
        a = np.stack(rows) if rows else np.zeros((0, num[j].shape[1]))
        if not np.allclose(a, num[j], rtol=rtol, atol=atol):
            raise GradcheckError(f"Jacobian computed with forward mode mismatch for output 0 with respect "
                                 f"to input {i},\nnumerical:{_fmt(num[j], x.dtype)}\n"
                                 f"analytical:{_fmt(a, x.dtype)}\n")


def gradgradcheck(func, inputs, grad_outputs=None, *, eps: float = 1e-6, atol: float = 1e-5,
                  rtol: float = 1e-3, gen_non_contig_grad_outputs: bool = False, raise_exception: bool = True,
                  nondet_tol: float = 0.0, check_undefined_grad: bool = True, check_grad_dtypes: bool = False,
                  check_batched_grad: bool = False, check_fwd_over_rev: bool = False,
                  check_rev_over_rev: bool = True, fast_mode: bool = False, masked: bool = False) -> bool:
    """gradcheck of the map (inputs, grad_outputs) -> vjp, i.e. second derivatives."""
    inputs = _as_tuple(inputs)
    if grad_outputs is None:
        rng = np.random.default_rng(0)
        outs = _diff_outputs(_outputs(func, inputs))
        grad_outputs = tuple(tensor(rng.standard_normal(o.shape), dtype=o.dtype, device=o.device,
                                    requires_grad=True) for o in outs)
    else:
        grad_outputs = _as_tuple(grad_outputs)
    n = len(inputs)
    idx = [i for i, x in enumerate(inputs) if isinstance(x, Tensor) and x._requires_grad]

    def vjp_fn(*args):
        ins, gos = args[:n], args[n:]
        outs = [o for o in _diff_outputs(_outputs(func, ins)) if o._requires_grad]
        gs = _grad(outs, [ins[i] for i in idx], grad_outputs=list(gos[:len(outs)]), create_graph=True,
                   allow_unused=True)
        return tuple(g for g in gs if g is not None)

    return gradcheck(vjp_fn, inputs + grad_outputs, eps=eps, atol=atol, rtol=rtol,
                     raise_exception=raise_exception, nondet_tol=nondet_tol,
                     check_undefined_grad=check_undefined_grad, check_grad_dtypes=check_grad_dtypes)
