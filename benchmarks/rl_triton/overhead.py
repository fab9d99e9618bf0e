"""Host overhead per call: where the microseconds of an eager call go.

    python benchmarks/rl_triton/overhead.py

Times, on a tiny input (so the GPU is never the bottleneck): an empty
``torch.empty``, the raw Triton launch of the GAE kernel through
``JITFunction.__getitem__``, the same compiled kernel launched directly (as
Triton does: tensors and launch hooks; then as ``rl_triton`` does without
registered hooks: addresses, no hooks), and the full op calls; then profiles
``compute_gae``.
"""

from __future__ import annotations

import cProfile
import pstats
import statistics
import time

import torch
import triton
from triton import knobs

import rl_triton
from rl_triton._kernels.gae import gae_kernel
from rl_triton._launch import _override, _target_programs, plan


def per_call_us(fn, calls: int = 2000, reps: int = 7) -> float:
    fn()
    torch.cuda.synchronize()
    out = []
    for _ in range(reps):
        t0 = time.perf_counter()
        for _ in range(calls):
            fn()
        torch.cuda.synchronize()
        out.append((time.perf_counter() - t0) / calls * 1e6)
    return statistics.median(out)


def main() -> None:
    E, T = 4, 32
    r, v, term = (torch.randn(E, T, device="cuda") for _ in range(3))
    lv = torch.randn(E, device="cuda")
    adv = torch.empty_like(r)
    grid = (1, 1)
    p = plan(E, T, 1, _target_programs(r.device.index), _override.get())
    values = [r, v, term, term, lv, adv, r, r, E, T, p.chunk_t, 1, 0.99, 0.95,
              False, 2, False, 1, p.block_e, p.block_t, p.flip, p.even]
    compiled = gae_kernel[grid](*values, num_warps=p.num_warps)
    device = torch.cuda.current_device()
    driver = triton.runtime.driver.active

    def direct() -> None:
        stream = driver.get_current_stream(device)
        compiled.run(1, 1, 1, stream, compiled.function, compiled.packed_metadata,
                     compiled.launch_metadata(grid, stream, *values),
                     knobs.runtime.launch_enter_hook, knobs.runtime.launch_exit_hook, *values)

    addresses = [x.data_ptr() if isinstance(x, torch.Tensor) else x for x in values]

    def addressed() -> None:
        stream = driver.get_current_stream(device)
        compiled.run(1, 1, 1, stream, compiled.function, compiled.packed_metadata,
                     None, None, None, *addresses)

    rows = {
        "torch.empty": per_call_us(lambda: torch.empty((E, T), device="cuda")),
        "triton JIT launch": per_call_us(lambda: gae_kernel[grid](*values, num_warps=p.num_warps)),
        "compiled kernel, direct": per_call_us(direct),
        "compiled, addresses": per_call_us(addressed),
        "compute_gae": per_call_us(lambda: rl_triton.compute_gae(r, v, term, last_value=lv)),
        "compute_vtrace": per_call_us(lambda: rl_triton.compute_vtrace(r, v, v, r, term, last_value=lv)),
        "compute_discounted_returns": per_call_us(lambda: rl_triton.compute_discounted_returns(r, term)),
        "compute_episodic_prefix_sum": per_call_us(lambda: rl_triton.compute_episodic_prefix_sum(r, term)),
    }
    for k, us in rows.items():
        print(f"{k:28s} {us:7.2f} us/call")
    prof = cProfile.Profile()
    prof.enable()
    for _ in range(5000):
        rl_triton.compute_gae(r, v, term, last_value=lv)
    prof.disable()
    torch.cuda.synchronize()
    pstats.Stats(prof).sort_stats("tottime").print_stats(14)


if __name__ == "__main__":
    main()
