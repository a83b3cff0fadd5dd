"""FSDP2 (`fully_shard` per block and at the root) on 2 and 3 MPI ranks, float64: data-parallel training
equals one PyTorch process on the concatenated batch (losses and weights), with reshard_after_forward on
and off, with a no-sync micro-batch first (gradient accumulation); parameters and gradients are
Shard(0) DTensors; mixed precision computes in bfloat16 (tests/dist_workers/fsdp.py)."""
from __future__ import annotations

import os

import numpy as np
import pytest
import torch

from tests.conftest import python_calls
from tests.dist_helpers import launch
from bench import gpu_models
from tests.dist_workers.tp_models import B, STEPS, TIED_GPT, build_model, fsdp_batch, tied_batch

Model = build_model(torch)


@pytest.fixture(scope="module", params=[2, 3, "2-batched"], ids=lambda w: f"world{w}")
def ranks(request, tmp_path_factory):
    """Each rank's results; "2-batched": 2 ranks with the cuda path's batched copies (one per group's gather
    and reduce-scatter input, by address) run on host arrays (tests/dist_workers/host_batched.py)."""
    world, batched = int(str(request.param)[0]), str(request.param).endswith("batched")
    out = tmp_path_factory.mktemp(f"fsdp{world}")
    rc, so, se = launch("fsdp.py", world, str(out), *(["batched"] if batched else []))
    assert rc == 0, f"workers failed (rc {rc}):\n{so}\n{se}"
    return [dict(np.load(os.path.join(out, f"rank{r}.npz"))) for r in range(world)]


def _reference(tag, res, world, accumulate=False):
    model = Model().double()
    if tag == "unused":
        model.extra = torch.nn.Linear(3, 2).double()
    prefix = f"{tag}/init/"
    model.load_state_dict({k[len(prefix):]: torch.from_numpy(v) for k, v in res.items() if k.startswith(prefix)})
    opt = torch.optim.AdamW(model.parameters(), lr=0.01)
    losses = []
    for step in range(STEPS):
        x, y = fsdp_batch(torch, step, world)
        out = model(x)
        loss = ((out - y) ** 2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        if accumulate:      # what the workers report: the second half-batch's 0.5 * mean, averaged over ranks
            per = ((out - y) ** 2).reshape(world, B, -1)[:, B // 2:].mean(dim=(1, 2))
            losses.append(0.5 * per.mean().item())
        else:
            losses.append(loss.item())
    return losses, {k: v.detach().numpy() for k, v in model.named_parameters()}


@pytest.mark.parametrize("tag", ["reshard", "keep", "accumulate", "unused"])
def test_fsdp_training_equals_one_process_on_the_whole_batch(ranks, tag):
    losses, final = _reference(tag, ranks[0], len(ranks), accumulate=tag == "accumulate")
    for r, res in enumerate(ranks):
        assert bool(res[f"{tag}/sharded"]) and bool(res[f"{tag}/is_fsdp"])
        assert str(res[f"{tag}/grad_layout"]) == "(Shard(dim=0),)"
        np.testing.assert_allclose(res[f"{tag}/losses"], losses, rtol=1e-10, atol=1e-12)
        for k, v in final.items():
            np.testing.assert_allclose(res[f"{tag}/final/{k}"], v, rtol=1e-9, atol=1e-11, err_msg=f"rank {r} {k}")
        # the forward sees whole gathered parameters (plain tensors), not the shards
        assert str(res[f"{tag}/seen"][0]) == "torch.float64,Tensor,(12, 12)"


def test_tied_parameter_stays_one_parameter(ranks):
    """GPT-2's lm_head weight is wte's: sharded once, its two uses' gradients summed, as one process trains."""
    model = gpu_models.gpt(torch, **TIED_GPT).double()
    prefix = "tied/init/"
    model.load_state_dict({k[len(prefix):]: torch.from_numpy(v) for k, v in ranks[0].items() if k.startswith(prefix)})
    opt = torch.optim.AdamW(model.parameters(), lr=0.01)
    losses = []
    for step in range(STEPS):
        loss = model(*(torch.from_numpy(a) for a in tied_batch(step, len(ranks))))
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    for res in ranks:
        assert bool(res["tied/still_tied"])
        np.testing.assert_allclose(res["tied/losses"], losses, rtol=1e-10, atol=1e-12)


def test_unused_parameter_leaves_its_grad_none(ranks):
    for res in ranks:                    # the reference's AdamW skips it: its weights stay the initial ones
        np.testing.assert_array_equal(res["unused/final/extra.weight"], res["unused/init/extra.weight"])


def test_reduce_scatters_overlap_the_rest_of_backward(ranks):
    """Every group's reduce-scatter starts during backward and is waited for only after the input's
    gradient (the last node of backward) has been computed; every gather of a group is one collective."""
    for res in ranks:
        timeline = res["overlap/timeline"].tolist()
        last = timeline.index("input gradient")
        assert timeline[:last].count("reduce_scatter started") >= 2, timeline     # the blocks at least
        assert "reduce_scatter waited" not in timeline[:last], timeline
        assert timeline.count("reduce_scatter waited") == timeline.count("reduce_scatter started") == 3
        # one all_gather_into_tensor a group, uneven pieces too (the head's 5 rows): the root and both
        # blocks in forward, the blocks again before their backward
        assert timeline.count("all_gather") == 5, timeline


def test_mixed_precision_computes_in_bfloat16(ranks):
    losses, _ = _reference("mixed", ranks[0], len(ranks))
    for res in ranks:
        assert str(res["mixed/seen"][0]) == "torch.bfloat16,Tensor,(12, 12)"
        np.testing.assert_allclose(res["mixed/losses"], losses, rtol=2e-2)
        assert not np.allclose(res["mixed/losses"], losses, rtol=1e-7, atol=0)   # bfloat16 rounding is there
        assert str(res["mixed/dtypes"]) == "torch.float32,torch.float32"       # shards and their grads stay fp32


def _plain_and_sharded():
    """A PyTorch MLP and flambeau's copy of it with `fully_shard` on its first layer and on the root."""
    import flambeau
    from flambeau.distributed.fsdp import _fully_shard as fs
    torch.manual_seed(0)
    plain = torch.nn.Sequential(torch.nn.Linear(4, 6), torch.nn.Tanh(), torch.nn.Linear(6, 2))
    sharded = flambeau.nn.Sequential(flambeau.nn.Linear(4, 6), flambeau.nn.Tanh(), flambeau.nn.Linear(6, 2))
    sharded.load_state_dict({k: flambeau.tensor(v.numpy()) for k, v in plain.state_dict().items()})
    fs.fully_shard(sharded[0])
    fs.fully_shard(sharded)
    return plain, sharded


def test_every_group_is_gathered_into_one_buffer(monkeypatch):
    """Each group's parameters are all-gathered by one all_gather_into_tensor (the padded flat layout); the
    gradients equal the unsharded model's (PyTorch, same weights)."""
    import flambeau
    import flambeau.distributed as dist
    from flambeau.distributed.fsdp import _fully_shard as fs
    gathered = []
    into_tensor = fs.all_gather_into_tensor
    monkeypatch.setattr(fs, "all_gather_into_tensor", lambda *a, **k: gathered.append(1) or into_tensor(*a, **k))
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        plain, sharded = _plain_and_sharded()
        x = np.random.default_rng(0).standard_normal((5, 4)).astype(np.float32)
        (plain(torch.from_numpy(x)) ** 2).sum().backward()
        (sharded(flambeau.tensor(x)) ** 2).sum().backward()
        assert len(gathered) == 3       # forward: the block's group and the root's; backward: the block's again
        for p, q in zip(plain.parameters(), sharded.parameters()):
            np.testing.assert_allclose(q.grad.full_tensor().numpy(), p.grad.numpy(), rtol=1e-6, atol=1e-6)
    finally:
        dist.destroy_process_group()


class _Shard:
    """What `_FlatLayout` reads of a managed parameter: its gathered shape and this rank's local piece."""

    def __init__(self, shape, local):
        self.shape = shape
        self.sharded = type("Sharded", (), {"_local_tensor": local})()


@pytest.mark.parametrize("n", [1, 2, 3, 4])
def test_flat_layout_gathers_and_scatters_torch_chunk_pieces(n, monkeypatch):
    """The padded flat layout against torch.chunk: every rank packs its chunk of each parameter (uneven
    chunks, ranks with no rows, a 0-row matrix), the ranks' pieces joined (what all_gather_into_tensor
    gives) hold each whole parameter in its columns; a packed whole gradient gives rank r, at its offsets,
    torch.chunk's piece r. Packing copies into columns without `concatenate` (on CuPy its one-kernel path
    uploads a pointer table from pageable memory, a stream synchronisation): the array namespace here has
    none."""
    import types
    import flambeau
    from flambeau.distributed.fsdp import _fully_shard as fs
    from flambeau.distributed.fsdp._fully_shard import _FlatLayout
    monkeypatch.setattr(fs, "_xp", lambda a: types.SimpleNamespace(empty=np.empty, zeros=np.zeros))
    shapes = [(5, 3), (7,), (1, 4), (12, 2), (3,), (2, 3, 2)]
    rng = np.random.default_rng(n)
    full = [torch.from_numpy(rng.standard_normal(s)) for s in shapes]

    def chunk(t, r):
        pieces = torch.chunk(t, n)
        return pieces[r] if r < len(pieces) else t[:0]
    layouts = [_FlatLayout([_Shard(s, flambeau.tensor(chunk(t, r).numpy())) for s, t in zip(shapes, full)], n)
               for r in range(n)]
    assert len({lay.width for lay in layouts}) == 1
    gathered = np.concatenate([lay.pack([p.sharded._local_tensor for p in
                                         [_Shard(s, flambeau.tensor(chunk(t, r).numpy())) for s, t in zip(shapes, full)]],
                                        1).numpy() for r, lay in enumerate(layouts)]).reshape(n, -1)
    lay = layouts[0]
    for i, t in enumerate(full):
        cols = gathered[:, lay.offsets[i]:lay.offsets[i] + lay.widths[i]].copy().reshape(-1)
        np.testing.assert_array_equal(cols[:lay.numels[i]].reshape(t.shape), t.numpy())
        assert lay.even[i] == (cols.size == t.numel())
    grads = [torch.from_numpy(rng.standard_normal(s)) for s in shapes]
    flat = lay.pack([flambeau.tensor(g.numpy()) for g in grads], n).numpy().reshape(n, -1)
    for r, mine in enumerate(layouts):
        for i, g in enumerate(grads):
            piece = flat[r, mine.offsets[i]:mine.offsets[i] + mine.mine[i]].reshape(mine.local_shapes[i])
            np.testing.assert_array_equal(piece, chunk(g, r).numpy())


def _world_of_one():
    import flambeau.distributed as dist
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)


def test_groups_gathering_at_once_keep_their_own_buffers():
    """Two groups of the same layout all-gather at once (two async unshards, then the waits): each gets its
    own parameters, so the buffer a group gathers into and copies out of is its own."""
    import flambeau
    import flambeau.distributed as dist
    from flambeau.distributed.fsdp import fully_shard
    _world_of_one()
    try:
        flambeau.manual_seed(0)
        model = flambeau.nn.Sequential(flambeau.nn.Linear(3, 4), flambeau.nn.Linear(3, 4))
        want = [m.weight.detach().numpy().copy() for m in model]
        for m in model:
            fully_shard(m)
        handles = [m.unshard(async_op=True) for m in model]
        for h in handles:
            h.wait()
        for m, w in zip(model, want):
            m.unshard()
            assert type(m.weight).__name__ == "Tensor"
            np.testing.assert_array_equal(m.weight.detach().numpy(), w)
            m.reshard()
    finally:
        dist.destroy_process_group()


def test_reshard_frees_the_gathered_memory():
    """After a block's forward (reshard_after_forward) nothing keeps its gathered parameters' arrays alive
    (a `[:0]` view of them would): weak references to them die. Under no_grad, so autograd saves nothing;
    the output is PyTorch's on the same weights."""
    import gc
    import weakref
    import flambeau
    import flambeau.distributed as dist
    from flambeau.distributed.fsdp import fully_shard
    _world_of_one()
    try:
        torch.manual_seed(0)
        plain = torch.nn.Sequential(torch.nn.Linear(4, 6), torch.nn.Linear(6, 2))
        model = flambeau.nn.Sequential(flambeau.nn.Linear(4, 6), flambeau.nn.Linear(6, 2))
        model.load_state_dict({k: flambeau.tensor(v.numpy()) for k, v in plain.state_dict().items()})
        for m in model:
            fully_shard(m)
        fully_shard(model)
        seen = []
        owner = lambda a: a if a.base is None else a.base            # noqa: E731  the array owning the memory
        model[0].register_forward_pre_hook(lambda m, a: seen.extend(weakref.ref(owner(p._data)) for p in (m.weight, m.bias)
                                                                     if type(p).__name__ == "Tensor"))
        x = np.random.default_rng(1).standard_normal((3, 4)).astype(np.float32)
        with flambeau.no_grad():
            out = model(flambeau.tensor(x))
        gc.collect()
        assert len(seen) == 2 and all(r() is None for r in seen)
        np.testing.assert_allclose(out.numpy(), plain(torch.from_numpy(x)).detach().numpy(), rtol=1e-6, atol=1e-6)
    finally:
        dist.destroy_process_group()


def test_shards_live_in_the_gather_buffer_and_replaced_ones_are_taken_back(monkeypatch):
    """After the first gather the shards are views of their group's all-gather input: later gathers pack
    nothing (the optimizer stepped the views in place: the second step's loss is PyTorch's after one AdamW
    step); a shard replaced by `p.data = ...` is copied in again: the forward then uses the new weights."""
    import flambeau
    import flambeau.distributed as dist
    from flambeau.distributed.fsdp import _fully_shard as fs
    from flambeau.distributed.tensor import Shard, distribute_tensor
    packed = []
    pack = fs._FlatLayout.pack
    monkeypatch.setattr(fs._FlatLayout, "pack", lambda self, ts, n: packed.append(
        any(t is q._local_tensor for t in ts for q in model.parameters())) or pack(self, ts, n))
    _world_of_one()
    try:
        plain, model = _plain_and_sharded()
        x = np.random.default_rng(0).standard_normal((5, 4)).astype(np.float32)
        opts = torch.optim.AdamW(plain.parameters(), lr=0.1), flambeau.optim.AdamW(model.parameters(), lr=0.1)
        for step in range(2):
            packed.clear()
            losses = []
            for m, opt, t in ((plain, opts[0], torch.from_numpy), (model, opts[1], flambeau.tensor)):
                loss = (m(t(x)) ** 2).sum()
                loss.backward()
                opt.step()
                opt.zero_grad()
                losses.append(loss.item())
            np.testing.assert_allclose(losses[1], losses[0], rtol=1e-5)
        assert packed == [False, False]       # the two groups' gradients; no shards
        new = np.random.default_rng(1).standard_normal((6, 4)).astype(np.float32)
        with torch.no_grad():
            plain[0].weight.copy_(torch.from_numpy(new))
        mesh = model[0]._fsdp_group.mesh
        model[0].weight.data = distribute_tensor(flambeau.tensor(new), mesh, [Shard(0)])
        with flambeau.no_grad():
            out = model(flambeau.tensor(x))
        np.testing.assert_allclose(out.numpy(), plain(torch.from_numpy(x)).detach().numpy(), rtol=1e-5, atol=1e-6)
    finally:
        dist.destroy_process_group()


class _RecordingCopyMany:
    """A stand-in for `triton_copy_many` (the batched copies of the cuda path) on NumPy arrays: each call
    recorded, every pair copied (by array, or by host address as the kernel copies device addresses)."""

    def __init__(self):
        self.calls = []

    def copy_many(self, srcs, dsts):
        self.calls.append(len(srcs))
        for s, d in zip(srcs, dsts):
            assert s.flags.c_contiguous and d.flags.c_contiguous and s.size == d.size
            d[...] = s

    @staticmethod
    def address_of(array) -> int:
        return array.ctypes.data

    def copy_addresses(self, like, srcs, dsts, numels):
        import ctypes
        self.calls.append(len(srcs))
        assert len(srcs) == len(dsts) == len(numels)
        for s, d, k in zip(srcs, dsts, numels):
            ctypes.memmove(d, s, k * like.itemsize)


@pytest.mark.parametrize("n", [1, 2, 3, 4])
def test_batched_pieces_pack_and_gather_as_the_column_copies(n, monkeypatch):
    """On cuda a group's copies are one batched launch over `_FlatLayout.pieces` (contiguous runs: rank r's
    chunk of each parameter): the reduce-scatter input packed that way equals the column-by-column pack,
    and the pieces of a gathered buffer give back every whole parameter (uneven chunks, a rank without rows,
    a 0-row matrix)."""
    import types
    import flambeau
    from flambeau._backends import multi_tensor
    from flambeau.distributed.fsdp import _fully_shard as fs
    from flambeau.distributed.fsdp._fully_shard import _FlatLayout
    monkeypatch.setattr(fs, "_xp", lambda a: np)
    shapes = [(5, 3), (7,), (1, 4), (12, 2), (3,), (2, 3, 2), (0, 3)]
    rng = np.random.default_rng(n)
    full = [rng.standard_normal(s) for s in shapes]
    lay = _FlatLayout([_Shard(s, flambeau.tensor(np.array_split(t, n)[0] if t.shape[0] else t)) for s, t in
                       zip(shapes, full)], n)
    columns = lay.pack([flambeau.tensor(g) for g in full], n).numpy()
    fake = _RecordingCopyMany()
    monkeypatch.setattr(multi_tensor, "copy_many_for", lambda device: fake if n > 1 else None)
    batched = lay.pack([flambeau.tensor(g) for g in full], n).numpy()
    assert fake.calls == ([len(lay.pieces[0])] if n > 1 else [])
    np.testing.assert_array_equal(batched, columns)
    index, flat_at, param_at, lengths = lay.pieces
    whole = [np.full(t.size, np.nan) for t in full]
    for i, a, b, k in zip(index, flat_at, param_at, lengths):
        whole[i][b:b + k] = columns[a:a + k]
    for w, t in zip(whole, full):
        np.testing.assert_array_equal(w.reshape(t.shape), t)


def test_batched_unshard_trains_as_pytorch(monkeypatch):
    """The gathered parameters copied out by one batched call per group and gather (the cuda path, here
    with a NumPy stand-in): two training steps equal PyTorch's unsharded model."""
    import flambeau
    import flambeau.distributed as dist
    from flambeau._backends import multi_tensor
    from flambeau.distributed.fsdp import _fully_shard as fs
    fake = _RecordingCopyMany()
    monkeypatch.setattr(multi_tensor, "copy_many_for", lambda device: fake)
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        plain, sharded = _plain_and_sharded()
        opts = (torch.optim.AdamW(plain.parameters(), lr=0.1), flambeau.optim.AdamW(sharded.parameters(), lr=0.1))
        for step in range(2):
            x = np.random.default_rng(step).standard_normal((5, 4)).astype(np.float32)
            (plain(torch.from_numpy(x)) ** 2).sum().backward()
            (sharded(flambeau.tensor(x)) ** 2).sum().backward()
            for o in opts:
                o.step()
                o.zero_grad()
        assert fake.calls == [2, 2, 2] * 2          # per step: the block's and the root's gathers, the block's again
        for p, q in zip(plain.parameters(), sharded.parameters()):
            np.testing.assert_allclose(q.full_tensor().detach().numpy(), p.detach().numpy(), rtol=1e-5, atol=1e-6)
    finally:
        dist.destroy_process_group()


def test_adamw_over_sharded_parameters_is_one_fused_launch_on_the_local_shards(monkeypatch):
    """AdamW over FSDP2's parameters (Shard(0) DTensors on cuda, gradients too) takes the fused multi-tensor
    kernel on the local shards: one launch a step for all of them (as PyTorch's foreach over the local
    tensors), its parameter and state arrays worked out once; the shards after three steps equal
    torch.optim.AdamW's on the same values. The cuda tensors and the kernel are the CPU stand-ins of
    tests/test_optim_fused.py (NumPy arrays with device addresses, the kernel's update in NumPy)."""
    import flambeau
    import flambeau.distributed as dist
    from flambeau._device import device
    from flambeau._tensor import Tensor
    from flambeau.distributed.device_mesh import init_device_mesh
    from flambeau.distributed.tensor import DTensor, Shard
    from flambeau.nn.parameter import Parameter
    from tests.test_optim_fused import _DevArray, _fake_kernel
    register, launches, made = _fake_kernel(monkeypatch)
    _world_of_one()
    try:
        mesh = init_device_mesh("cpu", (1,))
        cuda = device("cuda")

        def shard(a):
            local = Tensor._make(register(np.array(a, np.float32).view(_DevArray)), cuda)
            return DTensor._make(local, mesh, (Shard(0),), tuple(a.shape))
        rng = np.random.default_rng(0)
        shapes = ((6, 4), (4,), (3, 5))
        init = [rng.standard_normal(s).astype(np.float32) for s in shapes]
        params = [Parameter(shard(a)) for a in init]
        ref = [torch.tensor(a, requires_grad=True) for a in init]
        hyper = dict(lr=0.01, betas=(0.8, 0.95), eps=1e-6, weight_decay=0.1)
        opt, ref_opt = flambeau.optim.AdamW(params, **hyper), torch.optim.AdamW(ref, **hyper, foreach=False)
        for p in params:
            opt.state[p].update(step=flambeau.tensor(0.0), exp_avg=shard(np.zeros(p.shape)),
                                exp_avg_sq=shard(np.zeros(p.shape)))
        for _ in range(3):
            for p, q in zip(params, ref):
                g = rng.standard_normal(p.shape).astype(np.float32)
                p.grad, q.grad = shard(g), torch.tensor(g)
            opt.step()
            ref_opt.step()
        assert launches == [(3, 1.0), (3, 2.0), (3, 3.0)] and made == [1]
        for p, q in zip(params, ref):
            assert isinstance(p, DTensor)
            np.testing.assert_allclose(np.asarray(p._local_tensor._data), q.detach().numpy(), rtol=1e-5, atol=1e-6)
    finally:
        dist.destroy_process_group()




FSDP_PYTHON_CALLS_PER_PARAMETER = 8.5   # its hook, its sharded .grad (Tensor and DTensor), AdamW reading a DTensor


def test_fsdp_python_calls_per_parameter_per_step():
    """What FSDP2 adds to a training step (AdamW, 10 blocks each sharded, and the root), in Python calls per
    parameter: measured as the growth of (FSDP step - plain step) calls when each block has 6 linear layers
    instead of 2 (the same groups and collectives): the hook, the sharded gradient, the optimizer reading
    the DTensor; installing parameters, packing and copying out are loops and maps over lists made once.
    Before (installs per parameter, gradients through properties, per-parameter generator checks): 17; now 8."""
    import flambeau
    import flambeau.distributed as dist
    from flambeau.distributed.fsdp import fully_shard
    _world_of_one()
    try:
        def model(k):
            flambeau.manual_seed(0)
            return flambeau.nn.Sequential(*[flambeau.nn.Sequential(*[flambeau.nn.Linear(4, 4) for _ in range(k)])
                                            for _ in range(10)])

        def step(m, opt, s):
            x = flambeau.tensor(np.random.default_rng(s).standard_normal((3, 4)).astype(np.float32))
            opt.zero_grad(set_to_none=True)
            (m(x) ** 2).mean().backward()
            opt.step()
        added, n_params = [], []
        for k in (2, 6):
            counts = []
            for wrap in (False, True):
                m = model(k)
                if wrap:
                    for block in m:
                        fully_shard(block)
                    fully_shard(m)
                opt = flambeau.optim.AdamW(m.parameters(), lr=0.1)
                for s in range(3):
                    step(m, opt, s)
                counts.append(python_calls(lambda: step(m, opt, 3)))
            added.append(counts[1] - counts[0])
            n_params.append(len(list(m.parameters())))
        per_parameter = (added[1] - added[0]) / (n_params[1] - n_params[0])
        assert 3 <= per_parameter <= FSDP_PYTHON_CALLS_PER_PARAMETER, (per_parameter, added, n_params)
    finally:
        dist.destroy_process_group()


@pytest.fixture(scope="module")
def compiled_ranks(tmp_path_factory):
    out = tmp_path_factory.mktemp("fsdp_compile")
    rc, so, se = launch("fsdp_compile.py", 2, str(out))
    assert rc == 0, f"workers failed (rc {rc}):\n{so}\n{se}"
    return [dict(np.load(os.path.join(out, f"rank{r}.npz"))) for r in range(2)]


def test_compiled_fsdp2_model_compiles_each_block_and_trains_as_eager(compiled_ranks):
    """`compile()` of an FSDP2 model whose forward loops over its sharded blocks: the loop breaks the graph at
    each block's hooks, so the model's frame runs eagerly and its module calls are compiled as their own
    frames (each block's forward one graph with its layer norm, product, tanh and residual; FSDP's hooks run
    eagerly around it, never traced: no graph break inside them); it trains as the eager FSDP2 model does."""
    for res in compiled_ranks:
        ops = [int(n) for n in res["compiled/graph_ops"]]
        assert len(ops) >= 2 and max(ops) >= 4, ops          # the block's graph (and the head's)
        assert list(res["compiled/breaks"]) == [""], res["compiled/breaks"]     # FSDP's hooks never traced
        np.testing.assert_allclose(res["compiled/losses"], res["eager/losses"], rtol=1e-5, atol=1e-6)
        for k in [k for k in res if k.startswith("eager/final/")]:
            np.testing.assert_allclose(res[k.replace("eager", "compiled", 1)], res[k], rtol=1e-4, atol=1e-5,
                                       err_msg=k)
