"""One process compiling flambeau's fused AdamW kernel (`triton_adam._adam_chunks`) through
`triton_launch.compile_kernel` as on a cuda device of compute capability argv[2] (CuPy replaced by a
recorder of the loaded cubin), with FLAMBEAU_CACHE_DIR as the caller sets it. argv[1] == "warm": Triton's
compiler and its cache key (`triton_key`, the hash of Triton's own sources) raise if called. Prints one JSON
line: the loaded cubin's sha256, the kernel's launch metadata and `triton_launch.stats`. Run without
TRITON_INTERPRET (tests/test_cubin_cache.py)."""
import hashlib
import json
import sys

import triton
import triton.runtime.cache

from flambeau._backends import triton_adam, triton_launch as TL

mode, capability = sys.argv[1], sys.argv[2]
loaded = []


class Function:
    ptr = 1


class Module:
    def load(self, cubin):
        loaded.append(bytes(cubin))

    def get_function(self, name):
        return Function()


class FakeCupy:
    class cuda:
        Module = Module

        class Device:
            def __init__(self, dev):
                self.compute_capability = capability

        class driver:
            @staticmethod
            def funcSetAttribute(*args):
                pass


def refuse(*args, **kwargs):
    raise AssertionError("Triton's compiler was called on a warm cache")


TL._cupy = lambda: FakeCupy
TL.current_device = lambda: 0
if mode == "warm":
    triton.compile = triton.runtime.cache.triton_key = refuse
const = dict(CHUNK=triton_adam.CHUNK, BLOCK=triton_adam.BLOCK, AMSGRAD=False, MAXIMIZE=False, DECOUPLED=True,
             LR_ON_DEVICE=False, ALIGNED=True)
k = TL.compile_kernel(triton_adam._adam_chunks, triton_adam.SIGNATURE, const, num_warps=triton_adam.NUM_WARPS,
                      num_stages=1)
assert len(loaded) == 1
print(json.dumps({"sha": hashlib.sha256(loaded[0]).hexdigest(), "num_warps": k.num_warps, "shared": k.shared,
                  "global_scratch": k.global_scratch, "arg_types": list(k.arg_types), "stats": TL.stats}))
