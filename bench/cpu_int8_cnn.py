"""int8 convolutions on the CPU, compiled, against float and against PyTorch's int8 kernels, in one process.

    python bench/cpu_int8_cnn.py [--batch 32] [--size 224] [--rounds 5] [--min-time 0.3]

The workload is a ResNet-18-sized convolution stack without the residual adds (a 7x7 stride-2 stem,
then two 3x3 convolutions at 64, 128, 256 and 512 channels, the first of each later stage of stride
2; ReLU after each) in the form a PT2E-converted model has: uint8 activations dequantized before each
convolution, per-channel symmetric int8 weights dequantized, the ReLU output quantized for the next
layer (scales from the float model on the input batch), float output of the last layer. Systems
(inference, no grad, both libraries compiled with freezing):

    flambeau-int8-compile    the quantization pass makes each layer one onednn::qconv2d_pointwise
                             (int8 im2col + the AVX-512 VNNI GEMM, requantization fused)
    flambeau-fp32-compile    the float stack (same weights) compiled
    torch-int8-eager         PyTorch's onednn::qconv2d_pointwise called directly (prepacked weights)
    torch-int8-compile       torch.compile of the same q/dq graph (PyTorch's PT2E inductor path)
    torch-fp32-compile       torch.compile of the float stack

Reports the median time per call over interleaved rounds, ratios, and whether flambeau's int8 output
equals PyTorch's int8 eager output exactly. Output: JSON lines.
"""
from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from bench import compile_training as CT  # noqa: E402  (sets the environment before the libraries load)

import argparse  # noqa: E402
import importlib  # noqa: E402
import json  # noqa: E402
import shutil  # noqa: E402
import warnings  # noqa: E402

import numpy as np  # noqa: E402
import torch  # noqa: E402

import flambeau  # noqa: E402
from flambeau._backends import cpu_int8  # noqa: E402
from flambeau._inductor import config as inductor_config  # noqa: E402
from bench.cpu_int8 import _compiled, qdq_stack  # noqa: E402
from bench import measure  # noqa: E402

# (in channels, out channels, kernel, stride, padding)
LAYERS = [(3, 64, 7, 2, 3), (64, 64, 3, 1, 1), (64, 64, 3, 1, 1), (64, 128, 3, 2, 1), (128, 128, 3, 1, 1),
          (128, 256, 3, 2, 1), (256, 256, 3, 1, 1), (256, 512, 3, 2, 1), (512, 512, 3, 1, 1)]


def _params(batch: int, size: int):
    """Float weights/biases, their int8 per-channel quantization, each layer's input scale and zero
    point (from the float stack on the batch) and the batch."""
    rng = np.random.default_rng(0)
    x = rng.standard_normal((batch, 3, size, size)).astype(np.float32)
    ws, bs, qws, scales = [], [], [], []
    h = torch.tensor(x)
    for cin, cout, k, s, p in LAYERS:
        w = (rng.standard_normal((cout, cin, k, k)) / np.sqrt(cin * k * k)).astype(np.float32)
        b = (rng.standard_normal(cout) * 0.1).astype(np.float32)
        lo, hi = min(float(h.min()), 0.0), max(float(h.max()), 0.0)
        sc = float(np.float32((hi - lo) / 255))
        scales.append((sc, int(np.clip(round(-lo / sc), 0, 255))))
        wsc = (np.abs(w).reshape(cout, -1).max(1) / 127).astype(np.float32)
        qws.append((np.clip(np.rint(w / wsc[:, None, None, None]), -127, 127).astype(np.int8), wsc))
        ws.append(w)
        bs.append(b)
        h = torch.relu(torch.nn.functional.conv2d(h, torch.tensor(w), torch.tensor(b), s, p))
    return ws, bs, qws, scales, x


def _qdq_cnn(m, qws, bs, scales):
    """The conv stack as a converted model (bench/cpu_int8.py's qdq_stack): conv2d then ReLU, every layer."""
    def conv_relu(i, dx, dw, b):
        _, _, _, stride, pad = LAYERS[i]
        return m.relu(m.nn.functional.conv2d(dx, dw, b, stride, pad))
    return qdq_stack(m, qws, bs, scales, conv_relu)


def _float_cnn(m, ws, bs):
    w, b = [m.tensor(v) for v in ws], [m.tensor(v) for v in bs]

    def fn(x):
        h = x
        for i, (_, _, _, stride, pad) in enumerate(LAYERS):
            h = m.relu(m.nn.functional.conv2d(h, w[i], b[i], stride, pad))
        return h
    return fn


def _torch_int8_eager(qws, bs, scales, x_shape):
    packed = []
    for (q, s), (_, _, _, stride, pad), (xs, xz) in zip(qws, LAYERS, scales):
        packed.append(torch.ops.onednn.qconv_prepack(torch.tensor(q), torch.tensor(s), xs, xz, [stride] * 2,
                                                     [pad] * 2, [1, 1], 1, None))
    extra = [(torch.tensor(s), torch.zeros(len(s), dtype=torch.int64), torch.tensor(b)) for (_, s), b in zip(qws, bs)]

    def fn(x):
        h = torch.ops.quantized_decomposed.quantize_per_tensor.default(x, scales[0][0], scales[0][1], 0, 255,
                                                                       torch.uint8)
        for i, (_, _, _, stride, pad) in enumerate(LAYERS):
            last = i == len(LAYERS) - 1
            out_s, out_z = (1.0, 0) if last else scales[i + 1]
            h = torch.ops.onednn.qconv2d_pointwise(h, scales[i][0], scales[i][1], packed[i], *extra[i][:2],
                                                   extra[i][2], [stride] * 2, [pad] * 2, [1, 1], 1, out_s, out_z,
                                                   torch.float32 if last else None, "relu", [], "")
        return h
    return fn


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--size", type=int, default=224)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--min-time", type=float, default=0.3)
    opts = ap.parse_args()
    warnings.simplefilter("ignore")
    importlib.import_module("torch.ao.quantization.fx._decomposed")
    print(json.dumps({"config": True, "torch": torch.__version__, "torch_threads": torch.get_num_threads(),
                      "cpus": os.cpu_count(), "batch": opts.batch, "size": opts.size, "rounds": opts.rounds,
                      "vnni_kernel": cpu_int8.vnni()}), flush=True)
    ws, bs, qws, scales, x = _params(opts.batch, opts.size)
    fx, tx = flambeau.tensor(x), torch.tensor(x)
    fns, first, outs = {}, {}, {}
    inductor_config.freezing = True
    try:
        fns["flambeau-int8-compile"], first["flambeau-int8-compile"], outs["flambeau-int8"] = \
            _compiled(flambeau, _qdq_cnn(flambeau, qws, bs, scales), fx)
        fns["flambeau-fp32-compile"], first["flambeau-fp32-compile"], _ = _compiled(flambeau, _float_cnn(flambeau, ws, bs),
                                                                                    fx)
        t_eager = _torch_int8_eager(qws, bs, scales, x.shape)
        with torch.no_grad():
            outs["torch-int8"] = t_eager(tx)
        fns["torch-int8-eager"] = lambda: t_eager(tx)
        import torch._inductor.config as tic
        tic.freezing = True
        for name, fn in (("torch-int8-compile", _qdq_cnn(torch, qws, bs, scales)),
                         ("torch-fp32-compile", _float_cnn(torch, ws, bs))):
            try:
                fns[name], first[name], _ = _compiled(torch, fn, tx)
            except Exception as e:  # noqa: BLE001  (a peer that does not compile here is reported, not fatal)
                print(json.dumps({"system": name, "error": f"{type(e).__name__}: {str(e)[:200]}"}))
        times, med = measure.interleaved_rounds(fns, opts.rounds, lambda s: CT.mean_step_time(s, opts.min_time))
        for k, v in med.items():
            print(json.dumps({"workload": "int8_cnn", "system": k, "ms": round(v * 1e3, 2),
                              "range_ms": [round(min(times[k]) * 1e3, 2), round(max(times[k]) * 1e3, 2)],
                              "first_call_s": round(first[k], 2) if k in first else None}), flush=True)
        a, t = outs["flambeau-int8"].numpy(), outs["torch-int8"].numpy()
        int8 = med["flambeau-int8-compile"]
        summary = {"workload": "int8_cnn_summary",
                   "int8_compile_over_fp32_compile": round(int8 / med["flambeau-fp32-compile"], 3),
                   "int8_compile_over_torch_int8_eager": round(int8 / med["torch-int8-eager"], 3),
                   "equals_torch_int8_eager": bool(np.array_equal(a, t)),
                   "max_abs_diff_vs_torch_int8": float(np.abs(a - t).max())}
        for peer in ("torch-int8-compile", "torch-fp32-compile"):
            if peer in med:
                summary[f"int8_compile_over_{peer.replace('-', '_')}"] = round(int8 / med[peer], 3)
        print(json.dumps(summary), flush=True)
    finally:
        shutil.rmtree(CT._CACHE_ROOT, ignore_errors=True)


if __name__ == "__main__":
    main()
