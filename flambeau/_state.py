"""Process-wide settings read on hot paths: default dtype/device, grad mode, the mode stack, the
current cuda device. A foundation module: every layer may read and set these."""
from . import _dtype

default_dtype = _dtype.float32
default_device = None          # None means cpu
grad_enabled = True
inference_mode = False
fwd_grad_enabled = True
modes: list = []               # dispatch modes, innermost (top) last
anomaly = False
anomaly_check_nan = True
autocast: dict = {}            # device type -> dtype where autocast is on (empty: off); see flambeau.amp
cuda_device = 0                # the current cuda device index (flambeau.cuda.set_device)
float32_matmul_precision = "highest"   # cuda float32 products: "highest" exact, "high"/"medium" TF32
