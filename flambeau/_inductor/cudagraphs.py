"""CUDA graphs for compiled graphs (`mode="reduce-overhead"`, `options={"triton.cudagraphs": True}`).

A compiled graph on cuda launches tens to hundreds of kernels a call, each costing host time; a CUDA
graph records them once and replays them with one launch. `cudagraphify(compiled, device, static)`
wraps a `compile_fx.CompiledGraph`:

    call 1 with given input shapes/strides      runs the compiled code as it is (warm-up: kernels
                                                compiled, cuBLASLt/cuDNN plans made, workspaces allocated)
    call 2                                      records: the compiled code runs once under stream
                                                capture, its memory from the device's private pool;
                                                then the graph is launched
    later calls                                 copy the inputs that need it, launch the graph

Inputs. A *static* input (a parameter or buffer of the compiled module, `mark_static_address`, or
memory of the pool itself: the output of another recording, e.g. the forward's saved activations
read by the backward) is read in place: a replay needs it at the address it was recorded with (the
optimizer updates parameters in place), else the graph is recorded again. Every other input is
copied into a buffer the recording owns before each launch.

Outputs live in the pool at fixed addresses, so a replay overwrites what the last one returned.
Every recording knows the memory it wrote while being captured (its footprint); replaying it
overwrites each output of any recording that lies there, its own last outputs included. The
`Tensor`s returned for those outputs are then dead: using one raises PyTorch's error ("accessing
tensor output of CUDAGraphs that has been overwritten by a subsequent run"). Memory referenced
otherwise (a `.grad` kept for accumulation, a view taken of an output) cannot be redirected, so
while such memory is still referenced the call runs without the graph instead (logged once).
The pool is one per device, shared by all recordings (a training step's forward and backward and
the graphs of other compiled functions): a recording reuses memory that earlier ones freed.

What cannot be captured runs without a graph, recorded once per graph and reason as a fallback of
op "CUDA graph" (`flambeau._counters`; one line under FLAMBEAU_LOGS=fallbacks) saying why: a graph that runs eagerly, cpu inputs, random ops (a replay would repeat the
recorded random numbers), a non-static input written by the graph, a failed capture (a host
synchronisation or a host-to-device copy inside the graph), more than `config.cudagraph_max_recordings`
input shapes of one graph.

The CUDA side is a `GraphBackend` per device type (CuPy: a private `cupy.cuda.MemoryPool`, a
capture stream, `Stream.begin_capture`/`end_capture`, `Graph.launch`); tests register a fake one for
cpu graphs to check the bookkeeping here without a GPU.
"""
from __future__ import annotations

import bisect
import functools
import sys
import weakref

from .. import _logging
from .._counters import record_fallback
from .._backends import device_checks
from .._backends.cuda_graphs import CaptureFailed, CupyGraphs
from ..nn.parameter import Parameter
from .._tensor import Tensor
from . import config

log = _logging.get_logger("flambeau._inductor")
stats = {"recordings": 0, "replays": 0, "eager_calls": 0}
OVERWRITTEN = ("Error: accessing tensor output of CUDAGraphs that has been overwritten by a subsequent run. "
               "Stack trace: [Could not find stack trace]. To prevent overwriting, clone the tensor outside of "
               "torch.compile() or call torch.compiler.cudagraph_mark_step_begin() before each model invocation.")
CUDA_GRAPH = "CUDA graph"             # the op of the fallback recorded when a graph runs without one
WARMUP_CALLS = 1                     # calls per input layout run as they are before recording (PyTorch: 1)


class Overwritten:
    """Stands in for the array of a returned output whose memory a later replay wrote: any use raises."""
    __slots__ = ()

    def __getattr__(self, name):
        raise RuntimeError(OVERWRITTEN)

    def __getitem__(self, key):
        raise RuntimeError(OVERWRITTEN)

    def __len__(self):
        raise RuntimeError(OVERWRITTEN)


class Intervals:
    """A set of address ranges [lo, hi), merged and sorted, asked whether a range overlaps it."""

    def __init__(self, ranges=()):
        merged: list = []
        for lo, hi in sorted(ranges):
            if merged and lo <= merged[-1][1]:
                merged[-1][1] = max(merged[-1][1], hi)
            else:
                merged.append([lo, hi])
        self.lows = [lo for lo, _ in merged]
        self.highs = [hi for _, hi in merged]

    def overlaps(self, lo: int, hi: int) -> bool:
        i = bisect.bisect_right(self.lows, lo) - 1
        if i >= 0 and self.highs[i] > lo:
            return True
        return i + 1 < len(self.lows) and self.lows[i + 1] < hi

    def contains(self, lo: int, hi: int) -> bool:
        i = bisect.bisect_right(self.lows, lo) - 1
        return i >= 0 and self.highs[i] >= hi


# ---- the device side ---------------------------------------------------------------------------------
graph_backends: dict = {"cuda": CupyGraphs}      # device type -> GraphBackend class (tests add "cpu")
_trees: dict = {}


def tree_for(device) -> "Tree | None":
    """The device's recordings and pool (None where no GraphBackend serves the device type)."""
    t = _trees.get(device)
    if t is None:
        cls = graph_backends.get(device.type)
        if cls is None:
            return None
        t = _trees[device] = Tree(cls(device))
    return t


def reset() -> None:
    """Forget every recording and pool (tests; `flambeau.compiler.reset`)."""
    _trees.clear()


# ---- recordings --------------------------------------------------------------------------------------
class Recording:
    """One captured call: how each input reaches the graph, what each output is, the memory written."""

    def __init__(self, tree, graph, inputs: list, outputs: list, footprint: Intervals, device, flag, single):
        self.tree, self.graph, self.inputs, self.outputs = tree, graph, inputs, outputs
        self.footprint, self.device, self.flag, self.single = footprint, device, flag, single
        self.pool_indices = [i for i, o in enumerate(outputs) if o[0] == "array" and o[2]]
        self.live: list = []                 # (output index, weakref to the Tensor last returned for it)
        self.clobbers: list = []             # (recording, output index): outputs in my footprint (mine too)
        self.base_refs: dict = {}            # output index -> references to its array held here
        self._clobbered = None

    def array(self, i: int):
        return self.outputs[i][1]

    def refs(self, i: int) -> int:
        """References to output i's array (measured the same way when recording and before a replay)."""
        return sys.getrefcount(self.outputs[i][1])

    def fits(self, args) -> bool:
        """Whether every static input is where it was recorded."""
        ptr = self.tree.backend.ptr
        for (kind, where), a in zip(self.inputs, args):
            if kind == "static" and ptr(a._data) != where:
                return False
        return True

    def still_referenced(self) -> bool:
        """Whether memory this replay overwrites is held by something other than the Tensors we returned."""
        for rec, hit in self.clobbered():
            ours = rec.live_counts()
            for i in hit:
                if rec.refs(i) - rec.base_refs[i] - ours.get(i, 0) > 0:
                    return True
        return False

    def live_counts(self) -> dict:
        """{output index: Tensors returned for it that are alive and still hold its array}."""
        counts: dict = {}
        for i, ref in self.live:
            t = ref()
            if t is not None and t._data is self.outputs[i][1]:
                counts[i] = counts.get(i, 0) + 1
        return counts

    def replay(self, args) -> tuple:
        be = self.tree.backend
        for (kind, buf), a in zip(self.inputs, args):
            if kind == "copy":
                be.copy(buf, a._data)
        for rec, hit in self.clobbered():
            rec.kill_outputs(hit)
        be.launch(self.graph)
        if self.flag is not None:
            device_checks.flag_pending(self.flag)
        stats["replays"] += 1
        return self.results(args)

    def clobbered(self) -> list:
        """[(recording, {its output indices in my footprint})], cached until the next recording."""
        if self._clobbered is None:
            by = {}
            for rec, i in self.clobbers:
                by.setdefault(id(rec), (rec, set()))[1].add(i)
            self._clobbered = list(by.values())
        return self._clobbered

    def kill_outputs(self, hit: set) -> None:
        """My outputs `hit` are overwritten: the Tensors returned for them die."""
        keep = []
        for i, ref in self.live:
            t = ref()
            if t is None:
                continue
            if i in hit:
                t._data = Overwritten()
            else:
                keep.append((i, ref))
        self.live = keep

    def results(self, args) -> tuple:
        out, live = [], []
        for i, o in enumerate(self.outputs):
            if o[0] == "input":
                out.append(args[o[1]])
            elif o[0] == "array":
                t = Tensor._make(o[1], self.device, o[3])
                out.append(t)
                if o[2]:
                    live.append((i, weakref.ref(t)))
            else:
                out.append(o[1])
        self.live.extend(live)
        return out[0] if self.single else tuple(out)


class Tree:
    """Recordings of one device sharing its private pool (PyTorch's CUDA graph tree, flattened)."""

    def __init__(self, backend):
        self.backend = backend
        self.recordings: list = []
        self.static_memory = Intervals()
        self._static_ranges: list = []

    def drop(self, rec: Recording) -> None:
        """Forget a recording replaced by a new one (its graph is never launched again)."""
        self.recordings.remove(rec)
        for other in self.recordings:
            other.clobbers = [(r, i) for r, i in other.clobbers if r is not rec]
            other._clobbered = None

    def is_static_memory(self, a) -> bool:
        lo, hi = self.backend.span(a)
        return self.static_memory.contains(lo, hi)

    def add_static(self, ranges) -> None:
        self._static_ranges.extend(ranges)
        self.static_memory = Intervals(self._static_ranges)

    def record(self, run, args: list, static: list, device, flag) -> Recording:
        """Capture `run(*args)` (non-static tensors replaced by copies in the pool) into a Recording,
        launch it once and return it."""
        be = self.backend
        allocs: list = []
        inputs, capture_args = [], []
        with be.allocating(allocs):
            for a, st in zip(args, static):
                if not isinstance(a, Tensor):
                    inputs.append(("value", a))
                    capture_args.append(a)
                elif st:
                    inputs.append(("static", be.ptr(a._data)))
                    capture_args.append(a)
                else:
                    buf = be.empty_like(a._data)
                    be.copy(buf, a._data)
                    inputs.append(("copy", buf))
                    capture_args.append(Tensor._make(buf, device, a._dtype))
        graph, result = be.capture(functools.partial(run, *capture_args), allocs)
        single = not isinstance(result, (tuple, list))
        footprint = Intervals(allocs)
        by_id = {id(a): k for k, a in enumerate(capture_args) if isinstance(a, Tensor)}
        outputs = [_output_kind(o, by_id, footprint, be) for o in ((result,) if single else result)]
        del result, capture_args
        rec = Recording(self, graph, inputs, outputs, footprint, device, flag, single)
        for other in self.recordings + [rec]:
            rec.clobbers += [(other, i) for i in other.pool_indices if footprint.overlaps(*be.span(other.array(i)))]
            if other is not rec:
                other.clobbers += [(rec, i) for i in rec.pool_indices
                                   if other.footprint.overlaps(*be.span(rec.array(i)))]
                other._clobbered = None
        rec.base_refs = {i: rec.refs(i) for i in rec.pool_indices}
        self.recordings.append(rec)
        self.add_static(allocs)
        stats["recordings"] += 1
        be.launch(graph)
        if flag is not None:
            device_checks.flag_pending(flag)
        return rec


def _output_kind(o, by_id: dict, footprint: Intervals, be) -> tuple:
    """How a replay returns a captured output: ("input", position) for an input returned as it is,
    ("array", array, in the pool, dtype) for a tensor, ("value", v) for anything else."""
    if isinstance(o, Tensor) and id(o) in by_id:
        return ("input", by_id[id(o)])
    if isinstance(o, Tensor):
        return ("array", o._data, footprint.overlaps(*be.span(o._data)), o._dtype)
    return ("value", o)


# ---- the wrapper around a compiled graph ------------------------------------------------------------
def _random_extern(ek) -> bool:
    """Whether an extern draws random numbers (its seed would be fixed in the graph): a
    nondeterministic op, unless its `dropout_p` is 0."""
    op = ek.op
    if not getattr(op, "nondeterministic", False):
        return False
    names = [a.name for a in op._schema.args]
    if "dropout_p" in names:
        k = names.index("dropout_p")
        p = ek.kwargs.get("dropout_p", ek.args[k] if k < len(ek.args) else 0.0)
        return p != 0
    return True


def random_ops(externs) -> list:
    """The names of the random ops among a graph's extern nodes (what a CUDA graph can't replay)."""
    return sorted({getattr(ek.op, "name", str(ek.op)) for ek in externs if _random_extern(ek)})


def why_not(compiled) -> str | None:
    """Why a compiled graph cannot be recorded at all (None: it can)."""
    art = compiled.artifact
    if art is None:
        return f"the graph runs eagerly ({compiled.eager_reason})"
    if art.random_ops:
        return f"random ops {art.random_ops} (a replay would repeat the recorded random numbers)"
    return None


class CUDAGraphed:
    """The callable `compile_fx` returns under `config.triton_cudagraphs` (see module docstring)."""

    def __init__(self, compiled, device, static_inputs=()):
        self.compiled = compiled
        self.device = device
        self.static_positions = frozenset(static_inputs)
        self.tree = tree_for(device)
        self.recordings: dict = {}           # input layout -> Recording
        self.calls: dict = {}                # input layout -> calls seen
        self.failed: dict = {}               # input layout -> why it can't be recorded
        self.told: set = set()
        self.skip = None if self.tree is not None else f"graphs on {device.type} are not CUDA graphs"
        if self.skip is None:
            self.skip = why_not(compiled)
        if self.skip is not None:
            self._tell(self.skip)

    def __getattr__(self, name):             # kernel_count, source, artifact, ...: the compiled graph's
        return getattr(self.compiled, name)

    def _tell(self, why: str) -> None:
        if why not in self.told:             # one count and one FLAMBEAU_LOGS=fallbacks line per graph and reason
            self.told.add(why)
            record_fallback(CUDA_GRAPH, why)

    def _eager(self, args, why: str):
        self._tell(why)
        stats["eager_calls"] += 1
        return self.compiled(*args)

    def __call__(self, *args):
        if self.skip is not None:
            return self.compiled(*args)
        key = tuple((a._data.shape, a._data.strides, a._dtype, a._device) if isinstance(a, Tensor) else (type(a), a)
                    for a in args)
        rec = self.recordings.get(key)
        if rec is not None:
            if not rec.fits(args):
                return self._record(key, args, "a static input moved")
            if rec.still_referenced():
                return self._eager(args, "memory of an earlier replay's outputs is still referenced (a kept .grad, "
                                         "a view of an output), so this call runs without the graph")
            return rec.replay(args)
        why = self.failed.get(key)
        if why is not None:
            return self._eager(args, why)
        n = self.calls[key] = self.calls.get(key, 0) + 1
        if n <= WARMUP_CALLS:
            return self.compiled(*args)
        return self._record(key, args)

    def _record(self, key, args, again: str | None = None):
        why = self._not_recordable(args)
        if why is None and key not in self.recordings and len(self.recordings) >= config.cudagraph_max_recordings:
            why = f"more than cudagraph_max_recordings={config.cudagraph_max_recordings} input layouts"
        if why is None:
            try:
                rec = self.tree.record(self.compiled, list(args), self._flags, self.device,
                                       self.compiled.artifact.device_flag)
            except CaptureFailed as e:
                why = f"capture failed: {e}"
        old = self.recordings.pop(key, None)
        if old is not None:
            self.tree.drop(old)
        if why is not None:
            self.failed[key] = why
            return self._eager(args, why)
        if again is not None:
            log.debug("cudagraphs: graph %s recorded again: %s", self.compiled.id, again)
        self.recordings[key] = rec
        return rec.results(args)

    def _not_recordable(self, args) -> str | None:
        """Why these arguments can't be recorded (None: they can; `self._flags` then says which are static)."""
        flags = []
        for k, a in enumerate(args):
            if isinstance(a, Tensor) and a._device != self.device:
                return f"an input on {a._device} (CUDA graphs take only {self.device} tensors)"
            flags.append(isinstance(a, Tensor) and self._is_static(k, a))
        mutated = [k for k in self.compiled.artifact.mutated_inputs if not flags[k]]
        if mutated:
            return f"it writes inputs {mutated}, which are neither parameters nor buffers"
        self._flags = flags
        return None

    def _is_static(self, k: int, a: Tensor) -> bool:
        return (k in self.static_positions or isinstance(a, Parameter)
                or "_dynamo_static_input_type" in a.__dict__ or self.tree.is_static_memory(a._data))


def cudagraphify(compiled, device, static_inputs=()) -> CUDAGraphed:
    """`compiled` wrapped to record and replay CUDA graphs (see module docstring)."""
    return CUDAGraphed(compiled, device, static_inputs)
