"""flambeau._inductor: compiled graphs vs eager flambeau and PyTorch, fusion, cache, errors, NumPy path.

Each case is a function written against a module `T` (flambeau or torch), so the same code runs
on both. Graphs are traced with make_fx under DecompositionMode (core ops only), compiled with
compile_fx, and compared with eager flambeau and with PyTorch.
"""
import os
import re

import numpy as np
import pytest
import torch

import flambeau
from flambeau._decomp import DecompositionMode
from flambeau import _cpp_builder as cpp_builder
from flambeau._dynamo.testing import no_unexpected_fallbacks
from flambeau._inductor import CppCompileError, compile_fx, config
from flambeau.fx.experimental.proxy_tensor import make_fx
from tests.opdb import declared_eager_fallbacks


@pytest.fixture(autouse=True)
def _cache_dir(tmp_path_factory, monkeypatch):
    d = tmp_path_factory.getbasetemp() / "inductor_cache"
    monkeypatch.setattr(cpp_builder, "cache_dir", str(d))


def trace(fn, args):
    def f(*a):
        with DecompositionMode():
            return fn(flambeau, *a)
    return make_fx(f, tracing_mode="fake")(*args)


def to_torch(x):
    if isinstance(x, flambeau.Tensor):
        return torch.from_numpy(np.array(x.numpy(), copy=True))
    if isinstance(x, (list, tuple)):
        return type(x)(to_torch(v) for v in x)
    return x


def as_list(x):
    return list(x) if isinstance(x, (list, tuple)) else [x]


def check(fn, *args, rtol=None, atol=None, kernels=None):
    """Compile fn, compare with eager flambeau and PyTorch; return the CompiledGraph."""
    gm = trace(fn, args)
    c = compile_fx(gm, list(args))
    assert c.artifact is not None, c.eager_reason
    got = as_list(c(*args))
    eager = as_list(fn(flambeau, *args))
    ref = as_list(fn(torch, *[to_torch(a) for a in args]))
    assert len(got) == len(eager) == len(ref)
    for g, e, r in zip(got, eager, ref):
        assert g.dtype == e.dtype, (g.dtype, e.dtype)
        assert tuple(g.shape) == tuple(r.shape)
        torch.testing.assert_close(to_torch(g), to_torch(e), rtol=rtol, atol=atol, equal_nan=True)
        torch.testing.assert_close(to_torch(g), r, rtol=rtol, atol=atol, equal_nan=True)
    if kernels is not None:
        assert c.kernel_count == kernels, c.source
    return c


def randn(*shape, dtype=flambeau.float32):
    return flambeau.randn(*shape, dtype=dtype)


# ---- pointwise ---------------------------------------------------------------------------------
def test_pointwise_chain_is_one_kernel():
    x = randn(64, 33)
    check(lambda T, x: ((x * 0.5 + 1).exp().sin() / (x.abs() + 1)).tanh() - x.sigmoid(), x, kernels=1)


def test_broadcasting():
    x, y, z = randn(4, 1, 8), randn(3, 1), randn(8)
    check(lambda T, x, y, z: x + y * z - T.maximum(x, z), x, y, z)


def test_unary_math():
    x = randn(7, 9)
    pos = x.abs() + 0.5
    check(lambda T, x, p: [x.floor(), x.ceil(), x.round(), x.trunc(), x.sign(), T.erf(x), x.rsqrt().nan_to_num(0),
                           p.log(), p.log1p(), x.expm1(), p.sqrt(), x.atan(), x.sinh(), T.atan2(x, p),
                           x.clamp(-0.5, 0.5), T.nn.functional.relu(x), x ** 2, p ** x], x, pos)


def test_mixed_dtypes():
    x, d = randn(5, 6), randn(5, 6, dtype=flambeau.float64)
    i = flambeau.randint(-5, 5, (5, 6))
    check(lambda T, x, d, i: [x + d, x * i, i / 3, i + 2.5, (x > 0) + i, x.to(T.int64), i.to(T.float32) * x,
                              d.float() + x], x, d, i)


def test_int_ops():
    a = flambeau.randint(-50, 50, (6, 7))
    b = flambeau.randint(1, 9, (6, 7))
    check(lambda T, a, b: [a // b, a % b, a & b, a | b, a ^ b, a << 2, a >> 1, -a, a.abs(), a * b - 3,
                           T.div(a, b, rounding_mode="trunc"), T.remainder(a, -b), a.sum(1), a.max(0).values],
          a, b)


def test_int32_and_bool():
    a = flambeau.randint(-9, 9, (4, 5), dtype=flambeau.int32)
    m = randn(4, 5) > 0
    check(lambda T, a, m: [a + a, a * 3, m & (a > 0), ~m, m.sum(), m.any(1), m.all(0), T.logical_xor(m, a > 2)],
          a, m)


def test_where_and_masks():
    x = randn(16, 8)
    check(lambda T, x: [T.where(x > 0, x, 0.1 * x), x.masked_fill(x < -0.5, 7.0), (x > 0.2).float() * x], x)


# ---- reductions --------------------------------------------------------------------------------
@pytest.mark.parametrize("dim", [0, 1, 2, -1, (0, 2)])
@pytest.mark.parametrize("keepdim", [False, True])
def test_reductions_each_dim(dim, keepdim):
    x = randn(5, 6, 7)
    ops = [lambda T, x: x.sum(dim, keepdim=keepdim), lambda T, x: x.mean(dim, keepdim=keepdim),
           lambda T, x: T.amax(x, dim, keepdim=keepdim), lambda T, x: T.amin(x, dim, keepdim=keepdim),
           lambda T, x: x.var(dim, keepdim=keepdim)]
    if not isinstance(dim, tuple):
        ops += [lambda T, x: x.argmax(dim, keepdim=keepdim), lambda T, x: x.argmin(dim, keepdim=keepdim),
                lambda T, x: x.prod(dim, keepdim=keepdim)]
    check(lambda T, x: [f(T, x) for f in ops], x, rtol=1e-5, atol=1e-5)


def test_full_reductions_and_nan():
    x = randn(300, 301)
    check(lambda T, x: [x.sum(), x.mean(), x.max(), x.min(), x.argmax(), x.argmin()], x, rtol=1e-5, atol=1e-4)
    y = randn(4, 5)
    y[1, 2] = float("nan")
    check(lambda T, y: [T.amax(y, 1), T.amin(y, 0), y.argmax(1), T.maximum(y, y.t()[:4, :4].sum())], y)


def test_softmax():
    x = randn(32, 100)
    check(lambda T, x: [x.softmax(-1), x.log_softmax(0), T.nn.functional.softmax(x * 3, dim=1)], x)


def test_layernorm_gelu_tanh_is_one_kernel(monkeypatch):
    monkeypatch.setattr(config, "keep_ir", True)          # the scheduled kernel, read below
    x, w, b = randn(256, 1024), randn(1024), randn(1024)

    def fn(T, x, w, b):
        y = T.nn.functional.layer_norm(x, (1024,), w, b) * 1.5 + 0.1
        return T.nn.functional.gelu(y).tanh()
    c = check(fn, x, w, b, kernels=1, rtol=1e-5, atol=1e-5)
    k = c.artifact.kernels[0]
    assert [s.kind for s in k.steps].count("reduction") == 2 and k.steps[-1].kind == "pointwise"
    assert len(k.stores) == 1                  # the mean and variance never leave registers


# ---- views and data movement -------------------------------------------------------------------
def test_views_inside_chains():
    x, y = randn(4, 6, 8), randn(8, 24)
    check(lambda T, x, y: [x.permute(2, 0, 1).reshape(8, 24) * 2 + y, x.transpose(0, 1).sum(-1),
                           x[:, 1:5:2, ::3].exp(), x[1] + x[2], x.unsqueeze(1).expand(4, 3, 6, 8).sum(1),
                           x.reshape(-1, 4).t().contiguous(), x.view(24, 8).squeeze() - y.t()], x, y)


def test_output_views_of_inputs():
    x = randn(6, 4)
    c = check(lambda T, x: [x.t(), x[1:3], x * 1], x)
    outs = c(x)
    assert outs[0].data_ptr() == x.data_ptr()          # a view of the input, not a copy


def test_non_contiguous_inputs_recompile():
    x = randn(8, 5)
    gm = trace(lambda T, x: x * 2 + 1, [x])
    c = compile_fx(gm, [x])
    xt = randn(5, 8).t()
    np.testing.assert_allclose(c(xt).numpy(), (xt * 2 + 1).numpy())
    assert len(c.variants) == 2
    y = randn(9, 5)                                  # same strides, other sizes: runs the graph eagerly
    np.testing.assert_allclose(c(y).numpy(), (y * 2 + 1).numpy())


def test_indexing_and_embedding():
    w = randn(10, 4)
    idx = flambeau.tensor([[1, 2, 9], [0, 7, 3]])
    neg = flambeau.tensor([[1, -2, 9], [0, -1, 3]])
    x = randn(5, 6)
    gi = flambeau.randint(0, 6, (5, 3))
    check(lambda T, w, idx, neg, x, gi: [T.nn.functional.embedding(idx, w), w[neg], x[:, gi[0]], T.gather(x, 1, gi) * 2,
                                         x[gi[:, 1] % 5, gi[:, 0]]], w, idx, neg, x, gi)


def test_cat_and_stack():
    x, y = randn(4, 3), randn(4, 5)
    check(lambda T, x, y: [T.cat([x, y.exp()], dim=1), T.cat([x, x * 2], 0).sum(0), T.stack([x, x + 1], 1)], x, y)


def test_pad_and_slice_scatter():
    x = randn(3, 4)
    check(lambda T, x: [T.nn.functional.pad(x, (1, 2, 0, 1), value=0.5),
                        T.slice_scatter(x, x[:, :2] * 10, 1, 1, 3), T.select_scatter(x, x[0] + 1, 0, 2)], x)


# ---- externs and models ------------------------------------------------------------------------
def test_matmul_bias_relu(monkeypatch):
    monkeypatch.setattr(config, "keep_ir", True)          # the extern nodes, counted below
    x, w, b = randn(16, 32), randn(64, 32), randn(64)
    c = check(lambda T, x, w, b: T.nn.functional.relu(x @ w.t() + b), x, w, b, rtol=1e-5, atol=1e-5)
    assert c.kernel_count == 1 and len(c.artifact.externs) == 1


def test_mlp_forward():
    flambeau.manual_seed(0)
    x = randn(8, 20)
    params = [randn(32, 20) * 0.2, randn(32) * 0.1, randn(16, 32) * 0.2, randn(16) * 0.1, randn(3, 16), randn(3)]

    def mlp(T, x, w1, b1, w2, b2, w3, b3):
        F_ = T.nn.functional
        h = F_.relu(F_.linear(x, w1, b1))
        h = F_.gelu(F_.linear(h, w2, b2))
        return F_.linear(h, w3, b3).log_softmax(-1)
    check(mlp, x, *params, rtol=1e-5, atol=1e-5)


def test_fallback_ops_and_dtypes():
    x = randn(6, 5)
    h = randn(4, 3).half()
    c = check(lambda T, x, h: [x.cumsum(1) * 2, x.sort(1).values + 1, (h * 2).float() + 1], x, h)
    assert c.kernel_count >= 1


def test_constants_and_graphs_run_eagerly():
    c0 = randn(4)
    x = randn(3, 4)
    c = compile_fx(make_fx(lambda x: x * c0 + 1, tracing_mode="fake")(x), [x])     # get_attr constant
    assert c.kernel_count == 1
    np.testing.assert_allclose(c(x).numpy(), (x * c0 + 1).numpy(), rtol=1e-6)
    c = compile_fx(make_fx(lambda x, n: x * n, tracing_mode="fake")(x, 3), [x, 3])  # non-tensor input
    assert c.artifact is None and "not a tensor" in c.eager_reason
    np.testing.assert_allclose(c(x, 3).numpy(), (x * 3).numpy())
    c = compile_fx(make_fx(lambda x: x.sum(0) * 2, tracing_mode="symbolic")(x), [x])  # one graph, every size
    assert c.eager_reason is None and c.size_names == ["s0", "s1"]
    for xx in (x, randn(5, 9)):
        np.testing.assert_allclose(c(xx).numpy(), (xx.sum(0) * 2).numpy(), rtol=1e-6)


# ---- cache, errors, debug, NumPy path ----------------------------------------------------------
def test_cache_hit_skips_compiler(tmp_path, monkeypatch):
    monkeypatch.setattr(cpp_builder, "cache_dir", str(tmp_path))
    x = randn(33, 17)
    fn = lambda T, x: (x * 3.25).exp().sum(1)                  # noqa: E731
    gm = trace(fn, [x])
    n0 = cpp_builder.counters["compiles"]
    compile_fx(gm, [x])
    assert cpp_builder.counters["compiles"] == n0 + 1
    cpp_builder._loaded.clear()                                # a fresh process: only the disk cache
    hits = cpp_builder.counters["disk_hits"]
    c = compile_fx(trace(fn, [x]), [x])
    assert cpp_builder.counters["compiles"] == n0 + 1
    assert cpp_builder.counters["disk_hits"] == hits + 1
    np.testing.assert_allclose(c(x).numpy(), fn(flambeau, x).numpy(), rtol=1e-6)


def test_every_simd_spelling_is_probed_by_the_builder():
    """Kernels declare an op's libmvec function `simd` when the builder's probe found libmvec; the
    probe (a foundation module, which cannot ask the ops) must have linked every such function."""
    from flambeau._inductor.codegen_cpp import SIMD1
    assert SIMD1 and set(SIMD1) <= set(cpp_builder.PROBED_SIMD1)


def test_broken_kernel_source_raises_clear_error(tmp_path, monkeypatch):
    monkeypatch.setattr(cpp_builder, "cache_dir", str(tmp_path))
    info = cpp_builder.detect_flags()
    with pytest.raises(CppCompileError) as e:
        cpp_builder.load('extern "C" void kernel0(float* a) { a[0] = undefined_thing; }\n', info)
    msg = str(e.value)
    assert "undefined_thing" in msg and str(tmp_path) in msg and ".cpp" in msg


def test_numpy_backend_matches(monkeypatch):
    monkeypatch.setattr(config, "backend", "numpy")
    x, w, b = randn(8, 16), randn(16), randn(16)
    c = check(lambda T, x, w, b: T.nn.functional.gelu(T.nn.functional.layer_norm(x, (16,), w, b)).tanh(),
              x, w, b, rtol=1e-5, atol=1e-5)
    assert c.artifact.backend == "numpy"
    a = flambeau.randint(-20, 20, (4, 6))
    check(lambda T, a, x: [a // 3, a % 4, a.argmax(1), T.cat([x[:4, :6], a.float()], 1), x[a.abs() % 8, 0]],
          a, x)


def test_no_compiler_falls_back_to_numpy(monkeypatch):
    import importlib
    cfx = importlib.import_module("flambeau._inductor.compile_fx")
    monkeypatch.setattr(cpp_builder, "cxx", "no-such-compiler-xyz")
    monkeypatch.setattr(cfx, "_warned_no_compiler", [False])
    x = randn(5, 7)
    with pytest.warns(RuntimeWarning, match="no working C\\+\\+ compiler"):
        c = check(lambda T, x: (x.exp() + 1).sum(-1), x)
    assert c.artifact.backend == "numpy"


def test_output_code_and_debug_dump(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(config, "output_code", True)
    monkeypatch.setattr(config, "debug", True)
    monkeypatch.setattr(config, "debug_dir", str(tmp_path))
    x = randn(4, 4)
    compile_fx(trace(lambda T, x: x.softmax(-1), [x]), [x])
    err = capsys.readouterr().err
    assert 'extern "C" void kernel0' in err and "def call(args)" in err
    files = {f for _, _, fs in os.walk(tmp_path) for f in fs}
    assert {"fx_graph.py", "ir.txt", "schedule.txt", "output_code.cpp", "wrapper.py"} <= files


def test_memory_plan_reuses_buffers():
    x, w = randn(64, 64), randn(64, 64)
    c = check(lambda T, x, w: ((x.exp() @ w).tanh() @ w).sigmoid() @ w, x, w, rtol=1e-4, atol=1e-4)
    assert ".reshape(" in c.artifact.wrapper_source or "del " in c.artifact.wrapper_source


def _arena_on_cpu(monkeypatch, backend):
    """The arena on for cpu graphs of `backend` (Triton: its interpreter), buffers poisoned."""
    if backend == "triton":
        triton = pytest.importorskip("triton")
        if not triton.knobs.runtime.interpret:
            pytest.skip("Triton imported without its interpreter (a cuda machine)")
    monkeypatch.setattr(config, "backend", backend)
    monkeypatch.setattr(config, "arena_devices", ("cpu",))
    monkeypatch.setattr(config, "poison_buffers", True)


@pytest.mark.parametrize("backend", ["cpp", "triton"])
def test_arena_keeps_live_temporaries_apart_and_reuses_dead_ones(monkeypatch, backend):
    """With the arena on (`config.arena_devices`: cuda's default, here cpu's), a graph's kernel temporaries
    are views of one allocation per call at offsets planned when compiling (scheduler.plan_arena). In the
    poisoned arena two temporaries live at once that shared bytes would give wrong values against PyTorch;
    a dead one's bytes serve a later one (fewer distinct offsets than temporaries); outputs are allocated
    apart (an output tensor keeps no arena alive)."""
    _arena_on_cpu(monkeypatch, backend)
    x, w = randn(4, 512), randn(512, 512) / 16

    def fn(T, x, w):
        a, b = x.exp() @ w, x.cos() @ w            # two temporaries (exp, cos) live together up to the matmuls
        c = (a * b).tanh() @ w                    # one more, after they died
        u = (x * x.exp().sum(0).flip(0)).cos() @ w    # a reduction's temporary, read by the kernel storing the next
        d = (c + a + u).sigmoid() @ w
        return (d * 2).sum(0), d.relu()
    c = check(fn, x, w, rtol=1e-4, atol=1e-4)
    src = c.artifact.wrapper_source
    views = re.findall(r"(buf\d+) = _nd\(.*, _amem(?:, | \+ )(\d+)\)", src)
    assert len(views) >= 3, src
    assert len({off for _, off in views}) < len(views), src        # a dead temporary's bytes reused
    assert "_arena = _empty((" in src
    outputs = re.search(r"return \((.*)\)", src).group(1)
    assert not any(name in outputs for name, _ in views), src


@pytest.mark.parametrize("backend", ["cpp", "triton"])
def test_saved_activations_share_one_arena_and_train_as_pytorch(monkeypatch, backend):
    """With the arena on (here for cpu) a compiled training forward's activations saved for the backward
    only are views of one poisoned allocation per call, one after the other (distinct offsets, never
    overlapping), while the output the caller sees is allocated apart; loss and every gradient as
    PyTorch's after two steps (a second forward's arena must not disturb the first's values either)."""
    from tests.conftest import spy_compile_fx
    _arena_on_cpu(monkeypatch, backend)
    made = spy_compile_fx(monkeypatch, [])

    def build(lib):
        nn = lib.nn
        return nn.Sequential(nn.Linear(32, 64), nn.LayerNorm(64), nn.GELU(), nn.Linear(64, 64), nn.Tanh(),
                             nn.Linear(64, 8))
    fm, tm = build(flambeau), build(torch)
    with torch.no_grad():
        for p, q in zip(fm.parameters(), tm.parameters()):
            q.copy_(torch.tensor(np.asarray(p.detach()._data)))
    cf = flambeau.compile(fm)
    rng = np.random.default_rng(0)
    for _ in range(2):
        a = rng.standard_normal((16, 32)).astype(np.float32)
        out = cf(flambeau.tensor(a))
        loss, lt = (out ** 2).mean(), (tm(torch.tensor(a)) ** 2).mean()
        loss.backward()
        lt.backward()
        np.testing.assert_allclose(float(loss.detach()), float(lt.detach()), rtol=1e-5)
        for p, q in zip(fm.parameters(), tm.parameters()):
            np.testing.assert_allclose(np.asarray(p.grad._data), q.grad.numpy(), rtol=1e-4, atol=1e-5)
    src = next(c.artifact.wrapper_source for c in made if "_sarena" in c.artifact.wrapper_source)
    views = re.findall(r"(buf\d+) = _nd\(\((.*?)\), _dt_float32, _smem(?:, | \+ )(\d+)\)", src)
    assert len(views) >= 4 and "_sarena = _empty((" in src, src
    spans = sorted((int(off), int(off) + 4 * int(np.prod([int(d) for d in shape.split(",") if d.strip()])))
                   for _, shape, off in views)
    assert all(end <= nxt for (_, end), (nxt, _) in zip(spans, spans[1:])), spans      # apart
    outputs = re.search(r"return \((.*)\)", src).group(1)
    first_saved = outputs.split(", ")[0]
    assert all(first_saved != f"_T({name}, _dev)" for name, _, _ in views), src      # the caller's output apart


def test_saved_activations_the_backward_returns_stay_out_of_the_arena(monkeypatch):
    """A saved value the backward returns as a gradient (partitioners._returned; here every one, by a
    stub) keeps memory of its own: with all of them so, the forward makes no saved-activation arena."""
    from flambeau._functorch import partitioners
    from tests.conftest import spy_compile_fx
    monkeypatch.setattr(config, "arena_devices", ("cpu",))
    monkeypatch.setattr(partitioners, "_returned", lambda saved, outs: frozenset(range(len(saved))))
    made = spy_compile_fx(monkeypatch, [])
    nn = flambeau.nn
    m = flambeau.compile(nn.Sequential(nn.Linear(8, 16), nn.LayerNorm(16), nn.GELU(), nn.Linear(16, 4)))
    m(flambeau.randn(4, 8)).sum().backward()
    assert len(made) == 2 and not any("_sarena" in c.artifact.wrapper_source for c in made)


@pytest.mark.parametrize("channels_last", [False, True], ids=["contiguous", "channels_last"])
def test_global_average_pool_is_a_mean_as_pytorch(monkeypatch, channels_last):
    """adaptive_avg_pool2d to 1x1 (ResNet's head) is PyTorch's mean over H and W: values, input gradient
    and strides as PyTorch's (a channels-last input gives (C, 1, C, C)); compiled, the generated code
    computes it (no `_taps_gather` extern, which on cuda ran ~40 CuPy calls a step)."""
    from tests.conftest import spy_compile_fx
    made = spy_compile_fx(monkeypatch, [])
    a = np.random.default_rng(0).standard_normal((2, 6, 7, 7)).astype(np.float32)
    x, xt = flambeau.tensor(a, requires_grad=True), torch.tensor(a, requires_grad=True)
    xi, xti = (x.contiguous(memory_format=flambeau.channels_last), xt.contiguous(memory_format=torch.channels_last)) \
        if channels_last else (x, xt)
    y, yt = flambeau.nn.functional.adaptive_avg_pool2d(xi, 1), torch.nn.functional.adaptive_avg_pool2d(xti, 1)
    assert y.stride() == yt.stride()
    torch.testing.assert_close(to_torch(y.detach()), yt.detach())
    flambeau._dynamo.reset()
    f = flambeau.compile(lambda v: (flambeau.nn.functional.adaptive_avg_pool2d(v, 1).flatten(1) * 3).square().sum())
    f(xi).backward()
    (torch.nn.functional.adaptive_avg_pool2d(xti, 1).flatten(1) * 3).square().sum().backward()
    flambeau._dynamo.reset()
    torch.testing.assert_close(to_torch(x.grad), xt.grad)
    assert made and not any("_taps_gather" in c.artifact.wrapper_source for c in made)


# ---- the op database: compiled graph vs the same graph run eagerly ----------------------------
def _opdb_cases(family, dtypes=("float32", "int64", "bool"), per_op=3):
    import tests.opdb as O
    mod = __import__(f"tests.opdb.{family}", fromlist=["OPS"])
    cases = []
    for info in mod.OPS:
        if info.random:
            continue
        for dt in dtypes:
            if dt not in info.dtypes:
                continue
            for si, s in enumerate(info.samples(dt)[:per_op]):
                args, kwargs, _ = O.materialize(flambeau, s, dt, si, False)
                fn = info.resolve(flambeau)
                pos = [i for i, a in enumerate(args) if isinstance(a, flambeau.Tensor)]

                def call(*ts, fn=fn, args=args, kwargs=kwargs, pos=pos):
                    a = list(args)
                    for i, t in zip(pos, ts):
                        a[i] = t
                    r = fn(*a, **kwargs)
                    return [x for x in (r if isinstance(r, (tuple, list)) else [r]) if isinstance(x, flambeau.Tensor)]
                tens = [args[i] for i in pos]
                try:                                  # cases that do not trace are not ours to judge
                    with DecompositionMode():
                        n_out = len(call(*tens))
                        make_fx(call, tracing_mode="fake")(*tens)
                except Exception:
                    continue
                cases.append((f"{info.name}[{dt},{si}]", call, tens, n_out))
    return cases


def _storage_copy(t):
    """A copy of `t` on a copy of its whole storage, at the same offset and strides (as_strided
    samples read the storage beyond the tensor)."""
    from flambeau._ops.views import storage_root
    a = t._data
    flat, start, _ = storage_root(a)
    return flambeau.from_numpy(np.ndarray(a.shape, a.dtype, buffer=flat.copy(), offset=start * a.itemsize,
                                          strides=a.strides))


# what may run eagerly in these graphs besides the ops' declared eager fallbacks and the entries' own `fallbacks`
GRAPH_FALLBACKS = {"_pw_real": "the real part of a complex input: the code generator takes no complex dtype"}


@pytest.mark.slow
@pytest.mark.parametrize("backend", ["cpp", "numpy"])
@pytest.mark.parametrize("family", ["pointwise", "reduction", "shape_index", "norm_loss_act", "nn_ops", "misc",
                                    "linalg_creation"])
def test_opdb_compiled_matches_graph(family, backend, monkeypatch):
    """Every traceable op-database sample, all in one graph: compiled == the graph run eagerly."""
    monkeypatch.setattr(config, "backend", backend)
    cases = _opdb_cases(family)
    flat = [t for _, _, ts, _ in cases for t in ts]

    def all_cases(*ts):
        out, k = [], 0
        with DecompositionMode():
            for _, call, tens, _ in cases:
                out.extend(call(*ts[k:k + len(tens)]))
                k += len(tens)
        return out
    gm = make_fx(all_cases, tracing_mode="fake")(*flat)
    want_in = [_storage_copy(t) for t in flat]          # in-place cases write their inputs (copy_):
    got_in = [_storage_copy(t) for t in flat]           # each run gets its own copies, compared after
    want = gm(*want_in)
    infos = __import__(f"tests.opdb.{family}", fromlist=["OPS"]).OPS
    allowed = {**declared_eager_fallbacks(), **GRAPH_FALLBACKS, **{k: r for i in infos for k, r in i.fallbacks.items()}}
    with no_unexpected_fallbacks(allowed):
        c = compile_fx(gm, flat)
        assert c.artifact is not None, c.eager_reason   # the generated code ran, not the graph again
        got = c(*got_in)
    names = [name for name, _, _, n_out in cases for _ in range(n_out)]
    assert len(names) == len(got) == len(want)
    in_names = [f"{name} input {k}" for name, _, tens, _ in cases for k in range(len(tens))]
    bad = []
    for name, g, w in zip(names + in_names, list(got) + got_in, list(want) + want_in):
        if g.dtype != w.dtype or tuple(g.shape) != tuple(w.shape) or not np.allclose(
                g.numpy().astype(np.float64), w.numpy().astype(np.float64), rtol=1e-4, atol=1e-5, equal_nan=True):
            bad.append(name)
    assert not bad, bad


def test_out_of_range_index_raises_instead_of_reading_out_of_bounds():
    import warnings
    import flambeau as fl
    warnings.simplefilter("ignore")
    f = fl.compile(lambda w, i: fl.nn.functional.embedding(i, w) * 2, backend="inductor")
    w = fl.randn(5, 3)
    assert f(w, fl.tensor([0, 4])).shape == (2, 3)
    with pytest.raises(IndexError):
        f(w, fl.tensor([0, 7]))
    with pytest.raises(IndexError):
        f(w, fl.tensor([-6, 0]))


def test_integer_division_by_zero_raises_like_eager():
    import flambeau as fl
    g = fl.compile(lambda a, b: a // b + a % b, backend="inductor")
    a = fl.tensor([7, -8, 9])
    b = fl.tensor([2, 3, -4])
    assert g(a, b).tolist() == (a // b + a % b).tolist()
    with pytest.raises(RuntimeError, match="ZeroDivisionError"):
        g(a, fl.tensor([2, 0, 4]))


def test_numpy_path_integer_division_by_zero_raises_like_eager(monkeypatch):
    import flambeau as fl
    from flambeau._inductor import config as icfg
    monkeypatch.setattr(icfg, "backend", "numpy")
    fl._dynamo.reset()
    g = fl.compile(lambda a, b: a // b + a % b, backend="inductor")
    a, b = fl.tensor([7, -8, 9]), fl.tensor([2, 3, -4])
    assert g(a, b).tolist() == (a // b + a % b).tolist()
    with pytest.raises(RuntimeError, match="ZeroDivisionError"):
        g(a, fl.tensor([2, 0, 4]))
    fl._dynamo.reset()
