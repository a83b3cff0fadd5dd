"""The module surface real scripts import (issue 12, item 1), each name beside PyTorch's behaviour.

The names come from `tools/surface_report.py` run over public PyTorch programs (nanoGPT, minGPT,
makemore, pytorch/examples, llama2.c, char-rnn): torch.distributed, torch.nn.parallel,
torch.backends.{cuda,cudnn,mps}, torch.onnx, torch.accelerator, torch.version, the legacy tensor
types, torch.serialization's allowlist, and nn classes at their PyTorch module paths.
"""
from __future__ import annotations

import importlib
import io

import pytest
import torch

import flambeau


def _outcome(fn):
    """(exception type name, None) or ("ok", value) — PyTorch's answer and ours side by side."""
    try:
        return "ok", fn()
    except Exception as e:  # noqa: BLE001  the type is what is compared
        return type(e).__name__, None


# ---- torch.distributed: importable, truthful, no pretending ----------------------------------------
@pytest.mark.parametrize("name", ["get_rank", "get_world_size", "get_backend", "barrier"])
def test_distributed_calls_without_a_process_group_raise_as_pytorch(name):
    theirs = _outcome(getattr(torch.distributed, name))
    ours = _outcome(getattr(flambeau.distributed, name))
    assert ours[0] == theirs[0] == "ValueError"
    with pytest.raises(ValueError, match="init_process_group"):
        getattr(flambeau.distributed, name)()


def test_distributed_is_available_and_destroy_without_group_raises_as_pytorch():
    assert flambeau.distributed.is_available() is torch.distributed.is_available() is True
    assert flambeau.distributed.is_initialized() is torch.distributed.is_initialized() is False
    assert _outcome(flambeau.distributed.destroy_process_group)[0] == \
        _outcome(torch.distributed.destroy_process_group)[0]


def test_distributed_enums_and_backend_names_match():
    names = ("SUM", "AVG", "PRODUCT", "MIN", "MAX", "BAND", "BOR", "BXOR", "PREMUL_SUM")
    assert [n for n in names if hasattr(flambeau.distributed.ReduceOp, n)] == \
        [n for n in names if hasattr(torch.distributed.ReduceOp, n)]
    assert flambeau.distributed.ReduceOp.SUM.name == torch.distributed.ReduceOp.SUM.name == "SUM"
    for dev in ("cpu", "cuda"):
        assert flambeau.distributed.get_default_backend_for_device(dev) == \
            torch.distributed.get_default_backend_for_device(dev)
    assert flambeau.distributed.Backend("GLOO") == torch.distributed.Backend("GLOO") == "gloo"


def test_distributed_sampler_without_a_process_group_raises_as_pytorch():
    theirs = _outcome(lambda: torch.utils.data.DistributedSampler(list(range(4))))
    ours = _outcome(lambda: flambeau.utils.data.DistributedSampler(list(range(4))))
    assert ours == theirs == ("ValueError", None)


def test_libraries_import_what_is_available_promises():
    """transformers imports these at import time when `distributed.is_available()` is True."""
    from flambeau.distributed._functional_collectives import (all_gather_tensor_autograd,  # noqa: F401
                                                               all_to_all_single_autograd, wait_tensor)
    from flambeau.distributed.checkpoint.hf_storage import HuggingFaceStorageWriter
    from flambeau.distributed.tensor.placement_types import _StridedShard
    from torch.distributed.tensor.placement_types import _StridedShard as TorchStridedShard
    assert (repr(_StridedShard(0, split_factor=2)), _StridedShard(1, sf=2).is_shard()) == \
        (repr(TorchStridedShard(0, split_factor=2)), TorchStridedShard(1, sf=2).is_shard())
    with pytest.raises(NotImplementedError, match="HuggingFaceStorageWriter"):
        HuggingFaceStorageWriter("unused")
    from flambeau.distributed.fsdp import FullyShardedDataParallel
    assert not isinstance(flambeau.nn.Linear(2, 2), FullyShardedDataParallel)
    with pytest.raises(NotImplementedError, match="fully_shard"):
        FullyShardedDataParallel(flambeau.nn.Linear(2, 2))


# ---- torch.nn.parallel ---------------------------------------------------------------------------
def test_ddp_without_process_group_raises_as_pytorch():
    theirs = _outcome(lambda: torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(2, 2)))
    ours = _outcome(lambda: flambeau.nn.parallel.DistributedDataParallel(flambeau.nn.Linear(2, 2)))
    assert ours[0] == theirs[0] == "ValueError"


def test_data_parallel_on_cpu_calls_the_module():
    torch.manual_seed(0)
    ref = torch.nn.Linear(3, 2)
    ours = flambeau.nn.Linear(3, 2)
    ours.load_state_dict({k: flambeau.tensor(v.numpy()) for k, v in ref.state_dict().items()})
    x = torch.randn(4, 3)
    dp_ref, dp = torch.nn.DataParallel(ref), flambeau.nn.DataParallel(ours)
    assert dp.device_ids == dp_ref.device_ids == []
    assert list(dp.state_dict()) == list(dp_ref.state_dict())          # "module.weight", ...
    assert flambeau.nn.parallel.DataParallel is flambeau.nn.DataParallel
    torch.testing.assert_close(torch.from_numpy(dp(flambeau.tensor(x.numpy())).detach().numpy()), dp_ref(x))
    assert _outcome(lambda: flambeau.nn.parallel.data_parallel(ours, flambeau.tensor(x.numpy())))[0] == \
        _outcome(lambda: torch.nn.parallel.data_parallel(ref, x))[0] == "RuntimeError"


def test_data_parallel_over_several_devices_says_it_is_missing():
    with pytest.raises(NotImplementedError, match="replicating"):
        flambeau.nn.DataParallel(flambeau.nn.Linear(2, 2), device_ids=[0, 1])


# ---- backends, accelerator, version, cuda queries -------------------------------------------------
@pytest.mark.parametrize("path", ["backends.mps.is_available", "backends.mps.is_built", "accelerator.is_available",
                                  "accelerator.current_accelerator", "accelerator.device_count",
                                  "cuda.is_bf16_supported", "version.cuda", "backends.cudnn.is_available"])
def test_queries_answer_as_cpu_pytorch(path):
    def get(root):
        obj = root
        for part in path.split("."):
            obj = getattr(obj, part)
        return obj() if callable(obj) else obj
    assert get(flambeau) == get(torch)


def test_accelerator_calls_without_a_device_raise_as_pytorch():
    for name in ("current_device_index", "synchronize"):
        assert _outcome(getattr(flambeau.accelerator, name))[0] == \
            _outcome(getattr(torch.accelerator, name))[0] == "RuntimeError"


def test_backends_cuda_flags_round_trip():
    m = flambeau.backends.cuda.matmul
    before = m.allow_tf32
    try:
        m.allow_tf32 = True
        assert m.allow_tf32 is True and flambeau.get_float32_matmul_precision() == "high"
    finally:
        m.allow_tf32 = before
    with pytest.raises(AttributeError):
        m.no_such_flag = True
    before = flambeau.backends.cuda.flash_sdp_enabled()
    flambeau.backends.cuda.enable_flash_sdp(False)
    assert flambeau.backends.cuda.flash_sdp_enabled() is False
    flambeau.backends.cuda.enable_flash_sdp(before)
    cudnn = flambeau.backends.cudnn
    assert isinstance(cudnn.benchmark, bool) and isinstance(cudnn.deterministic, bool)


# ---- torch.onnx -------------------------------------------------------------------------------------
def test_onnx_imports_and_names_its_optional_dependency():
    assert flambeau.onnx.is_in_onnx_export() is torch.onnx.is_in_onnx_export() is False
    try:
        import onnx  # noqa: F401  (the exporter itself is tested in test_onnx.py)
    except ImportError:
        with pytest.raises(ImportError, match="pip install onnx"):
            flambeau.onnx.export(flambeau.nn.Linear(2, 2), (flambeau.zeros(1, 2),), io.BytesIO())


# ---- legacy tensor types --------------------------------------------------------------------------
_LEGACY = ["FloatTensor", "DoubleTensor", "HalfTensor", "BFloat16Tensor", "LongTensor", "IntTensor",
           "ShortTensor", "CharTensor", "ByteTensor", "BoolTensor"]


@pytest.mark.parametrize("name", _LEGACY)
def test_legacy_type_constructors_and_isinstance(name):
    ours, theirs = getattr(flambeau, name), getattr(torch, name)
    assert ours.dtype.name == str(theirs.dtype).split(".")[1]
    assert ours(2, 3).shape == theirs(2, 3).shape and ours(2, 3).dtype is ours.dtype
    assert ours().shape == theirs().shape
    data = [[1, 0], [3, 1]]
    assert ours(data).tolist() == theirs(data).tolist()
    for other in _LEGACY:
        t, f = theirs([1]), ours([1])
        assert isinstance(f, getattr(flambeau, other)) == isinstance(t, getattr(torch, other)), other
    assert not isinstance(ours([1]), getattr(flambeau.cuda, name))
    assert not issubclass(ours, flambeau.Tensor)
    assert repr(ours) == repr(theirs)


def test_legacy_types_cast_and_refuse_as_pytorch():
    x, xt = flambeau.zeros(2), torch.zeros(2)
    assert x.type() == xt.type() == "torch.FloatTensor"
    assert x.type(flambeau.LongTensor).dtype is flambeau.int64
    assert x.type("torch.DoubleTensor").dtype is flambeau.float64
    flambeau.FloatTensor(x)[0] = 5
    torch.FloatTensor(xt)[0] = 5
    assert x.tolist() == xt.tolist() == [5.0, 0.0]                 # same storage, no copy
    assert _outcome(lambda: flambeau.LongTensor(x))[0] == _outcome(lambda: torch.LongTensor(xt))[0] == "TypeError"
    assert _outcome(lambda: flambeau.LongTensor([1], dtype=flambeau.float32))[0] == \
        _outcome(lambda: torch.LongTensor([1], dtype=torch.float32))[0] == "TypeError"
    if not flambeau.cuda.is_available():
        assert _outcome(lambda: flambeau.cuda.FloatTensor(2))[0] == _outcome(lambda: torch.cuda.FloatTensor(2))[0]


# ---- nn classes at PyTorch's module paths ----------------------------------------------------------
_PATHS = ["nn.modules.activation.MultiheadAttention", "nn.modules.linear.NonDynamicallyQuantizableLinear",
          "nn.modules.pixelshuffle.PixelShuffle", "nn.modules.pixelshuffle.PixelUnshuffle",
          "nn.modules.channelshuffle.ChannelShuffle", "nn.modules.distance.PairwiseDistance",
          "nn.modules.distance.CosineSimilarity", "nn.modules.fold.Fold", "nn.modules.fold.Unfold",
          "nn.modules.upsampling.Upsample", "nn.modules.upsampling.UpsamplingNearest2d",
          "nn.modules.upsampling.UpsamplingBilinear2d", "nn.modules.instancenorm.InstanceNorm2d",
          "nn.modules.transformer.MultiheadAttention", "nn.parallel.DistributedDataParallel",
          "nn.parallel.DataParallel"]


@pytest.mark.parametrize("path", _PATHS)
def test_nn_names_at_pytorch_module_paths(path):
    module, name = path.rsplit(".", 1)
    theirs = getattr(importlib.import_module("torch." + module), name)
    ours = getattr(importlib.import_module("flambeau." + module), name)
    assert ours.__name__ == theirs.__name__
    assert ours is getattr(flambeau.nn, name, ours)


def test_multihead_attention_out_proj_type_matches():
    ours = flambeau.nn.MultiheadAttention(8, 2).out_proj
    theirs = torch.nn.MultiheadAttention(8, 2).out_proj
    assert type(ours).__name__ == type(theirs).__name__
    assert isinstance(ours, flambeau.nn.Linear)


# ---- serialization allowlist ------------------------------------------------------------------------
class Net(flambeau.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = flambeau.nn.Linear(3, 2)
        self.drop = flambeau.nn.Dropout(0.1)

    def forward(self, x):
        return self.fc(self.drop(x))


def _saved_net():
    net = Net()
    buf = io.BytesIO()
    flambeau.save(net, buf)
    buf.seek(0)
    return net, buf


def test_whole_module_load_needs_the_allowlist_as_in_pytorch():
    _, buf = _saved_net()
    with pytest.raises(Exception, match=r"add_safe_globals\(\[.*Net\]\)"):
        flambeau.load(buf)


def test_safe_globals_context_manager_allows_then_forgets():
    net, buf = _saved_net()
    allow = [Net, flambeau.nn.modules.linear.Linear, flambeau.nn.modules.dropout.Dropout]
    with flambeau.serialization.safe_globals(allow):
        assert flambeau.serialization.get_safe_globals()[:3] == allow
        loaded = flambeau.load(buf)
    assert flambeau.serialization.get_safe_globals() == []
    assert type(loaded) is Net
    assert (loaded.fc.weight.detach().numpy() == net.fc.weight.detach().numpy()).all()
    buf.seek(0)
    with pytest.raises(Exception, match="Weights only load failed"):
        flambeau.load(buf)


def test_safe_globals_partial_list_still_refuses_the_rest():
    _, buf = _saved_net()
    with flambeau.serialization.safe_globals([Net, flambeau.nn.modules.linear.Linear]):
        with pytest.raises(Exception, match="Dropout"):
            flambeau.load(buf)


def test_add_safe_globals_persists_until_cleared():
    _, buf = _saved_net()
    try:
        flambeau.serialization.add_safe_globals([Net, flambeau.nn.Linear, flambeau.nn.Dropout])
        assert type(flambeau.load(buf)) is Net
    finally:
        flambeau.serialization.clear_safe_globals()
    assert flambeau.serialization.get_safe_globals() == []
    with pytest.raises(TypeError):
        flambeau.serialization.add_safe_globals(Net)


class Box:
    def __init__(self, v):
        self.v = v


def test_pytorch_checkpoint_with_allowlisted_class_loads(tmp_path):
    p = tmp_path / "box.pt"
    torch.save({"box": Box(3), "w": torch.arange(3)}, p)
    with pytest.raises(Exception, match="Box"):
        flambeau.load(p)
    with torch.serialization.safe_globals([Box]):
        ref = torch.load(p)
    with flambeau.serialization.safe_globals([Box]):
        out = flambeau.load(p)
    assert out["box"].v == ref["box"].v == 3 and out["w"].tolist() == ref["w"].tolist()


# ---- torch.testing.assert_close -----------------------------------------------------------------------
_CLOSE_CASES = [
    ([1.0, 2.0, 3.0], [1.0, 2.1, 3.0], "float32", "float32", {}),
    ([1.0, 2.0], [1.0, 2.0, 3.0], "float32", "float32", {}),
    ([1.0, 2.0], [1.0, 2.0], "float32", "float64", {}),
    ([1.0, 2.0], [1.0, 2.0], "float32", "float64", {"check_dtype": False}),
    ([1, 2], [1, 3], "int64", "int64", {}),
    ([float("nan")], [float("nan")], "float32", "float32", {}),
    ([float("nan")], [float("nan")], "float32", "float32", {"equal_nan": True}),
    ([1.0, 2.0], [1.0, 2.0 + 1e-6], "float32", "float32", {}),
    ([1.0, 2.0], [1.0, 2.001], "float16", "float16", {}),
    ([[1.0, 1.0], [1.0, 1.0]], [[1.5, 1.0], [1.0, 1.25]], "float32", "float32", {}),
    ([1.0, 2.0], [1.0, 2.1], "float32", "float32", {"rtol": 0.1, "atol": 0.0}),
]


@pytest.mark.parametrize("a,e,da,de,kw", _CLOSE_CASES)
def test_assert_close_matches_pytorch(a, e, da, de, kw):
    def run(lib):
        return _message(lambda: lib.testing.assert_close(lib.tensor(a, dtype=getattr(lib, da)),
                                                          lib.tensor(e, dtype=getattr(lib, de)), **kw))
    assert run(flambeau) == run(torch)


def _message(fn):
    try:
        fn()
        return "ok"
    except Exception as e:  # noqa: BLE001  type and message are what is compared
        return f"{type(e).__name__}: {e}"


@pytest.mark.parametrize("a,e", [(1.0, 1.1), (1.0, 1.0 + 1e-9), (2, 3), ([1.0, 2.0], [1.0, 2.5]),
                                 ({"x": 1.0}, {"x": 2.0}), (1.0, 1)])
def test_assert_close_on_numbers_and_containers_matches_pytorch(a, e):
    assert _message(lambda: flambeau.testing.assert_close(a, e)) == _message(lambda: torch.testing.assert_close(a, e))


def test_assert_close_nested_tensors_name_the_item_and_reject_mixed_types():
    def run(lib):
        return _message(lambda: lib.testing.assert_close([lib.ones(2)], [lib.zeros(2)]))
    assert run(flambeau) == run(torch)
    assert _message(lambda: flambeau.testing.assert_close(flambeau.ones(2), 1.0)) == \
        _message(lambda: torch.testing.assert_close(torch.ones(2), 1.0)).replace("torch.Tensor", "flambeau._tensor.Tensor")


def test_dynamo_warn_once_warns_a_message_once_as_torch():
    import warnings

    from flambeau._dynamo.utils import warn_once
    msg = "flambeau test: warn_once message"
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        for _ in range(3):
            warn_once(msg)
        warn_once(msg + " (another)")
    assert [str(w.message) for w in seen] == [msg, msg + " (another)"]
    assert seen[0].filename == __file__
