"""Host cost of cudnn.py's graph-API `execute` and variant-pack build through real ctypes calls, on CPU:
a stand-in libcudnn (five entry points that succeed, compiled here with the system C compiler) bound
with cudnn.py's own ctypes signatures, so the argument conversions are the real ones and only cuDNN's
own work is missing. One JSON line per case, `us_per_call` the median of --repeats timeit runs (CPU
time of the process):

- `build`: `_GraphPlan._variant_pack` (create, ids, pointers, workspace, finalize) and its destroy;
- `execute_miss`: `execute` on pointers no kept pack has (a build, an eviction, the execute call);
- `execute_hit`: `execute` on the pointers of a kept pack (the pack cache and the execute call).

    PYTHONPATH=/path/to/tree python3 bench/cudnn_pack_host.py [--repeats 7] [--number 2000]
"""
from __future__ import annotations

import argparse
import ctypes
import json
import os
import subprocess
import tempfile
import time
import timeit

from flambeau._backends import cudnn

_SOURCE = r"""
#include <stdint.h>
#include <stdlib.h>
int cudnnBackendCreateDescriptor(int t, void **d) { *d = malloc(64); return 0; }
int cudnnBackendDestroyDescriptor(void *d) { free(d); return 0; }
int cudnnBackendFinalize(void *d) { return 0; }
int cudnnBackendSetAttribute(void *d, int a, int t, int64_t n, void *arr) { return 0; }
int cudnnBackendExecute(void *h, void *p, void *v) { return 0; }
"""


def stand_in_library(folder: str):
    """The stand-in libcudnn, built in `folder`, its functions typed as cudnn.py types them."""
    src, so = os.path.join(folder, "fake_cudnn.c"), os.path.join(folder, "libfake_cudnn.so")
    with open(src, "w") as f:
        f.write(_SOURCE)
    subprocess.run(["cc", "-O2", "-shared", "-fPIC", "-o", so, src], check=True)
    lib = ctypes.CDLL(so)
    for name in ("cudnnBackendCreateDescriptor", "cudnnBackendDestroyDescriptor", "cudnnBackendFinalize",
                 "cudnnBackendSetAttribute", "cudnnBackendExecute"):
        fn = getattr(lib, name)
        fn.argtypes, fn.restype = cudnn._SIGNATURES[name], ctypes.c_int
    return lib


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--number", type=int, default=2000)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as folder:
        lib = stand_in_library(folder)
        cudnn._state.update(lib=lib, tried=True)
        plan = cudnn._GraphPlan.__new__(cudnn._GraphPlan)     # no cuDNN graph: the fields execute reads
        plan.lib, plan.kind, plan.descs, plan.uids = lib, "forward", [], (ctypes.c_int64 * 3)(1, 2, 3)
        plan.plan, plan.ws = ctypes.c_void_p(1), 0
        base = [0x7F0000000000]

        def build():
            base[0] += 256
            lib.cudnnBackendDestroyDescriptor(plan._variant_pack((base[0], base[0] + 4096, base[0] + 8192, 1 << 40)))

        def execute_miss():
            base[0] += 256
            plan.execute(None, (base[0], base[0] + 4096, base[0] + 8192), 0, 0)

        def execute_hit():
            plan.execute(None, (1 << 20, 2 << 20, 3 << 20), 0, 0)
        for fn in (build, execute_miss, execute_hit):
            fn()
            t = timeit.Timer(fn, timer=time.process_time)
            us = sorted(t.repeat(number=args.number, repeat=args.repeats))[args.repeats // 2] / args.number * 1e6
            print(json.dumps({"bench": fn.__name__, "us_per_call": round(us, 3)}))


if __name__ == "__main__":
    main()
