"""The C++ wrapper: one compiled graph's call as generated C++ (`config.cpp_wrapper`, AOTInductor).

`CppWrapper(graph, order, memory, size_names).generate()` prints, after the kernels of the same
source (codegen_cpp.py), one function that owns the graph's intermediate memory and runs every step:

    extern "C" int fl_graph_run(void* const* in, void* const* out, const int64_t* sym,
                                void* const* consts) {
        float* arg0 = (float*)in[0];                  // graph inputs, by position
        float* buf3 = (float*)out[0];                 // output bases: memory the caller owns
        float* buf0 = (float*)fl_alloc(4 * (32));     // the memory plan: fresh or a freed buffer
        fl_sgemm(1, 4, 8, 8, arg0, ...);              // extern products: flambeau's packed GEMM
        kernel0(buf0, arg1, buf3);
        fl_free(buf0);
        return fl_take_error();                       // an error a kernel recorded (wrapper.kernel_error)
    }

`out` holds the *output bases*: each buffer an output is (or is a view of), allocated by the caller
with its layout's shape. `sym` holds the size symbols' values (`size_names` order); the kernels take
them as trailing arguments. The extern steps the C++ wrapper can run are `mm` and `bmm` (float32 and
bfloat16 through flambeau's GEMMs, float sums rounded once; float64 with double sums), 1-D and 2-D
`convolution` (grouped: one call per image and group; transposed, grouped too: the GEMM then fl_col2im;
3-D ones, grouped and transposed too, as direct loops), `max_pool2d_with_indices`, `max_pool3d_with_indices`, `adaptive_max_pool{1,2,3}d` and `_taps_gather` (interpolate, average pooling, pads), float32 or float64,
`sort`, `topk` and `cumsum` of any dtype (the C++ of cpp_wrapper_kernels.py); bfloat16/float16 operands of these are widened to float and
the results rounded once (`_widened`, WIDENED_OPS); and the fused CPU attention `_sdpa_flash_cpu`
(3-d or 4-d operands, masks, `flash_reason`; a two-output op: out and its
logsumexp), through the function pointers of `EXTERNS`, set once by `fl_set_externs(table, threads)`
(the JIT path hands it the eager libraries' functions, an AOTInductor package the copies linked into
its model.so). Any other step raises `Unsupported`: the JIT path then keeps the Python wrapper
(wrapper.py), AOTInductor refuses the graph.

A float32 product or convolution whose right operand (weight) is a frozen constant (`config.freezing`,
or any AOTInductor weight; `config.prepack_weights`) reads it from a buffer packed once when the graph
or package is loaded: the GEMM's B panels (`flm_pack_b`; a batched product's per batch item, one for
a weight broadcast over the batch) or the convolution's weight tiles (`flm_conv_pack_w`).
`fl_graph_prepack(consts)` fills the buffers the loader appends to the constants' table
(`fl_graph_num_packed`, `fl_graph_packed_floats(k)`); `fl_sgemm_packed` / `fl_conv2d_packed` read them.

`fl_graph_run_obj(...)` is the JIT entry: the input and output arrays as NumPy array objects (their
data pointer read at codegen_cpp.DATA_OFFSET), the sizes as integers, the constants' pointer table
last; `python_shim` prints the Python that calls it (one ctypes call per graph call).
"""
from __future__ import annotations

import copy
import ctypes

from .. import _dtype as D
from .._backends import cpu_attention, cpu_kernels
from .._ops.nn_pool import _pool_args
from . import codegen_cpp, config
from .cpp_wrapper_kernels import CONV2D, GEMM, KERNELS, LOWP_CODE
from .ir import Buffer, ExternKernel, InputBuffer, Layout, StridedView, Unsupported
from .scheduler import Kernel
from .sizevars import SizeExpr
from .wrapper import WrapperCodegen, kernel_error

CPP_EXTERN_OPS = ("mm", "bmm", "convolution", "_sdpa_flash_cpu", "max_pool2d_with_indices", "max_pool3d_with_indices",
                  "_taps_gather", "sort", "topk", "cumsum", "adaptive_max_pool1d", "adaptive_max_pool2d",
                  "adaptive_max_pool3d")
# the externs whose bfloat16/float16 operands are widened to float for their float32 code (bfloat16
# products have their own GEMM, the attention its own lowp paths)
PRODUCT_DTYPES = (D.float32, D.float64, D.bfloat16)     # mm/bmm operands run as they are (float16: widened)
WIDENED_OPS = ("mm", "bmm", "convolution", "max_pool2d_with_indices", "max_pool3d_with_indices", "_taps_gather",
               "sort", "topk", "cumsum", "adaptive_max_pool1d", "adaptive_max_pool2d", "adaptive_max_pool3d")
PARALLEL_MACS = 1 << 20          # as cpu_kernels.PARALLEL_MACS: smaller products run on one thread
LOWP_CODES = {D.float32: 0, D.bfloat16: 1, D.float16: 2}     # cpu_attention.cpp's operand dtype codes
# The library functions the generated wrapper calls, in the order of fl_set_externs' table: the wrapper's
# name -> (library symbol, return type, parameter types). The JIT path hands the table the eager
# libraries' addresses (`jit_externs`: cpu_kernels, cpu_attention), an AOTInductor package the copies
# linked into its model.so (`link_externs_source`).
_I = "int64_t"
EXTERNS = {
    "fl_sgemm": ("flm_sgemm", "void", f"{_I}, {_I}, {_I}, {_I}, const float*, {_I}, {_I}, {_I}, const float*, "
                 f"{_I}, {_I}, {_I}, float*, {_I}, {_I}, int, int"),
    "fl_conv2d": ("flm_conv2d", "void", ", ".join([_I] * 15) + ", const float*, const float*, const float*, "
                  "float*, int"),
    "fl_sgemm_packed": ("flm_sgemm_packed", "void", f"{_I}, {_I}, {_I}, const float*, {_I}, {_I}, const float*, "
                        f"float*, {_I}, int"),
    "fl_pack_b": ("flm_pack_b", "void", f"{_I}, {_I}, const float*, {_I}, {_I}, float*"),
    "fl_packed_b_floats": ("flm_packed_b_floats", _I, f"{_I}, {_I}"),
    "fl_conv2d_packed": ("flm_conv2d_packed", "void", ", ".join([_I] * 15) + ", const float*, const float*, "
                         "const float*, float*, int"),
    "fl_conv_pack_w": ("flm_conv_pack_w", "void", f"{_I}, {_I}, const float*, float*"),
    "fl_conv_packed_w_floats": ("flm_conv_packed_w_floats", _I, f"{_I}, {_I}"),
    "fl_gemm_bf16": ("flm_gemm_bf16", "void", f"{_I}, {_I}, {_I}, {_I}, const uint16_t*, {_I}, {_I}, {_I}, "
                     f"const uint16_t*, {_I}, {_I}, {_I}, float*, uint16_t*, int"),
    "fl_attention_forward": ("flm_attention_forward", "void", "const int64_t*, const int64_t*, int, const void*, "
                             "const void*, const void*, const float*, int, float, void*, float*, float*, int"),
    "fl_attention_workspace": ("flm_attention_workspace", _I, "const int64_t*, int, int"),
}

# the externs that pack a constant operand of each kind at load, and multiply with it
PACKING = {"mm": ("fl_pack_b", "fl_packed_b_floats", "fl_sgemm_packed"),
           "bmm": ("fl_pack_b", "fl_packed_b_floats", "fl_sgemm_packed"),
           "conv": ("fl_conv_pack_w", "fl_conv_packed_w_floats", "fl_conv2d_packed")}

def _runtime() -> str:
    """The helpers every C++ wrapper starts with: the externs' pointers and fl_set_externs, the
    thread count of a product, the buffers' allocation."""
    decls = "\n".join(f"typedef {ret} (*{name}_fn)({params});\nstatic {name}_fn {name} = nullptr;"
                       for name, (_, ret, params) in EXTERNS.items())
    sets = " ".join(f"{name} = ({name}_fn)table[{k}];" for k, name in enumerate(EXTERNS))
    return f"""
#include <cstdlib>
{decls}
static int fl_ext_threads = 1;
extern "C" void fl_set_externs(void* const* table, int threads) {{
    {sets}
    fl_ext_threads = threads;
}}
static inline int fl_threads(int64_t macs) {{ return macs < {PARALLEL_MACS} ? 1 : fl_ext_threads; }}
static inline void* fl_alloc(int64_t nbytes) {{
    return std::aligned_alloc(64, (size_t)((nbytes + 63) / 64 * 64 + 64));
}}
static inline void fl_free(void* p) {{ std::free(p); }}
{KERNELS}"""


RUNTIME = _runtime()


def link_externs_source() -> str:
    """`fl_link_externs(threads)`: an AOTInductor package's wrapper pointed at the library functions
    linked into its own model.so (called once by aoti_runtime.cpp's fl_aoti_create)."""
    decls = "\n".join(f'extern "C" {ret} {sym}({params});' for sym, ret, params in EXTERNS.values())
    table = ", ".join(f"(void*)&{sym}" for sym, _, _ in EXTERNS.values())
    return f"""{decls}
extern "C" void fl_link_externs(int threads) {{
    void* const table[] = {{{table}}};
    fl_set_externs(table, threads);
}}
"""


def jit_externs() -> dict:
    """{wrapper name: address} of the externs the eager libraries provide here (cpu_kernels' GEMM,
    convolution and, with AVX-512 BF16, bfloat16 GEMM; cpu_attention's flash attention)."""
    by_symbol = {**(cpu_kernels.extern_pointers() or {}), **cpu_attention.extern_pointers()}
    return {name: by_symbol[sym] for name, (sym, _, _) in EXTERNS.items() if sym in by_symbol}


def _c(e) -> str:
    """C source of an int | SizeExpr (a polynomial of the size symbols, locals of the function)."""
    return f"(int64_t)({e})" if isinstance(e, SizeExpr) else str(int(e))


def output_bases(graph) -> list:
    """The buffers the caller allocates: each non-input buffer an output is, or is a view of."""
    bases: list = []
    for o in graph.flat_outputs():
        b = o.base if isinstance(o, StridedView) else o
        if isinstance(b, Buffer) and not isinstance(b, InputBuffer) and b not in bases:
            bases.append(b)
    return bases


class CppWrapper:
    """See module docstring."""

    def __init__(self, graph, order, memory, size_names=(), externs=None, constants_frozen: bool = False,
                 mutable_constants=frozenset()):
        self.externs = frozenset(EXTERNS) if externs is None else frozenset(externs)   # (None: all, linked)
        self.constants_frozen = constants_frozen or config.freezing   # (AOTInductor: always)
        self.mutable = frozenset(mutable_constants)    # constants runs write (never packed)
        self.g = graph
        self.order = order
        self.mem = memory
        self.size_names = list(size_names)
        self.lines: list = []
        self.packed: dict = {}       # (kind, constant, layout) -> (slot, floats, pack statement): packed at load
        self.bases = output_bases(graph)

    def line(self, s: str):
        self.lines.append("    " + s)

    def generate(self) -> str:
        g = self.g
        self.lines = []
        for k, name in enumerate(self.size_names):
            self.line(f"const int64_t {name} = sym[{k}];")
        for b in g.inputs:
            self.line(f"{self._t(b)}* {b.name} = ({self._t(b)}*)in[{b.position}];")
        for j, b in enumerate(g.constants.values()):
            self.line(f"{self._t(b)}* {b.name} = ({self._t(b)}*)consts[{j}];")
        index = {b.name: i for i, b in enumerate(self.bases)}
        roots: list = []
        self.extern_roots = []         # extern results (a multi-output op's: each output) this function allocated
        for i, step in enumerate(self.order):
            if isinstance(step, Kernel):
                for b in step.stores:
                    self._place(b, index, roots, self.mem["allocs"][b.name])
                args = [b.name for b in step.loads + step.stores] + self.size_names
                self.line(f"{step.name}({', '.join(args)});")
            else:
                ek = step.node
                for b in ek.outputs if ek.layout is None else [ek]:
                    self._place(b, index, roots, ("alloc", None), extern=True)
                self._extern(ek)
            for name in self.mem["frees"][i]:
                if name in self.extern_roots:
                    self.line(f"fl_free({name});")
                    self.extern_roots.remove(name)
        for name in roots + self.extern_roots:       # (an extern result nothing read: a logsumexp)
            self.line(f"fl_free({name});")
        self.line("return fl_take_error();")
        body = "\n".join(self.lines)
        sig = "void* const* in, void* const* out, const int64_t* sym, void* const* consts"
        return RUNTIME + f'\nextern "C" int fl_graph_run({sig}) {{\n{body}\n}}\n' + self._prepack() + \
            self._obj_entry()

    def _prepack(self) -> str:
        """fl_graph_num_packed / fl_graph_packed_floats(k) / fl_graph_prepack(consts): the loader makes
        a buffer of packed_floats(k) floats (64-byte aligned) per packed operand, appends them to the
        constants' table and calls prepack once; the products then read them (see module docstring)."""
        n_const = len(self.g.constants)
        floats = [f for _, f, _ in self.packed.values()]
        packs = [f"    {pack.format(dst=f'(float*)consts[{n_const + slot}]')}" for slot, _, pack in self.packed.values()]
        sizes = ", ".join(floats) or "0"
        return (f'extern "C" int fl_graph_num_packed(void) {{ return {len(packs)}; }}\n'
                f'extern "C" int64_t fl_graph_packed_floats(int k) {{ const int64_t n[] = {{{sizes}}}; return n[k]; }}\n'
                f'extern "C" void fl_graph_prepack(void* const* consts) {{\n' + "\n".join(packs) + "\n}\n")

    def _t(self, b) -> str:
        t = codegen_cpp.STORAGE.get(b.dtype)        # (bfloat16/float16 buffers: their bit patterns)
        if t is None:
            raise Unsupported(f"the C++ wrapper has no type for {b.dtype.name} buffer {b.name}")
        return t

    def _place(self, b, index, roots, alloc, extern=False):
        t = self._t(b)
        if b.name in index:
            self.line(f"{t}* {b.name} = ({t}*)out[{index[b.name]}];")
            return
        act, other = alloc
        if act == "reuse":
            self.line(f"{t}* {b.name} = ({t}*){other};")
            return
        self.line(f"{t}* {b.name} = ({t}*)fl_alloc({_c(b.layout.numel)} * {b.dtype.itemsize});")
        if extern:
            self.extern_roots.append(b.name)
        else:
            roots.append(b.name)

    # ---- extern steps --------------------------------------------------------------------------
    def _extern(self, ek: ExternKernel):
        name = getattr(ek.op, "name", str(ek.op))
        if ek.kind != "extern" or name not in CPP_EXTERN_OPS:
            raise Unsupported(f"the C++ wrapper can't run op {name} ({ek.kind}): it runs {', '.join(CPP_EXTERN_OPS)}")
        lowp = {a.dtype for a in _tensors(ek)} & set(LOWP_CODE)
        if lowp and name in WIDENED_OPS and not (name in ("mm", "bmm") and lowp == {D.bfloat16}):
            self._widened(ek, name, lowp.pop())
            return
        getattr(self, f"_extern_{name}")(ek)

    def _widened(self, ek, name: str, dtype):
        """`ek` on bfloat16/float16 operands run by its float32 emitter: each such operand widened into
        a contiguous float temporary, each such result computed in one and rounded once (fl_narrow)."""
        code, temps = LOWP_CODE[dtype], []

        def widen(a):
            if isinstance(a, (list, tuple)):
                return type(a)(widen(x) for x in a)
            if not isinstance(a, (Buffer, StridedView)) or a.dtype is not dtype:
                return a
            p, lay = self._operand(a)
            tmp = f"fl_w{len(temps)}_{ek.name}"
            shape = ", ".join(_c(d) for d in lay.shape) or "0"
            strides = ", ".join(_c(d) for d in lay.strides) or "0"
            self.line(f"float* {tmp} = (float*)fl_alloc({_c(lay.numel)} * 4);")
            self.line(f"{{ const int64_t shp[] = {{{shape}}}; const int64_t st[] = {{{strides}}}; "
                      f"fl_widen({tmp}, (const uint16_t*){p}, {len(lay.shape)}, shp, st, {code}); }}")
            temps.append(tmp)
            return Buffer(tmp, Layout(lay.shape, D.float32))

        def wide_result(b):
            """A copy of result `b`: computed in a float temporary when `b` is of `dtype`."""
            w = copy.copy(b)
            if b.layout is None or b.dtype is not dtype:
                return w, None
            w.name, w.layout = f"fl_wo_{b.name}", Layout(b.layout.shape, D.float32, b.layout.strides)
            self.line(f"float* {w.name} = (float*)fl_alloc({_c(b.layout.numel)} * 4);")
            return w, (b, w)

        args, kwargs = widen(ek.args), {k: widen(v) for k, v in ek.kwargs.items()}
        if ek.layout is not None:
            sub, narrow = wide_result(ek)
            narrows = [narrow]
        else:
            sub = copy.copy(ek)
            pairs = [wide_result(o) for o in ek.outputs]
            sub.outputs, narrows = [w for w, _ in pairs], [n for _, n in pairs]
        sub.args, sub.kwargs = args, kwargs
        getattr(self, f"_extern_{name}")(sub)
        for b, w in filter(None, narrows):
            self.line(f"fl_narrow((uint16_t*){b.name}, {w.name}, {_c(b.layout.numel)}, {code});")
            temps.append(w.name)
        for tmp in temps:
            self.line(f"fl_free({tmp});")

    def _need(self, fn: str, what: str):
        if fn not in self.externs:
            raise Unsupported(f"the C++ wrapper's {what} is unavailable here ({EXTERNS[fn][0]} of flambeau's CPU "
                              "kernels did not build, or this CPU lacks its instructions)")

    def _need_gemm(self, dt):
        if dt is D.float32:
            self._need("fl_sgemm", "GEMM")

    @staticmethod
    def _product_dtype(ek, name: str, dtypes=(D.float32, D.bfloat16)):
        """The one dtype of a product's or convolution's operands and result, if the wrapper runs it."""
        tensors = [a for a in ek.args if isinstance(a, (Buffer, StridedView))]
        found = {a.dtype for a in tensors} | {ek.layout.dtype}
        if len(found) != 1 or next(iter(found)) not in dtypes:
            raise Unsupported(f"the C++ wrapper runs {name} on {' or '.join(d.name for d in dtypes)} operands of "
                              f"one dtype (got {[a.dtype.name for a in tensors]} -> {ek.layout.dtype.name})")
        return next(iter(found))

    @staticmethod
    def _operand(a):
        """(C pointer expression, layout) of an extern operand: a buffer or a strided view of one."""
        if isinstance(a, StridedView):
            return f"({a.base.name} + {_c(a.layout.offset)})", a.layout
        return a.name, a.layout

    def _frozen_constant(self, b) -> str | None:
        """`consts[j] + offset` (C) when operand `b` is a float32 constant of static layout that may be
        packed once at load (config.prepack_weights, constants frozen)."""
        base = b.base if isinstance(b, StridedView) else b
        lay = b.layout
        if not (config.prepack_weights and self.constants_frozen and lay.dtype is D.float32
                and isinstance(base, InputBuffer) and base.position is None and base.name in self.g.constants
                and base.name not in self.mutable):
            return None
        if not all(isinstance(v, int) for v in (*lay.shape, *lay.strides, lay.offset)):
            return None
        return f"(const float*)consts[{list(self.g.constants).index(base.name)}] + {lay.offset}"

    def _packed_slot(self, kind: str, b, floats: str, pack: str) -> int | None:
        """The packed-buffer slot of constant operand `b` (None when it is not one), made once per
        (kind, constant, layout): `floats` its size, `pack` the statement filling it ({src}, {dst})."""
        src = self._frozen_constant(b)
        if src is None:
            return None
        for fn in PACKING[kind]:
            self._need(fn, f"packed {kind} operand")
        lay = b.layout
        key = (kind, src, tuple(lay.shape), tuple(lay.strides))
        if key not in self.packed:
            self.packed[key] = (len(self.packed), floats, pack.format(src=src, dst="{dst}"))
        return self.packed[key][0]

    def _packed(self, slot: int) -> str:
        return f"(const float*)consts[{len(self.g.constants) + slot}]"

    def _extern_mm(self, ek):
        (pa, la), (pb, lb) = (self._operand(x) for x in ek.args[:2])
        M, K = la.shape
        N = lb.shape[1]
        sa, sb = [_c(s) for s in la.strides], [_c(s) for s in lb.strides]
        dt = self._product_dtype(ek, "mm", PRODUCT_DTYPES)
        if dt is D.bfloat16:
            self._gemm_bf16(ek, 1, M, N, K, pa, ("0", *sa), pb, ("0", *sb))
            return
        self._need_gemm(dt)
        slot = self._packed_slot("mm", ek.args[1], f"fl_packed_b_floats({N}, {K})",
                                 f"fl_pack_b({N}, {K}, {{src}}, {sb[0]}, {sb[1]}, {{dst}});")
        if slot is not None:
            self.line(f"fl_sgemm_packed({_c(M)}, {_c(N)}, {_c(K)}, {pa}, {sa[0]}, {sa[1]}, {self._packed(slot)}, "
                      f"{ek.name}, {_c(N)}, fl_threads({_c(M)} * {_c(N)} * {_c(K)}));")
            return
        self.line(f"{GEMM[dt]}(1, {_c(M)}, {_c(N)}, {_c(K)}, {pa}, 0, {sa[0]}, {sa[1]}, {pb}, 0, {sb[0]}, {sb[1]}, "
                  f"{ek.name}, 0, {_c(N)}, 0, fl_threads({_c(M)} * {_c(N)} * {_c(K)}));")

    def _extern_bmm(self, ek):
        (pa, la), (pb, lb) = (self._operand(x) for x in ek.args[:2])
        B, M, K = la.shape
        N = lb.shape[2]
        sa, sb = [_c(s) for s in la.strides], [_c(s) for s in lb.strides]
        dt = self._product_dtype(ek, "bmm", PRODUCT_DTYPES)
        if dt is D.bfloat16:
            self._gemm_bf16(ek, B, M, N, K, pa, sa, pb, sb)
            return
        self._need_gemm(dt)
        if self._bmm_packed(ek, B, M, N, K, pa, sa, lb):
            return
        self.line(f"{GEMM[dt]}({_c(B)}, {_c(M)}, {_c(N)}, {_c(K)}, {pa}, {sa[0]}, {sa[1]}, {sa[2]}, {pb}, {sb[0]}, "
                  f"{sb[1]}, {sb[2]}, {ek.name}, {_c(M)} * {_c(N)}, {_c(N)}, 0, "
                  f"fl_threads({_c(B)} * {_c(M)} * {_c(N)} * {_c(K)}));")

    def _bmm_packed(self, ek, B, M, N, K, pa, sa, lb) -> bool:
        """A batched product whose right operand is a constant: each batch item's panels packed once at
        load (one for all when the operand is broadcast over the batch), one packed product per item."""
        sbb = lb.strides[0] if isinstance(lb.strides[0], int) else None
        if sbb is None or not isinstance(B, int):
            return False
        items = 1 if sbb == 0 else B
        rs, cs = lb.strides[1], lb.strides[2]
        pack = "".join(f"fl_pack_b({N}, {K}, {{src}} + {t * sbb}, {rs}, {cs}, {{dst}} + {t} * fl_packed_b_floats({N}, {K})); "
                       for t in range(items))
        slot = self._packed_slot("bmm", ek.args[1], f"{items} * fl_packed_b_floats({N}, {K})", pack.rstrip())
        if slot is None:
            return False
        step = "0" if items == 1 else f"fl_packed_b_floats({N}, {K})"
        self.line(f"for (int64_t fl_t = 0; fl_t < {B}; fl_t++)")
        self.line(f"    fl_sgemm_packed({_c(M)}, {N}, {K}, {pa} + fl_t * {sa[0]}, {sa[1]}, {sa[2]}, "
                  f"{self._packed(slot)} + fl_t * {step}, {ek.name} + fl_t * {_c(M)} * {N}, {N}, "
                  f"fl_threads({_c(M)} * {N} * {K}));")
        return True

    def _extern_convolution(self, ek):
        """A 2-D convolution of groups 1; a 1-D one runs as the 2-D convolution of its (N, C, 1, L) view
        (the same memory, kernel (1, K), stride/padding/dilation 1/0/1 in the new dim)."""
        x, w, bias, stride, padding, dilation, transposed, _, groups = ek.args
        dt = self._product_dtype(ek, "convolution", (D.float32, D.float64))
        if dt is D.float32:
            self._need("fl_conv2d", "convolution")
        if len(x.layout.shape) not in (3, 4, 5):
            raise Unsupported("the C++ wrapper runs 1-D, 2-D and 3-D convolutions")
        ops = [(x, "input"), (w, "weight")] + ([(bias, "bias")] if bias is not None else [])
        for a, what in ops:
            if not a.layout.is_contiguous() and not (isinstance(a, StridedView) and _contiguous_at_offset(a.layout)):
                raise Unsupported(f"the C++ wrapper runs convolutions of contiguous operands only ({what} is strided)")
        if len(x.layout.shape) == 5:           # output channels: the result's (a transposed weight is (C, O/g, ...))
            dims = (*x.layout.shape, ek.layout.shape[1], *w.layout.shape[2:], *stride, *padding, *dilation,
                    *ek.layout.shape[2:], groups)
            fn = "fl_conv_transpose3d" if transposed else "fl_conv3d"
            self._geometry_call(f"{fn}<{self._t(ek)}>", dims, self._operand(x)[0], self._operand(w)[0],
                                self._operand(bias)[0] if bias is not None else "nullptr", ek.name,
                                f"fl_threads({' * '.join(_c(s) for s in (*ek.layout.shape, *w.layout.shape[1:]))})")
            return
        (px, lx), (pwt, lw) = self._operand(x), self._operand(w)
        pbias = self._operand(bias)[0] if bias is not None else "nullptr"
        one = len(lx.shape) == 3
        N, C, H, W = (_c(s) for s in (lx.shape[:2] + (1,) + lx.shape[2:] if one else lx.shape))
        O, _, KH, KW = (_c(s) for s in (lw.shape[:2] + (1,) + lw.shape[2:] if one else lw.shape))
        OH, OW = (_c(s) for s in ((1,) + tuple(ek.layout.shape[2:]) if one else ek.layout.shape[2:]))
        sh, sw = (_c(s) for s in ((1,) + tuple(stride) if one else stride))
        ph, pw = (_c(s) for s in ((0,) + tuple(padding) if one else padding))
        dh, dw = (_c(s) for s in ((1,) + tuple(dilation) if one else dilation))
        if transposed:
            self._transposed_convolution(ek, dt, groups, (N, C, H, W, _c(lw.shape[1]), KH, KW, sh, sw, ph, pw, dh,
                                                          dw, OH, OW), px, pwt, pbias)
            return
        if groups != 1:
            self._grouped_convolution(ek, dt, groups, (N, C, H, W, O, KH, KW, sh, sw, ph, pw, dh, dw, OH, OW), px,
                                      pwt, pbias)
            return
        slot = self._packed_slot("conv", w, f"fl_conv_packed_w_floats({O}, {C} * {KH} * {KW})",
                                 f"fl_conv_pack_w({O}, {C} * {KH} * {KW}, {{src}}, {{dst}});")
        fn, pwt = (CONV2D[dt], pwt) if slot is None else ("fl_conv2d_packed", self._packed(slot))
        self.line(f"{fn}({N}, {C}, {H}, {W}, {O}, {KH}, {KW}, {sh}, {sw}, {ph}, {pw}, {dh}, {dw}, {OH}, {OW}, "
                  f"{px}, {pwt}, {pbias}, {ek.name}, fl_threads({N} * {O} * {OH} * {OW} * {C} * {KH} * {KW}));")

    def _grouped_convolution(self, ek, dt, groups, dims, px, pwt, pbias):
        """A convolution of `groups` groups (depthwise: one channel each) as one groups-1 convolution per
        image and group on the channel slices, the (image, group) pairs split over threads."""
        N, C, H, W, O, KH, KW, sh, sw, ph, pw, dh, dw, OH, OW = dims
        cg, og = f"({C} / {groups})", f"({O} / {groups})"
        bias = "nullptr" if pbias == "nullptr" else f"{pbias} + fl_g * {og}"
        self.line(f"#pragma omp parallel for collapse(2) schedule(static) "
                  f"num_threads(fl_threads({N} * {O} * {OH} * {OW} * {cg} * {KH} * {KW}))")
        self.line(f"for (int64_t fl_n = 0; fl_n < {N}; fl_n++)")
        self.line(f"    for (int64_t fl_g = 0; fl_g < {groups}; fl_g++)")
        self.line(f"        {CONV2D[dt]}(1, {cg}, {H}, {W}, {og}, {KH}, {KW}, {sh}, {sw}, {ph}, {pw}, {dh}, {dw}, {OH}, "
                  f"{OW}, {px} + (fl_n * {C} + fl_g * {cg}) * {H} * {W}, {pwt} + fl_g * {og} * {cg} * {KH} * {KW}, "
                  f"{bias}, {ek.name} + (fl_n * {O} + fl_g * {og}) * {OH} * {OW}, 1);")

    def _transposed_convolution(self, ek, dt, groups, dims, px, pwt, pbias):
        """A transposed convolution, per image and group: cols = W_g^T @ x[n, g] (the GEMM; W_g, the group's
        (C/groups, O*KH*KW) rows of the weight, read transposed; O the output channels of a group), then
        fl_col2im adds each column into the output positions it reaches (and the group's bias)."""
        self._need_gemm(dt)
        N, C, H, W, O, KH, KW, sh, sw, ph, pw, dh, dw, OH, OW = dims
        rows, hw, ct, cg = f"{O} * {KH} * {KW}", f"{H} * {W}", self._t(ek), f"({C} / {groups})"
        bias = "nullptr" if pbias == "nullptr" else f"{pbias} + fl_g * {O}"
        self.line(f"{{ {ct}* fl_cols = ({ct}*)fl_alloc({rows} * {hw} * {dt.itemsize});")
        self.line(f"  for (int64_t fl_n = 0; fl_n < {N}; fl_n++) for (int64_t fl_g = 0; fl_g < {groups}; fl_g++) {{")
        self.line(f"    {GEMM[dt]}(1, {rows}, {hw}, {cg}, {pwt} + fl_g * {cg} * {rows}, 0, 1, {rows}, "
                  f"{px} + (fl_n * {C} + fl_g * {cg}) * {hw}, 0, {hw}, 1, fl_cols, 0, {hw}, 0, "
                  f"fl_threads({rows} * {hw} * {cg}));")
        self.line(f"    fl_col2im<{ct}>({O}, {H}, {W}, {KH}, {KW}, {sh}, {sw}, {ph}, {pw}, {dh}, {dw}, {OH}, {OW}, fl_cols, "
                  f"{bias}, {ek.name} + (fl_n * {groups} + fl_g) * {O} * {OH} * {OW}, fl_threads({rows} * {hw}));")
        self.line("  }")
        self.line("  fl_free(fl_cols); }")

    def _geometry_call(self, fn: str, dims, *args):
        """`fn(g, *args)` with the int64 table g of `dims` (sizes, kernel, stride, padding, dilation; ints, size
        expressions or C text)."""
        table = ", ".join(d if isinstance(d, str) else _c(d) for d in dims)
        self.line(f"{{ const int64_t fl_g[] = {{{table}}}; {fn}(fl_g, {', '.join(args)}); }}")

    def _max_pool_operands(self, ek, nd: int) -> tuple:
        """(x, (kernel, stride, padding, dilation), x's C pointer, x's layout, values, indices) of a
        max_pool{nd}d_with_indices extern, whose input must be a contiguous float tensor."""
        x, kernel_size, stride, padding, dilation, _ = ek.op.bind(*ek.args, **ek.kwargs)
        if x.dtype not in GEMM or not (x.layout.is_contiguous() or (
                isinstance(x, StridedView) and _contiguous_at_offset(x.layout))):
            raise Unsupported(f"the C++ wrapper runs max_pool{nd}d_with_indices on contiguous float inputs only")
        px, lx = self._operand(x)
        values, indices = (next(o for o in ek.outputs if o.i == i) for i in (0, 1))
        return x, _pool_args(nd, kernel_size, stride, padding, dilation), px, lx, values, indices

    def _extern_max_pool3d_with_indices(self, ek):
        """max_pool3d_with_indices of a contiguous float (N, C, D, H, W) or (C, D, H, W) input (fl_max_pool3d)."""
        x, (ks, st, pd, dl), px, lx, values, indices = self._max_pool_operands(ek, 3)
        planes = " * ".join(_c(s) for s in lx.shape[:-3])
        dims = (planes, *lx.shape[-3:], *values.layout.shape[-3:], *ks, *st, *pd, *dl)
        self._geometry_call(f"fl_max_pool3d<{self._t(x)}>", dims, px, values.name, indices.name,
                            f"fl_threads({' * '.join(_c(s) for s in values.layout.shape)} * {ks[0] * ks[1] * ks[2]})")

    def _extern_max_pool2d_with_indices(self, ek):
        """max_pool2d_with_indices of a contiguous float32/float64 (N, C, H, W) or (C, H, W) input
        (cpp_wrapper_kernels.fl_max_pool2d; bfloat16/float16 widened to float, exact)."""
        x, (ks, st, pd, dl), px, lx, values, indices = self._max_pool_operands(ek, 2)
        H, W = (_c(s) for s in lx.shape[-2:])
        planes = " * ".join(_c(s) for s in lx.shape[:-2])
        OH, OW = (_c(s) for s in values.layout.shape[-2:])
        self.line(f"fl_max_pool2d<{self._t(x)}>({planes}, {H}, {W}, {OH}, {OW}, {ks[0]}, {ks[1]}, {st[0]}, {st[1]}, {pd[0]}, "
                  f"{pd[1]}, {dl[0]}, {dl[1]}, {px}, {values.name}, {indices.name}, "
                  f"fl_threads({planes} * {OH} * {OW} * {ks[0] * ks[1]}));")

    def _adaptive_max_pool(self, ek, nd: int):
        """adaptive_max_pool{nd}d of a contiguous float input, its planes seen as 3-D ones
        (cpp_wrapper_kernels.fl_adaptive_max_pool: PyTorch's windows, a NaN wins, flat indices)."""
        x, _ = ek.op.bind(*ek.args, **ek.kwargs)
        if x.dtype not in GEMM or not (x.layout.is_contiguous() or (
                isinstance(x, StridedView) and _contiguous_at_offset(x.layout))):
            raise Unsupported(f"the C++ wrapper runs adaptive_max_pool{nd}d on contiguous float inputs only")
        px, lx = self._operand(x)
        values, indices = (next(o for o in ek.outputs if o.i == i) for i in (0, 1))
        planes = " * ".join(_c(s) for s in lx.shape[:-nd]) or "1"
        ones = (1,) * (3 - nd)
        dims = (planes, *ones, *lx.shape[-nd:], *ones, *values.layout.shape[-nd:])
        self._geometry_call(f"fl_adaptive_max_pool<{self._t(x)}>", dims, px, values.name, indices.name,
                            f"fl_threads({' * '.join(_c(s) for s in lx.shape)})")

    def _extern_adaptive_max_pool1d(self, ek):
        self._adaptive_max_pool(ek, 1)

    def _extern_adaptive_max_pool2d(self, ek):
        self._adaptive_max_pool(ek, 2)

    def _extern_adaptive_max_pool3d(self, ek):
        self._adaptive_max_pool(ek, 3)

    def _extern__taps_gather(self, ek):
        """_taps_gather (interpolate, average and adaptive average pooling, reflect/replicate pads) of a
        contiguous float32/float64 input (bfloat16/float16: widened): one fl_taps_axis pass per resampled
        trailing dim, through temporaries."""
        x, indices, weights = ek.op.bind(*ek.args, **ek.kwargs)
        tables = list(indices) + list(weights)
        if x.dtype not in GEMM or any(w.dtype is not x.dtype for w in weights) or \
                any(i.dtype is not D.int64 for i in indices):
            raise Unsupported("the C++ wrapper runs _taps_gather on float inputs (int64 indices, weights of the "
                              f"input's dtype; got {x.dtype.name}, {[w.dtype.name for w in weights]})")
        for a in [x] + tables:
            if not (a.layout.is_contiguous() or (isinstance(a, StridedView) and _contiguous_at_offset(a.layout))):
                raise Unsupported("the C++ wrapper runs _taps_gather on contiguous operands only")
        shape, ct = list(x.layout.shape), self._t(x)
        src, n = self._operand(x)[0], len(indices)
        for i, idx in enumerate(indices):
            ax = len(shape) - n + i
            nout, taps = idx.layout.shape
            outer = " * ".join(_c(s) for s in shape[:ax]) or "1"
            inner = " * ".join(_c(s) for s in shape[ax + 1:]) or "1"
            nin = _c(shape[ax])
            shape[ax] = nout
            dst = ek.name if i == n - 1 else f"fl_taps{i}_{ek.name}"
            if i < n - 1:
                self.line(f"{ct}* {dst} = ({ct}*)fl_alloc({' * '.join(_c(s) for s in shape)} * {x.dtype.itemsize});")
            w = self._operand(weights[i])[0] if weights else "nullptr"
            self.line(f"fl_taps_axis<{ct}>({outer}, {nin}, {_c(nout)}, {inner}, {_c(taps)}, {src}, {self._operand(idx)[0]}, "
                      f"{w}, {dst}, fl_threads({outer} * {_c(nout)} * {inner} * {_c(taps)}));")
            if i > 0:
                self.line(f"fl_free({src});")
            src = dst

    def _extern_sort(self, ek):
        x, dim, descending, _ = ek.op.bind(*ek.args, **ek.kwargs)
        self._sort(ek, x, dim, None, descending)

    def _extern_topk(self, ek):
        x, k, dim, largest, _ = ek.op.bind(*ek.args, **ek.kwargs)
        self._sort(ek, x, dim, k, largest)

    def _sort(self, ek, x, dim, k, descending):
        """sort (k None: every element) or topk along `dim` of a contiguous input (cpp_wrapper_kernels.fl_sort:
        stable, NaN the largest, as the eager kernels; bfloat16/float16 widened, exact)."""
        if not (x.layout.is_contiguous() or (isinstance(x, StridedView) and _contiguous_at_offset(x.layout))):
            raise Unsupported(f"the C++ wrapper runs {ek.op.name} on contiguous inputs only")
        shape = list(x.layout.shape) or [1]
        d = dim % len(shape)
        outer = " * ".join(_c(s) for s in shape[:d]) or "1"
        inner = " * ".join(_c(s) for s in shape[d + 1:]) or "1"
        values, indices = (next(o for o in ek.outputs if o.i == i) for i in (0, 1))
        n = _c(shape[d])
        kk = n if k is None else _c(k)
        self.line(f"fl_sort<{self._t(x)}>({outer}, {n}, {inner}, {kk}, {self._operand(x)[0]}, {values.name}, "
                  f"{indices.name}, {int(bool(descending))}, fl_threads({outer} * {inner} * {n} * 16));")

    def _extern_cumsum(self, ek):
        """cumsum along `dim` of a contiguous input into the result's dtype (cpp_wrapper_kernels.fl_cumsum: a
        double or int64 running sum, as PyTorch's CPU kernel; bfloat16/float16 widened, rounded once)."""
        x, dim, _ = ek.op.bind(*ek.args, **ek.kwargs)
        if not (x.layout.is_contiguous() or (isinstance(x, StridedView) and _contiguous_at_offset(x.layout))):
            raise Unsupported("the C++ wrapper runs cumsum on contiguous inputs only")
        shape = list(x.layout.shape) or [1]
        d = dim % len(shape)
        outer = " * ".join(_c(s) for s in shape[:d]) or "1"
        inner = " * ".join(_c(s) for s in shape[d + 1:]) or "1"
        acc = "double" if ek.dtype.is_floating_point else "int64_t"
        self.line(f"fl_cumsum<{self._t(x)}, {self._t(ek)}, {acc}>({outer}, {_c(shape[d])}, {inner}, "
                  f"{self._operand(x)[0]}, {ek.name}, fl_threads({outer} * {inner} * {_c(shape[d])}));")

    def _gemm_bf16(self, ek, B, M, N, K, pa, sa, pb, sb):
        """A bfloat16 product (batch B, element strides sa/sb as (batch, row, column)): float sums in a
        workspace, rounded once into the result (cpu_kernels.cpp's flm_gemm_bf16)."""
        self._need("fl_gemm_bf16", "bfloat16 GEMM")
        mnb = f"{_c(B)} * {_c(M)} * {_c(N)}"
        self.line(f"{{ float* fl_work = (float*)fl_alloc({mnb} * 4);")
        self.line(f"  fl_gemm_bf16({_c(B)}, {_c(M)}, {_c(N)}, {_c(K)}, {pa}, {sa[0]}, {sa[1]}, {sa[2]}, {pb}, "
                  f"{sb[0]}, {sb[1]}, {sb[2]}, fl_work, {ek.name}, fl_threads({mnb} * {_c(K)}));")
        self.line("  fl_free(fl_work); }")

    def _extern__sdpa_flash_cpu(self, ek):
        """The fused CPU attention (cpu_attention.cpp's forward) on 4-d operands (3-d ones as one batch):
        out (B, H, L, Ev) in the operands' dtype and the float logsumexp (B, H, L), both contiguous; a mask
        read where it is, broadcast to (B, H, L, S) by zero strides (a float32 one), or first made float
        (fl_mask_float: bool as 0/-inf, bfloat16/float16 widened); see flash_reason."""
        q, k, v, mask, causal, scale, gqa = ek.op.bind(*ek.args, **ek.kwargs)
        why = flash_reason(q.dtype, [a.layout.shape for a in (q, k, v)], None if mask is None else mask.dtype, gqa,
                           _same_size)
        if why:
            raise Unsupported(f"the C++ wrapper can't run _sdpa_flash_cpu: {why}")
        self._need("fl_attention_forward", "fused attention")
        (pq, lq), (pk, lk), (pv, lv) = (self._operand(a) for a in (q, k, v))
        four = [(lay.shape, lay.strides) if len(lay.shape) == 4 else ((1, *lay.shape), (0, *lay.strides))
                for lay in (lq, lk, lv)]
        (B, H, L, E), (_, Hk, S, _), (_, _, _, Ev) = (shape for shape, _ in four)
        sizes = ", ".join(_c(s) for s in (B, H, Hk, L, S, E, Ev))
        pm, mask_strides = self._attention_mask(ek, mask, (B, H, L, S))
        strides = ", ".join(_c(s) for _, st in four for s in st) + ", " + ", ".join(mask_strides)
        out, lse = (next(o.name for o in ek.outputs if o.i == i) for i in (0, 1))
        sc = f"(float)(1.0 / std::sqrt((double){_c(E)}))" if scale is None else repr(float(scale))
        self.line(f"{{ const int64_t fl_sz[] = {{{sizes}}}; const int64_t fl_st[] = {{{strides}}};")
        self.line(f"  const int fl_th = fl_threads({_c(B)} * {H} * {_c(L)} * {_c(S)} * {_c(Ev)} * 4);")
        self.line("  float* fl_work = (float*)fl_alloc(fl_attention_workspace(fl_sz, 0, fl_th) * 4);")
        self.line(f"  fl_attention_forward(fl_sz, fl_st, {LOWP_CODES[q.dtype]}, {pq}, {pk}, {pv}, {pm}, "
                  f"{int(bool(causal))}, {sc}, {out}, {lse}, fl_work, fl_th);")
        self.line("  fl_free(fl_work); }")
        if pm.startswith("fl_mask_"):
            self.line(f"fl_free({pm});")

    def _attention_mask(self, ek, mask, target) -> tuple:
        """(C pointer of the float mask, its 4 element strides broadcast to `target` (B, H, L, S))."""
        if mask is None:
            return "nullptr", ["0"] * 4
        pm, lm = self._operand(mask)
        shape, strides = list(lm.shape), list(lm.strides)
        if mask.dtype is not D.float32:
            name = f"fl_mask_{ek.name}"
            dims = ", ".join(_c(s) for s in shape) or "0"
            st = ", ".join(_c(s) for s in strides) or "0"
            code = 0 if mask.dtype is D.bool else LOWP_CODES[mask.dtype]
            self.line(f"float* {name} = (float*)fl_alloc({_c(lm.numel)} * 4);")
            self.line(f"{{ const int64_t shp[] = {{{dims}}}; const int64_t st[] = {{{st}}}; "
                      f"fl_mask_float({name}, (const char*){pm}, {len(shape)}, shp, st, {code}); }}")
            pm, strides = name, list(Layout(shape, D.float32).strides)
        shape, strides = [1] * (4 - len(shape)) + shape, [0] * (4 - len(strides)) + strides
        return pm, [_c(st) if not _same_size(n, 1) else "0" for n, st in zip(shape, strides)]

    # ---- the JIT entry ---------------------------------------------------------------------------
    def _obj_entry(self) -> str:
        off = codegen_cpp.DATA_OFFSET
        if off is None:
            raise Unsupported("NumPy arrays' data pointer offset is unknown here: the C++ wrapper needs it")
        n_in = max([b.position for b in self.g.inputs] + [p for p, _, _ in self.g.size_inputs] + [-1]) + 1
        ins = {b.position: b for b in self.g.inputs}
        params = [f"const char* i{p}" for p in sorted(ins)] + [f"const char* o{k}" for k in range(len(self.bases))]
        params += [f"int64_t {s}" for s in self.size_names] + ["void* const* consts"]
        ptr = "*(void* const*)({} + %d)" % off
        in_arr = ", ".join(ptr.format(f"i{p}") if p in ins else "nullptr" for p in range(n_in)) or "nullptr"
        out_arr = ", ".join(ptr.format(f"o{k}") for k in range(len(self.bases))) or "nullptr"
        sym = ", ".join(self.size_names) or "0"
        return (f'extern "C" int fl_graph_run_obj({", ".join(params)}) {{\n'
                f"    void* in[] = {{{in_arr}}};\n    void* out[] = {{{out_arr}}};\n"
                f"    const int64_t sym[] = {{{sym}}};\n    return fl_graph_run(in, out, sym, consts);\n}}\n")


def _tensors(ek) -> list:
    """An extern's tensor operands and results (Buffers and StridedViews)."""
    out: list = []

    def visit(a):
        if isinstance(a, (Buffer, StridedView)):
            out.append(a)
        elif isinstance(a, (list, tuple)):
            for x in a:
                visit(x)
    visit(list(ek.args))
    visit(list(ek.kwargs.values()))
    return out + ([ek] if ek.layout is not None else [o for o in ek.outputs if o.layout is not None])


def _same_size(a, b) -> bool:
    """Two sizes known equal at compile time (ints, or the same size expression)."""
    return a == b if isinstance(a, int) and isinstance(b, int) else str(a) == str(b)


def flash_reason(dtype, shapes, mask_dtype, enable_gqa: bool, same=_same_size) -> str:
    """Why a C++ wrapper can't call the fused CPU attention on operands of this dtype and these
    (query, key, value) shapes with a mask of `mask_dtype` (None: no mask) (empty when it can): all 4-d
    of one batch size or all 3-d, static head counts (equal, or grouped-query), a bool mask or one of
    the operands' dtype. The inductor decomposes the others into the math path
    (decompositions.sdpa_flash_cpu) for graphs without Python externs."""
    if dtype not in LOWP_CODES:
        return f"dtype {dtype.name}"
    if {len(s) for s in shapes} not in ({3}, {4}):
        return "operands that are not all 3-d or all 4-d"
    (b, hq, _, _), (bk, hk, _, _), (bv, hv, _, _) = (s if len(s) == 4 else (1, *s) for s in shapes)
    if mask_dtype is not None and mask_dtype not in (D.bool, dtype):
        return f"a {mask_dtype.name} mask"
    if not (same(b, bk) and same(b, bv)):
        return "broadcast batch sizes"
    if not all(isinstance(h, int) for h in (hq, hk, hv)) or hk != hv or \
            not (hq == hk or (enable_gqa and hq % hk == 0)):
        return "head counts that are dynamic, broadcast or not grouped-query"
    return ""


def _contiguous_at_offset(layout) -> bool:
    return Layout(layout.shape, layout.dtype, layout.strides).is_contiguous()


class CppShimCodegen(WrapperCodegen):
    """The Python of a graph whose wrapper is C++: unpack the inputs, read the sizes (and check them,
    as wrapper.py does for a dynamic graph), allocate the output bases, one call of
    `fl_graph_run_obj`, raise a kernel's error, return the outputs (views of the bases, inputs)."""

    def __init__(self, graph, order, memory, size_names, eager, device, run, consts, arrays):
        super().__init__(graph, order, memory, "cpp", {}, size_names, eager, device)
        self.ns.update({"_run": run, "_consts": consts, "_kernel_error": kernel_error, "_const_arrays": arrays})

    def generate(self) -> str:
        g, L = self.g, self.lines
        L.append("def call(args):")
        positions = sorted({b.position for b in g.inputs} | {p for p, d, _ in g.size_inputs if d is None})
        if positions:
            L.append(f"    {', '.join(f'_in{p}' for p in positions)}{',' if len(positions) == 1 else ''} = args")
            for b in g.inputs:
                L.append(f"    {b.name} = _in{b.position}._data")
        if g.dynamic:
            self._bind_sizes()
        bases = output_bases(g)
        for b in bases:
            L.append(f"    {b.name} = _empty({tuple(b.layout.shape)!r}, {self._dtype(b.dtype)})")
        args = [b.name for b in sorted(g.inputs, key=lambda b: b.position)] + [b.name for b in bases]
        L.append(f"    _e = _run({', '.join(args + self.size_names + ['_consts'])})")
        L.append("    if _e:")
        L.append("        _kernel_error(_e)")
        for pos, buf in g.mutations.items():
            L.append(f"    _copyto(_in{pos}._data, {buf.name})")
        L.append(f"    return {self._outputs()}")
        return "\n".join(L) + "\n"


def bind_jit(lib, graph, size_names):
    """(run, consts, arrays): the library's `fl_graph_run_obj` with its argument types, externs set
    to the eager libraries' functions (`jit_externs`), the constants' pointer table and their arrays
    (which the caller keeps alive with the table)."""
    p = ctypes.c_void_p
    found = jit_externs()
    table = (p * len(EXTERNS))(*[found.get(name) for name in EXTERNS])
    lib.fl_set_externs.argtypes = [p, ctypes.c_int]
    lib.fl_set_externs.restype = None
    lib.fl_set_externs(table, cpu_kernels.gemm_threads())
    run = lib.fl_graph_run_obj
    n_arrays = len(graph.inputs) + len(output_bases(graph))
    run.argtypes = [ctypes.py_object] * n_arrays + [ctypes.c_int64] * len(size_names) + [p]
    run.restype = ctypes.c_int
    arrays = [c.constant._data for c in graph.constants.values()]
    lib.fl_graph_packed_floats.argtypes = [ctypes.c_int]
    lib.fl_graph_packed_floats.restype = ctypes.c_int64
    arrays += [cpu_kernels.aligned_empty(lib.fl_graph_packed_floats(k)) for k in range(lib.fl_graph_num_packed())]
    consts = (p * max(1, len(arrays)))(*[a.ctypes.data for a in arrays])
    lib.fl_graph_prepack.argtypes = [p]
    lib.fl_graph_prepack(consts)
    return run, consts, arrays
