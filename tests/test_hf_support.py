"""The PyTorch surface model libraries touch beyond the core, each against PyTorch: version
comparisons, legacy tensor types, storages, view(dtype) across sizes, `in`, activation
checkpointing, saved-tensor hooks, flex attention and block masks, custom operators,
distributions, accelerator queries, TransformGetItemToIndex."""
import operator
import warnings

import numpy as np
import pytest
import torch

import flambeau
from flambeau.torch_version import TorchVersion


def f(a, dtype=None):
    return flambeau.tensor(np.asarray(a), dtype=dtype)


def t(a, dtype=None):
    return torch.tensor(np.asarray(a), dtype=dtype)


# ---- versions

VERSIONS = ["2.13.0+cpu", "2.13.0", "2.0", "2", "2.0.0rc1", "2.0.dev1", "2.0a1", "2.0.post1", "1.10.0a",
            "2.1.0+cu121", "2.13.0+flambeau.0.1.0", "10.0"]
OTHERS = ["2.0", "2.13", "2.13.0", "2.14", (2, 13), (2, 1, 1), "1.9.9", "2.0.0", "2.0.0rc2", "2.0.dev2",
          "2.13.0+cpu", "10.0", "9.99"]


@pytest.mark.parametrize("mine", VERSIONS)
def test_version_comparisons_as_pytorch(mine):
    ref = torch.torch_version.TorchVersion(mine)
    ours = TorchVersion(mine)
    for other in OTHERS:
        for op in (operator.lt, operator.le, operator.gt, operator.ge, operator.eq, operator.ne):
            assert op(ours, other) == op(ref, other), (mine, op, other)


def test_torch_version_is_a_version_string():
    v = flambeau.__version__
    assert isinstance(v, str) and isinstance(v, TorchVersion)
    assert v >= "2.4" and v < (3, 0) and v.split("+")[0] == flambeau.version.PYTORCH_API_VERSION
    assert flambeau.version.cuda is None
    assert TorchVersion("parrot") < "pigeon"      # not a version: compared as strings, as PyTorch
    with pytest.raises(TypeError):
        TorchVersion("2.0") < 3


# ---- legacy tensor types, storages, view(dtype), `in`

def test_legacy_tensor_types():
    x = flambeau.zeros(2, dtype=flambeau.long)
    assert isinstance(x, flambeau.LongTensor) and not isinstance(x, flambeau.FloatTensor)
    assert not isinstance(x, flambeau.cuda.LongTensor)
    assert isinstance(flambeau.ones(1), flambeau.FloatTensor)
    assert flambeau.LongTensor(2, 3).shape == (2, 3) and flambeau.LongTensor(2, 3).dtype == flambeau.int64
    assert flambeau.FloatTensor([1, 2]).tolist() == torch.FloatTensor([1, 2]).tolist()
    assert flambeau.BoolTensor([1, 0]).dtype == flambeau.bool
    assert issubclass(flambeau.LongTensor, flambeau.Tensor) == issubclass(torch.LongTensor, torch.Tensor)
    assert (flambeau.LongTensor | None) is not None     # usable in type hints


def test_untyped_storage_is_shared_by_views():
    x = flambeau.arange(6.0)
    ref = torch.arange(6.0)
    s = x.untyped_storage()
    assert s.nbytes() == ref.untyped_storage().nbytes() == 24
    assert s.data_ptr() == x.data_ptr() == x[2:].untyped_storage().data_ptr()
    assert x.view(2, 3).T.untyped_storage() == s
    assert flambeau.ones(6).untyped_storage().data_ptr() != s.data_ptr()
    assert x.storage().size() == ref.storage().size() == 6


def test_storage_from_file_and_asarray(tmp_path):
    path = tmp_path / "raw.bin"
    data = np.arange(10, dtype=np.float32)
    path.write_bytes(data.tobytes())
    ours = flambeau.UntypedStorage.from_file(str(path), shared=False, nbytes=data.nbytes)
    ref = torch.UntypedStorage.from_file(str(path), shared=False, nbytes=data.nbytes)
    a = flambeau.asarray(ours[8:24], dtype=flambeau.uint8).view(flambeau.float32)
    b = torch.asarray(ref[8:24], dtype=torch.uint8).view(torch.float32)
    assert a.tolist() == b.tolist() == [2.0, 3.0, 4.0, 5.0]
    assert ours[4] == ref[4]


def test_from_numpy_of_a_memmap_shares_the_file(tmp_path):
    path = tmp_path / "m.bin"
    np.arange(6, dtype=np.float32).tofile(path)
    mapped = np.memmap(path, dtype=np.float32, mode="r+", shape=(6,))
    x = flambeau.from_numpy(mapped)
    view = x.reshape(2, 3)[1:]
    assert type(view) is flambeau.Tensor and view.tolist() == [[3.0, 4.0, 5.0]]
    view[0, 0] = 30.0
    mapped.flush()
    assert np.fromfile(path, dtype=np.float32)[3] == 30.0


@pytest.mark.parametrize("make", [
    lambda m: m.tensor(1.0).view(m.uint8),
    lambda m: m.arange(6, dtype=m.uint8)[:3].view(m.int16),
    lambda m: m.zeros(4, 3, dtype=m.uint8).T.view(m.int16),
    lambda m: m.zeros(2, 4, dtype=m.uint8)[:, 1:3].view(m.int16),
    lambda m: m.arange(8, dtype=m.uint8).reshape(2, 4).view(m.int32),
    lambda m: m.arange(6.0).reshape(2, 3).view(m.uint8),
    lambda m: m.arange(8, dtype=m.int16).view(m.int8)[1::2],
], ids=range(7))
def test_view_dtype_of_another_size_as_pytorch(make):
    try:
        ref = make(torch)
    except RuntimeError as e:
        with pytest.raises(RuntimeError) as ours:
            make(flambeau)
        assert str(ours.value) == str(e)
        return
    ours = make(flambeau)
    assert ours.tolist() == ref.tolist() and ours.stride() == ref.stride()


def test_contains_as_pytorch():
    for m in (torch, flambeau):
        x = m.tensor([[1, 2], [3, 4]])
        assert (3 in x, 5 in x, m.tensor([1, 2]) in x, 2.0 in x) == (True, False, True, True)
        with pytest.raises(RuntimeError, match="only supports Tensor or scalar"):
            "a" in x


# ---- checkpoint and saved tensor hooks

def _checkpointed(m, reentrant, x_np, w_np):
    from importlib import import_module
    checkpoint = import_module(f"{m.__name__}.utils.checkpoint").checkpoint
    lin = m.nn.Linear(4, 4)
    with m.no_grad():
        lin.weight.copy_(m.tensor(w_np))
        lin.bias.zero_()
    x = m.tensor(x_np, requires_grad=True)

    def body(x, scale=1.0):
        return m.tanh(lin(x)).exp() * scale

    kwargs = {} if reentrant else {"scale": 2.0}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        y = checkpoint(body, x, use_reentrant=reentrant, **kwargs)
    y.sum().backward()
    return y.detach().numpy(), x.grad.numpy(), lin.weight.grad.numpy()


@pytest.mark.parametrize("reentrant", [True, False])
def test_checkpoint_gradients_as_pytorch(reentrant):
    rng = np.random.default_rng(0)
    x_np, w_np = rng.standard_normal((3, 4), dtype=np.float32), rng.standard_normal((4, 4), dtype=np.float32)
    for a, b in zip(_checkpointed(flambeau, reentrant, x_np, w_np), _checkpointed(torch, reentrant, x_np, w_np)):
        np.testing.assert_allclose(a, b, rtol=1.3e-6, atol=1e-5)


def test_checkpoint_recomputes_instead_of_saving():
    """Non-reentrant: nothing of the body is kept; backward reruns it (same dropout mask)."""
    from flambeau.utils.checkpoint import checkpoint
    calls = []
    drop = flambeau.nn.Dropout(0.5)

    def body(z):
        calls.append(1)
        return drop(z) * z

    flambeau.manual_seed(0)
    z = flambeau.ones(64, requires_grad=True)
    out = checkpoint(body, z, use_reentrant=False)
    assert len(calls) == 1
    out.sum().backward()
    assert len(calls) == 2
    kept = out.detach() != 0
    # d/dz (mask * z * z / (1 - p)) = 2 z mask / (1 - p): nonzero exactly where the forward kept
    assert ((z.grad != 0) == kept).all() and 0 < int(kept.sum()) < 64


def test_saved_tensors_hooks_see_every_saved_tensor():
    from flambeau.autograd.graph import saved_tensors_hooks, save_on_cpu
    packed, unpacked = [], []

    def pack(x):
        packed.append(x)
        return x * 1

    def unpack(x):
        unpacked.append(x)
        return x

    a = flambeau.tensor([1.0, 2.0], requires_grad=True)
    with saved_tensors_hooks(pack, unpack):
        y = (a * a).exp().sum()
    assert len(packed) == 3         # mul saves both inputs, exp its output
    y.backward()
    assert len(unpacked) == 3
    ref = torch.tensor([1.0, 2.0], requires_grad=True)
    (ref * ref).exp().sum().backward()
    np.testing.assert_allclose(a.grad.numpy(), ref.grad.numpy(), rtol=1e-6)
    b = flambeau.tensor([0.5, 1.5], requires_grad=True)
    with save_on_cpu():
        z = (b.sin() * b).sum()
    z.backward()
    rb = torch.tensor([0.5, 1.5], requires_grad=True)
    (rb.sin() * rb).sum().backward()
    np.testing.assert_allclose(b.grad.numpy(), rb.grad.numpy(), rtol=1e-6)


# ---- flex attention

def _causal(b, h, q, kv):
    return q >= kv


def _window(b, h, q, kv):
    return (q - kv).abs() < 100


@pytest.mark.parametrize("mask_mod", [_causal, _window])
def test_create_block_mask_as_pytorch(mask_mod):
    from torch.nn.attention.flex_attention import create_block_mask as ref_create
    from flambeau.nn.attention.flex_attention import create_block_mask
    ours = create_block_mask(mask_mod, 2, 1, 300, 260, device="cpu", BLOCK_SIZE=64)
    ref = ref_create(mask_mod, 2, 1, 300, 260, device="cpu", BLOCK_SIZE=64)
    for name in ("kv_num_blocks", "kv_indices", "full_kv_num_blocks", "full_kv_indices", "q_num_blocks",
                 "q_indices", "full_q_num_blocks", "full_q_indices"):
        assert getattr(ours, name).tolist() == getattr(ref, name).tolist(), name
    assert ours.to_dense().tolist() == ref.to_dense().tolist()
    assert tuple(ours.shape) == tuple(ref.shape) and ours.BLOCK_SIZE == ref.BLOCK_SIZE


def test_flex_attention_as_pytorch():
    from torch.nn.attention.flex_attention import create_block_mask as ref_create, flex_attention as ref_flex
    from flambeau.nn.attention.flex_attention import create_block_mask, flex_attention, AuxRequest
    rng = np.random.default_rng(0)
    q, k, v = (rng.standard_normal(s) for s in ((2, 4, 7, 8), (2, 2, 9, 8), (2, 2, 9, 8)))

    def mask_mod(b, h, qi, kv):
        return (qi + 2 >= kv) & (kv > 0) & (qi != 3)     # row 3 attends to nothing

    def score_mod(s, b, h, qi, kv):
        return s + (qi - kv) * 0.1 + h

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        ro, raux = ref_flex(t(q), t(k), t(v), score_mod=score_mod, block_mask=ref_create(mask_mod, 2, 4, 7, 9,
                                                                                          device="cpu"),
                            enable_gqa=True, return_aux=torch.nn.attention.flex_attention.AuxRequest(lse=True))
    oo, oaux = flex_attention(f(q), f(k), f(v), score_mod=score_mod, block_mask=create_block_mask(
        mask_mod, 2, 4, 7, 9, device="cpu"), enable_gqa=True, return_aux=AuxRequest(lse=True))
    np.testing.assert_allclose(oo.numpy(), ro.numpy(), rtol=1e-7, atol=1e-12)
    np.testing.assert_allclose(oaux.lse.numpy(), raux.lse.numpy(), rtol=1e-7)


# ---- custom operators

def test_custom_op_with_fake_and_autograd():
    import flambeau.library as L

    def scaled_square(x: flambeau.Tensor, scale: float) -> flambeau.Tensor:
        return x * x * scale

    op = L.custom_op("hfsupport::scaled_square", scaled_square, mutates_args=())
    L.register_fake("hfsupport::scaled_square", lambda x, scale: flambeau.empty_like(x))
    seen = []

    def setup(ctx, inputs, output):
        ctx.save_for_backward(inputs[0])
        ctx.scale = inputs[1]

    def backward(ctx, grad):
        seen.append(1)
        (x,) = ctx.saved_tensors
        return grad * 2 * x * ctx.scale, None

    L.register_autograd(op, backward, setup_context=setup)
    assert flambeau.ops.hfsupport.scaled_square.default is op._opoverload
    x = flambeau.tensor([1.0, -2.0], requires_grad=True)
    y = flambeau.ops.hfsupport.scaled_square(x, 3.0)
    assert y.tolist() == [3.0, 12.0]
    y.sum().backward()
    assert seen == [1] and x.grad.tolist() == [6.0, -12.0]
    meta = op(flambeau.empty(5, device="meta"), 2.0)
    assert meta.device.type == "meta" and meta.shape == (5,)
    with pytest.raises(ValueError, match="namespace"):
        L.custom_op("no_namespace", scaled_square, mutates_args=())


# ---- distributions

def test_distributions_as_pytorch():
    from flambeau.distributions import Categorical, MultivariateNormal, constraints
    logits = [[0.0, 1.0, 2.0], [1.0, 1.0, -5.0]]
    ours, ref = Categorical(logits=f(logits, flambeau.float64)), torch.distributions.Categorical(
        logits=t(logits, torch.float64))
    np.testing.assert_allclose(ours.entropy().numpy(), ref.entropy().numpy(), rtol=1e-12)
    np.testing.assert_allclose(ours.log_prob(f([2, 0])).numpy(), ref.log_prob(t([2, 0])).numpy(), rtol=1e-12)
    assert ours.sample((4,)).shape == (4, 2)
    cov = np.array([[2.0, 0.3], [0.3, 1.0]])
    mvn, rmvn = MultivariateNormal(f([0.5, -1.0]), covariance_matrix=f(cov)), \
        torch.distributions.MultivariateNormal(t([0.5, -1.0]), covariance_matrix=t(cov))
    np.testing.assert_allclose(mvn.log_prob(f([1.0, 1.0])).numpy(), rmvn.log_prob(t([1.0, 1.0])).numpy(), rtol=1e-12)
    draws = mvn.sample((20000,))
    np.testing.assert_allclose(np.cov(draws.numpy().T), cov, atol=0.1)
    batch = np.stack([np.eye(2), -np.eye(2), [[1.0, 2.0], [0.0, 1.0]]])
    assert constraints.positive_definite.check(f(batch)).tolist() == \
        torch.distributions.constraints.positive_definite.check(t(batch)).tolist()


# ---- accelerator, TransformGetItemToIndex

def test_accelerator_on_a_cpu_machine():
    if flambeau.cuda.is_available():
        pytest.skip("a GPU is visible")
    assert flambeau.accelerator.current_accelerator() is None and not flambeau.accelerator.is_available()
    assert flambeau.accelerator.device_count() == 0
    assert flambeau.get_device_module() is flambeau.cpu and flambeau.get_device_module("cuda") is flambeau.cuda
    with pytest.raises(RuntimeError, match="Cannot access accelerator device when none is available"):
        flambeau.accelerator.current_device_index()


def test_transform_getitem_to_index():
    from flambeau._dynamo._trace_wrapped_higher_order_op import TransformGetItemToIndex
    x = flambeau.arange(12.0).reshape(3, 4).clone()
    i = flambeau.tensor(2)
    assert x[i]._base is x                       # outside: a 0-dim index is an int (a view)
    with TransformGetItemToIndex():
        y, z = x[i], x[1, i]
    assert y._base is None and y.tolist() == [8.0, 9.0, 10.0, 11.0] and z.item() == 6.0
    assert x[i]._base is x                       # restored
