"""Block-size autotuning of generated Triton kernels (`flambeau._inductor.autotune`, mode="max-autotune"):
the candidates, the choice of the fastest by CUDA-event timing (a fake CuPy here: each variant's time
is given), the disk cache, and no timing while a CUDA graph is being captured. On the GPU machine a
compiled model under mode="max-autotune" matches eager (tests/test_cudagraphs.py runs it)."""
from __future__ import annotations

import os

import pytest

import flambeau as fl
from flambeau._inductor import autotune, codegen_triton


def _launch(xblock=256, warps=4):
    return codegen_triton.Launch("k", [], [], 100000, xblock, {"XBLOCK": xblock, "R0BLOCK": 64}, warps)


class FakeCupy:
    """What `choose` uses of CuPy: the current stream, events, elapsed time of the variant last run."""

    def __init__(self, times: dict, capturing=False):
        self.times, self.capturing, self.last, self.ran = times, capturing, None, []
        fake = self

        class Stream:
            def is_capturing(self):
                return fake.capturing

        class Event:
            def record(self, stream=None):
                pass

            def synchronize(self):
                pass

        class Cuda:
            def get_current_stream(self):
                return Stream()

            def get_elapsed_time(self, a, b):
                return fake.times[(fake.last.xblock, fake.last.num_warps)]
        Cuda.Event = Event
        self.cuda = Cuda()

    def run(self, v):
        self.last = v
        self.ran.append((v.xblock, v.num_warps))


class Owner:
    kernel_key = "k"


def _write(path, text):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as f:
        f.write(text)


def test_candidates_around_the_generators_choice():
    got = [(v.xblock, v.num_warps, v.constexprs["XBLOCK"], v.constexprs["R0BLOCK"])
           for v in autotune.candidates(_launch(), 100000)]
    assert got == [(256, 4, 256, 64), (128, 4, 128, 64), (512, 4, 512, 64), (256, 2, 256, 64), (256, 8, 256, 64)]
    assert [v.xblock for v in autotune.candidates(_launch(xblock=64), 64)] == [64, 32, 64, 64]
    assert autotune.tunable([(_launch(), None)]) and not autotune.tunable([(_launch(), None), (_launch(), None)])


def test_the_fastest_is_kept_and_cached_on_disk(tmp_path):
    times = {(256, 4): 5.0, (128, 4): 6.0, (512, 4): 2.0, (256, 2): 9.0, (256, 8): 3.0}
    cp = FakeCupy(times)
    best = autotune.choose(Owner(), _launch(), {}, cp.run, cp, str(tmp_path), "sm90", _write)
    assert (best.xblock, best.num_warps, best.constexprs["XBLOCK"]) == (512, 4, 512)
    assert best.grid({}) == (-(-100000 // 512),)
    assert len(cp.ran) == 5 * (1 + autotune.TIMED_LAUNCHES)
    again = FakeCupy(times)
    best2 = autotune.choose(Owner(), _launch(), {}, again.run, again, str(tmp_path), "sm90", _write)
    assert again.ran == [] and (best2.xblock, best2.num_warps) == (512, 4)


def test_nothing_is_timed_while_capturing(tmp_path):
    cp = FakeCupy({}, capturing=True)
    assert autotune.choose(Owner(), _launch(), {}, cp.run, cp, str(tmp_path), "sm90", _write) is None
    assert cp.ran == []


@pytest.mark.cuda
def test_max_autotune_on_cuda_matches_eager():
    import torch
    fl.compiler.reset()
    before = dict(autotune.stats)
    f = lambda x: (x.sin() * 2).softmax(-1) + x.sum(0)        # noqa: E731
    c = fl.compile(f, mode="max-autotune-no-cudagraphs")
    x = fl.randn(512, 1000, device="cuda")
    for _ in range(2):
        torch.testing.assert_close(torch.from_numpy(c(x).cpu().numpy()), torch.from_numpy(f(x).cpu().numpy()),
                                   rtol=1e-5, atol=1e-5)
    assert autotune.stats["tuned"] + autotune.stats["from_disk"] > before["tuned"] + before["from_disk"]


def test_candidates_compile_in_workers_and_losers_are_released():
    """Under max-autotune every candidate of a cuda graph's tuned kernels and templates is compiled by the compile
    workers (none in this process), and after each choice only the winner's kernel stays loaded: sm_90 compile
    with fake CuPy, in a subprocess without the interpreter (tests/scripts/autotune_sm90_compile.py)."""
    from tests.conftest import run_sm90_compile_script
    run_sm90_compile_script("autotune_sm90_compile.py")


def test_every_candidate_is_built_before_any_is_timed(tmp_path):
    times = {(256, 4): 5.0, (128, 4): 6.0, (512, 4): 2.0, (256, 2): 9.0, (256, 8): 3.0}
    cp = FakeCupy(times)
    best = autotune.choose(Owner(), _launch(), {}, cp.run, cp, str(tmp_path), "sm90", _write,
                           lambda v: cp.ran.append(("build", v.xblock, v.num_warps)))
    assert cp.ran[:5] == [("build", xb, w) for xb, w in times] and ("build",) not in [r[:1] for r in cp.ran[5:]]
    assert (best.xblock, best.num_warps) == (512, 4)


def test_precompile_variants_are_the_candidates_but_the_generators():
    la = _launch()
    assert autotune.precompile_variants(la) == autotune.candidates(la, 100000)[1:]
    assert autotune.precompile_variants(codegen_triton.Launch("k", [], [], 100000, 256, {"XBLOCK": 256}, 4,
                                                              splits=2)) == []
