"""A Graph kept as bytes while nothing reads it (issue 13: the garbage collector's cost of compiled graphs).

AOT autograd's forward and backward graphs stay alive after their compile, for a later recompile (other
input strides, a backward without some tangents). As objects, a graph of N nodes is ~5N tracked objects
(each node, its users/input dicts, its args tuples, its meta dict) that every full collection of the
process walks, for the life of the process. `pack(graph)` pickles the nodes, their arguments and meta and
the graph's namespace into one bytes object; the objects the graph refers to by identity (operator
targets, dtypes, devices, classes: anything but the graph's own structure and plain data) are kept aside
in one tuple and put back by identity. `unpack` returns an equal Graph. GraphModule packs its graph with
`pack_graph()` and unpacks it at the first read of `gm.graph` (fx/graph_module.py).
"""
from __future__ import annotations

import io
import pickle

from .graph import Graph, _Namespace
from .node import Node

_BY_VALUE = (type(None), bool, int, float, complex, str, bytes, slice, range, tuple, list, dict, set, frozenset)
_LINKS = ("graph", "_prev", "_next", "users", "_input_nodes")     # rebuilt by unpack


class PackedGraph:
    """A pickled Graph (`data`), its node count and the objects it refers to by identity (`refs`)."""
    __slots__ = ("data", "refs", "node_count")

    def __init__(self, data: bytes, refs: tuple, node_count: int):
        self.data, self.refs, self.node_count = data, refs, node_count


class _Pickler(pickle.Pickler):
    """Nodes are written as their position (so no node is pickled through another's arguments, which
    would recurse along the graph), the graph as itself, any other non-plain object by identity."""

    def __init__(self, file, graph: Graph, position: dict):
        super().__init__(file, protocol=pickle.HIGHEST_PROTOCOL)
        self.graph, self.position = graph, position
        self.refs: list = []
        self.index: dict = {}

    def persistent_id(self, obj):
        t = type(obj)
        if t in _BY_VALUE:
            return None
        if t is Node:
            return ("n", self.position[id(obj)])
        if obj is self.graph:
            return ("g",)
        if t is _Namespace:
            return None
        k = self.index.get(id(obj))
        if k is None:
            k = self.index[id(obj)] = len(self.refs)
            self.refs.append(obj)
        return ("r", k)


class _Unpickler(pickle.Unpickler):
    def __init__(self, file, graph: Graph, nodes: list, refs: tuple):
        super().__init__(file)
        self.graph, self.nodes, self.refs = graph, nodes, refs

    def persistent_load(self, pid):
        kind = pid[0]
        return self.nodes[pid[1]] if kind == "n" else self.graph if kind == "g" else self.refs[pid[1]]


def pack(graph: Graph) -> PackedGraph:
    """`graph` as bytes (its `owning_module` left out: the unpacking module sets it)."""
    nodes = list(graph.nodes)
    position = {id(n): i for i, n in enumerate(nodes)}
    state = {k: v for k, v in graph.__dict__.items() if k not in ("_root", "_insert", "owning_module")}
    records = [({k: v for k, v in n.__dict__.items() if k not in _LINKS},
                [position[id(u)] for u in n.users], [position[id(i)] for i in n._input_nodes]) for n in nodes]
    f = io.BytesIO()
    p = _Pickler(f, graph, position)
    p.dump((state, records))
    return PackedGraph(f.getvalue(), tuple(p.refs), len(nodes))


def unpack(packed: PackedGraph) -> Graph:
    """A Graph equal to the one packed: its nodes in order, with their arguments, users and meta."""
    g = Graph.__new__(Graph)
    nodes = [Node.__new__(Node) for _ in range(packed.node_count)]
    state, records = _Unpickler(io.BytesIO(packed.data), g, nodes, packed.refs).load()
    g.__dict__.update(state)
    g._root = Node(g, "", "root", "", (), {})
    g._insert = g._root.prepend
    g.owning_module = None
    for n, (st, users, inputs) in zip(nodes, records):
        n.__dict__.update(st)
        n.graph = g
        n._prev = n._next = n
        n.users = dict.fromkeys([nodes[k] for k in users])
        n._input_nodes = dict.fromkeys([nodes[k] for k in inputs])
        g._root.prepend(n)
    return g
