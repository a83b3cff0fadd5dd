"""Third-party devices (PrivateUse1): tests/scripts/privateuse1_backend.py renames the device to
"npu", backs it with a NumPy namespace that counts its calls, and trains a small model on it; its
report is checked here against PyTorch training the same model from the same weights on cpu."""
import json
import os
import pathlib
import subprocess
import sys

import numpy as np
import pytest
import torch

import flambeau

SCRIPT = pathlib.Path(__file__).parent / "scripts" / "privateuse1_backend.py"


@pytest.fixture(scope="module")
def report(tmp_path_factory):
    rng = np.random.default_rng(0)
    w = {"w0": rng.standard_normal((4, 3)), "b0": rng.standard_normal(4), "w1": rng.standard_normal((1, 4)),
         "b1": rng.standard_normal(1), "x": rng.standard_normal((5, 3)), "y": rng.standard_normal((5, 1))}
    w = {k: v.astype(np.float32) for k, v in w.items()}
    path = tmp_path_factory.mktemp("pu1") / "weights.npz"
    np.savez(path, **w)
    env = dict(os.environ, PYTHONPATH=str(pathlib.Path(flambeau.__file__).parent.parent))
    r = subprocess.run([sys.executable, str(SCRIPT), str(path)], capture_output=True, text=True, env=env, timeout=300)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout.splitlines()[-1]), w


def _torch_training(w):
    model = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.Tanh(), torch.nn.Linear(4, 1))
    with torch.no_grad():
        for p, k in zip(model.parameters(), ["w0", "b0", "w1", "b1"]):
            p.copy_(torch.tensor(w[k]))
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    losses = []
    for _ in range(2):
        opt.zero_grad()
        loss = torch.nn.functional.mse_loss(model(torch.tensor(w["x"])), torch.tensor(w["y"]))
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses, {k: v.numpy() for k, v in model.state_dict().items()}


def test_tensors_live_on_the_renamed_device(report):
    out, _ = report
    assert out["x_device"] == out["y_device"] == "npu"
    assert out["y_is_npu"] and not out["cpu_is_npu"] and out["storage_is_npu"]
    assert out["y_equals_2x"]
    assert out["device_error"] == "RuntimeError"           # an unknown device type, as PyTorch
    assert out["mixed_error"] == "RuntimeError"            # npu + cpu tensors, as PyTorch's device check


def test_training_step_on_the_device_matches_pytorch(report):
    out, w = report
    losses, trained = _torch_training(w)
    np.testing.assert_allclose(out["losses"], losses, rtol=1e-5)
    for k, v in trained.items():
        np.testing.assert_allclose(np.array(out["trained"][k], dtype=np.float32), v, rtol=1e-5, atol=1e-6)
    assert out["param_devices"] == out["grad_devices"] == ["npu"]
    assert out["namespace_calls_in_training"] > 0 and out["matmul_calls"] >= 4    # the kernels ran over its namespace


def test_state_dict_save_and_load_keep_the_device(report):
    out, _ = report
    assert out["state_dict_devices"] == out["loaded_devices"] == ["npu"]
    assert out["map_location_devices"] == ["cpu"] and out["loaded_equal"]


def test_per_op_kernel_override(report):
    out, _ = report
    assert out["override_calls"] == [[2, 3]] and out["override_result_ok"] and out["cpu_add_not_overridden"]


def test_generate_methods_names_match_pytorch():
    """The methods PyTorch generates for a renamed PrivateUse1 backend (checked on PyTorch in a subprocess:
    the rename is for the process)."""
    code = ("import torch\ntorch.utils.rename_privateuse1_backend('npu')\n"
            "torch.utils.generate_methods_for_privateuse1_backend(for_storage=True)\n"
            "print(hasattr(torch.Tensor, 'is_npu'), hasattr(torch.Tensor, 'npu'), hasattr(torch.nn.Module, 'npu'), "
            "hasattr(torch.UntypedStorage, 'is_npu'))\n")
    ref = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120).stdout.split()
    ours = subprocess.run([sys.executable, "-c", code.replace("torch", "flambeau")], capture_output=True, text=True,
                          timeout=120, env=dict(os.environ, PYTHONPATH=str(pathlib.Path(flambeau.__file__).parent.parent))
                          ).stdout.split()
    assert ours == ref == ["True"] * 4
