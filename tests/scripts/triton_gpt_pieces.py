"""GPT-2-sized pieces compiled through the Triton backend vs eager, on the device given as argv[1]
('cpu' runs under TRITON_INTERPRET=1 with FLAMBEAU_INDUCTOR_BACKEND=triton; 'cuda' on the GPU).
Prints one line per piece: the largest error relative to the largest reference value."""
import sys

import numpy as np

import flambeau as fl

dev = sys.argv[1] if len(sys.argv) > 1 else "cpu"
F = fl.nn.functional
N, C, V = (8192, 768, 50257) if dev == "cuda" else (512, 768, 50257)


def rel(a, b):
    a, b = a.float().cpu().numpy(), b.float().cpu().numpy()
    return float(np.abs(a - b).max() / (np.abs(b).max() + 1e-12))


def check(name, fn, *args, grad=()):
    outs = []
    for compiled in (False, True):
        fl._dynamo.reset()
        xs = [a.detach().clone().requires_grad_(i in grad) for i, a in enumerate(args)]
        f = fl.compile(fn) if compiled else fn
        y = f(*xs)
        r = [y.detach()]
        if grad:
            (y.float() * fl.linspace(0.5, 1.5, y.numel(), device=dev).reshape(y.shape)).sum().backward()
            r += [xs[i].grad for i in grad]
        outs.append(r)
    print(name, [round(rel(c, e), 5) for c, e in zip(outs[1], outs[0])], flush=True)


fl.manual_seed(0)
x = fl.randn(N, C, device=dev)
xb = x.to(fl.bfloat16)
check("colsum_bf16", lambda a: a.float().sum(0), xb)
check("colsum_f32", lambda a: a.sum(0), x)
w, b = fl.randn(C, device=dev), fl.randn(C, device=dev)
check("layernorm", lambda a, w, b: F.layer_norm(a, (C,), w, b), x, w, b, grad=(0, 1, 2))
check("gelu_bf16", lambda a: F.gelu(a, approximate="tanh"), xb, grad=(0,))
logits = fl.randn(N, V, device=dev).to(fl.bfloat16)
tgt = fl.randint(0, V, (N,), device=dev)
check("cross_entropy", lambda a, t: F.cross_entropy(a.float(), t), logits, tgt, grad=(0,))
emb = fl.randn(V, C, device=dev)
idx = fl.randint(0, V, (N,), device=dev)
check("embedding", lambda e, i: F.embedding(i, e), emb, idx, grad=(0,))
check("linear_bias_bf16", lambda a, w, b: F.linear(a, w, b), xb, fl.randn(C, C, device=dev).to(fl.bfloat16),
      w.to(fl.bfloat16), grad=(0, 1, 2))

if dev == "cuda":                          # one GPT-2 layer at full width, bf16 autocast: every parameter's gradient
    import os
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
    from bench import gpu_models
    xs, ys = fl.randint(0, V, (2, 1024), device=dev), fl.randint(0, V, (2, 1024), device=dev)
    grads = []
    for compiled in (False, True):
        fl._dynamo.reset()
        fl.manual_seed(0)
        model = gpu_models.gpt(fl, layers=1).to(dev)
        f = fl.compile(model) if compiled else model
        with fl.autocast(device_type="cuda", dtype=fl.bfloat16):
            loss = f(xs, ys)
        loss.backward()
        grads.append((float(loss), {n: p.grad for n, p in model.named_parameters()}))
        del f, model
    print("gpt1_loss", grads[0][0], grads[1][0])
    for n in grads[0][1]:
        print("gpt1_grad", n, round(rel(grads[1][1][n], grads[0][1][n]), 5), flush=True)
