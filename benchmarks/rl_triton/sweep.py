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
from bench_scans import device_seconds, input_sets, log  # noqa: E402
from cases import call  # noqa: E402

CANDIDATES = {
    (4096, 2048): [dict(block_e=e, block_t=t, num_warps=w)
                   for e, t, w in [(1, 1024, 4), (1, 1024, 8), (1, 512, 2), (1, 512, 4), (2, 512, 4),
                                   (2, 1024, 8), (1, 2048, 8), (4, 256, 4)]],
    (65536, 32): [dict(block_e=e, block_t=32, num_warps=w)
                  for e, w in [(16, 2), (32, 2), (32, 4), (64, 4), (64, 8), (128, 8)]],
    (16, 262144): [dict(block_e=1, block_t=t, chunked=True, num_warps=w)
                   for t in (512, 1024, 2048) for w in (2, 4, 8)],
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
    parser.add_argument("--out", default="sweep.json")
    args = parser.parse_args()
    found = []
    for op in args.ops.split(","):
        for shape, candidates in CANDIDATES.items():
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
            found.append(dict(op=op, shape=shape, rows=rows))
            del sets
            torch.cuda.empty_cache()
    Path(args.out).write_text(json.dumps(found, indent=1))


if __name__ == "__main__":
    main()
