"""PyTorch's PT2E X86 flow (torchao's) on the models of tests/test_quantization_pt2e.py, run in its own
process with torchao on its path (tests/test_quantization_pt2e.py starts it). Usage:
    python pt2e_reference.py OUT.npz   -> the models' weights, calibration data, each observer's
    buffers and qparams, the folded weights and converted outputs, for the static and dynamic configs."""
import sys
import warnings

import numpy as np
import torch

warnings.filterwarnings("ignore")
from torchao.quantization.pt2e import move_exported_model_to_eval  # noqa: E402
from torchao.quantization.pt2e.quantize_pt2e import convert_pt2e, prepare_pt2e, prepare_qat_pt2e  # noqa: E402
from torchao.quantization.pt2e.quantizer import x86_inductor_quantizer as xiq  # noqa: E402

sys.path.insert(0, __file__.rsplit("/tests/", 1)[0])
from tests.quantization_models import (build_avg_cnn, build_cnn, build_cnn_bn, build_flatten_cnn,  # noqa: E402
                                       build_mlp, build_mlp_bn, build_pool_cnn, build_qat_cnn, build_qat_res,
                                       calibration, qat_batches, qdq_pattern)


def run(name, build, shape, dynamic, out, conv_only=False):
    torch.manual_seed(0)
    model = build(torch).eval()
    for k, v in model.state_dict().items():
        out[f"{name}/state/{k}"] = v.detach().numpy()
    data = calibration(shape)
    gm = torch.export.export(model, (torch.tensor(data[0]),)).module()
    cfg = xiq.get_default_x86_inductor_quantization_config(is_dynamic=dynamic)
    quantizer = xiq.X86InductorQuantizer()
    quantizer = quantizer.set_module_type_qconfig(torch.nn.Conv2d, cfg) if conv_only else quantizer.set_global(cfg)
    prepared = prepare_pt2e(gm, quantizer)
    for x in data:
        prepared(torch.tensor(x))
    obs = sorted((n.target for n in prepared.graph.nodes if n.op == "call_module"       # shared ones: each call
                  and n.target.startswith("activation_post_process_")), key=lambda k: int(k.rsplit("_", 1)[1]))
    for i, k in enumerate(obs):
        m = getattr(prepared, k)
        out[f"{name}/obs{i}/type"] = np.array(type(m).__name__)
        for buf in ("min_val", "max_val", "histogram"):
            if hasattr(m, buf):
                out[f"{name}/obs{i}/{buf}"] = getattr(m, buf).numpy()
        if not dynamic:
            s, z = m.calculate_qparams()
            out[f"{name}/obs{i}/scale"], out[f"{name}/obs{i}/zero_point"] = s.numpy(), z.numpy()
    converted = convert_pt2e(prepared)
    for k, v in converted.named_buffers():
        if k.startswith("_frozen_param"):
            out[f"{name}/{k}"] = v.numpy()
    out[f"{name}/output"] = converted(torch.tensor(data[1] * 3)).detach().numpy()
    out[f"{name}/qdq"] = np.array(qdq_pattern(converted.graph, _kind))


_KINDS = {"aten.conv2d.default": "conv", "aten.linear.default": "linear", "aten.max_pool2d.default": "max_pool",
          "aten.avg_pool2d.default": "avg_pool", "aten.adaptive_avg_pool2d.default": "avg_pool",
          "aten.flatten.using_ints": "flatten", "aten.view.default": "flatten", "aten.cat.default": "cat"}


def _kind(node):
    return _KINDS.get(str(node.target))


def run_qat(out, name, build, lr=0.1):
    """QAT of build_qat_cnn / build_qat_res (conv-bn fused by prepare_qat_pt2e): the losses of each SGD
    step, the batch norms' running statistics after training, the converted model's folded int8 weights
    and output."""
    torch.manual_seed(0)
    model = build(torch).train()
    for k, v in model.state_dict().items():
        out[f"{name}/state/{k}"] = v.detach().numpy().copy()      # training updates the tensors in place
    batches = qat_batches()
    gm = torch.export.export(model, (torch.tensor(batches[0][0]),)).module()
    cfg = xiq.get_default_x86_inductor_quantization_config(is_qat=True)
    prepared = prepare_qat_pt2e(gm, xiq.X86InductorQuantizer().set_global(cfg))
    out[f"{name}/observer_calls"] = np.array(sum(n.op == "call_module" and n.target.startswith("activation_post_process_")
                                                 for n in prepared.graph.nodes))
    opt = torch.optim.SGD(prepared.parameters(), lr=lr, momentum=0.9)
    losses = []
    for x, y in batches:
        loss = torch.nn.functional.cross_entropy(prepared(torch.tensor(x)), torch.tensor(y))
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    out[f"{name}/losses"] = np.array(losses)
    for k, v in prepared.named_buffers():
        if "running_" in k:
            out[f"{name}/{k.replace('.', '_')}"] = v.numpy()
    move_exported_model_to_eval(prepared)
    converted = convert_pt2e(prepared)
    for k, v in converted.named_buffers():
        if k.startswith("_frozen_param"):
            out[f"{name}/{k}"] = v.numpy()
    out[f"{name}/output"] = converted(torch.tensor(batches[0][0])).detach().numpy()


def main(path):
    out = {}
    run("cnn", build_cnn, (4, 3, 16, 16), False, out)
    run("cnn_bn", build_cnn_bn, (4, 3, 16, 16), False, out)
    run("mlp", build_mlp, (5, 20), False, out)
    run("mlp_bn", build_mlp_bn, (5, 20), False, out)
    run("pool_cnn", build_pool_cnn, (4, 3, 16, 16), False, out)
    run("pool_cnn_conv_only", build_pool_cnn, (4, 3, 16, 16), False, out, conv_only=True)
    run("avg_cnn", build_avg_cnn, (4, 3, 16, 16), False, out)
    for how in ("flatten", "method", "view"):
        run(f"flat_{how}", lambda m, how=how: build_flatten_cnn(m, how), (4, 3, 16, 16), False, out)
    run("mlp_dynamic", build_mlp, (5, 20), True, out)
    run_qat(out, "qat", build_qat_cnn)
    run_qat(out, "qat_res", build_qat_res)
    np.savez(path, **out)


if __name__ == "__main__":
    main(sys.argv[1])
