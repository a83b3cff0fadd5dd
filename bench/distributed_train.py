"""GPT-2 trained with DistributedDataParallel on N processes vs one process, flambeau next to PyTorch.

    python bench/distributed_train.py [--device cuda] [--nproc 2] [--systems flambeau,torch]
                                      [--modes eager,compiled] [--steps 10] [--warmup 3] [--small]
                                      [--parallel ddp|fsdp2|tp] [--checkpoint DIR] [--profile DIR]
                                      [--trace DIR] [--layers N] [--count-calls] [--bucket-cap-mb MB]
                                      [--repeat N]

Each configuration is a launch of this file as a worker: under `python -m flambeau.distributed.run`
(`import torch` is flambeau there) or `python -m torch.distributed.run` (PyTorch), one process per GPU
(cuda: NCCL, bf16 autocast) or per CPU core (cpu: gloo, float32). The model is bench/gpu_models.py's
GPT-2 124M (`--small`: a 2-layer GPT of width 64, for checking this script's logic on CPU), seeded
identically in every process, AdamW. Every step draws one global batch of nproc x B sequences of T
tokens (B 8, T 1024; `--small`: B 2, T 32); configurations:

    ref     1 process on the whole global batch (the losses DDP must reproduce)
    single  1 process on B sequences (the 1-GPU throughput for scaling efficiency)
    ddp     nproc processes, DDP, each on its B sequences of the global batch
    ddp1    1 process in DDP (a process group of one): DDP's own cost (hooks, buckets, a compiled graph's
            split, launches of collectives with no peer) without the communication beside `single`

`--parallel fsdp2` replaces DDP by FSDP2 (`fully_shard` on every block, then on the model, over a 1-D
DeviceMesh). `--parallel tp` is 2-way (nproc-way) Megatron tensor parallelism (`parallelize_module`: per
block c_attn and c_fc ColwiseParallel, both c_proj RowwiseParallel; embeddings, norms and the tied head
replicated): every rank trains on the same B sequences, so its losses are compared with `single` (1 process
on those B sequences) and there is no scaling efficiency. c_attn's fused q|k|v rows are reordered first so
each rank's column shard holds its heads' q, k and v (the attention then splits its local output in three:
the same model, its output features permuted). `--checkpoint DIR` runs two configurations instead: `ddp` saves model and optimizer state with
`distributed.checkpoint.save` (`get_state_dict`) after its steps, then trains RESUME_STEPS more steps;
`resume` (1 process) loads that checkpoint into a fresh model and optimizer (`set_state_dict`) and trains the
same RESUME_STEPS steps on the whole global batch; the driver compares their losses.

`compiled` wraps the model in `compile` before DDP (after sharding for FSDP2); `--compile-order outer`
compiles the DDP module instead (PyTorch's recommended order: its DDPOptimizer splits the graph at bucket
boundaries so gradient all-reduces overlap the backward). Each worker prints one JSON
line: ms per step (mean
over --steps after --warmup steps, wall clock between device synchronisations; losses are read after the
timing) and the losses of every step (in DDP the mean over ranks). The driver adds, per system and mode:
the largest relative difference between the ddp and ref losses, the scaling efficiency
(single ms / ddp ms: nproc-process throughput over nproc x 1-process throughput) and, per mode, flambeau's
ddp step time over PyTorch's. Each worker also reports host_ms_per_step (the host's time to queue the timed
steps, before the closing synchronisation: near ms_per_step means the host is the bottleneck). `--profile
DIR`: after the timed steps, rank 0 of each configuration runs PROFILE_STEPS more under cProfile timed by the
process's CPU clock (a loaded machine's waits for the CPU do not count; MPI's busy waits do) and writes the
top functions (by own time, and by cumulative time) to DIR/<system>-<mode>-<config>-<parallel>.txt (all of them
to .pstats beside it: `python3 -m pstats`, or diff two configurations' call counts). `--trace DIR`:
after the timed steps every rank of each configuration records PROFILE_STEPS more under PyTorch's profiler
(bench/stream_timeline.py: kernels by stream, the compute stream's idle gaps, CUDA API calls) into
DIR/<system>-<mode>-<config>-<parallel>-r<rank>.json.gz; read them with `python bench/stream_timeline.py`.
Every worker's host time per step is reported too (host_ms_per_rank: a slow rank's host holds the others'
collectives back), its main thread's CPU time and its voluntary/involuntary context switches per step
(main_thread_cpu_ms_per_rank near host_ms and few involuntary switches: the Python itself ran that long, no
other thread or process took its core); `BENCH_PIN_CPUS="0-3;16-19"` keeps rank i to the i-th CPU list
(`--pin-fastest` sets it for each launch to the CPUs timed fastest just before, one per core). Its process CPU time per step (cpu_ms_per_rank: what a loaded machine's waits for a core
do not inflate; MPI's busy waits count, gloo's blocking waits do not), with the garbage collector's time per step and its full collections in the timed steps
(gc_ms_per_rank, gc_full_per_rank).
`--repeat N`: N rounds of every configuration and system, interleaved; each round's summaries carry
`even_hosts` (every process of that mode, both systems, within EVEN_HOSTS of the fastest's calibration: the
GPU machines' Python speed moves 2x between processes), then the medians over all rounds and over the even
ones (`across_rounds`).
`--count-calls`: after the timed steps rank 0 runs PROFILE_STEPS more counting the Python-level calls (functions
and builtins, `sys.setprofile`) and reports calls_per_step: the ddp/fsdp2 count less single's is what the wrapper
adds a step. `--layers N` sets the block count (`--small --layers 12`: GPT-2's 148 parameters at width 64, the
per-parameter costs of the real model on CPU). `--batch B --seq T` set the sequences per rank and their length:
GPT-2 at `--batch 1 --seq 64` runs the same kernels, launches and collectives (the gradients' sizes do not change)
with little GPU work behind them, so its step time is what the host takes to issue a step.
A configuration that fails prints its error instead.
"""
from __future__ import annotations

import argparse
import gc
import json
import os
import resource
import statistics
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
LAUNCHERS = {"flambeau": "flambeau.distributed.run", "torch": "torch.distributed.run"}
GPT2 = dict(vocab=50257, block=1024, d=768, layers=12, heads=12, batch=8, seq=1024)
SMALL = dict(vocab=96, block=32, d=64, layers=2, heads=2, batch=2, seq=32)
LR = 3e-4
DATA_SEED = 1234
RESUME_STEPS = 2
PROFILE_STEPS = 3
PHASE_STEPS = 10        # steps whose phases (`--phases`) are timed
PROFILE_ROWS = 40


def _tp_attention_forward(torch, heads: int):
    """GPT-2 attention on a column shard of c_attn (rows reordered by `_tensor_parallel`): the local output
    is this rank's heads' q | k | v; the row-parallel c_proj sums the heads' contributions over ranks."""
    F = torch.nn.functional

    def forward(self, x):
        B, T, _ = x.shape
        q, k, v = self.c_attn(x).chunk(3, dim=2)
        width = q.shape[-1]
        local_heads = width * heads // x.shape[-1]
        q, k, v = (z.view(B, T, local_heads, width // local_heads).transpose(1, 2) for z in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.drop(self.c_proj(y.transpose(1, 2).contiguous().view(B, T, width)))
    return forward


def _tensor_parallel(torch, model, cfg: dict, world_size: int, cuda: bool) -> None:
    """Megatron-style tensor parallelism of every block over a 1-D mesh of `world_size` ranks."""
    import types
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module
    mesh = init_device_mesh("cuda" if cuda else "cpu", (world_size,))
    d = cfg["d"]
    order = [part * d + r * (d // world_size) + i for r in range(world_size) for part in range(3)
             for i in range(d // world_size)]
    index = torch.tensor(order, device=model.h[0].attn.c_attn.weight.device)
    forward = _tp_attention_forward(torch, cfg["heads"])
    with torch.no_grad():
        for block in model.h:
            attn = block.attn
            attn.c_attn.weight.copy_(attn.c_attn.weight.index_select(0, index))
            attn.c_attn.bias.copy_(attn.c_attn.bias.index_select(0, index))
            attn.forward = types.MethodType(forward, attn)
    for block in model.h:
        parallelize_module(block, mesh, {"attn.c_attn": ColwiseParallel(), "attn.c_proj": RowwiseParallel(),
                                         "c_fc": ColwiseParallel(), "c_proj": RowwiseParallel()})


def _parallelize(torch, model, args, cfg: dict, world_size: int, cuda: bool, local: int):
    """The model wrapped for `world_size` processes (DDP, FSDP2 or TP), compiled in `compiled` mode."""
    if world_size > 1 and args.parallel == "tp":
        _tensor_parallel(torch, model, cfg, world_size, cuda)
    if world_size > 1 and args.parallel == "fsdp2":
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import fully_shard
        mesh = init_device_mesh("cuda" if cuda else "cpu", (world_size,))
        for block in model.h:
            fully_shard(block, mesh=mesh)
        fully_shard(model, mesh=mesh)
    outer = args.compile_order == "outer"
    if args.mode == "compiled" and not outer:
        model = torch.compile(model)
    if (world_size > 1 or args.config == "ddp1") and args.parallel == "ddp":
        cap = {"bucket_cap_mb": args.bucket_cap_mb} if args.bucket_cap_mb else {}
        model = torch.nn.parallel.DistributedDataParallel(model, device_ids=[local] if cuda else None, **cap)
    if args.mode == "compiled" and outer:           # the DDP module compiled: the DDPOptimizer's graph split
        model = torch.compile(model)
    return model


def _param_groups(torch, model) -> list:
    """The optimizer's parameter groups: under TP the DTensor parameters (the sharded layers) apart from the
    replicated plain ones, since a foreach optimizer step cannot mix DTensors and Tensors in one group
    (PyTorch's AdamW raises "got mixed torch.Tensor and DTensor" on cuda, where foreach is its default)."""
    from torch.distributed.tensor import DTensor
    params = list(model.parameters())
    groups = [[p for p in params if isinstance(p, DTensor)], [p for p in params if not isinstance(p, DTensor)]]
    return [{"params": g} for g in groups if g]


def _checkpoint_state(torch, model, opt):
    from torch.distributed.checkpoint.state_dict import get_state_dict
    model_sd, optim_sd = get_state_dict(model, opt)
    return {"model": model_sd, "optim": optim_sd}


def _save(torch, model, opt, folder: str) -> None:
    import torch.distributed.checkpoint as dcp
    dcp.save(_checkpoint_state(torch, model, opt), checkpoint_id=folder)


def _load(torch, model, opt, folder: str) -> None:
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import set_state_dict
    state = _checkpoint_state(torch, model, opt)
    dcp.load(state, checkpoint_id=folder)
    set_state_dict(model, opt, model_state_dict=state["model"], optim_state_dict=state["optim"])


def worker(args) -> None:
    import numpy as np
    import torch
    import torch.distributed as dist
    sys.path.insert(0, ROOT)
    from bench import gpu_models, measure
    cfg = _config(args)
    cuda = args.device == "cuda"
    local = int(os.environ.get("LOCAL_RANK", "0"))
    pins = os.environ.get("BENCH_PIN_CPUS")          # "0-3;16-19": rank i keeps to the i-th CPU list
    if pins:
        os.sched_setaffinity(0, _cpu_list(pins.split(";")[local % len(pins.split(";"))]))
    if cuda:
        torch.cuda.set_device(local)
    device = f"cuda:{local}" if cuda else "cpu"
    world_size = int(os.environ.get("WORLD_SIZE", "1"))
    if world_size > 1 or args.config == "ddp1":
        options = {"pg_options": dist.ProcessGroupNCCL.Options(is_high_priority_stream=True)} \
            if cuda and args.nccl_high_priority else {}
        dist.init_process_group("nccl" if cuda else "gloo", **options)
    rank = dist.get_rank() if world_size > 1 else 0
    torch.manual_seed(0)
    model = gpu_models.gpt(torch, vocab=cfg["vocab"], block=cfg["block"], d=cfg["d"], layers=cfg["layers"],
                           heads=cfg["heads"]).to(device)
    model = _parallelize(torch, model, args, cfg, world_size, cuda, local)
    opt = torch.optim.AdamW(_param_groups(torch, model), lr=LR, weight_decay=0.1)
    rows = cfg["batch"] * args.batch_factor
    rng = np.random.default_rng(DATA_SEED)
    steps = args.warmup + args.steps
    data = rng.integers(0, cfg["vocab"], (steps + RESUME_STEPS, 2, args.global_batch, cfg["seq"]))
    first = 0 if args.parallel == "tp" else rank * rows          # TP: every rank on the same rows
    mine = data[:, :, first:first + rows]
    batches = [(torch.tensor(mine[s, 0], device=device), torch.tensor(mine[s, 1], device=device))
               for s in range(steps + RESUME_STEPS)]
    amp = torch.bfloat16 if cuda else None
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    losses = []
    if args.config == "resume":
        _load(torch, model, opt, args.checkpoint)
        losses = [gpu_models.train_step(torch, model, opt, *batches[s], amp).detach()
                  for s in range(steps, steps + RESUME_STEPS)]
        print(json.dumps({"workload": _workload(args), "system": _system(torch), "mode": args.mode,
                          "config": "resume", "world_size": 1,
                          "losses": [float(v) for v in torch.stack(losses).float().tolist()]}), flush=True)
        return
    for s in range(args.warmup):
        losses.append(gpu_models.train_step(torch, model, opt, *batches[s], amp).detach())
    sync()
    calibration = measure.host_calibration_ms(repeats=3)   # this rank's Python speed, beside the others'
    if world_size > 1:          # every rank starts its clock together: a rank whose calibration ran faster would
        dist.barrier()          # time its first steps waiting for the others (0.3 s over 30 steps at 100 vs 200 ms)
    gc_clock = _GcClock()
    start, cpu_start = time.perf_counter(), time.process_time()
    thread_start, usage = time.thread_time(), resource.getrusage(resource.RUSAGE_SELF)
    for s in range(args.warmup, steps):
        losses.append(gpu_models.train_step(torch, model, opt, *batches[s], amp).detach())
    host_ms = (time.perf_counter() - start) / args.steps * 1e3
    sync()
    ms = (time.perf_counter() - start) / args.steps * 1e3
    cpu_ms = (time.process_time() - cpu_start) / args.steps * 1e3
    thread_ms = (time.thread_time() - thread_start) / args.steps * 1e3
    after = resource.getrusage(resource.RUSAGE_SELF)
    switches = [(after.ru_nvcsw - usage.ru_nvcsw) / args.steps, (after.ru_nivcsw - usage.ru_nivcsw) / args.steps]
    gc_clock.stop()
    if args.profile:
        _profile(args, torch, rank, lambda: gpu_models.train_step(torch, model, opt, *batches[-1], amp), sync)
    calls = _count_calls(lambda: gpu_models.train_step(torch, model, opt, *batches[-1], amp), sync) \
        if args.count_calls else None
    if args.trace:
        _trace(args, torch, rank, local, lambda: gpu_models.train_step(torch, model, opt, *batches[-1], amp))
    phases = _phases(torch, model, opt, batches[-1], amp, cuda) if args.phases else None
    host = [host_ms, gc_clock.ms / args.steps, gc_clock.full, cpu_ms, thread_ms, switches, calibration, phases]
    per_rank = [host]
    if world_size > 1:
        per_rank = [None] * world_size
        dist.all_gather_object(per_rank, host)
    if args.checkpoint:
        _save(torch, model, opt, args.checkpoint)
        losses = [gpu_models.train_step(torch, model, opt, *batches[s], amp).detach()
                  for s in range(steps, steps + RESUME_STEPS)]
    stacked = torch.stack(losses).float()
    if world_size > 1:
        dist.all_reduce(stacked, op=dist.ReduceOp.AVG if cuda else dist.ReduceOp.SUM)
        if not cuda:
            stacked = stacked / world_size
    if rank == 0:
        print(json.dumps({"workload": _workload(args), "system": _system(torch),
                          "mode": args.mode, "config": args.config, "device": args.device,
                          "world_size": world_size, "batch_per_rank": rows, "seq": cfg["seq"],
                          "ms_per_step": ms, "host_ms_per_step": host_ms, "host_ms_per_rank": [r[0] for r in per_rank],
                          "gc_ms_per_rank": [r[1] for r in per_rank], "gc_full_per_rank": [r[2] for r in per_rank],
                          "cpu_ms_per_rank": [r[3] for r in per_rank],
                          "main_thread_cpu_ms_per_rank": [r[4] for r in per_rank],
                          "context_switches_per_step_per_rank": [r[5] for r in per_rank],
                          "host_calibration_ms_per_rank": [r[6] for r in per_rank],
                          "tokens_per_s": (1 if args.parallel == "tp" else world_size) * rows * cfg["seq"] / ms * 1e3,
                          "cpus": len(os.sched_getaffinity(0)),
                          **({"calls_per_step": calls} if calls is not None else {}),
                          **({"phases_ms_per_rank": [r[7] for r in per_rank]} if args.phases else {}),
                          "losses": [float(v) for v in stacked.cpu().tolist()]}), flush=True)
    if world_size > 1:
        dist.destroy_process_group()


def _phases(torch, model, opt, batch, amp, cuda: bool) -> dict:
    """Device time of each phase of a step (median over PHASE_STEPS steps, ms), from CUDA events recorded
    on the current stream (cpu: host clock readings): forward; backward until the last parameter gradient
    is computed (an event after each backward node that hands gradients to parameters, the last one kept:
    before those accumulations and DDP's post-accumulate hooks; hooks on the nodes, not the parameters, whose
    hooks would keep DDP from leaving its last waits to the optimizer); the rest of backward (the
    accumulations and, in DDP, the reductions waited for when backward ends); optimizer step (with the
    reductions DDP left to it); zero_grad and the host's lead into the next step."""
    from bench import gpu_models
    Event = torch.cuda.Event if cuda else _HostMark
    last = {}

    def mark(step: dict, name: str, loss=None) -> None:
        step[name] = _recorded(Event)
        if loss is not None:
            for node in _gradient_nodes(loss.grad_fn):
                node.register_hook(lambda *args: last.__setitem__("grads", _recorded(Event)))
    marks = []
    for _ in range(PHASE_STEPS + 1):
        step = {"start": _recorded(Event)}
        gpu_models.train_step(torch, model, opt, *batch, amp, mark=lambda *a, step=step: mark(step, *a))
        step["grads"] = last.pop("grads")
        marks.append(step)
    if cuda:
        torch.cuda.synchronize()
    order = ("start", "forward", "grads", "backward", "step")
    names = ("forward", "backward_compute", "backward_wait", "optimizer", "zero_grad_and_gap")
    out = {n: [] for n in names}
    for step, after in zip(marks, marks[1:]):
        points = [step[k] for k in order] + [after["start"]]
        for n, a, b in zip(names, points, points[1:]):
            out[n].append(a.elapsed_time(b))
    return {n: statistics.median(v) for n, v in out.items()}


def _gradient_nodes(root) -> list:
    """The backward nodes under `root` that hand a gradient to a parameter (an AccumulateGrad among their
    next functions)."""
    seen, stack, out = set(), [root], []
    while stack:
        node = stack.pop()
        if node is None or id(node) in seen:
            continue
        seen.add(id(node))
        nexts = [n for n, _ in node.next_functions]
        if any(type(n).__name__ == "AccumulateGrad" for n in nexts if n is not None):
            out.append(node)
        stack.extend(n for n in nexts if n is not None and type(n).__name__ != "AccumulateGrad")
    return out


def _recorded(Event):
    e = Event(enable_timing=True)
    e.record()
    return e


class _HostMark:
    """A cpu run's stand-in for a timing CUDA event: the host clock when recorded."""

    def __init__(self, enable_timing: bool = True):
        self.t = None

    def record(self) -> None:
        self.t = time.perf_counter()

    def elapsed_time(self, end) -> float:
        return (end.t - self.t) * 1e3


def _profile(args, torch, rank: int, step, sync) -> None:
    """PROFILE_STEPS steps under cProfile on process CPU time (every rank steps; rank 0 writes the tables)."""
    import cProfile
    import io
    import pstats
    prof = cProfile.Profile(time.process_time)
    sync()
    prof.enable()
    for _ in range(PROFILE_STEPS):
        step()
    sync()
    prof.disable()
    if rank != 0:
        return
    out = io.StringIO()
    stats = pstats.Stats(prof, stream=out)
    stats.sort_stats("tottime").print_stats(PROFILE_ROWS)
    stats.sort_stats("cumulative").print_stats(PROFILE_ROWS)
    os.makedirs(args.profile, exist_ok=True)
    name = f"{_system(torch)}-{args.mode}-{args.config}-{args.parallel}.txt"
    with open(os.path.join(args.profile, name), "w") as f:
        f.write(f"{PROFILE_STEPS} steps, times are process CPU seconds\n" + out.getvalue())
    prof.dump_stats(os.path.join(args.profile, name[:-len(".txt")] + ".pstats"))


def _count_calls(step, sync) -> float:
    """Python-level calls (Python functions and builtins) per step over PROFILE_STEPS steps."""
    n = [0]

    def count(frame, event, arg):
        if event == "call" or event == "c_call":
            n[0] += 1
    sync()
    sys.setprofile(count)
    for _ in range(PROFILE_STEPS):
        step()
    sys.setprofile(None)
    sync()
    return n[0] / PROFILE_STEPS


class _GcClock:
    """Time the cyclic garbage collector takes while this exists (`gc.callbacks`), and how many of its
    collections were full ones (generation 2): a pause on one rank holds every rank's collectives back."""

    def __init__(self) -> None:
        self.ms, self.full, self._start = 0.0, 0, 0.0
        gc.callbacks.append(self._on_gc)

    def _on_gc(self, phase: str, info: dict) -> None:
        if phase == "start":
            self._start = time.perf_counter()
            return
        self.ms += (time.perf_counter() - self._start) * 1e3
        self.full += info["generation"] == 2

    def stop(self) -> None:
        gc.callbacks.remove(self._on_gc)


def _trace(args, torch, rank: int, local: int, step) -> None:
    """PROFILE_STEPS steps of every rank under PyTorch's profiler (bench/stream_timeline.py); in a flambeau
    worker `import torch` is flambeau until the alias is lifted, so the real PyTorch can profile."""
    if _system(torch) == "flambeau":
        from flambeau import compat
        compat.disable()
    from bench import stream_timeline
    os.makedirs(args.trace, exist_ok=True)
    name = f"{_system(torch)}-{args.mode}-{args.config}-{args.parallel}-r{rank}.json.gz"
    stream_timeline.record(step, PROFILE_STEPS, os.path.join(args.trace, name), local)


def _cpu_list(text: str) -> set:
    """CPUs of a list like "0-3,8": the affinity a rank keeps to under BENCH_PIN_CPUS."""
    cpus = set()
    for part in text.split(","):
        lo, _, hi = part.partition("-")
        cpus.update(range(int(lo), int(hi or lo) + 1))
    return cpus


def _system(torch) -> str:
    return "flambeau" if torch.__name__ == "flambeau" else "torch"


def _workload(args) -> str:
    return ("gpt-small-" if args.small else "gpt2-") + args.parallel + ("-checkpoint" if args.checkpoint else "")


def _config(args) -> dict:
    """The model and batch sizes: GPT-2's (or --small's), with --layers, --batch and --seq applied."""
    over = {k: getattr(args, k) for k in ("layers", "batch", "seq") if getattr(args, k)}
    return dict(SMALL if args.small else GPT2, **over)


def _launch(system: str, mode: str, config: str, args, timeout: float) -> dict:
    nproc = args.nproc if config == "ddp" else 1
    factor = args.nproc if config in ("ref", "resume") else 1
    cmd = [sys.executable, "-m", LAUNCHERS[system], "--nproc-per-node", str(nproc), os.path.abspath(__file__),
           "--worker", "--device", args.device, "--mode", mode, "--config", config, "--steps", str(args.steps),
           "--warmup", str(args.warmup), "--batch-factor", str(factor),
           "--global-batch", str(args.nproc * _config(args)["batch"]),
           "--parallel", args.parallel, "--compile-order", args.compile_order] + (["--small"] if args.small else []) + \
        (["--profile", os.path.abspath(args.profile)] if args.profile else []) + \
        (["--trace", os.path.abspath(args.trace)] if args.trace else []) + \
        (["--layers", str(args.layers)] if args.layers else []) + (["--count-calls"] if args.count_calls else []) + \
        (["--batch", str(args.batch)] if args.batch else []) + (["--seq", str(args.seq)] if args.seq else []) + \
        (["--phases"] if args.phases else []) + (["--nccl-high-priority"] if args.nccl_high_priority else []) + \
        (["--bucket-cap-mb", str(args.bucket_cap_mb)] if args.bucket_cap_mb else []) + \
        (["--checkpoint", os.path.join(args.checkpoint, system)] if args.checkpoint else [])
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""), NCCL_NVLS_ENABLE="0",
               OMP_NUM_THREADS=os.environ.get("OMP_NUM_THREADS", "1"))
    base = {"workload": _workload(args), "system": system, "mode": mode, "config": config}
    pinned = {}
    if args.pin_fastest:
        pinned["pinned_cpus"] = fastest_cpus(nproc)
        env["BENCH_PIN_CPUS"] = ";".join(str(c) for c, _ in pinned["pinned_cpus"])
        base.update(pinned)
    try:
        p = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout, cwd=ROOT)
    except subprocess.TimeoutExpired:
        return dict(base, error=f"timed out after {timeout:.0f} s")
    lines = [ln for ln in p.stdout.splitlines() if ln.startswith("{")]
    if p.returncode != 0 or not lines:
        text = (p.stderr or p.stdout).strip().splitlines()
        errors = [ln.strip() for ln in text if "Error" in ln and "error_file" not in ln][-2:]
        return dict(base, error=f"rc {p.returncode}: " + " | ".join(errors + text[-4:]))
    return dict(json.loads(lines[-1]), **pinned)


def fastest_cpus(n: int, work: int = 50_000) -> list:
    """The `n` CPUs of this process's affinity on which `measure.host_calibration_ms(work)` runs fastest now
    (best of two runs each, this process moved onto each CPU in turn), no two hyperthreads of one core
    where the affinity allows: [(cpu, ms)]. `--pin-fastest` keeps rank i to the i-th (BENCH_PIN_CPUS): the
    GPU machine's CPUs run Python up to 2x apart, and the slowness moves between CPUs over minutes."""
    sys.path.insert(0, ROOT)
    from bench import measure
    allowed = sorted(os.sched_getaffinity(0))
    timed = []
    try:
        for cpu in allowed:
            os.sched_setaffinity(0, {cpu})
            timed.append((measure.host_calibration_ms(work, repeats=2), cpu))
    finally:
        os.sched_setaffinity(0, allowed)
    chosen, taken = [], set()
    for ms, cpu in sorted(timed):
        if cpu not in taken:
            chosen.append((cpu, ms))
            taken |= _siblings(cpu)
    chosen += [(cpu, ms) for ms, cpu in sorted(timed) if all(cpu != c for c, _ in chosen)]
    return chosen[:n]


def _siblings(cpu: int) -> set:
    """The CPUs sharing `cpu`'s core (its hyperthreads, itself included); {cpu} where the kernel does not say."""
    try:
        with open(f"/sys/devices/system/cpu/cpu{cpu}/topology/thread_siblings_list") as f:
            return _cpu_list(f.read().strip()) | {cpu}
    except OSError:
        return {cpu}


def _summaries(results: list, systems: list, modes: list, parallel: str) -> list:
    out = []
    get = {(r["system"], r["mode"], r["config"]): r for r in results if "error" not in r}
    for system in systems:
        for mode in modes:
            ref, single, ddp = (get.get((system, mode, c)) for c in ("ref", "single", "ddp"))
            row = {"summary": f"{parallel}-vs-one-process", "system": system, "mode": mode}
            resume = get.get((system, mode, "resume"))
            if resume and ddp:
                row["max_rel_loss_diff_after_resume"] = max(abs(a - b) / max(abs(b), 1e-12) for a, b in
                                                            zip(resume["losses"], ddp["losses"][-RESUME_STEPS:]))
            same = single if parallel == "tp" else ref          # the 1-process run on the same rows
            if same and ddp:
                row["max_rel_loss_diff"] = max(abs(a - b) / max(abs(b), 1e-12)
                                               for a, b in zip(ddp["losses"], same["losses"]))
            if single and ddp and parallel == "tp":
                row["speedup_over_one_process"] = single["ms_per_step"] / ddp["ms_per_step"]
            elif single and ddp:
                row["scaling_efficiency"] = single["ms_per_step"] / ddp["ms_per_step"]
            out.append(row)
    for mode in modes:
        f, t = get.get(("flambeau", mode, "ddp")), get.get(("torch", mode, "ddp"))
        if f and t and "ms_per_step" in f and "ms_per_step" in t:
            out.append({"summary": "flambeau-vs-torch", "mode": mode, "parallel": parallel,
                        "ms": [f["ms_per_step"], t["ms_per_step"]], "ratio": f["ms_per_step"] / t["ms_per_step"]})
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--device", choices=("cpu", "cuda"), default="cuda")
    p.add_argument("--nproc", type=int, default=2)
    p.add_argument("--systems", default="flambeau,torch")
    p.add_argument("--modes", default="eager,compiled")
    p.add_argument("--configs", default="ddp,single,ref", help="run in this order (each for every system)")
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--small", action="store_true")
    p.add_argument("--parallel", choices=("ddp", "fsdp2", "tp"), default="ddp")
    p.add_argument("--compile-order", choices=("inner", "outer"), default="inner",
                   help="compiled mode: compile the model before wrapping it in DDP (inner) or the DDP module "
                        "(outer: PyTorch's recommended order, where the DDPOptimizer splits the graph at buckets)")
    p.add_argument("--profile", default="", help="cProfile tables of rank 0 of each configuration into DIR")
    p.add_argument("--trace", default="", help="every rank's device timeline (PyTorch's profiler) into DIR")
    p.add_argument("--layers", type=int, default=0, help="blocks of the GPT (default: 12, --small: 2)")
    p.add_argument("--batch", type=int, default=0, help="sequences per rank (default: 8, --small: 2)")
    p.add_argument("--seq", type=int, default=0, help="tokens per sequence (default: 1024, --small: 32); a tiny batch "
                   "(--batch 1 --seq 64) leaves the GPU little to do: the step time is then the host's cost of a step")
    p.add_argument("--count-calls", action="store_true", help="rank 0's Python-level calls per step")
    p.add_argument("--nccl-high-priority", action="store_true", help="cuda: the NCCL group's collectives on a "
                   "stream of the device's greatest priority (ProcessGroupNCCL.Options(is_high_priority_stream=True))")
    p.add_argument("--phases", action="store_true", help="cuda: every rank's device time per phase of a step "
                   "(forward, backward compute, backward's wait for the reductions, optimizer; CUDA events)")
    p.add_argument("--bucket-cap-mb", type=float, default=0.0, help="DDP's bucket_cap_mb (default: DDP's 25); a small "
                   "cap on the --small model splits a compiled DDP graph in several pieces, as GPT-2's 25 MiB does")
    p.add_argument("--pin-fastest", action="store_true", help="before each launch time every CPU and keep rank i "
                   "to the i-th fastest (BENCH_PIN_CPUS), one per core; each line carries pinned_cpus [(cpu, ms)]")
    p.add_argument("--checkpoint", default="", help="save after the N-process run, resume in 1 process (DIR)")
    p.add_argument("--repeat", type=int, default=1, help="rounds of every configuration and system, interleaved; "
                   "each round's summaries say whether its hosts ran at one speed (even_hosts), and the medians "
                   "over the rounds follow")
    p.add_argument("--budget-s", type=float, default=1e9, help="skip configurations once this much time is spent")
    p.add_argument("--timeout-s", type=float, default=600)
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--mode", default="eager", help=argparse.SUPPRESS)
    p.add_argument("--config", default="ddp", help=argparse.SUPPRESS)
    p.add_argument("--batch-factor", type=int, default=1, help=argparse.SUPPRESS)
    p.add_argument("--global-batch", type=int, default=0, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.worker:
        worker(args)
        return
    systems, modes = args.systems.split(","), args.modes.split(",")
    configs = ["ddp", "resume"] if args.checkpoint else args.configs.split(",")
    start, summaries = time.monotonic(), []
    for rnd in range(args.repeat):
        results = []
        for mode in modes:
            for config in configs:
                for system in systems:
                    left = args.budget_s - (time.monotonic() - start)
                    if left <= 0:
                        r = {"system": system, "mode": mode, "config": config, "error": "skipped: time budget spent"}
                    else:
                        r = _launch(system, mode, config, args, min(args.timeout_s, left))
                    r["round"] = rnd
                    results.append(r)
                    print(json.dumps(r), flush=True)
        for row in _summaries(results, systems, modes, args.parallel):
            row["round"], row["even_hosts"] = rnd, _even_hosts(results, row.get("mode"))
            summaries.append(row)
            print(json.dumps(row), flush=True)
    if args.repeat > 1:
        for row in across_rounds(summaries):
            print(json.dumps(row), flush=True)


EVEN_HOSTS = 1.25       # a round's hosts are even when its slowest rank's calibration is within this of its fastest's


def _even_hosts(results: list, mode: str | None) -> bool:
    """Whether every process of the round's `mode` runs (both systems, every rank) had about one Python speed
    (`host_calibration_ms_per_rank` within EVEN_HOSTS): only such rounds compare the systems' host-bound steps."""
    cal = [c for r in results if r.get("mode") == mode for c in r.get("host_calibration_ms_per_rank") or ()]
    return bool(cal) and max(cal) <= EVEN_HOSTS * min(cal)


def across_rounds(summaries: list) -> list:
    """Per (summary, system, mode): the median of each round's ratio or scaling efficiency, over all rounds
    and over the rounds with even hosts (None when there were none), and the rounds' values."""
    keys = ("ratio", "scaling_efficiency", "speedup_over_one_process")
    groups: dict = {}
    for row in summaries:
        for k in keys:
            if row.get(k) is not None:
                groups.setdefault((row["summary"], row.get("system"), row.get("mode"), k), []).append(
                    (row[k], row.get("even_hosts", False)))
    out = []
    for (summary, system, mode, k), vals in groups.items():
        every = [v for v, _ in vals]
        even = [v for v, e in vals if e]
        out.append({"summary": f"{summary}-across-rounds", "system": system, "mode": mode, "value": k,
                    "median": statistics.median(every), "median_even_hosts": statistics.median(even) if even else None,
                    "rounds": every, "even_rounds": len(even)})
    return out


if __name__ == "__main__":
    main()
