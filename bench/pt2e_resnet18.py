"""ResNet-18 through each library's PT2E x86 flow, int8-compiled, against float and against PyTorch's, in one process.

    python bench/pt2e_resnet18.py [--batch 32] [--size 224] [--rounds 3] [--min-time 0.3]

The model is torchvision's resnet18 (BasicBlocks with BatchNorm, ReLU modules (one per call, not in
place: torchao's partitioner refuses a module called twice), max/avg pooling, fc; written here for both
libraries, the same weights and running statistics) in eval mode; the ReLU modules let both quantizers
propagate int8 through the max pool. Each library captures it at the
benchmark's batch, prepares it with its X86InductorQuantizer (default static config: the batch norms
folded into the convolutions, histogram observers), calibrates on one batch, converts it and compiles
it with freezing: flambeau `capture_pre_autograd_graph` + `prepare_pt2e` + `convert_pt2e` +
`flambeau.compile`, PyTorch `torch.export` + torchao's (0.18, from .torchao) + `torch.compile`.
Systems (inference, no grad):

    flambeau-int8-compile    flambeau's converted model compiled (int8 convolutions, the residual adds
                             fused as qconv2d_pointwise.binary, int8 fc)
    flambeau-fp32-compile    the float model compiled
    torch-int8-compile       PyTorch's converted model compiled (its x86 inductor quantization passes)
    torch-fp32-compile       the float model compiled by torch.compile

Reports the median time per call over interleaved rounds, the ratios, and how far the int8 outputs are
from the float model's and from each other. Output: JSON lines.
"""
from __future__ import annotations

import os
import sys

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
sys.path.insert(0, ROOT)
from bench import compile_training as CT  # noqa: E402  (sets the environment before the libraries load)

import argparse  # noqa: E402
import json  # noqa: E402
import shutil  # noqa: E402
import time  # noqa: E402
import warnings  # noqa: E402

import numpy as np  # noqa: E402
import torch  # noqa: E402

import flambeau  # noqa: E402
from flambeau._backends import cpu_int8  # noqa: E402
from flambeau._inductor import config as inductor_config  # noqa: E402
from bench import measure  # noqa: E402
from bench.cpu_int8 import _compiled  # noqa: E402


def resnet18(m, classes=1000):
    nn = m.nn

    class BasicBlock(nn.Module):
        def __init__(self, cin, cout, stride):
            super().__init__()
            self.conv1, self.bn1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False), nn.BatchNorm2d(cout)
            self.conv2, self.bn2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False), nn.BatchNorm2d(cout)
            self.relu1, self.relu2 = nn.ReLU(), nn.ReLU()
            self.downsample = None
            if stride != 1 or cin != cout:
                self.downsample = nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout))

        def forward(self, x):
            idt = x if self.downsample is None else self.downsample(x)
            out = self.relu1(self.bn1(self.conv1(x)))
            return self.relu2(self.bn2(self.conv2(out)) + idt)

    class ResNet18(nn.Module):
        def __init__(self):
            super().__init__()
            self.conv1, self.bn1 = nn.Conv2d(3, 64, 7, 2, 3, bias=False), nn.BatchNorm2d(64)
            self.relu, self.maxpool = nn.ReLU(), nn.MaxPool2d(3, 2, 1)
            widths = [(64, 64, 1), (64, 128, 2), (128, 256, 2), (256, 512, 2)]
            self.layers = nn.Sequential(*[nn.Sequential(BasicBlock(cin, cout, s), BasicBlock(cout, cout, 1))
                                          for cin, cout, s in widths])
            self.fc = nn.Linear(512, classes)

        def forward(self, x):
            x = self.maxpool(self.relu(self.bn1(self.conv1(x))))
            x = self.layers(x)
            return self.fc(m.nn.functional.adaptive_avg_pool2d(x, 1).flatten(1))
    return ResNet18()


def _weights(model) -> dict:
    """Seeded weights (He-scaled), batch-norm scales, shifts and running statistics for the state dict."""
    rng = np.random.default_rng(0)
    out = {}
    for k, v in model.state_dict().items():
        shape = tuple(v.shape)
        if k.endswith("num_batches_tracked"):
            out[k] = np.zeros(shape, np.int64)
            continue
        if len(shape) >= 2:
            value = rng.standard_normal(shape) * np.sqrt(2.0 / np.prod(shape[1:]))
        elif k.endswith("running_var"):
            value = rng.uniform(0.5, 2.0, shape)
        elif k.endswith("weight"):
            value = rng.uniform(0.5, 1.5, shape)
        else:                       # running_mean, biases
            value = rng.standard_normal(shape) * 0.1
        out[k] = value.astype(np.float32)
    return out


def _flambeau_int8(model, x):
    from flambeau.ao.quantization.quantize_pt2e import capture_pre_autograd_graph, convert_pt2e, prepare_pt2e
    from flambeau.ao.quantization.quantizer import x86_inductor_quantizer as xiq
    prepared = prepare_pt2e(capture_pre_autograd_graph(model, (x,)),
                            xiq.X86InductorQuantizer().set_global(xiq.get_default_x86_inductor_quantization_config()))
    with flambeau.no_grad():
        prepared(x)
    return convert_pt2e(prepared)


def _torch_int8(model, x):
    sys.path.insert(0, os.path.join(ROOT, ".torchao"))
    from torchao.quantization.pt2e.quantize_pt2e import convert_pt2e, prepare_pt2e
    from torchao.quantization.pt2e.quantizer import x86_inductor_quantizer as xiq
    gm = torch.export.export(model, (x,)).module()
    prepared = prepare_pt2e(gm, xiq.X86InductorQuantizer().set_global(xiq.get_default_x86_inductor_quantization_config()))
    with torch.no_grad():
        prepared(x)
    return convert_pt2e(prepared)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--size", type=int, default=224)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--min-time", type=float, default=0.3)
    opts = ap.parse_args()
    warnings.simplefilter("ignore")
    print(json.dumps({"config": True, "torch": torch.__version__, "torch_threads": torch.get_num_threads(),
                      "cpus": os.cpu_count(), "batch": opts.batch, "size": opts.size, "rounds": opts.rounds,
                      "vnni_kernel": cpu_int8.vnni(), "load_average": os.getloadavg()}), flush=True)
    weights = _weights(resnet18(torch))
    models = {}
    for m in (flambeau, torch):
        model = resnet18(m).eval()
        model.load_state_dict({k: m.tensor(v) for k, v in weights.items()})
        models[m] = model
    x = np.random.default_rng(1).standard_normal((opts.batch, 3, opts.size, opts.size)).astype(np.float32)
    fx, tx = flambeau.tensor(x), torch.tensor(x)
    fns, first, outs = {}, {}, {}
    inductor_config.freezing = True
    import torch._inductor.config as tic
    tic.freezing = True
    try:
        t0 = time.perf_counter()
        q = _flambeau_int8(models[flambeau], fx)
        prep = time.perf_counter() - t0
        fns["flambeau-int8-compile"], first["flambeau-int8-compile"], outs["flambeau-int8"] = _compiled(flambeau, q, fx)
        fns["flambeau-fp32-compile"], first["flambeau-fp32-compile"], outs["flambeau-fp32"] = \
            _compiled(flambeau, models[flambeau], fx)
        t0 = time.perf_counter()
        tq = _torch_int8(models[torch], tx)
        tprep = time.perf_counter() - t0
        fns["torch-int8-compile"], first["torch-int8-compile"], outs["torch-int8"] = _compiled(torch, tq, tx)
        fns["torch-fp32-compile"], first["torch-fp32-compile"], outs["torch-fp32"] = _compiled(torch, models[torch], tx)
        print(json.dumps({"prepare_calibrate_convert_s": {"flambeau": round(prep, 1), "torch": round(tprep, 1)}}),
              flush=True)
        times, med = measure.interleaved_rounds(fns, opts.rounds, lambda s: CT.mean_step_time(s, opts.min_time))
        for k, v in med.items():
            print(json.dumps({"workload": "pt2e_resnet18", "system": k, "ms": round(v * 1e3, 2),
                              "range_ms": [round(min(times[k]) * 1e3, 2), round(max(times[k]) * 1e3, 2)],
                              "first_call_s": round(first[k], 2)}), flush=True)
        o = {k: v.detach().numpy() for k, v in outs.items()}
        scale = float(np.abs(o["torch-fp32"]).max())
        int8 = med["flambeau-int8-compile"]
        print(json.dumps({
            "workload": "pt2e_resnet18_summary",
            "int8_compile_over_fp32_compile": round(int8 / med["flambeau-fp32-compile"], 3),
            "int8_compile_over_torch_int8_compile": round(int8 / med["torch-int8-compile"], 3),
            "int8_compile_over_torch_fp32_compile": round(int8 / med["torch-fp32-compile"], 3),
            "torch_int8_over_torch_fp32": round(med["torch-int8-compile"] / med["torch-fp32-compile"], 3),
            "fp32_max_abs_diff_flambeau_vs_torch": float(np.abs(o["flambeau-fp32"] - o["torch-fp32"]).max()),
            "int8_max_abs_diff_vs_fp32": {"flambeau": float(np.abs(o["flambeau-int8"] - o["flambeau-fp32"]).max()),
                                          "torch": float(np.abs(o["torch-int8"] - o["torch-fp32"]).max())},
            "int8_max_abs_diff_flambeau_vs_torch": float(np.abs(o["flambeau-int8"] - o["torch-int8"]).max()),
            "top1_agreement_int8_vs_fp32": {
                "flambeau": float((o["flambeau-int8"].argmax(1) == o["flambeau-fp32"].argmax(1)).mean()),
                "torch": float((o["torch-int8"].argmax(1) == o["torch-fp32"].argmax(1)).mean())},
            "output_scale": scale, "load_average": os.getloadavg()}), flush=True)
    finally:
        shutil.rmtree(CT._CACHE_ROOT, ignore_errors=True)


if __name__ == "__main__":
    main()
