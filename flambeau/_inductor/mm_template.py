"""Triton matrix-product templates with fused epilogues (mode="max-autotune", PyTorch's mm templates).

Under `config.max_autotune` with the Triton backend, `fuse_products` rewrites the schedule: each `mm`/`bmm`
extern with static sizes and bf16/fp16/fp32 operands becomes a `TemplateKernel`, a generated Triton product

    C[b, M, N] = A[b, M, K] @ B[b, K, N]        (any strides, float32 accumulation, `tl.dot`)

whose tile, once accumulated, is handed to its *epilogue*: the scheduler's pointwise kernel that reads the
product (a bias add, an activation, a residual add, a cast: whatever the flat pointwise kernel computes),
printed by the Triton code generator over the tile's element indices with the product's value taken from
the accumulator (rounded to the product's dtype first, as the extern's output would be). The product is then
never stored, unless later kernels read it too or it is an output. A product whose first reader is not such
a kernel (or is an epilogue already taken by an earlier product: x @ w + y @ v) is templated alone.

Each template is one source (strides and offsets are literals); its block configurations (`CONFIGS`) are launches
of it with other constexprs, all compiled by the compile workers with the module's other kernels (`all_launches`).
At the first call on cuda `TemplateChoice` waits until every configuration is built, times each and the extern it
replaced (cuBLASLt, then the epilogue as its own kernel) with CUDA events, keeps the fastest (dropping the others'
Launchers) and caches the choice on disk next to autotune.py's block sizes (same key scheme), so a second process
times nothing. A call while the stream is captured into a CUDA graph never times: it takes the cached choice, else
the extern. Triton's interpreter (cpu tensors) has nothing to time: it runs the first configuration, so the
template is what CPU tests check.
"""
from __future__ import annotations

import dataclasses
import json
import math
import os

import numpy as np

from .. import _backends, _dtype as D, _logging, _state
from . import autotune, codegen_triton, config, extern_gemm
from .autotune import _path
from .codegen_triton import INT32_LIMIT, LOWP, TL, Launch, LaunchBuffer, TritonHandler, TritonKernelPrinter, TVar
from .index import Index, Sym, contiguous_strides
from .ir import Buffer, StridedView, set_handler
from .scheduler import ExternStep, Kernel, expand_groups
from .wrapper import strided_array

log = _logging.get_logger("flambeau._inductor")
PRODUCTS = ("mm", "bmm")
TEMPLATE_DTYPES = (D.bfloat16, D.float16, D.float32)
TIMED_LAUNCHES = 5                  # calls timed per choice (after one untimed)
stats = {"template_calls": 0, "extern_calls": 0, "tuned": 0, "from_disk": 0, "fused_epilogues": 0}


@dataclasses.dataclass(frozen=True)
class Config:
    block_m: int
    block_n: int
    block_k: int
    group_m: int = 8
    num_warps: int = 4
    num_stages: int = 3


CONFIGS = (Config(128, 128, 64, 8, 8, 3), Config(128, 256, 64, 8, 8, 3), Config(64, 128, 32, 8, 4, 4),
           Config(128, 64, 32, 8, 4, 4), Config(64, 64, 32, 8, 4, 3))
SMEM_BUDGET = 200 * 1024            # bytes of operand tiles in flight (stages x (A + B tile)) a config may use


def configs_for(dtype) -> list:
    """The configurations whose pipelined operand tiles fit in an H100's shared memory for inputs of `dtype`
    (the first is always kept: the interpreter's)."""
    it = dtype.itemsize
    return [c for i, c in enumerate(CONFIGS)
            if i == 0 or c.num_stages * (c.block_m + c.block_n) * c.block_k * it <= SMEM_BUDGET]


class Operand:
    """One product operand as the template reads it: its base buffer and the element offset and strides
    of its (batch, row, column) dims (batch stride 0 for an mm)."""

    def __init__(self, a):
        base = a.base if isinstance(a, StridedView) else a
        self.name, self.dtype = base.name, a.dtype
        lay = a.layout
        st = list(lay.strides)
        self.offset = lay.offset
        self.shape = tuple(lay.shape)
        self.strides = tuple([0] + st if len(st) == 2 else st)


class TemplateKernel(Kernel):
    """A scheduled matrix product with its epilogue (`epilogue`: the pointwise Kernel it replaces, or None:
    then the product itself is stored; with `store_product` it is stored too, for its later readers or as an
    output). `loads`: the operands' bases, then the epilogue's other loads; `stores`: the product's, then
    the epilogue's."""

    def __init__(self, product, epilogue, store_product: bool = False):
        # (Kernel's own constructor wants a node: a product alone has none)
        self.name = epilogue.name if epilogue is not None else f"template_{product.name}"
        self.nodes, self.steps, self.locals = (epilogue.nodes, epilogue.steps, epilogue.locals) if epilogue \
            is not None else ([], [], set())
        self.outer, self.outer_groups, self.column, self.scatter = (), [], False, None
        self.product, self.epilogue = product, epilogue
        self.store_product = store_product or epilogue is None
        self.a, self.b = Operand(product.args[0]), Operand(product.args[1])
        self.operand_names = {self.a.name, self.b.name}     # read whole by every tile: never written in place
        self.batch, self.m, self.k = (1, *self.a.shape) if len(self.a.shape) == 2 else self.a.shape
        self.n = self.b.shape[-1]
        bases = {}
        for x in (*(a.base if isinstance(a, StridedView) else a for a in product.args),
                  *(epilogue.loads if epilogue is not None else ())):
            if x.name != product.name:
                bases.setdefault(x.name, x)
        self.loads = list(bases.values())
        self.stores = ([product] if self.store_product else []) + (list(epilogue.stores) if epilogue else [])


def templatable(ek) -> bool:
    """Whether an extern node is a product the template takes: mm/bmm of two static same-dtype operands."""
    if getattr(ek.op, "name", None) not in PRODUCTS or ek.kwargs or ek.layout is None or len(ek.args) != 2:
        return False
    args = ek.args
    if not all(isinstance(a, (Buffer, StridedView)) and a.dtype in TEMPLATE_DTYPES for a in args):
        return False
    if args[0].dtype != args[1].dtype or ek.layout.is_symbolic() or any(a.layout.is_symbolic() for a in args):
        return False
    return all(s > 0 for s in ek.layout.shape) and args[0].layout.shape[-1] > 0


def _identity_epilogue(k, prod) -> bool:
    """Whether Kernel `k` is a flat pointwise kernel reading the (contiguous) product only at the element
    it writes, over exactly the product's elements: its body can run on the product's tile."""
    if k.outer or len(k.steps) != 1 or k.steps[0].kind != "pointwise" or k.scatter is not None:
        return False
    lay = prod.layout
    if tuple(lay.strides) != tuple(contiguous_strides(lay.shape)) or lay.offset != 0:
        return False
    numel = math.prod(lay.shape)
    for n in k.nodes:
        if math.prod(n.ranges) != numel:
            return False
        for b, idx in n.reads:
            if b.name == prod.name and n.canonical(idx).key() != n.write_index().key():
                return False
    return True


def fuse_products(order: list, graph) -> list:
    """The schedule with each templatable product extern replaced by a TemplateKernel (see the docstring);
    a graph with symbolic sizes keeps its externs (its kernels take the sizes, a template takes none)."""
    if graph.dynamic:
        return order
    outputs = {getattr(o.base if isinstance(o, StridedView) else o, "name", None) for o in graph.flat_outputs()}
    readers: dict = {}
    for step in order:
        for b in (step.loads if isinstance(step, Kernel) else step.node.inputs()):
            readers.setdefault(b.name, []).append(step)
    out, replaced = [], {}
    for step in order:
        if isinstance(step, ExternStep) and templatable(step.node):
            prod = step.node
            users = readers.get(prod.name, [])       # (in order: the template runs where the first reads)
            if users and isinstance(users[0], Kernel) and id(users[0]) not in replaced and \
                    _identity_epilogue(users[0], prod):
                replaced[id(users[0])] = TemplateKernel(prod, users[0], len(users) > 1 or prod.name in outputs)
                stats["fused_epilogues"] += 1
                continue
            out.append(TemplateKernel(prod, None))
            continue
        out.append(replaced.get(id(step), step))
    return out


# ---- code generation ---------------------------------------------------------------------------------
class _EpiloguePrinter(TritonKernelPrinter):
    """The code generator's printer over a [BLOCK_M, BLOCK_N] tile instead of an [XBLOCK, 1] block."""

    def block_shape(self) -> str:
        return "[BLOCK_M, BLOCK_N]"


def _dot_precision(dtype) -> str:
    if dtype is D.float32 and _state.float32_matmul_precision == "highest":
        return ', input_precision="ieee"'
    return ""


def _clamped(r: str, size: int, block: str) -> str:
    """Row (column) indices wrapped into the operand (`r % size`: the tile past its edge reads valid rows, whose
    results the store masks), hinted contiguous where every wrap falls on a 16-element boundary (no vector of
    the loads then straddles one)."""
    if size % 16:
        return f"{r} % {size}"
    return f"tl.max_contiguous(tl.multiple_of({r} % {size}, {block}), {block})"


def generate(tk: TemplateKernel, interpret: bool = False) -> tuple:
    """(source of the template's jit function, [Launch per config]) of a TemplateKernel."""
    a, b = tk.a, tk.b
    numels = [x.layout.numel for x in tk.loads + tk.stores]
    wide = any(n > INT32_LIMIT for n in numels)
    p = _EpiloguePrinter(tk.epilogue if tk.epilogue is not None else tk, (), interpret)
    p.int64 = wide
    p.lines, p.depth = [], 1
    cast = ".to(tl.int64)" if wide else ""
    M, N, K = tk.m, tk.n, tk.k
    for s in (f"pid = tl.program_id(0){cast}",
              f"grid_n = ({N} + BLOCK_N - 1) // BLOCK_N",
              f"grid_m = ({M} + BLOCK_M - 1) // BLOCK_M",
              "width = GROUP_M * grid_n",
              "first_m = (pid // width) * GROUP_M",
              "size_m = tl.minimum(grid_m - first_m, GROUP_M)",
              "pid_m = first_m + (pid % width) % size_m",
              "pid_n = (pid % width) // size_m",
              f"bid = tl.program_id(1){cast}",
              "rm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)",
              "rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)",
              "rk = tl.arange(0, BLOCK_K)",
              f"ram = {_clamped('rm', M, 'BLOCK_M')}",
              f"rbn = {_clamped('rn', N, 'BLOCK_N')}",
              f"a_ptrs = {a.name} + ({a.offset} + bid * {a.strides[0]} + ram[:, None] * {a.strides[1]} + "
              f"rk[None, :] * {a.strides[2]})",
              f"b_ptrs = {b.name} + ({b.offset} + bid * {b.strides[0]} + rk[:, None] * {b.strides[1]} + "
              f"rbn[None, :] * {b.strides[2]})",
              "acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)",
              f"for k in range(0, {K}, BLOCK_K):"):
        p.line(s)
    p.depth += 1
    p.line("if EVEN_K:")
    p.line("    a = tl.load(a_ptrs)")
    p.line("    b = tl.load(b_ptrs)")
    p.line("else:")
    p.line(f"    a = tl.load(a_ptrs, mask=rk[None, :] < {K} - k, other=0.0)")
    p.line(f"    b = tl.load(b_ptrs, mask=rk[:, None] < {K} - k, other=0.0)")
    if interpret and a.dtype is D.bfloat16:       # the interpreter's dot multiplies bfloat16's bits as integers
        p.line("a, b = a.to(tl.float32), b.to(tl.float32)")
    p.line(f"acc += tl.dot(a, b{_dot_precision(a.dtype)})")
    p.line(f"a_ptrs += BLOCK_K * {a.strides[2]}")
    p.line(f"b_ptrs += BLOCK_K * {b.strides[1]}")
    p.depth -= 1
    prod = tk.product
    p.line(f"xmask = (rm[:, None] < {M}) & (rn[None, :] < {N})")
    p.line(f"xindex = bid * {M * N} + rm[:, None] * {N} + rn[None, :]")
    if prod.dtype in LOWP:
        p.line(f"acc = acc.to({TL[prod.dtype]}).to(tl.float32)")
    if tk.store_product:
        st = prod.layout.strides
        off = f"bid * {st[0]} + rm[:, None] * {st[-2]} + rn[None, :] * {st[-1]}" if len(st) == 3 else \
            f"rm[:, None] * {st[0]} + rn[None, :] * {st[1]}"
        val = "acc" if prod.dtype not in LOWP else f"acc.to({TL[prod.dtype]})"
        p.line(f"tl.store({prod.name} + ({off}), {val}, mask=xmask)")
    with set_handler(TritonHandler(p)):
        if tk.epilogue is not None:
            p.locals[prod.name] = TVar("acc", prod.dtype)
            step = tk.epilogue.steps[0]
            p._store_step(step, [], _tile_index(p, tk, step.inner_groups))
    params = [x.name for x in tk.loads + tk.stores] + (["fl_err"] if p.uses_error_flag else []) + \
        [f"{c}: tl.constexpr" for c in ("BLOCK_M", "BLOCK_N", "BLOCK_K", "GROUP_M", "EVEN_K")]
    src = f"@triton.jit\ndef {tk.name}({', '.join(params)}):\n" + "\n".join(p.lines) + "\n"
    bufs = [LaunchBuffer(x.name, x.dtype) for x in tk.loads + tk.stores]
    launches = []
    for c in configs_for(a.dtype):
        tiles = -(-M // c.block_m) * -(-N // c.block_n)
        consts = dict(BLOCK_M=c.block_m, BLOCK_N=c.block_n, BLOCK_K=c.block_k, GROUP_M=c.group_m,
                      EVEN_K=K % c.block_k == 0)
        launches.append(Launch(tk.name, bufs, [], tiles, 1, consts, c.num_warps, error_flag=p.uses_error_flag,
                               splits=tk.batch, num_stages=c.num_stages))
    return src, launches


def _tile_index(p, tk: TemplateKernel, groups: list) -> list:
    """The epilogue's per-dim indices over the tile. Where its loop groups are the product's own (batch,) rows,
    columns, they are `bid`, `rm`, `rn` themselves (no division of the flat index: the compiler then sees the
    columns contiguous and vectorises loads and stores); else the flat index split as the code generator does."""
    sizes = [math.prod(g) for g in groups]
    dims = {(tk.batch * tk.m, tk.n): (f"bid * {tk.m} + rm[:, None]", "rn[None, :]"),
            (tk.batch, tk.m, tk.n): ("bid", "rm[:, None]", "rn[None, :]"),
            (tk.m, tk.n): ("rm[:, None]", "rn[None, :]")}.get(tuple(sizes))       # (the last wins for an mm)
    if dims is None or len(sizes) == 1:
        return p._split("x", "xindex", groups, p.x_names)
    syms = []
    for j, (e, size) in enumerate(zip(dims, sizes)):
        p.line(f"x{j} = {e}")
        p.x_names.add(f"x{j}")
        syms.append(Index.of(Sym(f"x{j}", size)))
    return expand_groups(groups, syms)


# ---- choosing between the configurations and the extern -----------------------------------------------
def cache_path(cache_dir: str, kernel_key: str, name: str, dkey: str) -> str:
    """Where a template's choice is cached: autotune.py's scheme, under the precision it was timed with."""
    return _path(cache_dir, kernel_key, name, {"precision": _state.float32_matmul_precision}, dkey)


def select(n_choices: int, run, timer, path: str, capturing: bool, write, build=None) -> int | None:
    """The index of the fastest of `n_choices` (the last is the extern): from the disk cache at `path`, else
    timed with `timer(fn) -> ms` of `fn() = run(i)` and written there; None while capturing with nothing cached
    (the caller then takes the extern, without keeping that). `build(i)` (optional) makes choice i's kernels
    ready before any choice is timed (the compile workers' jobs awaited); a choice it fails for is skipped."""
    if os.path.exists(path):
        with open(path) as f:
            stats["from_disk"] += 1
            return json.load(f)["choice"]
    if capturing:
        return None
    failed = set()
    if build is not None:
        for i in range(n_choices - 1):
            try:
                build(i)
            except Exception as e:  # a configuration this GPU can't compile: skipped below
                log.info("mm template %s: configuration %d skipped: %s", path, i, e)
                failed.add(i)
    times = []
    for i in range(n_choices):
        if i in failed:
            times.append((math.inf, i))
            continue
        try:
            times.append((timer(lambda i=i: run(i)), i))
        except Exception as e:     # a configuration this GPU can't compile or launch (shared memory): skipped
            if i == n_choices - 1:
                raise
            log.info("mm template %s: configuration %d skipped: %s", path, i, e)
            times.append((math.inf, i))
    best = min(times)[1]
    ms = [t if math.isfinite(t) else None for t, _ in times]
    write(path, json.dumps({"choice": best, "ms": ms}))
    log.info("mm template %s: choice %d of %d (the last: the extern), ms %s", path, best, n_choices, ms)
    stats["tuned"] += 1
    return best


def cuda_timer(cupy):
    """timer(fn) -> ms per call of `fn` over TIMED_LAUNCHES calls after one untimed, with CUDA events."""
    def timer(fn):
        fn()
        stream = cupy.cuda.get_current_stream()
        start, end = cupy.cuda.Event(), cupy.cuda.Event()
        start.record(stream)
        for _ in range(TIMED_LAUNCHES):
            fn()
        end.record(stream)
        end.synchronize()
        return cupy.cuda.get_elapsed_time(start, end) / TIMED_LAUNCHES
    return timer


class TemplateChoice:
    """What the wrapper calls for a TemplateKernel (`entry()(*loads, *stores[, err])`): the chosen template
    configuration, or the extern product followed by the epilogue kernel. `templates`: a Launcher per config;
    `product(arrays, out)`: the extern product of the arrays of `tk.loads` (into `out` when given); `epilogue`:
    the Launcher of the epilogue kernel alone (None without one). It keeps none of the TemplateKernel (whose
    nodes hold the graph's lowering: loaders, IR, tens of thousands of objects for a GPT-2 step)."""

    def __init__(self, tk, templates, product, epilogue, device, choose):
        self.templates, self.product, self.epilogue = templates, product, epilogue
        self.store_product = tk.store_product
        self.error_flag = templates[0].error_flag
        self.interpret = device.type == "cpu"
        self.choose = choose                 # fn(self, args) -> index of the choice or None (see select)
        self.choice = 0 if self.interpret else None
        n = len(tk.loads)
        if epilogue is not None:
            where = {x.name: i for i, x in enumerate(tk.loads)}
            self.epi_args = [where.get(x.name, -1) for x in tk.epilogue.loads]
        self.n_loads = n

    def direct(self) -> bool:
        """False: a template's choice takes arrays (the extern product views them), never raw addresses, so
        the wrapper keeps its operands' temporaries as arrays (`wrapper._raw_temporaries`)."""
        return False

    def entry(self, raw: tuple = ()):
        if raw:
            raise ValueError("TemplateChoice.entry: a template takes arrays, not raw addresses")
        return self

    def run(self, i: int, args):
        if i < len(self.templates):
            stats["template_calls"] += 1
            return self.templates[i](*args)
        stats["extern_calls"] += 1
        loads, rest = args[:self.n_loads], args[self.n_loads:]
        if self.epilogue is None:
            self.product(loads, rest[0])
            return None
        if self.store_product:                      # into its own output, then the epilogue's stores
            c, rest = self.product(loads, rest[0]), rest[1:]
        else:
            c = self.product(loads, None)
        return self.epilogue(*[c if j < 0 else loads[j] for j in self.epi_args], *rest)

    def __call__(self, *args):
        i = self.choice
        if i is None:
            i = self.choose(self, args)
            if i is None:                    # capturing, nothing known: the extern, not kept
                return self.run(len(self.templates), args)
            self.choice = i
            self.release_losers()
        return self.run(i, args)

    def release_losers(self) -> None:
        """Once chosen, what the choice never runs is dropped: the other configurations' Launchers (their
        loaded kernels, whose CuPy modules unload with them) and, for a template, the extern's epilogue."""
        self.templates = [t if j == self.choice else None for j, t in enumerate(self.templates)]
        if self.choice < len(self.templates):
            self.epilogue = None


def aliases_inputs(args, n_loads: int) -> bool:
    """Whether a store of the call is also one of its loads (repeating it to time it would change the result)."""
    ptr = (lambda x: x.data.ptr) if not isinstance(args[0], np.ndarray) else (lambda x: x.ctypes.data)
    loads = {ptr(x) for x in args[:n_loads]}
    return any(ptr(x) in loads for x in args[n_loads:])


def generate_module(kernels, size_names=(), interpret: bool = False) -> tuple:
    """`codegen_triton.generate` of a graph's kernels, its TemplateKernels printed here: (module source,
    {kernel name: Launch, or for a template [Launch per config]}); a template's epilogue is also printed
    alone, as `<name>_epilogue` (the extern choice's second kernel)."""
    templates = [k for k in kernels if isinstance(k, TemplateKernel)]
    alone = [_renamed(t.epilogue, t.name + "_epilogue") for t in templates if t.epilogue is not None]
    source, launches = codegen_triton.generate([k for k in kernels if not isinstance(k, TemplateKernel)] + alone,
                                               size_names, interpret)
    for t in templates:
        src, launches[t.name] = generate(t, interpret)
        source += "\n\n" + src
    return source, launches


def all_launches(kernels, launches: dict) -> list:
    """Every Launch of `generate_module`'s kernels (each template configuration, each epilogue alone, and under
    `config.max_autotune` each block-size variant of a tuned kernel: `autotune.precompile_variants`), kernel by
    kernel in order: what the compile workers build ahead (`triton_runtime.precompile`), all of a module at once."""
    out = []
    for k in kernels:
        la = launches[k.name]
        if isinstance(la, list):
            out += la
        else:
            out += [la] + (autotune.precompile_variants(la) if config.max_autotune else [])
        if isinstance(k, TemplateKernel) and k.epilogue is not None:
            out.append(launches[k.name + "_epilogue"])
    return out


def _renamed(k: Kernel, name: str) -> Kernel:
    """A shallow copy of Kernel `k` under another name."""
    copy = object.__new__(type(k))
    copy.__dict__.update(k.__dict__)
    copy.name = name
    return copy


def launcher(rt, module, tk: TemplateKernel, launches: dict, device) -> TemplateChoice:
    """The TemplateChoice of a TemplateKernel of a loaded module (`rt`: triton_runtime)."""
    templates = [rt.Launcher(module, la, device) for la in launches[tk.name]]
    epilogue = rt.Launcher(module, launches[tk.name + "_epilogue"], device) if tk.epilogue is not None else None
    choose = None
    if device.type == "cuda":
        cupy = rt._cupy()
        path = cache_path(rt.cache_dir(), templates[0].kernel_key, tk.name, rt.device_key(device))

        def choose(tc, args):
            if aliases_inputs(args, tc.n_loads):     # never repeated: the extern, as without max-autotune
                return len(tc.templates)
            return select(len(tc.templates) + 1, lambda i: tc.run(i, args), cuda_timer(cupy), path,
                          cupy.cuda.get_current_stream().is_capturing(), rt._write_atomic,
                          lambda i: tc.templates[i].build())
    return TemplateChoice(tk, templates, extern_product(tk, device), epilogue, device, choose)


def extern_product(tk: TemplateKernel, device):
    """product(arrays of tk.loads, out) -> the product as the extern computes it (cuBLASLt on cuda,
    `extern_gemm.planned_product`; the op's eager kernel on cpu), written into `out` when given."""
    ek = tk.product
    op = ek.op                               # (the closures keep the op, not the IR node)
    where = {x.name: i for i, x in enumerate(tk.loads)}

    def operand(a):
        if isinstance(a, StridedView):
            i, lay = where[a.base.name], a.layout
            return lambda arrays: strided_array(arrays[i], lay)
        i = where[a.name]
        return lambda arrays: arrays[i]
    fa, fb = operand(ek.args[0]), operand(ek.args[1])
    if device.type == "cuda":
        xp = _backends.get("cuda").xp
        call = extern_gemm.planned_product(ek.args, where, lambda arrays: (fa(arrays), fb(arrays)),
                                           lambda *arrays: op.kernel(xp, fa(arrays), fb(arrays)))
        return lambda arrays, out: call(*arrays, out=out)

    def product(arrays, out):
        d = op.kernel(np, fa(arrays), fb(arrays))
        if out is None:
            return d
        out[...] = d
        return out
    return product
