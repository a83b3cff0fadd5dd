"""AOTInductor: `aoti_compile_and_package(ep, package_path=...)` compiles an ExportedProgram ahead of time.

    ExportedProgram --run_decompositions(inductor table)--> core graph
      -> parameters, buffers and constants lifted into constants of the graph (freezing.py; with
         config.freezing also folded: constant subgraphs computed once, weights stored contiguous)
      -> GraphLowering / schedule / plan_memory (as compile_fx)
      -> model.cpp: the C++ kernels (codegen_cpp), the C++ wrapper owning the buffers and calling them
         (cpp_wrapper.py) and the model's tables (input/output specs, size binding and range checks,
         output shapes, the weights' offsets and checksum), compiled with aoti_runtime.cpp (the C API
         of aoti_runtime.h), flambeau's GEMM/convolution (cpu_kernels.cpp) and fused attention
         (cpu_attention.cpp) into one model.so
      -> a zip (.pt2): archive_format, version, metadata.json, model.so, model.cpp, aoti_runtime.h,
         weights.bin (the constants, each at a 64-byte aligned offset; the index is in metadata.json
         and compiled into model.so)

Dynamic sizes (export's Dims) stay symbolic: the kernels take them as arguments, model.so reads them
from the input shapes and checks each against its Dim's range. Loading and running: aoti_package.py.
Buffers the program updates (BUFFER_MUTATION: BatchNorm in training mode, counters, caches) are
constants the runner owns and model.so rewrites after each run (StateTable). Programs that write
their inputs, take non-tensor inputs, or need an op the C++ wrapper can't run (it runs mm and bmm,
1-D/2-D convolution (grouped, transposed), 3-D convolution, 2-D/3-D max pooling and the resampling gather of
interpolate/average pooling/pads in float32, float64, bfloat16 and float16, sort and topk, and the
fused CPU attention, besides the generated kernels) are refused with a RuntimeError naming the reason.
"""
from __future__ import annotations

import contextlib
import hashlib
import io
import json
import os
import re
import subprocess
import tempfile
import zipfile

import numpy as np

from .. import _cpp_builder
from .._backends import cpp_headers
from .. import _dtype as D
from .._decomp import core_aten_decompositions
from .._device import CPU
from .._tensor import Tensor
from ..utils import _pytree as pytree
from . import codegen_cpp, config, freezing
from .compile_fx import _size_names
from .cpp_wrapper import CppWrapper, link_externs_source, output_bases
from .decompositions import decomposition_table
from .graph import GraphLowering
from .ir import InputBuffer, StridedView, Unsupported
from .scheduler import Kernel, plan_memory, schedule
from .sizevars import SizeExpr, derived_definition

ARCHIVE_FORMAT = b"flambeau-aoti"
PACKAGE_VERSION = 1
ABI_VERSION = 2                     # FL_AOTI_ABI_VERSION of aoti_runtime.h
ALIGN = 64
HERE = os.path.dirname(os.path.abspath(__file__))
HEADER = os.path.join(HERE, "aoti_runtime.h")
RUNTIME_SRC = os.path.join(HERE, "aoti_runtime.cpp")
GEMM_SRC = os.path.join(os.path.dirname(HERE), "_backends", "cpu_kernels.cpp")
ATTENTION_SRC = os.path.join(os.path.dirname(HERE), "_backends", "cpu_attention.cpp")
DTYPE_CODES = {D.float32: 0, D.float64: 1, D.int64: 2, D.int32: 3, D.int16: 4, D.int8: 5, D.uint8: 6, D.bool: 7,
               D.bfloat16: 8, D.float16: 9}
STATE_KINDS = ("PARAMETER", "BUFFER", "CONSTANT_TENSOR")
OUTPUT_KINDS = ("USER_OUTPUT", "BUFFER_MUTATION")
SYMBOL = re.compile(r"\bs\d+\b")           # a size symbol's name in a size expression's text
# CPU features a package's code may use: the compiler's predefined macro -> __builtin_cpu_supports name
CPU_FEATURES = {"__SSE4_2__": "sse4.2", "__AVX__": "avx", "__AVX2__": "avx2", "__FMA__": "fma", "__F16C__": "f16c",
                "__BMI__": "bmi", "__BMI2__": "bmi2", "__AVX512F__": "avx512f", "__AVX512BW__": "avx512bw",
                "__AVX512DQ__": "avx512dq", "__AVX512VL__": "avx512vl", "__AVX512VNNI__": "avx512vnni",
                "__AVX512BF16__": "avx512bf16", "__AVX512FP16__": "avx512fp16", "__AMX_TILE__": "amx-tile",
                "__AMX_BF16__": "amx-bf16", "__AMX_INT8__": "amx-int8"}
TARGET_FLAGS = ("-march=", "-mprefer-vector-width=")     # the flags that choose the CPU code is built for


class AOTICompileError(RuntimeError):
    """A program AOTInductor can't package (the message names why)."""


@contextlib.contextmanager
def _options(options: dict | None):
    saved = {}
    try:
        for k, v in (options or {}).items():
            key = k.replace(".", "_")
            if key not in config.__annotations__:
                raise RuntimeError(f"aoti_compile_and_package: unknown inductor config {k!r}")
            saved[key] = getattr(config, key)
            setattr(config, key, v)
        yield
    finally:
        for k, v in saved.items():
            setattr(config, k, v)


def aoti_compile_and_package(ep, package_path: str | os.PathLike | io.IOBase | None = None,
                             inductor_configs: dict | None = None) -> str:
    """Compile `ep` (an ExportedProgram) into a package at `package_path` (default: a temporary
    .pt2 file); returns the path. See module docstring."""
    with _options(inductor_configs):
        return _package(ep, package_path)


def _package(ep, package_path) -> str:
    prog = ep.run_decompositions(decomposition_table(core_aten_decompositions(), python_externs=False))
    sig = prog.graph_signature
    for s in sig.output_specs:
        if s.kind.name not in OUTPUT_KINDS:
            raise AOTICompileError(f"aoti_compile_and_package: the program's output {s.arg.name} is a "
                                   f"{s.kind.name} ({s.target}); AOTInductor packages user outputs and buffer updates")
    gm = prog.graph_module
    placeholders = list(gm.graph.find_nodes(op="placeholder"))
    state = iter(prog._state_inputs())
    lifted, fqns, user_names = {}, [], []
    for node, spec in zip(placeholders, sig.input_specs):
        if spec.kind.name in STATE_KINDS:
            lifted[node] = next(state).detach().contiguous()
            fqns.append(spec.target)
        elif spec.kind.name == "USER_INPUT":
            user_names.append(spec.arg.name)
        else:
            raise AOTICompileError(f"aoti_compile_and_package: input {spec.arg.name} of kind {spec.kind.name} "
                                   "is not supported")
    attr_fqn = dict(zip(freezing.lift_to_constants(gm, lifted), fqns))
    mutated = {i: s.target for i, s in enumerate(sig.output_specs) if s.kind.name == "BUFFER_MUTATION"}
    mutable = {a for a, f in attr_fqn.items() if f in mutated.values()}
    folded = freezing.constant_fold(gm, keep=mutable) if config.freezing else 0
    examples = [t.contiguous() for t in pytree.tree_leaves(ep.example_inputs) if isinstance(t, Tensor)]
    if len(examples) != len(user_names):
        raise AOTICompileError("aoti_compile_and_package: the program takes non-tensor inputs "
                               f"({len(user_names)} inputs, {len(examples)} tensors)")
    try:
        graph = GraphLowering(gm, examples, CPU, codegen_cpp.DTYPES).run()
        state = StateTable(gm, graph, attr_fqn, mutated)
        size_names = _size_names(graph)
        order = schedule(graph)
        memory = plan_memory(order, graph)
        kernels = [k for k in order if isinstance(k, Kernel)]
        info, features = _target(dict(_cpp_builder.detect_flags()))
        wrapper = CppWrapper(graph, order, memory, size_names, constants_frozen=True,
                             mutable_constants=state.mutable_names).generate() + link_externs_source()
        weights, offsets = _weights(graph)
        model = ModelSource(graph, size_names, user_names, prog.range_constraints, offsets, weights,
                            prog.dim_names, state).generate()
    except Unsupported as e:
        raise AOTICompileError(f"aoti_compile_and_package: {e}") from None
    source = '#include "aoti_runtime.h"\n' + codegen_cpp.generate(kernels, info["simd_math"], size_names) + \
        wrapper + model + (f'extern "C" const char* fl_aoti_cpu_features(void) {{ return "{" ".join(features)}"; }}\n'
                           f'extern "C" const char* fl_aoti_march(void) {{ return "{config.aoti_march}"; }}\n')
    so = _build(source, info)
    meta = _metadata(ep, graph, state, user_names, prog.range_constraints, offsets, weights, folded)
    meta.update(march=config.aoti_march, cpu_features=features)
    return _write(package_path, so, source, weights, meta)


def _target(info: dict) -> tuple:
    """(the build info for `config.aoti_march`, the CPU features the compiler may use for it)."""
    march = config.aoti_march
    flags = list(info["flags"])
    if march != "native":
        if not re.fullmatch(r"[A-Za-z0-9_.-]+", march):
            raise AOTICompileError(f"aoti_compile_and_package: bad aoti_march {march!r}")
        flags = [f for f in flags if not f.startswith(TARGET_FLAGS)] + [f"-march={march}"]
    r = subprocess.run([info["cxx"], *[f for f in flags if f.startswith("-m")], "-dM", "-E", "-x", "c++", os.devnull],
                       capture_output=True, text=True)
    if r.returncode != 0:
        raise AOTICompileError(f"aoti_compile_and_package: the compiler refuses -march={march}: "
                               f"{(r.stderr or r.stdout).strip()[:400]}")
    macros = {line.split()[1] for line in r.stdout.splitlines() if line.startswith("#define ")}
    return dict(info, flags=flags), sorted(v for k, v in CPU_FEATURES.items() if k in macros)


# ---- weights -------------------------------------------------------------------------------------
def _weights(graph) -> tuple:
    """(weights.bin bytes, byte offset of each constant in graph.constants order)."""
    blob = bytearray()
    offsets = []
    for b in graph.constants.values():
        data = np.ascontiguousarray(b.constant._data)
        if not b.layout.is_contiguous():
            raise Unsupported(f"constant {b.name} is not contiguous")
        blob += b"\0" * (-len(blob) % ALIGN)
        offsets.append(len(blob))
        blob += data.tobytes()
    return bytes(blob), offsets


def checksum(data: bytes) -> int:
    """fl_aoti_checksum of aoti_runtime.cpp: sum of the little-endian 8-byte words times 2i+1, mod 2**64."""
    words = np.frombuffer(data + b"\0" * (-len(data) % 8), dtype="<u8")
    with np.errstate(over="ignore"):
        return int((words * (np.arange(len(words), dtype=np.uint64) * np.uint64(2) + np.uint64(1))).sum(
            dtype=np.uint64))


# ---- the model's C++ tables ----------------------------------------------------------------------
def _c(e) -> str:
    return f"(int64_t)({e})" if isinstance(e, SizeExpr) else f"INT64_C({int(e)})"


def _sympy_c(e) -> str:
    """C source of a derived size symbol's definition (floor divisions of base symbols)."""
    name = type(e).__name__
    if e.is_Symbol:
        return e.name
    if e.is_Integer:
        return f"INT64_C({int(e)})"
    if name == "Add":
        return "(" + " + ".join(_sympy_c(a) for a in e.args) + ")"
    if name == "Mul":
        return "(" + " * ".join(_sympy_c(a) for a in e.args) + ")"
    if name == "FloorDiv":
        return f"fl_floordiv_i({_sympy_c(e.args[0])}, {_sympy_c(e.args[1])})"
    if name in ("Mod", "PythonMod"):
        return f"fl_mod_i({_sympy_c(e.args[0])}, {_sympy_c(e.args[1])})"
    raise Unsupported(f"the size expression {e} has no C spelling here")


def _plain_symbol(e):
    if isinstance(e, SizeExpr) and len(e.terms) == 1 and e.terms[0][1] == 1 and len(e.terms[0][0]) == 1:
        return e.terms[0][0][0]
    return None


def _ranges(range_constraints) -> dict:
    """{symbol name: (lower, upper)}; an unbounded upper end is -1."""
    out = {}
    for sym, r in range_constraints.items():
        lo, hi = _int_or(r.lower, 0), _int_or(r.upper, -1)
        out[str(sym)] = (max(lo, 1), hi if hi < (1 << 62) else -1)
    return out


def _spelt(e, dim_names: dict) -> str:
    """The size expression `e` as C format text, its symbols spelt as the user's Dim names ('batch + 1')."""
    text = SYMBOL.sub(lambda m: dim_names.get(m.group(0), m.group(0)), str(e))
    if text.startswith("(") and text.endswith(")") and "(" not in text[1:-1]:
        text = text[1:-1]
    return _c_text(text)


def _c_text(text: str) -> str:
    """`text` escaped for a C string literal that is an snprintf format."""
    return json.dumps(text)[1:-1].replace("%", "%%")


def _int_or(v, default: int) -> int:
    try:
        return int(v)
    except (TypeError, ValueError, OverflowError):     # an infinite end of a range
        return default


class StateTable:
    """The package's constants as the program's state: each constant's FQN (the parameter, buffer or
    constant of the exported module it holds; '' for a folded one) and the buffers the program updates
    (BUFFER_MUTATION outputs): graph output index -> the positions of the constants holding that
    buffer. model.so copies each update into its constant after a run, so a runner's buffers carry the
    state from call to call (BatchNorm's running statistics in training mode, counters, caches), as
    PyTorch's AOTInductor keeps mutated buffers in the runner's constants."""

    def __init__(self, gm, graph, attr_fqn: dict, mutated: dict):
        by_id = {id(getattr(gm, a)): f for a, f in attr_fqn.items()}
        self.fqns = [by_id.get(id(b.constant), "") for b in graph.constants.values()]
        self.updates = {}
        for i, fqn in mutated.items():
            self.updates[i] = [j for j, f in enumerate(self.fqns) if f == fqn]
            if not self.updates[i]:
                raise Unsupported(f"the program updates buffer {fqn}, which has no constant in the package")
        names = list(graph.constants)
        self.mutable_names = {names[j] for js in self.updates.values() for j in js}

    def mutable(self, j: int) -> bool:
        return any(j in js for js in self.updates.values())


class ModelSource:
    """The generated part of model.so that aoti_runtime.cpp reads (FlAotiModelInfo)."""

    def __init__(self, graph, size_names, user_names, range_constraints, offsets, weights, dim_names=None,
                 state: StateTable | None = None):
        self.g = graph
        self.dim_names = dict(dim_names or {})
        self.size_names = size_names
        self.user_names = user_names
        self.ranges = _ranges(range_constraints)
        self.offsets = offsets
        self.weights = weights
        self.state = state
        self.inputs = sorted(graph.inputs, key=lambda b: b.position)
        outputs = graph.outputs if isinstance(graph.outputs, list) else [graph.outputs]
        updates = state.updates if state is not None else {}
        self.outputs = [o for i, o in enumerate(outputs) if i not in updates]
        self.state_outputs = [(outputs[i], js) for i, js in updates.items()]
        if graph.mutations:
            raise Unsupported("the program writes its inputs")

    def _sizes_locals(self) -> list:
        return [f"    const int64_t {n} = sizes[{k}];" for k, n in enumerate(self.size_names)]

    def _spec(self, tag: str, i: int, name: str, layout, lines: list) -> str:
        shape, lower, upper = [], [], []
        for s in layout.shape:
            if isinstance(s, SizeExpr):
                lo, hi = self.ranges.get(_plain_symbol(s), (-1, -1))
                shape.append(-1)
                lower.append(lo)
                upper.append(hi)
            else:
                shape += [int(s)]
                lower += [int(s)]
                upper += [int(s)]
        for what, vals in (("shape", shape), ("lower", lower), ("upper", upper)):
            lines.append(f"static const int64_t fl_{tag}{i}_{what}[] = {{{', '.join(map(str, vals)) or '0'}}};")
        code = DTYPE_CODES.get(layout.dtype)
        if code is None:
            raise Unsupported(f"{tag} {name} has dtype {layout.dtype.name}, which the C API does not name")
        return (f'{{"{name}", {code}, {len(shape)}, fl_{tag}{i}_shape, fl_{tag}{i}_lower, '
                f"fl_{tag}{i}_upper}}")

    def generate(self) -> str:
        L: list = []
        ins = [self._spec("in", i, self.user_names[i], b.layout, L) for i, b in enumerate(self.inputs)]
        for i, o in enumerate(self.outputs):
            if not hasattr(o, "layout"):
                raise Unsupported(f"output {i} is not a tensor ({type(o).__name__})")
        outs = [self._spec("out", i, f"output{i}", o.layout, L) for i, o in enumerate(self.outputs)]
        L.append(f"static const FlAotiTensorSpec fl_inputs[] = {{{', '.join(ins) or '{}'}}};")
        L.append(f"static const FlAotiTensorSpec fl_outputs[] = {{{', '.join(outs) or '{}'}}};")
        L.append(f"static const int64_t fl_offsets[] = {{{', '.join(map(str, self.offsets)) or '0'}}};")
        L += self._constants() + self._bind() + self._output_shape() + self._run()
        L.append(f"""extern "C" const FlAotiModelInfo* fl_aoti_model_info(void) {{
    static const FlAotiModelInfo info = {{{ABI_VERSION}, {len(ins)}, fl_inputs, {len(outs)}, fl_outputs,
        {len(self.offsets)}, fl_offsets, INT64_C({len(self.weights)}), UINT64_C({checksum(self.weights)}),
        {len(self.size_names)}, fl_bind_sizes, fl_output_shape, fl_model_run, fl_constants}};
    return &info;
}}""")
        return COPY_HELPER + "\n".join(L) + "\n"

    def _constants(self) -> list:
        """fl_constants: each constant's FQN, dtype, shape and whether runs write it (FlAotiConstantSpec)."""
        L, specs = [], []
        for j, b in enumerate(self.g.constants.values()):
            fqn = self.state.fqns[j] if self.state is not None else ""
            shape = ", ".join(str(int(s)) for s in b.layout.shape) or "0"
            L.append(f"static const int64_t fl_const{j}_shape[] = {{{shape}}};")
            if b.dtype not in DTYPE_CODES:
                raise Unsupported(f"constant {fqn or b.name} has dtype {b.dtype.name}, which the C API does not name")
            specs.append(f'{{{json.dumps(fqn)}, {DTYPE_CODES[b.dtype]}, {len(b.layout.shape)}, fl_const{j}_shape, '
                         f"{int(self.state is not None and self.state.mutable(j))}}}")
        L.append(f"static const FlAotiConstantSpec fl_constants[] = {{{', '.join(specs) or '{}'}}};")
        return L

    def _bind(self) -> list:
        L = ["static int fl_bind_sizes(const int64_t* const* shapes, int64_t* sizes, char* err, int n) {"]
        where = {}
        for pos, dim, e in self.g.size_inputs:
            name = _plain_symbol(e)
            if dim is None:
                raise Unsupported("the program takes a size as an integer input")
            if name is not None and name not in where:
                where[name] = (pos, dim)
        for name in self.size_names:
            d = derived_definition(name)
            if d is not None:
                L.append(f"    const int64_t {name} = {_sympy_c(d)};")
                continue
            pos, dim = where[name]
            lo, hi = self.ranges.get(name, (1, -1))
            who = f"input {self.user_names[pos]} dim {dim}"
            L.append(f"    const int64_t {name} = shapes[{pos}][{dim}];")
            cond = f"{name} < {lo}" + (f" || {name} > {hi}" if hi >= 0 else "")
            rng = f"[{lo}, {hi if hi >= 0 else 'inf'}]"
            dim = f"the Dim {_c_text(self.dim_names[name])}" if name in self.dim_names else f"its dynamic dim ({name})"
            L.append(f"    if ({cond}) {{ snprintf(err, n, \"{who}: size %lld is outside the range {rng} of "
                     f"{dim}\", (long long){name}); return {SHAPE_ERROR}; }}")
        for b in self.inputs:
            for d, s in enumerate(b.layout.shape):
                if _plain_symbol(s) is not None and where.get(_plain_symbol(s)) == (b.position, d):
                    continue
                who = f"input {self.user_names[b.position]} dim {d}"
                got = f"shapes[{b.position}][{d}]"
                L.append(f"    if ({got} != {_c(s)}) {{ snprintf(err, n, \"{who}: size %lld, the program needs %lld "
                         f"({_spelt(s, self.dim_names)})\", (long long){got}, (long long){_c(s)}); "
                         f"return {SHAPE_ERROR}; }}")
        L += [f"    sizes[{k}] = {n};" for k, n in enumerate(self.size_names)]
        L += ["    return 0;", "}"]
        return L

    def _output_shape(self) -> list:
        L = ["static void fl_output_shape(int i, const int64_t* sizes, int64_t* shape) {"] + self._sizes_locals()
        L.append("    switch (i) {")
        for i, o in enumerate(self.outputs):
            L.append(f"    case {i}:" + "".join(f" shape[{d}] = {_c(s)};" for d, s in enumerate(o.layout.shape))
                     + " break;")
        L += ["    default: break;", "    }", "}"]
        return L

    def _run(self) -> list:
        """Output bases that are plain contiguous outputs are the runner's output buffers; the others
        are temporaries, and every other output is copied (strided) into its buffer."""
        bases = output_bases(self.g)
        index = {b.name: k for k, b in enumerate(bases)}
        consts = {name: j for j, name in enumerate(self.g.constants)}
        direct, copies = {}, []
        for i, o in enumerate(self.outputs):
            name = getattr(o, "name", None)
            if name in index and name not in direct and o.layout.is_contiguous():
                direct[name] = i
            else:
                copies.append(i)
        L = ["static int fl_model_run(void* const* in, void* const* out, const int64_t* sizes, void* const* consts) {"]
        L += self._sizes_locals()
        L.append(f"    void* bases[{max(1, len(bases))}];")
        for k, b in enumerate(bases):
            if b.name in direct:
                L.append(f"    bases[{k}] = out[{direct[b.name]}];")
            else:
                L.append(f"    bases[{k}] = fl_alloc({_c(b.layout.numel)} * {b.dtype.itemsize});")
        L.append("    int code = fl_graph_run(in, bases, sizes, consts);")
        for i in copies:
            L.append("    " + self._copy_out(f"(char*)out[{i}]", self.outputs[i], index, consts, f"output {i}"))
        L += self._write_state(index, consts)
        for k, b in enumerate(bases):
            if b.name not in direct:
                L.append(f"    fl_free(bases[{k}]);")
        L += ["    return code;", "}"]
        return L

    def _copy_out(self, dst: str, o, index: dict, consts: dict, what: str) -> str:
        """C statement: the C-contiguous copy at `dst` of value `o` (a buffer or a strided view of an
        output base, an input or a constant)."""
        base = o.base if isinstance(o, StridedView) else o
        if isinstance(base, InputBuffer) and base.position is not None:
            src = f"in[{base.position}]"
        elif isinstance(base, InputBuffer):
            src = f"consts[{consts[base.name]}]"
        elif base.name in index:
            src = f"bases[{index[base.name]}]"
        else:
            raise Unsupported(f"{what} ({o!r}) can't be copied out")
        lay = o.layout
        shape = ", ".join(_c(s) for s in lay.shape) or "0"
        strides = ", ".join(_c(s) for s in lay.strides) or "0"
        return (f"{{ const int64_t shp[] = {{{shape}}}; const int64_t st[] = {{{strides}}}; "
                f"fl_copy_strided({dst}, (const char*){src} + {_c(lay.offset)} * {lay.dtype.itemsize}, "
                f"{len(lay.shape)}, shp, st, {lay.dtype.itemsize}); }}")

    def _write_state(self, index: dict, consts: dict) -> list:
        """After a successful run, each updated buffer's new value copied into its constant(s). Every
        update is a value the run computed (functionalization's copy, realised by the lowering), never a
        constant itself, so writing one constant can't change the source of another."""
        L = ["    if (code == 0) {"] if self.state_outputs else []
        for o, js in self.state_outputs:
            base = o.base if isinstance(o, StridedView) else o
            if isinstance(base, InputBuffer) and base.position is None:
                raise Unsupported(f"the update of buffer {self.state.fqns[js[0]]} reads constant {base.name} in place")
            L += ["        " + self._copy_out(f"(char*)consts[{j}]", o, index, consts, "a buffer update") for j in js]
        return L + (["    }"] if self.state_outputs else [])


SHAPE_ERROR = 4                      # FL_AOTI_ERR_SHAPE
COPY_HELPER = r"""
#include <cstdio>
// dst (C-contiguous) = the strided view (shape, element strides) at src, item by item.
static void fl_copy_strided(char* dst, const char* src, int ndim, const int64_t* shape, const int64_t* st, int64_t item) {
    if (ndim == 0) { std::memcpy(dst, src, item); return; }
    int64_t inner = 1;
    for (int d = 1; d < ndim; d++) inner *= shape[d];
    for (int64_t i = 0; i < shape[0]; i++)
        fl_copy_strided(dst + i * inner * item, src + i * st[0] * item, ndim - 1, shape + 1, st + 1, item);
}
"""


# ---- building ------------------------------------------------------------------------------------
def _object(src_path: str, flags: list, info: dict) -> str:
    """Compile one static source (the runtime, the GEMM) to an object file, cached on disk."""
    with open(src_path) as f:
        text = cpp_headers.with_headers(f.read()).encode()      # the key covers the _backends headers it includes
    with open(HEADER, "rb") as f:
        text += f.read()
    key = hashlib.sha256(text + " ".join(flags).encode() + info["version"].encode()).hexdigest()[:32]
    path = os.path.join(_cpp_builder.cache_dir, "aoti", f"{key}.o")
    if not os.path.exists(path):
        os.makedirs(os.path.dirname(path), exist_ok=True)
        tmp = f"{path}.{os.getpid()}.tmp"
        _run([info["cxx"], *flags, "-I", HERE, "-c", src_path, "-o", tmp], src_path)
        os.replace(tmp, path)
    return path


def _run(cmd: list, what: str):
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        msg = (r.stderr or r.stdout).strip()[:4000]
        raise _cpp_builder.CppCompileError(f"AOTInductor: compiling {what} failed.\n  command: {' '.join(cmd)}\n{msg}")


def _build(source: str, info: dict) -> bytes:
    """model.so's bytes: model.cpp + aoti_runtime.cpp + cpu_kernels.cpp + cpu_attention.cpp, linked with
    -Bsymbolic (two packages loaded in one process each call their own code)."""
    flags = [f for f in info["flags"] if f != "-shared"]
    with tempfile.TemporaryDirectory(prefix="flambeau_aoti_build_") as d:
        model = os.path.join(d, "model.cpp")
        with open(model, "w") as f:
            f.write(source)
        objs = [os.path.join(d, "model.o")]
        _run([info["cxx"], *flags, *config.kernel_cflags, "-I", HERE, "-c", model, "-o", objs[0]], model)
        # the runtime checks the CPU's features before any model code runs: built for any x86-64
        objs.append(_object(RUNTIME_SRC, [f for f in flags if not f.startswith(TARGET_FLAGS)], info))
        gemm_flags = flags + ["-ffp-contract=fast"] + (["-DFLM_SIMD_MATH"] if info.get("simd_math") else [])
        objs += [_object(GEMM_SRC, gemm_flags, info), _object(ATTENTION_SRC, gemm_flags, info)]
        so = os.path.join(d, "model.so")
        _run([info["cxx"], *info["flags"], *objs, "-o", so, "-Wl,-Bsymbolic", *info["libs"]], "model.so")
        with open(so, "rb") as f:
            return f.read()


# ---- the package ---------------------------------------------------------------------------------
def _dims(layout) -> list:
    return [int(s) if not isinstance(s, SizeExpr) else str(s) for s in layout.shape]


def _metadata(ep, graph, state, user_names, range_constraints, offsets, weights, folded) -> dict:
    ranges = _ranges(range_constraints)
    inputs = sorted(graph.inputs, key=lambda b: b.position)
    outputs = graph.outputs if isinstance(graph.outputs, list) else [graph.outputs]
    outputs = [o for i, o in enumerate(outputs) if i not in state.updates]
    return {
        "format": ARCHIVE_FORMAT.decode(), "version": PACKAGE_VERSION, "abi_version": ABI_VERSION,
        "inputs": [{"name": n, "dtype": b.dtype.name, "shape": _dims(b.layout)}
                   for n, b in zip(user_names, inputs)],
        "outputs": [{"dtype": o.dtype.name, "shape": _dims(o.layout)} for o in outputs],
        "dynamic_dims": {n: {"min": lo, "max": None if hi < 0 else hi, "name": ep.dim_names.get(n, n)}
                         for n, (lo, hi) in ranges.items()},
        "constants": [{"name": b.name, "fqn": fqn, "dtype": b.dtype.name, "shape": list(b.layout.shape),
                       "offset": off, "mutable": state.mutable(j)}
                      for j, (b, off, fqn) in enumerate(zip(graph.constants.values(), offsets, state.fqns))],
        "weights_nbytes": len(weights), "weights_checksum": str(checksum(weights)),
        "in_spec": pytree.treespec_dumps(ep.call_spec.in_spec),
        "out_spec": pytree.treespec_dumps(ep.call_spec.out_spec),
        "freezing": bool(config.freezing), "folded_constants": folded,
    }


def _write(package_path, so: bytes, source: str, weights: bytes, meta: dict) -> str:
    if package_path is None:
        fd, package_path = tempfile.mkstemp(suffix=".pt2", prefix="flambeau_aoti_")
        os.close(fd)
    entries = {"archive_format": ARCHIVE_FORMAT, "version": str(PACKAGE_VERSION).encode(),
               "metadata.json": json.dumps(meta, indent=1).encode(), "model.so": so,
               "model.cpp": source.encode(), "weights.bin": weights}
    with open(HEADER, "rb") as f:
        entries["aoti_runtime.h"] = f.read()
    target = package_path if isinstance(package_path, io.IOBase) else os.fspath(package_path)
    with zipfile.ZipFile(target, "w", zipfile.ZIP_STORED) as z:
        for name, data in entries.items():
            z.writestr(name, data)
    return package_path if isinstance(package_path, io.IOBase) else os.fspath(package_path)
