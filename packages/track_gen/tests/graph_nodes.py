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


def captured(fn, stream) -> tuple[int, object]:
    """Record ``fn`` on the Warp stream ``stream`` in a CUDA capture begun and
    ended through the driver (Warp sees it as an external capture); returns
    the ``CUgraph`` (destroy it with ``destroy``) and Warp's graph object."""
    import warp as wp

    cu = ctypes.CDLL("libcuda.so.1")
    handle = ctypes.c_void_p(stream.cuda_stream)
    assert cu.cuStreamBeginCapture_v2(handle, 1) == 0  # CU_STREAM_CAPTURE_MODE_THREAD_LOCAL
    try:
        wp.capture_begin(stream=stream, external=True, capture_mode=wp.CaptureMode.THREAD_LOCAL)
        try:
            fn()
        finally:
            warp_graph = wp.capture_end(stream=stream)
    finally:
        graph = ctypes.c_void_p()
        code = cu.cuStreamEndCapture(handle, ctypes.byref(graph))
    assert code == 0
    return graph.value, warp_graph


def destroy(graph: int) -> None:
    assert ctypes.CDLL("libcuda.so.1").cuGraphDestroy(ctypes.c_void_p(graph)) == 0
