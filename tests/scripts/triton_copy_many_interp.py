"""Run flambeau's batched copy kernel (flambeau/_backends/triton_copy_many.py) under Triton's interpreter
(TRITON_INTERPRET=1, set by the caller) on CPU tensors of several dtypes and uneven sizes (several chunks,
ends mid-block), and compare every destination with its source; the bytes around each destination must be
untouched. Prints one line per case and exits non-zero on a mismatch. Used by tests/test_distributed_ddp_reducer.py."""
import sys

import numpy as np
import torch
import interp_numpy2  # noqa: F401  (before any kernel runs)

import triton.language as tl

from flambeau._backends import multi_tensor, triton_copy_many as C

CHUNK, BLOCK = 64, 16           # small, so that tensors span several chunks and end mid-block
SIZES = (1, 15, 64, 100, 129, 300)
CASES = ((torch.float32, tl.int32), (torch.bfloat16, tl.int16), (torch.int64, tl.int64), (torch.uint8, tl.int8))


def run(dtype, word, seed=0) -> bool:
    g = torch.Generator().manual_seed(seed)
    srcs = [(torch.randn(n, generator=g) * 100).to(dtype) for n in SIZES]
    pads = [torch.full((n + 8,), 7).to(dtype) for n in SIZES]      # each destination sits inside a padded buffer
    dsts = [p[4:4 + n] for p, n in zip(pads, SIZES)]
    addresses = [[s.data_ptr() for s in srcs], [d.data_ptr() for d in dsts]]
    tab = torch.from_numpy(multi_tensor.table(addresses, list(SIZES), CHUNK))
    n_chunks = multi_tensor.chunk_count(tab.numpy(), len(SIZES), C.ROWS)
    o = multi_tensor.offsets(len(SIZES), n_chunks, C.ROWS)
    views = [tab[o[i]:(o[i + 1] if i < 3 else None)] for i in range(4)]
    C._copy_chunks[(n_chunks,)](*views, len(SIZES), CHUNK=CHUNK, BLOCK=BLOCK, WORD=word)
    ok = all(torch.equal(d.view(torch.uint8), s.view(torch.uint8)) for s, d in zip(srcs, dsts))
    untouched = all(torch.equal(p[:4], torch.full((4,), 7).to(dtype)) and
                    torch.equal(p[4 + n:], torch.full((4,), 7).to(dtype)) for p, n in zip(pads, SIZES))
    return ok and untouched


def main() -> int:
    bad = 0
    for dtype, word in CASES:
        ok = run(dtype, word)
        bad += not ok
        print(f"{dtype}: {'ok' if ok else 'MISMATCH'}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
