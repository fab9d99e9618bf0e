"""What the current capture is, on which stream a call records, and whether
a masked regeneration may go behind a conditional node.

CUDA-only questions (capture status, open forks) go to the CUDA driver
through ctypes; torch is consulted only when the caller already imported it.
"""

from __future__ import annotations

import ctypes
import functools
import itertools
import sys
from typing import Any

import warp as wp

from track_gen import exec as exec_mode
from track_gen.errors import CaptureError

_CAPTURE_ACTIVE = 1  # CU_STREAM_CAPTURE_STATUS_ACTIVE
_DEFAULT_STREAMS = (0, 1, 2)  # the legacy default stream and its aliases


def warp_capture(stream: wp.Stream) -> tuple[wp.Stream, wp.Graph] | None:
    """The capture Warp registered on ``stream``'s handle, as the stream
    object Warp keys it by (``capture_if`` looks captures up by object) and
    its graph; ``None`` when Warp knows no capture there."""
    for key, graph in stream.device.captures.items():
        if key.cuda_stream == stream.cuda_stream:
            return key, graph
    return None


def torch_capture_stream(device: wp.context.Device) -> wp.Stream | None:
    """Torch's current stream on ``device`` while it captures (only when the
    caller imported torch), as a Warp stream; else ``None``."""
    torch = sys.modules.get("torch")
    if torch is None or not torch.cuda.is_initialized():
        return None
    current = torch.cuda.current_stream(device.ordinal)
    # The legacy and per-thread default streams never capture, and asking
    # them would touch a capture running on another (blocking) stream.
    if current.cuda_stream in _DEFAULT_STREAMS:
        return None
    if current.cuda_stream == device.stream.cuda_stream:
        return device.stream if device.stream.is_capturing else None
    stream = _wrapped(device.ordinal, current.cuda_stream, current)
    return stream if stream.is_capturing else None


@functools.lru_cache(maxsize=64)
def _wrapped(ordinal: int, handle: int, torch_stream: Any) -> wp.Stream:
    stream = wp.Stream(f"cuda:{ordinal}", cuda_stream=handle)
    stream._torch_stream = torch_stream  # keeps torch's stream alive with ours
    return stream


def is_torch_current(stream: wp.Stream) -> bool:
    """``stream`` is torch's current stream on its device (only asked when
    the caller imported torch)."""
    torch = sys.modules.get("torch")
    if torch is None or not torch.cuda.is_initialized():
        return False
    return torch.cuda.current_stream(stream.device.ordinal).cuda_stream == stream.cuda_stream


def records_conditional(stream: wp.Stream) -> bool:
    """Whether a masked regeneration recorded on the capturing ``stream``
    goes behind a conditional node (the cost table of the RL auto-reset page).

    Raises:
        CaptureError: inside ``exec.conditional()`` on a capture Warp does not
            know (no ``wp.ScopedCapture`` / ``registered()``); or a side
            stream forked inside the capture is still open.
    """
    mode = exec_mode.mode()
    if mode == "unconditional" or not wp.is_conditional_graph_supported():
        return False
    if warp_capture(stream) is None:
        if mode == "conditional":
            raise CaptureError("exec.conditional() needs a capture Warp registered: record inside "
                               "wp.ScopedCapture, or under torch.cuda.graph inside "
                               "track_gen.interop.torch.registered(conditional=True)")
        return False
    if mode == "default" and is_torch_current(stream):
        return False
    if open_fork(stream):
        raise CaptureError("a side stream forked inside this capture is not joined: join it "
                           "(capture_stream.wait_stream(side)) before course.regenerate(mask=...), or "
                           "record the call inside track_gen.exec.unconditional() (a conditional node "
                           "ends and restarts the capture, which CUDA refuses with an open fork)")
    return True


# --- the CUDA driver: capture status and graph topology -------------------------------------

@functools.lru_cache(maxsize=1)
def _driver() -> ctypes.CDLL:
    return ctypes.CDLL("libcuda.so.1")


def _capture_info(stream: wp.Stream) -> tuple[int, int, list[int]]:
    """``(status, graph, dependencies)`` of ``stream``'s capture."""
    cu = _driver()
    status, capture_id = ctypes.c_int(), ctypes.c_uint64()
    graph, deps, count = ctypes.c_void_p(), ctypes.POINTER(ctypes.c_void_p)(), ctypes.c_size_t()
    handle = ctypes.c_void_p(stream.cuda_stream)
    if hasattr(cu, "cuStreamGetCaptureInfo_v3"):
        edges = ctypes.c_void_p()
        code = cu.cuStreamGetCaptureInfo_v3(handle, ctypes.byref(status), ctypes.byref(capture_id),
                                            ctypes.byref(graph), ctypes.byref(deps), ctypes.byref(edges),
                                            ctypes.byref(count))
    else:
        code = cu.cuStreamGetCaptureInfo_v2(handle, ctypes.byref(status), ctypes.byref(capture_id),
                                            ctypes.byref(graph), ctypes.byref(deps), ctypes.byref(count))
    if code != 0:
        raise CaptureError(f"the CUDA driver could not read the capture's status (error {code})")
    return status.value, graph.value or 0, [deps[i] or 0 for i in range(count.value)]


def _nodes(graph: int) -> list[int]:
    cu, count = _driver(), ctypes.c_size_t()
    cu.cuGraphGetNodes(ctypes.c_void_p(graph), None, ctypes.byref(count))
    nodes = (ctypes.c_void_p * count.value)()
    cu.cuGraphGetNodes(ctypes.c_void_p(graph), nodes, ctypes.byref(count))
    return [n or 0 for n in nodes[:count.value]]


def _dependencies(node: int) -> list[int]:
    cu, count = _driver(), ctypes.c_size_t()
    v2 = hasattr(cu, "cuGraphNodeGetDependencies_v2")

    def call(out: Any) -> int:
        if v2:
            return cu.cuGraphNodeGetDependencies_v2(ctypes.c_void_p(node), out, None, ctypes.byref(count))
        return cu.cuGraphNodeGetDependencies(ctypes.c_void_p(node), out, ctypes.byref(count))

    call(None)
    deps = (ctypes.c_void_p * count.value)()
    call(deps)
    return [d or 0 for d in deps[:count.value]]


def open_fork(stream: wp.Stream) -> bool:
    """A node of ``stream``'s capture that its next node would not depend on:
    work on a side stream forked into the capture and not joined back."""
    with stream.device.context_guard:
        status, graph, frontier = _capture_info(stream)
        if status != _CAPTURE_ACTIVE:
            raise CaptureError("the capture on this stream is invalidated (a capture-unsafe call, or an "
                               "unjoined fork ended it): fix the capture before recording into it")
        seen, todo = set(frontier), list(frontier)
        while todo:
            for dep in _dependencies(todo.pop()):
                if dep not in seen:
                    seen.add(dep)
                    todo.append(dep)
        return any(node not in seen for node in _nodes(graph))


# --- lifetime: Python objects kept alive by a CUDA graph -------------------------------------

_HOST_FN = ctypes.CFUNCTYPE(None, ctypes.c_void_p)
_kept: dict[int, list[Any]] = {}
_tokens = itertools.count(1)
_released: list[int] = []
_USER_OBJECT_NO_DESTRUCTOR_SYNC = 1
_GRAPH_USER_OBJECT_MOVE = 1


def _on_graph_destroyed(token: int | None) -> None:
    # Called by the driver from its own thread, where no CUDA call is allowed:
    # dropping the objects (which frees device memory) waits for release_dropped().
    _released.append(token or 0)


_destroy = _HOST_FN(_on_graph_destroyed)


def release_dropped() -> None:
    """Let go of the objects of graphs CUDA destroyed since the last call."""
    while _released:
        _kept.pop(_released.pop(), None)


def keep_with_capture(stream: wp.Stream, objects: list[Any]) -> None:
    """Keep ``objects`` alive until CUDA destroys the graph that ``stream`` is
    capturing (and every executable instantiated from it)."""
    release_dropped()
    token = next(_tokens)
    cu, user_object = _driver(), ctypes.c_void_p()
    with stream.device.context_guard:
        _, graph, _ = _capture_info(stream)
        code = cu.cuUserObjectCreate(ctypes.byref(user_object), ctypes.c_void_p(token), _destroy, 1,
                                     _USER_OBJECT_NO_DESTRUCTOR_SYNC)
        if code == 0:
            code = cu.cuGraphRetainUserObject(ctypes.c_void_p(graph), user_object, 1, _GRAPH_USER_OBJECT_MOVE)
    if code != 0:
        raise CaptureError(f"could not tie the course's lifetime to the graph (CUDA error {code}): "
                           "keep it alive yourself with retain(graph, course)")
    _kept[token] = objects


def note_recorded(stream: wp.Stream | None, course: Any) -> None:
    """A call of ``course`` recorded on ``stream``: the Warp graph capturing
    there (if any) keeps the course alive as long as itself. Warp registers
    a capture only while it records, so no capture status is asked."""
    capture = warp_capture(stream) if stream is not None else None
    if capture is not None:
        kept = capture[1].__dict__.setdefault("_track_gen_courses", [])
        if not any(c is course for c in kept):
            kept.append(course)
