"""Which cuda device a rank's work lands on when the script never calls `cuda.set_device` (pytorch/examples'
tensor-parallel scripts, its FSDP2 example): a DeviceMesh picks LOCAL_RANK (else rank % devices, warning) for a
process that has not used cuda yet, as PyTorch's does; `init_process_group(device_id=...)` is checked as
PyTorch checks it and makes the device current (both ranks had used device 0: NCCL's "Duplicate GPU
detected"). The cuda side is a stand-in on the cpu; the two-GPU runs are in docs/benchmark_history.md."""
from __future__ import annotations

import pytest

import flambeau
import flambeau.distributed as dist
from flambeau.distributed import device_mesh


@pytest.fixture
def fake_cuda(monkeypatch):
    chosen = []
    monkeypatch.setattr(flambeau.cuda, "is_available", lambda: True)
    monkeypatch.setattr(flambeau.cuda, "device_count", lambda: 2)
    monkeypatch.setattr(flambeau.cuda, "set_device", lambda d: chosen.append(d))
    monkeypatch.setattr(device_mesh.c10d, "get_world_size", lambda group=None: 4)
    monkeypatch.setattr(device_mesh.c10d, "get_rank", lambda group=None: 3)
    return chosen


def test_a_mesh_takes_local_rank_for_a_process_that_has_not_used_cuda(fake_cuda, monkeypatch):
    monkeypatch.setattr(flambeau.cuda, "is_initialized", lambda: False)
    monkeypatch.setenv("LOCAL_RANK", "1")
    device_mesh._choose_cuda_device()
    assert fake_cuda == [1]


def test_without_local_rank_it_warns_and_takes_rank_modulo_devices(fake_cuda, monkeypatch):
    monkeypatch.setattr(flambeau.cuda, "is_initialized", lambda: False)
    monkeypatch.delenv("LOCAL_RANK", raising=False)
    with pytest.warns(UserWarning, match="did not set/select the default device"):
        device_mesh._choose_cuda_device()
    assert fake_cuda == [1]                      # rank 3 % 2 devices


def test_a_process_that_chose_its_device_keeps_it(fake_cuda, monkeypatch):
    monkeypatch.setattr(flambeau.cuda, "is_initialized", lambda: True)
    monkeypatch.setenv("LOCAL_RANK", "1")
    device_mesh._choose_cuda_device()
    assert fake_cuda == []


def test_is_initialized_reports_use_not_availability(monkeypatch):
    """Neither a device chosen nor cuda memory taken: not initialised (it used to be is_available()); a device
    chosen (set_device) or the allocator installed (cuda memory taken): initialised."""
    from flambeau import _backends
    monkeypatch.setattr(flambeau.cuda, "is_available", lambda: True)
    monkeypatch.setattr(flambeau._state, "cuda_device_chosen", False)
    monkeypatch.setattr(_backends, "_allocator_installed", [])
    assert not flambeau.cuda.is_initialized()
    monkeypatch.setattr(_backends, "_allocator_installed", [True])
    assert flambeau.cuda.is_initialized()
    monkeypatch.setattr(_backends, "_allocator_installed", [])
    monkeypatch.setattr(flambeau._state, "cuda_device_chosen", True)
    assert flambeau.cuda.is_initialized()


def test_device_id_is_checked_as_pytorch_checks_it():
    import torch
    import torch.distributed as tdist
    for lib, d in ((dist, flambeau), (tdist, torch)):
        if not d.cuda.is_available():
            with pytest.raises(ValueError, match="device_id is an int, but no accelerator support is found"):
                lib.init_process_group("gloo", store=lib.HashStore(), rank=0, world_size=1, device_id=0)
    dist.init_process_group(store=dist.HashStore(), rank=0, world_size=1, device_id=flambeau.device("cpu"))
    try:
        assert dist.get_backend() == "gloo"
    finally:
        dist.destroy_process_group()


def test_a_cuda_device_id_becomes_the_current_device(monkeypatch):
    from flambeau.distributed import distributed_c10d as c10d
    chosen = []
    monkeypatch.setattr(flambeau.cuda, "is_available", lambda: True)
    monkeypatch.setattr(flambeau.cuda, "device_count", lambda: 2)
    monkeypatch.setattr(flambeau.cuda, "set_device", lambda d: chosen.append(d))
    assert c10d._bind_device(flambeau.device("cuda:1")).index == 1 and chosen == [1]
    assert c10d._bind_device(0).index == 0 and chosen == [1, 0]
    with pytest.raises(ValueError, match="Please use a device_id with index"):
        c10d._bind_device(flambeau.device("cuda"))
    with pytest.raises(ValueError, match="is out of range"):
        c10d._bind_device(flambeau.device("cuda:5"))
