"""Shape padding of large matrix products on cuda (PyTorch's `config.shape_padding`, its pad_mm pass).

A bfloat16/float16 product whose k or n (or, for a transposed left operand, m) is off 16 bytes
leaves cuBLASLt only its slow align1 kernels, so `cublaslt.gemm` runs it on zero-padded copies: 2-D
memory copies of the operands in, of the result out (GPT-2's lm_head, vocabulary 50257: 8 copies,
2.65 ms of a compiled H100 step). Before lowering, `pad_matrix_products` rewrites the FX graph so
that the padding is done where the operand is computed:

    mm(a, b)  ->  mm(constant_pad_nd(a'), constant_pad_nd(b'))[:m, :n]

The pad goes under the views between the value and the product that keep the padded dim (a
transpose, a reshape of the leading dims), onto the value that computes the operand, and every
other user of that value reads a slice of the padded one: the kernel that computes GPT-2's logits
gradient stores it padded with zeros once, and both backward products and nothing else read it.
A pad of a graph input (a weight) is a copy. The lowering realises every pad made here and returns
the slices as strided views of the padded memory, outputs included (graph.py, `PAD_MM`).
"""
from __future__ import annotations

from .. import _dtype as D
from .._backends.cublaslt import PAD_BYTES, PAD_MIN_MACS
from .._decomp._table import aten
from .._tensor import Tensor
from . import config

PAD_MM = "pad_mm"               # node.meta key: "pad" on a pad made here, "view" on a slice of one
PADDED_DTYPES = (D.bfloat16, D.float16)   # tensor-core products: cuBLASLt's aligned kernels need 16 bytes


def pad_matrix_products(gm) -> int:
    """Rewrite the large misaligned `mm` nodes of a graph for Triton kernels (on cuda; on the CPU in
    Triton's interpreter, where tests check it) as the module docstring says; returns how many."""
    if not config.shape_padding:
        return 0
    graph = gm.graph
    pads: dict = {}          # (value, ((dim, size), ...)) -> its pad; a slice of a pad -> (pad, sizes)
    done = 0
    for node in list(graph.nodes):
        if node.op != "call_function" or node.target is not aten.mm:
            continue
        sizes = _padded_sizes(node)
        if sizes is None:
            continue
        (m, _, n), (mp, kp, np_) = sizes
        with graph.inserting_before(node):
            a = _padded(graph, node.args[0], {0: mp, 1: kp}, pads)
            b = _padded(graph, node.args[1], {0: kp, 1: np_}, pads)
            out = _call(graph, aten.mm, (a, b))
            for d, (size, full) in enumerate(((m, mp), (n, np_))):
                if size != full:
                    out = _call(graph, aten.slice, (out, d, 0, size))
            out.meta[PAD_MM] = "view"
        node.replace_all_uses_with(out)
        graph.erase_node(node)
        done += 1
    if done:
        gm.recompile()
    return done


def _padded_sizes(node):
    """((m, k, n), (m', k', n')) of an mm node to pad, None to leave it."""
    a, b = (x.meta.get("val") if hasattr(x, "meta") else None for x in node.args[:2])
    if not (isinstance(a, Tensor) and isinstance(b, Tensor)) or a.dtype not in PADDED_DTYPES or \
            a.ndim != 2 or b.ndim != 2 or getattr(a, "fake_mode", None) is None:
        return None                          # (new nodes' values are computed in the graph's fake mode)
    (m, k), n = tuple(a.shape), b.shape[1]
    if not all(type(s) is int for s in (m, k, n)) or m * k * n < PAD_MIN_MACS:
        return None
    align = PAD_BYTES // a.dtype.itemsize
    up = lambda v: -(-v // align) * align          # noqa: E731
    padded = (up(m) if _transposed(node.args[0]) else m, up(k), up(n))
    return ((m, k, n), padded) if padded != (m, k, n) else None


def _transposed(x) -> bool:
    return x.op == "call_function" and x.target is aten.permute and list(x.args[1]) == [1, 0]


def _call(graph, op, args):
    """A new node of `op` with its fake value computed from its inputs'."""
    vals = [a.meta["val"] if hasattr(a, "meta") else a for a in args]
    with next(v for v in vals if isinstance(v, Tensor)).fake_mode:
        val = op(*vals)
    node = graph.call_function(op, tuple(args))
    node.meta["val"] = val
    return node


def _padded(graph, x, sizes: dict, pads: dict):
    """`x` zero-padded to `sizes` ({dim: size}), the pad placed on the value under x's views."""
    v = x.meta["val"]
    want = {d: s for d, s in sizes.items() if s != v.shape[d]}
    if not want:
        return x
    if _transposed(x):
        return _call(graph, aten.permute, (_padded(graph, x.args[0], {1 - d: s for d, s in want.items()}, pads),
                                           [1, 0]))
    last = v.ndim - 1
    if x.op == "call_function" and x.target is aten.view and set(want) == {last} and \
            x.args[0].meta["val"].shape[-1] == v.shape[-1]:
        src = x.args[0]
        inner = _padded(graph, src, {src.meta["val"].ndim - 1: want[last]}, pads)
        return _call(graph, aten.view, (inner, list(v.shape[:-1]) + [want[last]]))
    key = (x, tuple(sorted(want.items())))
    if x.meta.get(PAD_MM) == "view" and pads.get(x) is not None and pads[x][1] == key[1]:
        return pads[x][0]                    # the slice of a pad made for another product: that pad
    if key not in pads:
        widths = []
        for d in reversed(range(v.ndim)):
            widths += [0, want.get(d, v.shape[d]) - v.shape[d]]
        if x.op == "placeholder":           # (placeholders stay first: the pad goes before the product)
            pad = _call(graph, aten.constant_pad_nd, (x, widths, 0))
        else:
            with graph.inserting_after(x):
                pad = _call(graph, aten.constant_pad_nd, (x, widths, 0))
        pad.meta[PAD_MM] = "pad"
        if x.op != "placeholder":            # the value's other users read the padded memory
            with graph.inserting_after(pad):
                view = pad
                for d in sorted(want):
                    view = _call(graph, aten.slice, (view, d, 0, v.shape[d]))
            view.meta[PAD_MM] = "view"
            pads[view] = (pad, key[1])
            for user in list(x.users):
                if user is not pad:
                    user.replace_input_with(x, view)
        pads[key] = pad
    return pads[key]
