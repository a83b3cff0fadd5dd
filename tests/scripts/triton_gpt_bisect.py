"""One GPT-2 layer at full width on cuda under bf16 autocast: gradients compiled vs eager, with one
code generator knob changed (argv[1]: default | nofuse | looped | bigblocks | mathsdpa | nolocals)."""
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
import flambeau as fl  # noqa: E402
from bench import gpu_models  # noqa: E402
from flambeau._inductor import config  # noqa: E402

mode = sys.argv[1]
if mode == "nofuse":
    config.fuse = False
elif mode == "looped":
    config.triton_persistent_limit = 0
elif mode == "bigblocks":
    config.triton_block = 1 << 14
elif mode == "nolocals":
    config.keep_locals = False
elif mode == "mathsdpa":
    for f in ("enable_flash_sdp", "enable_mem_efficient_sdp", "enable_cudnn_sdp"):
        getattr(fl.backends.cuda, f)(False)
V = 50257
xs, ys = fl.randint(0, V, (1, 1024), device="cuda"), fl.randint(0, V, (1, 1024), device="cuda")
res = []
for compiled in (False, True):
    fl._dynamo.reset()
    fl.manual_seed(0)
    model = gpu_models.gpt(fl, layers=1).cuda()
    f = fl.compile(model) if compiled else model
    with fl.autocast(device_type="cuda", dtype=fl.bfloat16):
        loss = f(xs, ys)
    loss.backward()
    res.append({n: p.grad.float().cpu().numpy() for n, p in model.named_parameters()})
errs = {n: float(np.abs(res[1][n] - res[0][n]).max() / (np.abs(res[0][n]).max() + 1e-12)) for n in res[0]}
print(mode, {n.replace("h.0.", ""): round(e, 3) for n, e in errs.items()}, flush=True)
