"""Tune the launch plan: device time of each op under candidate launch configs.

    python benchmarks/rl_triton/sweep.py [--ops gae,vtrace] [--out FILE]

Prints, per op and shape, the planned config's time and the best candidate's,
so the plan's constants (``rl_triton._launch``) can be set from measurements.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

import torch  # noqa: E402

import rl_triton  # noqa: E402
from bench_scans import copy_bandwidth, device_seconds, input_sets, log  # noqa: E402
from cases import call, nbytes  # noqa: E402

CANDIDATES = {
    (4096, 2048): [dict(block_e=e, block_t=t, num_warps=w, flip=f)
                   for e, t, w in [(1, 1024, 4), (1, 512, 4), (1, 2048, 8), (2, 512, 4)] for f in (False, True)],
    (65536, 32): [dict(block_e=e, block_t=32, num_warps=w, flip=f)
                  for e, w in [(4, 1), (8, 1), (8, 2), (16, 1), (16, 2), (32, 2), (64, 4)] for f in (False, True)],
    (16, 262144): [dict(block_e=1, block_t=t, chunked=True, num_warps=w, flip=f)
                   for t, w in [(1024, 4), (2048, 4), (2048, 8), (4096, 8), (8192, 8), (8192, 16)]
                   for f in (False, True)],
}


def narrowed(config: dict, width: int) -> dict:
    """Shrink a candidate's tile by ``width`` (Retrace's tiles carry the actions)."""
    c = dict(config)
    while width > 1 and c["block_e"] > 1:
        c["block_e"] //= 2
        width //= 2
    c["block_t"] = max(16, c["block_t"] // width)
    return c


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--ops", default="gae,vtrace,retrace,episodic_prefix_sum")
    parser.add_argument("--shapes", default="4096x2048,65536x32,16x262144")
    parser.add_argument("--out", default="sweep.json")
    args = parser.parse_args()
    found = []
    bandwidth = copy_bandwidth()
    for op in args.ops.split(","):
        for shape, candidates in CANDIDATES.items():
            if f"{shape[0]}x{shape[1]}" not in args.shapes.split(","):
                continue
            sets = input_sets(op, shape, "cuda")
            planned = 1e6 * device_seconds(lambda x: call(op, rl_triton, x), sets)
            rows = [dict(config="planned", device_us=planned)]
            for config in candidates:
                config = narrowed(config, 8) if op == "retrace" else config
                try:
                    with rl_triton.launch_config(**config):
                        us = 1e6 * device_seconds(lambda x: call(op, rl_triton, x), sets)
                except Exception as exc:  # a config the compiler rejects
                    log(f"  {config}: {type(exc).__name__}")
                    us = float("inf")
                rows.append(dict(config=config, device_us=us))
            best = min(rows, key=lambda r: r["device_us"])
            log(f"{op} {shape}: planned {planned:.1f} us, best {best['device_us']:.1f} us {best['config']}")
            log("  " + ", ".join(f"{r['config'] if r['config'] == 'planned' else tuple(r['config'].values())}:"
                                 f" {r['device_us']:.1f}" for r in rows))
            floor = 1e6 * nbytes(op, sets[0]) / bandwidth
            log(f"  floor {floor:.1f} us: planned {planned / floor:.2f}x, best {best['device_us'] / floor:.2f}x")
            found.append(dict(op=op, shape=shape, floor_us=floor, rows=rows))
            del sets
            torch.cuda.empty_cache()
    Path(args.out).write_text(json.dumps(found, indent=1))


if __name__ == "__main__":
    main()
