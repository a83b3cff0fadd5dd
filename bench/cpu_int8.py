"""int8 linear layers on the CPU, compiled, against float and against PyTorch's int8 kernels, in one process.

    python bench/cpu_int8.py [--batch 256] [--width 1024] [--rounds 7] [--min-time 0.3]

The workload is an MLP of three linear layers (width x width, ReLU between) in the form a
PT2E-converted model has: the input quantized to uint8, each layer's input dequantized, per-channel
symmetric int8 weights dequantized, linear, ReLU, the result quantized for the next layer (X86
InductorQuantizer's pattern), float output. Systems (inference, no grad):

    flambeau-int8-compile    flambeau.compile: the quantization pass makes each layer one int8 GEMM
                             (onednn::qlinear_pointwise on AVX-512 VNNI, requantization fused)
    flambeau-qdq-compile     the same graph with the pass off: q/dq as float kernels, float GEMM
    flambeau-fp32-compile    the float MLP (same weights) compiled
    torch-int8-eager         PyTorch's x86 int8 ops called directly (onednn::qlinear_pointwise, what
                             its inductor emits for this pattern)
    torch-int8-compile       torch.compile of the same q/dq graph with freezing (PyTorch's PT2E path)
    torch-fp32-eager         the float MLP in PyTorch

flambeau's systems compile with `config.freezing` (as PyTorch's compile with freezing): weights are
constants, and the int8 weights' `qlinear_prepack` (the VNNI panel packing) runs once at compile time.

Reports the median time per call over rounds (systems interleaved), ratios, and whether flambeau's
int8 output equals PyTorch's int8 eager output exactly. The environment settings of
bench/compile_training.py apply (it is imported first). Output: JSON lines.
"""
from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from bench import compile_training as CT  # noqa: E402  (sets the environment before the libraries load)
from bench import measure  # noqa: E402

import argparse  # noqa: E402
import importlib  # noqa: E402
import json  # noqa: E402
import shutil  # noqa: E402
import time  # noqa: E402
import warnings  # noqa: E402

import numpy as np  # noqa: E402
import torch  # noqa: E402

import flambeau  # noqa: E402
from flambeau._backends import cpu_int8  # noqa: E402
from flambeau._inductor import config as inductor_config  # noqa: E402

LAYERS = 3


def _params(width: int, batch: int):
    """Float weights and biases, their int8 per-channel quantization, the activation scales (from
    the float model's ranges on a calibration batch) and an input batch."""
    rng = np.random.default_rng(0)
    ws = [(rng.standard_normal((width, width)) / np.sqrt(width)).astype(np.float32) for _ in range(LAYERS)]
    bs = [(rng.standard_normal(width) * 0.1).astype(np.float32) for _ in range(LAYERS)]
    x = rng.standard_normal((batch, width)).astype(np.float32)
    scales, qws, h = [], [], x
    for i, (w, b) in enumerate(zip(ws, bs)):
        lo, hi = min(float(h.min()), 0.0), max(float(h.max()), 0.0)
        s = float(np.float32((hi - lo) / 255))
        scales.append((s, int(np.clip(round(-lo / s), 0, 255))))
        wsc = (np.abs(w).max(1) / 127).astype(np.float32)
        qws.append((np.clip(np.rint(w / wsc[:, None]), -127, 127).astype(np.int8), wsc))
        h = h @ w.T + b
        if i < LAYERS - 1:
            h = np.maximum(h, 0)
    return ws, bs, qws, scales, x


def qdq_stack(m, qws, bs, scales, layer):
    """A converted model's graph written with library m's quantized_decomposed ops, as a module whose
    int8 weights, scales and biases are buffers (constants under freezing, as a converted model's): the
    input quantized to uint8 (scales[0]); for each layer i, its input and its per-channel int8 weight
    dequantized, `layer(i, dx, dw, b)` (the float op with its activation), the result quantized for the
    next layer (scales[i + 1]); float output. bench/cpu_int8_cnn.py builds its conv stack with it."""
    qd = m.ops.quantized_decomposed
    last = len(qws) - 1

    class QdqStack(m.nn.Module):
        def __init__(self):
            super().__init__()
            for i, (q, s) in enumerate(qws):
                self.register_buffer(f"qw{i}", m.tensor(q))
                self.register_buffer(f"ws{i}", m.tensor(s))
                self.register_buffer(f"wz{i}", m.zeros(len(s), dtype=m.int64))
                self.register_buffer(f"b{i}", m.tensor(bs[i]))

        def forward(self, x):
            h = qd.quantize_per_tensor.default(x, scales[0][0], scales[0][1], 0, 255, m.uint8)
            for i in range(last + 1):
                s, z = scales[i]
                dx = qd.dequantize_per_tensor.default(h, s, z, 0, 255, m.uint8)
                dw = qd.dequantize_per_channel.default(getattr(self, f"qw{i}"), getattr(self, f"ws{i}"),
                                                       getattr(self, f"wz{i}"), 0, -127, 127, m.int8)
                h = layer(i, dx, dw, getattr(self, f"b{i}"))
                if i < last:
                    h = qd.quantize_per_tensor.default(h, scales[i + 1][0], scales[i + 1][1], 0, 255, m.uint8)
            return h
    return QdqStack().eval()


def _qdq_mlp(m, qws, bs, scales):
    """The MLP as a converted model (qdq_stack): linear, ReLU between the layers."""
    def linear_relu(i, dx, dw, b):
        h = m.nn.functional.linear(dx, dw, b)
        return h if i == LAYERS - 1 else m.relu(h)
    return qdq_stack(m, qws, bs, scales, linear_relu)


def _torch_int8_eager(qws, bs, scales, batch):
    packed = [(torch.ops.onednn.qlinear_prepack(torch.tensor(q), [batch, q.shape[1]]), torch.tensor(s),
               torch.zeros(len(s), dtype=torch.int64)) for q, s in qws]
    b = [torch.tensor(v) for v in bs]

    def fn(x):
        s, z = scales[0]
        h = torch.ops.quantized_decomposed.quantize_per_tensor.default(x, s, z, 0, 255, torch.uint8)
        for i in range(LAYERS):
            s, z = scales[i]
            last = i == LAYERS - 1
            out_s, out_z = (1.0, 0) if last else scales[i + 1]
            h = torch.ops.onednn.qlinear_pointwise(h, s, z, *packed[i], b[i], out_s, out_z,
                                                   torch.float32 if last else None, "none" if last else "relu",
                                                   [], "")
        return h
    return fn


def _float_mlp(m, ws, bs):
    w, b = [m.tensor(v) for v in ws], [m.tensor(v) for v in bs]

    def fn(x):
        h = x
        for i in range(LAYERS):
            h = m.nn.functional.linear(h, w[i], b[i])
            if i < LAYERS - 1:
                h = m.relu(h)
        return h
    return fn


def _compiled(m, fn, x, **kw):
    t0 = time.perf_counter()
    c = m.compile(fn, **kw)
    with m.no_grad():
        out = c(x)

    def run():
        with m.no_grad():
            return c(x)
    return run, time.perf_counter() - t0, out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--width", type=int, default=1024)
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--min-time", type=float, default=0.3)
    opts = ap.parse_args()
    warnings.simplefilter("ignore")
    importlib.import_module("torch.ao.quantization.fx._decomposed")
    print(json.dumps({"config": True, "torch": torch.__version__, "torch_threads": torch.get_num_threads(),
                      "cpus": os.cpu_count(), "rounds": opts.rounds, "min_time_s": opts.min_time,
                      "batch": opts.batch, "width": opts.width, "layers": LAYERS, "vnni_kernel": cpu_int8.vnni(),
                      "cpu_has": measure.cpu_has(("avx512f", "avx512_vnni", "avx512_bf16", "amx_int8"))}), flush=True)
    ws, bs, qws, scales, x = _params(opts.width, opts.batch)
    fx, tx = flambeau.tensor(x), torch.tensor(x)
    fns, first, outs = {}, {}, {}
    inductor_config.freezing = True
    try:
        qdq = _qdq_mlp(flambeau, qws, bs, scales)
        fns["flambeau-int8-compile"], first["flambeau-int8-compile"], outs["flambeau-int8"] = \
            _compiled(flambeau, qdq, fx)
        inductor_config.quantized_linear = False
        flambeau._dynamo.reset()
        fns["flambeau-qdq-compile"], first["flambeau-qdq-compile"], outs["flambeau-qdq"] = _compiled(flambeau, qdq, fx)
        inductor_config.quantized_linear = True
        fns["flambeau-fp32-compile"], first["flambeau-fp32-compile"], _ = \
            _compiled(flambeau, _float_mlp(flambeau, ws, bs), fx)
        t_eager = _torch_int8_eager(qws, bs, scales, opts.batch)
        outs["torch-int8"] = t_eager(tx)
        fns["torch-int8-eager"] = lambda: t_eager(tx)
        try:
            import torch._inductor.config as tic
            tic.freezing = True
            fns["torch-int8-compile"], first["torch-int8-compile"], _ = _compiled(
                torch, _qdq_mlp(torch, qws, bs, scales), tx)
        except Exception as e:  # noqa: BLE001  (a peer that does not compile here is reported, not fatal)
            print(json.dumps({"system": "torch-int8-compile", "error": f"{type(e).__name__}: {str(e)[:200]}"}))
        tf = _float_mlp(torch, ws, bs)
        fns["torch-fp32-eager"] = lambda: tf(tx)
        times, med = measure.interleaved_rounds(fns, opts.rounds, lambda s: CT.mean_step_time(s, opts.min_time))
        for k, v in med.items():
            print(json.dumps({"workload": "int8_mlp", "system": k, "ms": round(v * 1e3, 3),
                              "first_call_s": round(first[k], 2) if k in first else None}), flush=True)
        a, t = outs["flambeau-int8"].numpy(), outs["torch-int8"].numpy()
        int8 = med["flambeau-int8-compile"]
        summary = {"workload": "int8_mlp_summary",
                   "int8_compile_over_fp32_compile": round(int8 / med["flambeau-fp32-compile"], 3),
                   "int8_compile_over_qdq_compile": round(int8 / med["flambeau-qdq-compile"], 3),
                   "int8_compile_over_torch_int8_eager": round(int8 / med["torch-int8-eager"], 3),
                   "equals_torch_int8_eager": bool(np.array_equal(a, t)),
                   "max_abs_diff_vs_torch_int8": float(np.abs(a - t).max())}
        if "torch-int8-compile" in med:
            summary["int8_compile_over_torch_int8_compile"] = round(int8 / med["torch-int8-compile"], 3)
        print(json.dumps(summary), flush=True)
    finally:
        shutil.rmtree(CT._CACHE_ROOT, ignore_errors=True)


if __name__ == "__main__":
    main()
