"""How many Triton kernels a compiled GPT-2 training step launches on cuda, whole or split for DDP, counted on a
machine without a GPU: each graph's cuda code is generated (`bench/fake_cuda_loader.generating_compile_fx`) and
run as it is on the CPU; every launch of every generated kernel counts (a split reduction's two launches too).

`python3 bench/ddp_split_kernels.py [--layers 12] [--d 768] [--splits single,narrowest,bucket]`: one JSON line per
split: `single` (one graph), `narrowest` (the DDPOptimizer's default: each cut moved to just before a matrix
product), `bucket` (PyTorch's cut, where a 25 MiB bucket fills). bf16 autocast, B1xT64 (the kernel count does not
depend on the batch); each DDP subgraph holds `FLAMBEAU_DDP_SUBGRAPH_BUCKETS` buckets' worth (default 4; 1 is
PyTorch's one a bucket). Each split runs in its own process. Extra kernels are what a split costs beyond the
communication: lost fusions and each subgraph's own weight and gradient casts."""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BUCKET_BYTES = 25 * 2 ** 20         # DDP's default bucket_cap_mb
FIRST_BUCKET_BYTES = 2 ** 20


def count(split: str, layers: int, d: int) -> dict:
    sys.path.insert(0, ROOT)
    import flambeau as fl
    from bench import gpu_models
    from bench.fake_cuda_loader import generating_compile_fx
    from flambeau import _inductor
    from flambeau._dynamo import config
    from flambeau._dynamo.backends.distributed import DDPOptimizer
    from flambeau._dynamo.backends.registry import lookup_backend
    generated = []
    _inductor.compile_fx = generating_compile_fx(generated)
    fl.manual_seed(0)
    model = gpu_models.gpt(fl, vocab=50257, block=1024, d=d, layers=layers, heads=max(1, d // 64))
    backend = lookup_backend("inductor")
    if split != "single":
        config.ddp_split_narrowest = split == "narrowest"
        backend = DDPOptimizer(BUCKET_BYTES, backend, first_bucket_bytes=FIRST_BUCKET_BYTES)
    step = fl.compile(model, backend=backend)
    with fl.autocast(device_type="cpu", dtype=fl.bfloat16):
        loss = step(fl.randint(0, 50257, (1, 64)), fl.randint(0, 50257, (1, 64)))
    loss.backward()
    per_graph = []
    for _, launches in generated:
        n = 0
        for launch in launches.values():
            while launch is not None:
                n, launch = n + 1, launch.then
        per_graph.append(n)
    return {"split": split, "layers": layers, "d": d, "graphs": len(generated), "kernels": sum(per_graph),
            "kernels_per_graph": per_graph}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--layers", type=int, default=12)
    p.add_argument("--d", type=int, default=768)
    p.add_argument("--splits", default="single,narrowest,bucket")
    p.add_argument("--child", default="", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.child:
        print(json.dumps(count(args.child, args.layers, args.d)), flush=True)
        return
    for split in args.splits.split(","):
        out = subprocess.run([sys.executable, os.path.abspath(__file__), "--child", split, "--layers", str(args.layers),
                              "--d", str(args.d)], capture_output=True, text=True, cwd=ROOT)
        lines = [ln for ln in out.stdout.splitlines() if ln.startswith("{")]
        print(lines[-1] if lines else json.dumps({"split": split, "error": out.stderr.strip().splitlines()[-3:]}),
              flush=True)


if __name__ == "__main__":
    main()
