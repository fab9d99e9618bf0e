"""CUDA-only behaviour: graph capture, no host synchronisation, sequences past 131072."""

import pytest
import torch

import rl_triton
from rollouts import OPS, REFERENCES, assert_matches, rollout, run

pytestmark = pytest.mark.gpu

ALL_OPS = sorted(OPS)


@pytest.mark.parametrize("op", ALL_OPS)
@pytest.mark.parametrize("chunked", [False, True])
def test_op_replays_in_a_cuda_graph(op, chunked, cuda):
    """Captured once, replayed on new data written into the same input buffers."""
    static, first, second = rollout(64, 1000, seed=1), rollout(64, 1000, seed=1), rollout(64, 1000, seed=2)
    with rl_triton.launch_config(chunked=chunked, block_t=128):
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            OPS[op](static, cuda)  # compile outside the capture
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            outputs = OPS[op](static, cuda)
    for batch in (first, second):
        for f in batch.arrays():
            static.t(f, cuda).copy_(batch.t(f, "cpu"))
        graph.replay()
        torch.cuda.synchronize()
        assert_matches(tuple(o.cpu().numpy() for o in outputs), REFERENCES[op](batch))


@pytest.mark.parametrize("op", ALL_OPS)
def test_no_host_synchronisation(op, cuda):
    batch = rollout(8, 300, seed=4)
    with rl_triton.launch_config(chunked=True, block_t=64):
        OPS[op](batch, cuda)  # compile, and move the inputs once
        torch.cuda.synchronize()
        torch.cuda.set_sync_debug_mode("error")
        try:
            OPS[op](batch, cuda)
        finally:
            torch.cuda.set_sync_debug_mode("default")


@pytest.mark.parametrize("op", ALL_OPS)
def test_long_sequences_past_131072(op, cuda):
    """The planned (chunked) path on few long rows against the reference."""
    batch = rollout(2, 200_003, seed=6, p_term=1e-4, p_trunc=1e-4)
    assert_matches(run(op, batch, cuda), REFERENCES[op](batch), rtol=1e-4)


@pytest.mark.parametrize("op", ALL_OPS)
def test_many_concurrent_chunks(op, cuda):
    """782 chunks a row, more than the GPU holds at once, against the reference."""
    batch = rollout(3, 200_003, seed=7, p_term=1e-4, p_trunc=1e-4)
    with rl_triton.launch_config(chunked=True, block_t=256):
        got = run(op, batch, cuda)
    assert_matches(got, REFERENCES[op](batch), rtol=1e-4)


@pytest.mark.parametrize("op", ALL_OPS)
@pytest.mark.parametrize("shape", [(4096, 33), (65536, 32), (3, 4097)])
def test_benchmark_shapes_against_reference(op, shape, cuda):
    batch = rollout(*shape, seed=8)
    assert_matches(run(op, batch, cuda), REFERENCES[op](batch))


def test_registered_launch_hooks_see_every_launch(cuda):
    """Triton's launch hooks (profilers register them) still run; with none
    registered the launch passes addresses and skips them."""
    from triton import knobs

    batch = rollout(16, 100, seed=3)
    run("gae", batch, cuda)  # compiled, so later calls take the direct launch
    seen = []

    def enter(metadata):
        seen.append(metadata.get()["name"])

    knobs.runtime.launch_enter_hook.add(enter)
    try:
        got = run("gae", batch, cuda)
    finally:
        knobs.runtime.launch_enter_hook.remove(enter)
    assert seen == ["gae_kernel"]
    assert_matches(got, REFERENCES["gae"](batch))
    run("gae", batch, cuda)
    assert seen == ["gae_kernel"]


def test_chunk_programs_keep_the_register_cap(cuda):
    """Chunked launches compile to at most the plan's registers per thread."""
    from rl_triton._kernels.gae import gae_kernel
    from rl_triton._launch import CHUNK_MAX_REGISTERS, _launchers

    batch = rollout(2, 20_000, seed=9)
    with rl_triton.launch_config(chunked=True):
        assert_matches(run("gae", batch, cuda), REFERENCES["gae"](batch))
    launcher = next(lr for (kernel_id, _), lr in _launchers.items() if kernel_id == id(gae_kernel))
    caps = [(p.max_registers, entry[3].n_regs) for (_, p, *_), entry in launcher.compiled.items()
            if p.chunked]
    assert caps
    for cap, used in caps:
        assert cap == CHUNK_MAX_REGISTERS and used <= cap
