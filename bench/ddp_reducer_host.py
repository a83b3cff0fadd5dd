"""Host time DDP's reducer adds to a training step, without the model's forward and backward.

    python bench/ddp_reducer_host.py [--device cuda] [--small] [--as-view] [--steps 50] [--reps 7] [--train]

One process (world size 1: NCCL on cuda, the host engine on cpu) wraps GPT-2 124M (`--small`: the 12-layer
GPT of width 64, GPT-2's 148 parameters; on cpu the default) in DistributedDataParallel with the default
buckets, then times steps that do only what DDP does around a backward: the forward's `_pre_forward` and
`prepare_for_backward`, the gradients set on the parameters (made once: the model's backward is not run),
every parameter's post-accumulate-grad hook called in reverse registration order (as backward reaches them:
bucket copies, all-reduce launches, the wait and copy back), the gradients dropped (`zero_grad(set_to_none)`).
On cuda nothing is synchronised inside the timed steps, so the time is the host's: the reducer's Python, its
CUDA and NCCL calls. Prints one JSON line: the median over `--reps` of the fastest of `--steps` steps (host
us per step), buckets, parameters. PyTorch's reducer cannot be driven this way (its hooks are C++), so there
is no peer: compare against `bench/distributed_train.py`'s ddp and single host_ms.

`--train`: whole training steps instead (bf16 autocast on cuda, AdamW, batch 1 x 128 tokens so the device
keeps up; --small: 32 tokens), the model with and without DDP alternating in this one process (one host
speed for both), the device synchronised before each step and not inside it: the host ms of each, their difference (what DDP adds
to the host's step), on cuda the multi-tensor address tables uploaded per step (0 for DDP when the gradients
come back at the same addresses every step), and the reducer's gradient copies made one by one (0 when every
gradient is laid out as its bucket view: one batched copy per bucket).
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

SMALL = dict(vocab=96, block=32, d=64, layers=12, heads=2)
GPT2 = dict(vocab=50257, block=1024, d=768, layers=12, heads=12)
WARMUP = 5
TRAIN_BATCH, TRAIN_SEQ = 1, 128


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    p.add_argument("--small", action="store_true")
    p.add_argument("--as-view", action="store_true", help="gradient_as_bucket_view=True")
    p.add_argument("--steps", type=int, default=50)
    p.add_argument("--reps", type=int, default=7)
    p.add_argument("--train", action="store_true", help="whole training steps, with and without DDP")
    args = p.parse_args()
    import flambeau as torch
    import flambeau.distributed as dist
    from bench import gpu_models
    cuda = args.device == "cuda"
    if cuda:
        torch.cuda.set_device(0)
    dist.init_process_group("nccl" if cuda else "gloo", store=dist.HashStore(), rank=0, world_size=1)
    cfg = SMALL if args.small or not cuda else GPT2
    if args.train:
        return _train(args, torch, gpu_models, cfg)
    torch.manual_seed(0)
    model = gpu_models.gpt(torch, **cfg).to(args.device)
    ddp = torch.nn.parallel.DistributedDataParallel(model, gradient_as_bucket_view=args.as_view)
    reducer = ddp.reducer
    params = list(model.parameters())
    grads = [torch.randn(q.shape, device=args.device) for q in params]
    hooks = [(q, fn) for q in reversed(params) for _, fn in q._post_acc_hooks]

    def step() -> None:
        ddp._pre_forward(True)
        reducer.prepare_for_backward([])
        for q, g in zip(params, grads):
            q._grad = g
        for q, fn in hooks:
            fn(q)
        for q in params:
            q._grad = None
    for _ in range(WARMUP):
        step()
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    sync()
    fastest = []
    for _ in range(args.reps):
        times = []
        for _ in range(args.steps):
            t = time.perf_counter()
            step()
            times.append(time.perf_counter() - t)
        sync()
        fastest.append(min(times) * 1e6)
    print(json.dumps({"workload": "ddp-reducer-host", "system": "flambeau-eager", "device": args.device,
                      "model": "gpt-small-12" if cfg is SMALL else "gpt2-124m", "as_view": args.as_view,
                      "host_us_per_step": statistics.median(fastest), "reps_us": [round(v, 1) for v in fastest],
                      "buckets": len(reducer.buckets), "params": len(params)}), flush=True)
    dist.destroy_process_group()


def _train(args, torch, gpu_models, cfg) -> None:
    import numpy as np
    cuda = args.device == "cuda"
    runs = []
    for wrap in (False, True):
        torch.manual_seed(0)
        model = gpu_models.gpt(torch, **cfg).to(args.device)
        if wrap:
            model = torch.nn.parallel.DistributedDataParallel(model, gradient_as_bucket_view=args.as_view)
        runs.append((model, torch.optim.AdamW(model.parameters(), lr=3e-4, weight_decay=0.1)))
    rng = np.random.default_rng(0)
    seq = min(TRAIN_SEQ, cfg["block"])
    x, y = (torch.tensor(rng.integers(0, cfg["vocab"], (TRAIN_BATCH, seq)), device=args.device)
            for _ in range(2))
    amp = torch.bfloat16 if cuda else None
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    for model, opt in runs:
        for _ in range(WARMUP):
            gpu_models.train_step(torch, model, opt, x, y, amp)
    sync()
    uploads, single_copies = _count_table_uploads(cuda), _count_single_copies()
    times, built = [[], []], [0, 0]
    for _ in range(args.reps * args.steps // 5):
        for i, (model, opt) in enumerate(runs):
            sync()
            before = uploads[0]
            t = time.perf_counter()
            gpu_models.train_step(torch, model, opt, x, y, amp)
            times[i].append(time.perf_counter() - t)
            built[i] += uploads[0] - before
    sync()
    single, ddp = (statistics.median(t) * 1e3 for t in times)
    print(json.dumps({"workload": "ddp-train-host", "system": "flambeau-eager", "device": args.device,
                      "model": "gpt-small-12" if cfg is SMALL else "gpt2-124m", "as_view": args.as_view,
                      "batch": TRAIN_BATCH, "seq": seq, "single_host_ms": single, "ddp_host_ms": ddp,
                      "ddp_added_host_ms": ddp - single, "steps": len(times[0]),
                      "table_uploads_per_step": {"single": built[0] / len(times[0]), "ddp": built[1] / len(times[1])},
                      "unbatched_gradient_copies_per_step": single_copies[0] / len(times[1])}),
          flush=True)
    torch.distributed.destroy_process_group()


def _count_single_copies() -> list:
    """[n]: counts the reducer's gradient copies made one by one from now on (`_copy_into`: a gradient not laid
    out as its bucket view falls off the batched copy; 0 expected)."""
    from flambeau.nn.parallel import distributed as ddp_module
    n, copy = [0], ddp_module._copy_into

    def counting_copy(dst, src) -> None:
        n[0] += 1
        copy(dst, src)
    ddp_module._copy_into = counting_copy
    return n


def _count_table_uploads(cuda: bool) -> list:
    """[n]: counts the multi-tensor address tables uploaded from now on (`multi_tensor.upload`: a table cache
    miss of the batched copies or the fused AdamW); stays 0 on cpu."""
    n = [0]
    if cuda:
        from flambeau._backends import multi_tensor
        upload = multi_tensor.upload

        def counting_upload(cupy, host):
            n[0] += 1
            return upload(cupy, host)
        multi_tensor.upload = counting_upload
    return n


if __name__ == "__main__":
    main()
