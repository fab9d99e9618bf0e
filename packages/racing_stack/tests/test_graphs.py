"""`racing_stack.ppo.graphs.capture_stream` on Torch's pool of streams,
stood in for on the CPU by one that hands out 32 handles in turn."""

from __future__ import annotations

import gc
import itertools

import pytest
import torch

from racing_stack.ppo import graphs


class _Pool:
    """Torch's pool: ``Stream(device)`` gives the next of 32 handles, round robin."""

    def __init__(self) -> None:
        self.handles = itertools.cycle(range(1000, 1032))

    def __call__(self, device):
        stream = type("Stream", (), {})()
        stream.cuda_stream = next(self.handles)
        return stream


class _Owner:
    """Something that captures graphs (a weakly referenceable object)."""


@pytest.fixture
def pool(monkeypatch):
    monkeypatch.setattr(torch.cuda, "Stream", _Pool())
    monkeypatch.setattr(graphs, "_HELD", set())


def test_each_live_owner_captures_on_a_stream_no_other_live_owner_holds(pool):
    owners = [_Owner() for _ in range(32)]
    handles = [graphs.capture_stream(owner, "cuda").cuda_stream for owner in owners]
    assert sorted(handles) == list(range(1000, 1032))  # the pool's every stream, each once
    with pytest.raises(RuntimeError, match="every one of Torch's 32 streams"):
        graphs.capture_stream(_Owner(), "cuda")
    freed = handles[5]
    del owners[5]
    gc.collect()
    assert graphs._HELD == set(handles) - {freed}
    assert graphs.capture_stream(_Owner(), "cuda").cuda_stream == freed  # the one a dead owner let go


def test_a_warm_ups_stream_is_none_a_live_owner_holds(pool):
    owners = [_Owner() for _ in range(31)]
    held = {graphs.capture_stream(owner, "cuda").cuda_stream for owner in owners}
    free = [graphs._free_stream("cuda").cuda_stream for _ in range(3)]
    assert set(free) == set(range(1000, 1032)) - held
