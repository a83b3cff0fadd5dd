"""A third-party device for flambeau (PyTorch's PrivateUse1) backed by a NumPy namespace that counts
its calls; run by tests/test_privateuse1.py in a fresh process (the device rename is for the
process). Prints one JSON object of what it observed."""
import collections
import json
import sys
import tempfile

import numpy as np

import flambeau


class CountingNumpy:
    """NumPy, with every function call counted by name."""

    def __init__(self):
        self.calls = collections.Counter()

    def __getattr__(self, name):
        value = getattr(np, name)
        if callable(value) and not isinstance(value, type):
            def counted(*args, **kwargs):
                self.calls[name] += 1
                return value(*args, **kwargs)
            return counted
        return value


def main(weights_path: str) -> dict:
    xp = CountingNumpy()
    flambeau.utils.rename_privateuse1_backend("npu")
    flambeau.utils.register_privateuse1_array_backend(xp)
    flambeau.utils.generate_methods_for_privateuse1_backend(for_storage=True)
    out = {}
    x = flambeau.randn(2, 3, device="npu")
    y = x + x
    out["x_device"], out["y_device"] = str(x.device), str(y.device)
    out["y_is_npu"], out["cpu_is_npu"] = y.is_npu, y.cpu().is_npu
    out["y_equals_2x"] = bool(np.array_equal(y.cpu().numpy(), 2 * x.cpu().numpy()))
    out["storage_is_npu"] = y.untyped_storage().is_npu
    out["device_error"] = type(_raises(lambda: flambeau.device("npx"))).__name__
    out["mixed_error"] = type(_raises(lambda: x + flambeau.ones(2, 3))).__name__

    w = np.load(weights_path)
    model = flambeau.nn.Sequential(flambeau.nn.Linear(3, 4), flambeau.nn.Tanh(), flambeau.nn.Linear(4, 1))
    with flambeau.no_grad():
        for p, k in zip(model.parameters(), ["w0", "b0", "w1", "b1"]):
            p.copy_(flambeau.tensor(w[k]))
    model = model.npu()
    before = sum(xp.calls.values())
    opt = flambeau.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    inp, target = flambeau.tensor(w["x"]).to("npu"), flambeau.tensor(w["y"]).npu()
    losses = []
    for _ in range(2):
        opt.zero_grad()
        loss = flambeau.nn.functional.mse_loss(model(inp), target)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    out["losses"] = losses
    out["namespace_calls_in_training"] = sum(xp.calls.values()) - before
    out["matmul_calls"] = xp.calls["matmul"]
    out["param_devices"] = sorted({str(p.device) for p in model.parameters()})
    out["grad_devices"] = sorted({str(p.grad.device) for p in model.parameters()})
    sd = model.state_dict()
    out["state_dict_devices"] = sorted({str(v.device) for v in sd.values()})
    with tempfile.TemporaryDirectory() as d:
        flambeau.save(sd, f"{d}/m.pt")
        loaded = flambeau.load(f"{d}/m.pt")
        on_cpu = flambeau.load(f"{d}/m.pt", map_location="cpu")
    out["loaded_devices"] = sorted({str(v.device) for v in loaded.values()})
    out["map_location_devices"] = sorted({str(v.device) for v in on_cpu.values()})
    out["loaded_equal"] = all(np.array_equal(loaded[k].cpu().numpy(), sd[k].cpu().numpy()) for k in sd)
    out["trained"] = {k: v.cpu().numpy().tolist() for k, v in sd.items()}

    seen = []

    def npu_add(self, other, alpha=1):
        seen.append(tuple(self.shape))
        return (self.cpu() + other.cpu() * alpha).to("npu")
    flambeau.library.Library("aten", "IMPL").impl("add.Tensor", npu_add, "PrivateUse1")
    z = x + x
    out["override_calls"] = seen
    out["override_result_ok"] = bool(np.array_equal(z.cpu().numpy(), y.cpu().numpy())) and str(z.device) == "npu"
    out["cpu_add_not_overridden"] = (flambeau.ones(2) + flambeau.ones(2)).tolist() == [2.0, 2.0] and len(seen) == 1
    return out


def _raises(fn):
    try:
        fn()
    except Exception as e:          # the exception a bad call raises, reported by type
        return e
    return None


if __name__ == "__main__":
    print(json.dumps(main(sys.argv[1])))
