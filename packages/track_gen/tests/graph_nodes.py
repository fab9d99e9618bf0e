"""Count the nodes of a CUDA graph by type, straight from the CUDA driver
(what a replay runs), independently of the library's own helpers."""

from __future__ import annotations

import collections
import ctypes

KERNEL, CONDITIONAL = 0, 13  # CU_GRAPH_NODE_TYPE_KERNEL, CU_GRAPH_NODE_TYPE_CONDITIONAL


def node_types(graph: int | ctypes.c_void_p) -> collections.Counter[int]:
    """``{node type: count}`` of the top level of the ``CUgraph`` ``graph``."""
    graph = graph.value if isinstance(graph, ctypes.c_void_p) else graph
    cu = ctypes.CDLL("libcuda.so.1")
    count = ctypes.c_size_t()
    assert cu.cuGraphGetNodes(ctypes.c_void_p(graph), None, ctypes.byref(count)) == 0
    nodes = (ctypes.c_void_p * count.value)()
    assert cu.cuGraphGetNodes(ctypes.c_void_p(graph), nodes, ctypes.byref(count)) == 0
    types: collections.Counter[int] = collections.Counter()
    for node in nodes[:count.value]:
        kind = ctypes.c_int()
        assert cu.cuGraphNodeGetType(ctypes.c_void_p(node), ctypes.byref(kind)) == 0
        types[kind.value] += 1
    return types
