"""flambeau/_backends/cpp_headers.py: C++ shared by several sources is written once (lowp.h's bfloat16/
float16 conversions: no other source defines them again), and a source compiled from its text gets the
header's text in place of its include (unknown includes are left alone). The conversions themselves are
checked bit for bit through each user: tests/test_inductor_lowp.py (the code generator's prelude),
tests/test_sdpa_cpu.py::test_bfloat16_vs_pytorch (cpu_attention.cpp), tests/test_cpu_kernels.py::
test_bfloat16_gemm_vs_pytorch_and_float64 (cpu_kernels.cpp)."""
from __future__ import annotations

import pathlib

from flambeau._backends import cpp_headers
from flambeau._inductor import codegen_cpp

ROOT = pathlib.Path(cpp_headers.__file__).resolve().parent.parent       # the flambeau package
DEFINITIONS = ("fl_f32_to_bf16(float f) {", "fl_f16_to_f32(uint16_t h) {", "0x7FC0", "0x7E00u")


def test_with_headers_inlines_this_folders_headers_only():
    source = '#include <cmath>\n#include "lowp.h"     // a comment\n#include "missing.h"\nint x;\n'
    out = cpp_headers.with_headers(source)
    assert out == '#include <cmath>\n' + cpp_headers.header("lowp.h") + '\n#include "missing.h"\nint x;\n'


def test_the_conversions_are_defined_once():
    holders = sorted(str(p.relative_to(ROOT)) for p in ROOT.rglob("*") if p.suffix in (".cpp", ".h", ".py")
                     and any(d in p.read_text() for d in DEFINITIONS))
    assert holders == ["_backends/lowp.h"]
    for name in ("cpu_attention.cpp", "cpu_kernels.cpp"):
        assert '#include "lowp.h"' in (ROOT / "_backends" / name).read_text()
    assert cpp_headers.header("lowp.h") in codegen_cpp.HELPERS
