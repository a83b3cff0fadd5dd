"""torch.backends: switches of the libraries behind the kernels. `flambeau.backends.cuda.matmul`
holds the cuBLAS flags (TF32, reduced-precision reductions). `flambeau.backends.cudnn` is
flambeau._backends.cudnn itself (enabled, allow_tf32, deterministic, benchmark, is_available,
version), so setting a flag here sets it where the convolution kernels read it.
`flambeau.backends.cuda` also holds the scaled_dot_product_attention backend switches; `flambeau.backends.mha`
the Transformer layers' inference fast path."""
import sys

from .._backends import cudnn

sys.modules[__name__ + ".cudnn"] = cudnn
from . import cuda  # noqa: E402,F401
from . import mha  # noqa: E402,F401
from . import mps  # noqa: E402,F401
