"""Knobs of the code generator (module attributes; tests and users may set them).

Environment variables read at import:
    FLAMBEAU_LOGS=output_code      print the generated C++ and wrapper of each compiled graph
    FLAMBEAU_COMPILE_DEBUG=1       write every stage (graph, IR, kernels, source) to debug_dir
    FLAMBEAU_TUNE_MALLOC=1         opt in to glibc malloc thresholds for compiled graphs (see tune_malloc)
"""
from __future__ import annotations

import os

output_code: bool = False          # also on when FLAMBEAU_LOGS selects output_code (flambeau._logging)
debug: bool = os.environ.get("FLAMBEAU_COMPILE_DEBUG", "") not in ("", "0")
debug_dir: str = os.environ.get("FLAMBEAU_COMPILE_DEBUG_DIR", os.path.join(os.getcwd(), "flambeau_compile_debug"))
# The C++ compiler and the on-disk library cache are knobs of `flambeau._cpp_builder` (`cxx`,
# `cache_dir`; FLAMBEAU_CXX, FLAMBEAU_CACHE_DIR), which the eager CPU kernels share.

# backend of cpu graphs: "cpp" (C++/OpenMP through the system compiler), "numpy" (generated NumPy
# code) or "triton" (Triton kernels run by Triton's interpreter: set TRITON_INTERPRET=1, see
# codegen_triton.py / triton_runtime.py); "cpp" falls back to "numpy" with a warning when no working
# compiler is found. Graphs on cuda tensors always use "triton" (kernels compiled for the GPU).
# keep each compiled graph's scheduled kernels and extern IR nodes on it (`CompiledGraph.artifact.kernels`,
# `.externs`: tests and debugging read them); off, they are freed once the code is generated, so that a
# compiled graph holds only what it runs (issue 11: a process's tracked objects pace and cost its full
# garbage collections)
keep_ir: bool = debug

backend: str = os.environ.get("FLAMBEAU_INDUCTOR_BACKEND", "cpp")

# The per-call wrapper of cpu graphs as generated C++ (cpp_wrapper.py: one ctypes call per graph call)
# instead of generated Python; a graph with a step the C++ wrapper can't run keeps the Python wrapper
# (counted in compile_fx.counters["cpp_wrapper_fallbacks"]). FLAMBEAU_CPP_WRAPPER=1 turns it on.
cpp_wrapper: bool = os.environ.get("FLAMBEAU_CPP_WRAPPER", "0") not in ("", "0")
# Freezing (freezing.py): parameters and buffers of an inference graph become constants of the compiled
# code, subgraphs of constants are folded once at compile time and the folded weights stored contiguous
# (the layout the GEMM reads, e.g. a linear layer's weight transposed once). JIT graphs are frozen only
# when nothing needs gradients; AOTInductor always stores the weights as constants, and folds with it.
freezing: bool = os.environ.get("FLAMBEAU_FREEZING", "0") not in ("", "0")
# The C++ wrapper packs a matrix product's constant right operand (a frozen or AOTInductor weight) into
# the GEMM's panel layout once, when the compiled graph or package is loaded, instead of at every call.
prepack_weights: bool = True
# The CPU an AOTInductor package is compiled for: "native" (this machine's -march=native: fastest, runs
# on CPUs with the same features) or any -march name of the compiler ("x86-64-v3", "skylake-avx512")
# for a package that runs on more machines. The package records the CPU features its code may use
# and refuses to load, with a message naming them, on a CPU that lacks any.
aoti_march: str = "native"

fuse: bool = True                 # group buffers into shared loop nests
keep_locals: bool = True          # keep kernel-internal buffers in registers
reuse_buffers: bool = True        # memory planning: reuse freed buffers of the same size/dtype
poison_buffers: bool = False      # fill every buffer the wrapper allocates with NaN / -1 (tests: unwritten elements)
# Devices on which a graph with static sizes takes the kernels' temporaries (buffers dead before the call
# returns) as views of one allocation per call, at offsets planned when compiling (scheduler.plan_arena):
# on cuda a CuPy allocation costs microseconds of Python per buffer, a view less. FLAMBEAU_INDUCTOR_ARENA=0: none.
arena_devices: tuple = ("cuda",) if os.environ.get("FLAMBEAU_INDUCTOR_ARENA", "1") != "0" else ()
# On those devices a training forward's activations saved for the backward only (AOT autograd's outputs
# after the user's: they all live until the backward has run) are views of one more allocation per call
# (wrapper `_plan_saved_arena`; not with CUDA graphs). FLAMBEAU_INDUCTOR_SAVED_ARENA=0: each its own.
saved_arena: bool = os.environ.get("FLAMBEAU_INDUCTOR_SAVED_ARENA", "1") != "0"
# A mutated input's final value (a BatchNorm running statistic), which AOT autograd would copy into the
# input after the call, is stored into the input by the kernel computing it where that is safe
# (wrapper.in_place_writes; not with CUDA graphs): no copy per mutated input and call.
# FLAMBEAU_INDUCTOR_WRITE_INPUTS=0: copied back after the call.
write_inputs_in_place: bool = os.environ.get("FLAMBEAU_INDUCTOR_WRITE_INPUTS", "1") != "0"
max_inline_ops: int = 200         # realise a pointwise value whose expression grows beyond this
inline_ops_multi_use: int = 12    # ... or that has several users and costs more than this
realize_opcount_threshold: int = 30  # ... the same for the Triton generator (PyTorch's value: memory-bound kernels)
realize_saved_outputs: bool = True  # ... or that has several users, one of them the graph's output (graph.py)
realize_reads_threshold: int = 2   # ... or that has several users and reads more large buffers than this
#   (large: at least 1/8 of the value's elements; for 2 users, storing costs 1 write + 2 reads of the value and
#   computing it once more re-reads its r large inputs: cheaper to store from r = 3)
parallel_threshold: int = 1 << 15  # elements of work below which a kernel runs on one thread (with
#   GOMP_SPINCOUNT=10000, set by _cpp_builder for libgomp's load only, the team is still spinning
#   between kernels: 2 threads win from ~16K up)
accumulate_float_in_double: bool = True   # float32 sums/products accumulate in double
# Compiler flags added for generated kernels. No floating-point contraction (PyTorch's inductor default
# too): every op rounds as its eager kernel does, and a value that a kernel computes twice is equal to
# itself (with a*b - a*b fused into fma(a, b, -(a*b)), isfinite(x) = (x - x == 0) was False for finite x).
kernel_cflags: tuple = ("-ffp-contract=off",)
# A PT2E-converted graph's dequantize -> linear (-> relu) (-> quantize) runs as one int8 GEMM with int32
# accumulation (onednn::qlinear_pointwise on AVX-512 VNNI, quantization.py) instead of float kernels around
# the float GEMM.
quantized_linear: bool = True
# The same for dequantize -> 2-D convolution (-> relu) (-> quantize): onednn::qconv2d_pointwise, an int8
# im2col feeding the same GEMM (quantization.py).
quantized_conv: bool = True
# dequantize -> max pool / cat / view -> quantize with one set of static qparams runs the op on the int8
# tensors (quantization_int8_io.py: X86InductorQuantizer's shared observers around pooling and cat).
quantized_pooling: bool = True
# Opt-in (off by default; FLAMBEAU_TUNE_MALLOC=1 or set this before the first compile): keep freed
# memory in the process (glibc: mmap threshold 32 MiB, no heap trimming below 1 GiB) so that the
# buffers of each call of a compiled graph reuse pages instead of faulting fresh ones in (measured: a
# fifth of a small training step). It changes glibc's allocator for the whole process, for good,
# which a library must not do unasked; hence opt-in. Applied once, at the first compile.
tune_malloc: bool = os.environ.get("FLAMBEAU_TUNE_MALLOC", "0") not in ("", "0")
# The arrays a compiled CPU graph makes (outputs, saved activations, temporaries) are allocated by
# flambeau's caching allocator (_backends/cpu_allocator.py: NumPy's allocation policy, set around each
# compiled call only), so each call reuses the blocks earlier calls freed instead of faulting fresh pages
# in: the scoped counterpart of tune_malloc, on by default.
cpu_cache_allocator: bool = True

# Triton kernel shapes (codegen_triton.py). Elements per program: a flat pointwise kernel's block, and
# the XBLOCK * RBLOCK a row kernel aims at; the interpreter runs programs one after another, so it
# takes larger blocks (fewer programs, each one NumPy call per op).
triton_block: int = 1024
triton_interpret_block: int = 1 << 14
triton_persistent_limit: int = 4096   # rows up to this many elements are reduced in one block (persistent)
triton_loop_block: int = 1024         # RBLOCK of a looped row
triton_column_block: tuple = (64, 16)  # (XBLOCK, RBLOCK) of an outer (column) reduction
# Split reductions: a lone reduction of at least triton_split_min inner elements whose outputs need
# fewer than half this many programs (a full reduction: one) is cut into parts reduced in parallel
# into a workspace, then combined by a second kernel (the interpreter runs programs one by one: few parts).
triton_split_min: int = 8192
# ... and of a column reduction (outputs contiguous in memory, the reduced dim strided: a per-channel sum
# over a channels-last activation), whose blocks are XBLOCK outputs wide (triton_column_block).
triton_split_min_column: int = 2048
triton_split_programs: int = 512
triton_interpret_split_programs: int = 4
# Combo kernels (triton_schedule.combine_pointwise): independent flat pointwise kernels of one graph (the
# autocast casts of a block's weights, of its weight gradients) launched as one kernel, each its own range of
# programs; moved up to the first (they read graph inputs only) or down to the last (their values are only
# graph outputs), extending at most this many bytes of lifetimes per combo (PyTorch's combo_kernels, off there
# by default). A compiled DDP model's subgraphs each cast their own weights: without combos, ~8 small kernels
# a GPT-2 block that one graph's horizontal fusion of same-shaped casts across blocks avoids.
triton_combo_kernels: bool = True
triton_combo_bytes: int = 64 << 20
triton_combo_members: int = 32

# Large bfloat16/float16 matrix products on cuda with a size off 16 bytes (GPT-2's vocabulary, 50257)
# compute on operands zero-padded where they are produced (pad_mm.py; PyTorch's shape_padding).
shape_padding: bool = True

# Layout optimization (layout_opt.py; PyTorch's layout_opt): a graph lowered for the Triton generator
# (cuda, or cpu with backend "triton") that has 4-d convolutions runs channels-last: convolution operands
# and outputs and the 4-d values computed from them are NHWC in memory (cuDNN converts no operand, per-channel
# reductions read C innermost). On by default (as PyTorch's on cuda); FLAMBEAU_LAYOUT_OPT=0 turns it off.
# ResNet-50 B64 bf16 training on the H100 (session 14, one call, bench/gpu_top.py): GPU busy 14.4 ms a step
# on vs 18.2 off, wall 17.6 vs 19.6 ms.
layout_optimization: bool = os.environ.get("FLAMBEAU_LAYOUT_OPT", "1") not in ("", "0")

# Modes of flambeau.compile (PyTorch's list_mode_options): "reduce-overhead" sets triton_cudagraphs,
# "max-autotune" both, "max-autotune-no-cudagraphs" max_autotune; options={"triton.cudagraphs": True}
# and friends set them directly.
triton_cudagraphs: bool = False       # record each compiled cuda graph as a CUDA graph and replay it (cudagraphs.py)
cudagraph_max_recordings: int = 8     # input layouts recorded per compiled graph; later ones run without
max_autotune: bool = False            # benchmark block sizes of generated Triton kernels (autotune.py)
# Worker processes compiling a cuda graph's Triton kernels in parallel (triton_runtime.precompile;
# PyTorch's compile_threads); 1 compiles each kernel in the launching process at its first launch.
compile_threads: int = int(os.environ.get("FLAMBEAU_COMPILE_THREADS", min(32, os.cpu_count() or 1)))
