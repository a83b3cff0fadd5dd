"""A second compile of the same model reuses every compiled Triton kernel (issue 13's kernel cache):

- the min-cut partitioner chooses the saved values independently of the address order in which a
  set of graph nodes iterates (it broke ties by that order, so two compiles of GPT-2 saved different
  activations and generated different forward/backward kernels);
- two compiles of a small GPT training step (after `flambeau._dynamo.reset()`, and of a second model
  instance) generate byte-identical Triton modules, and the second one loads every kernel's cubin
  from the disk cache (`triton_runtime.stats`), counted through the real cubin loader
  (`load_or_compile`) with `triton.compile` and CuPy replaced by recorders (no GPU here);
- the cubin cache is keyed per kernel (`triton_runtime.KernelRef.key`): a module that differs in one
  kernel compiles only that one, and kernels that differ only in their own and their parameters' names (a
  GPT's identical layers) share one cubin;
- a warm process loads every cubin without importing the generated module: no `@triton.jit` runs.
"""
from __future__ import annotations

import random

import pytest

import flambeau as fl
from bench import gpu_models
from bench.fake_cuda_loader import generating_compile_fx, loader_cupy
from flambeau import _cpp_builder, _inductor
from flambeau._functorch import partitioners

triton_runtime = pytest.importorskip("flambeau._inductor.triton_runtime")

VOCAB, BLOCK = 64, 16


class ShuffledSet(set):
    """A set that iterates in another order than a plain set's (as another memory layout would)."""

    def __iter__(self):
        items = list(super().__iter__())
        random.Random(len(items)).shuffle(items)
        return iter(items)

    def __or__(self, other):
        return ShuffledSet(set.__or__(self, other))


def _capture(monkeypatch) -> list:
    """Make compile_fx record (source, launches) of the Triton code generated for cuda (without
    running it: the graph itself runs), as compile_fx builds them."""
    modules = []
    monkeypatch.setattr(_inductor, "compile_fx", generating_compile_fx(modules))
    return modules


def _gpt_step(seed: int, layers: int = 2):
    fl.manual_seed(seed)
    model = fl.compile(gpu_models.gpt(fl, vocab=VOCAB, block=BLOCK, d=32, layers=layers, heads=2))
    with fl.autocast(device_type="cpu", dtype=fl.bfloat16):
        loss = model(fl.randint(0, VOCAB, (2, BLOCK)), fl.randint(0, VOCAB, (2, BLOCK)))
    loss.backward()


def _graphs_of_a_step(monkeypatch, seed=0, layers=2) -> list:
    modules = _capture(monkeypatch)
    fl._dynamo.reset()
    _gpt_step(seed, layers)
    fl._dynamo.reset()
    return modules


@pytest.fixture
def fake_gpu(monkeypatch, tmp_path):
    """The cubin loader of a cuda device 'sm90' in a fresh cache directory, with `build_cubin`
    (triton.compile) and CuPy's module loading replaced by recorders."""
    Cupy = loader_cupy(lambda cubin: cubin == b"cubin")
    built = []

    def build_cubin(fn, sig, constexprs, num_warps, aligned, capability):
        built.append(fn.__name__)
        return b"cubin", {"name": fn.__name__, "num_warps": num_warps, "shared": 0, "global_scratch": 0}
    monkeypatch.setattr(_cpp_builder, "cache_dir", str(tmp_path))
    monkeypatch.setattr(triton_runtime.TL, "_cupy", lambda: Cupy)
    monkeypatch.setattr(triton_runtime, "build_cubin", build_cubin)
    return built


def _load_all(source: str, launches: dict, device=None) -> int:
    """Load every kernel of a generated module as a launch on 'sm90' would; the number of cache hits.
    The module is made for `device` (default cpu: imported for the interpreter at once)."""
    from flambeau._device import CPU
    mod, _ = triton_runtime.load_module(source, device or CPU)
    before = triton_runtime.stats["cubin_cache_hits"]
    for la in launches.values():
        while la is not None:
            triton_runtime.load_or_compile(mod.kernel(la.name), la.signature(), la.constexprs, la.num_warps,
                                           triton_runtime._arg_names(la), "sm90")
            la = la.then
    return triton_runtime.stats["cubin_cache_hits"] - before


def _n_functions(launches: dict) -> int:
    n = 0
    for la in launches.values():
        while la is not None:
            n, la = n + 1, la.then
    return n


def test_partition_does_not_depend_on_set_order(monkeypatch):
    saved = []
    real_split = partitioners._split

    def spy(joint, chosen, num_fwd_outputs):
        saved.append([n.name for n in sorted(set(chosen), key=list(joint.graph.nodes).index)])
        return real_split(joint, chosen, num_fwd_outputs)
    monkeypatch.setattr(partitioners, "_split", spy)
    _graphs_of_a_step(monkeypatch, layers=4)
    monkeypatch.setattr(partitioners, "set", ShuffledSet, raising=False)
    _graphs_of_a_step(monkeypatch, layers=4)
    assert len(saved) == 2 and saved[0] == saved[1]


def test_second_compile_and_second_instance_hit_the_cache_for_every_kernel(monkeypatch, fake_gpu):
    first = _graphs_of_a_step(monkeypatch, seed=0)
    again = _graphs_of_a_step(monkeypatch, seed=0)        # after reset: same model code, new instance
    other = _graphs_of_a_step(monkeypatch, seed=1)        # other weights: the same kernels
    assert len(first) == 2                                # forward and backward
    assert [s for s, _ in first] == [s for s, _ in again] == [s for s, _ in other]
    n = sum(_n_functions(la) for _, la in first)
    cold = sum(_load_all(s, la) for s, la in first)
    built = len(fake_gpu)
    assert cold > 0 and cold + built == n         # the two layers' identical kernels share one cubin
    assert sum(_load_all(s, la) for s, la in again) == n and len(fake_gpu) == built
    assert sum(_load_all(s, la) for s, la in other) == n and len(fake_gpu) == built


def test_cubins_are_keyed_per_kernel(monkeypatch, fake_gpu):
    (source, launches), _ = _graphs_of_a_step(monkeypatch)
    _load_all(source, launches)
    name, la = next(iter(launches.items()))
    changed = dict(launches)
    first = source.index(f"def {name}(")
    end = source.index("\n\n", first)
    edited = source[:end] + "\n    XBLOCK = XBLOCK" + source[end:]     # one kernel's source differs
    built = len(fake_gpu)
    hits = _load_all(edited, changed)
    assert len(fake_gpu) - built == 1 and fake_gpu[-1] == name
    assert hits == _n_functions(launches) - 1


def test_a_warm_process_loads_every_cubin_without_importing_the_module(monkeypatch, fake_gpu):
    import triton

    class Cuda:
        type = "cuda"
    monkeypatch.setattr(triton_runtime, "device_key", lambda d: "interpret" if d.type == "cpu" else "sm90")
    graphs = _graphs_of_a_step(monkeypatch)
    cold = sum(_load_all(s, la, Cuda()) for s, la in graphs)     # cold: every distinct kernel built
    n = len(fake_gpu) + cold
    monkeypatch.setattr(triton_runtime, "_modules", {})                 # another process

    def refuse(*args, **kwargs):
        raise AssertionError("a jit function was made or compiled on a warm cache")
    monkeypatch.setattr(triton, "jit", refuse)
    monkeypatch.setattr(triton_runtime, "build_cubin", refuse)
    imported = triton_runtime.stats["modules_imported"]
    assert sum(_load_all(s, la, Cuda()) for s, la in graphs) == n
    assert triton_runtime.stats["modules_imported"] == imported
    assert all(m._module is None for m in triton_runtime._modules.values())


def test_indirect_index_names_of_the_analysis_are_not_reused():
    """The analysis named an indirect index after id() of its value, which a freed value gives to the
    next one: distinct gathers then compared equal or not by memory layout (GPT-2's forward module
    differed between processes)."""
    from flambeau import _dtype as D
    from flambeau._inductor.ir import AnalysisHandler, _AVal
    names = set()
    for _ in range(20):
        index = AnalysisHandler().indirect_indexing(_AVal(D.int64), 5)    # the value is freed after each
        names |= {a.name for a in index.atoms()}
    assert len(names) == 20
    h = AnalysisHandler()
    v = _AVal(D.int64)
    assert h.indirect_indexing(v, 5).key() == h.indirect_indexing(v, 5).key()


def test_the_cache_key_ignores_the_names_of_the_kernel_its_parameters_and_locals():
    """`canonical_source`: kernels equal up to the names of the kernel, its parameters and its locals (a GPT's
    layers: `arg5`/`buf28_v` in one, `arg17`/`buf55_v` in the next) share a key; any other difference (an
    operation, a literal, the order of the parameters' uses) does not."""
    def kernel(name, a, out, local, op="+", lit="768.0"):
        return (f"def {name}({a}, {out}, XBLOCK: tl.constexpr):\n"
                f"    xindex = tl.program_id(0) * XBLOCK + tl.arange(0, XBLOCK)\n"
                f"    {local} = tl.load({a} + xindex).to(tl.float32)\n"
                f"    tl.store({out} + xindex, {local} {op} tl.full([], {lit}, tl.float32))")
    key = lambda src: triton_runtime.canonical_source(src)[0]       # noqa: E731
    base = key(kernel("kernel3", "arg5", "buf9", "buf28_v"))
    assert key(kernel("kernel40", "arg17", "buf90", "buf55_v")) == base
    assert key(kernel("kernel3", "arg5", "buf9", "buf28_v", op="*")) != base
    assert key(kernel("kernel3", "arg5", "buf9", "buf28_v", lit="767.0")) != base
    assert key(kernel("kernel3", "buf9", "arg5", "buf28_v").replace("(buf9, arg5,", "(arg5, buf9,")) != base
    assert ".to(tl.float32)" in base and "arg5" not in base and "buf28_v" not in base
    assert ".to(tl.float32)" in key(kernel("kernel3", "arg5", "buf9", "to"))     # an attribute is never renamed
    assert triton_runtime.canonical_source(kernel("k", "a", "b", "c"))[1] == {"a": "_fl_p0", "b": "_fl_p1",
                                                                              "XBLOCK": "_fl_p2"}
