"""Benchmark track generation: full batches and masked regenerations, per device.

    python benchmarks/track_gen/generate.py [--sizes 64,1024,16384,65536] [--out FILE | --publish]

For each device (``cpu``, and ``cuda:0`` when present) and batch size E it
times a full-batch generation (generated, checked and baked, default 64 x 64
SDF) and a masked regeneration of one env, reports courses/s, valid courses/s
and the invalid fraction, and, on CPU, compares like for like with Gymnasium's
CarRacing in the same run (valid new tracks per second, retries included:
what its ``reset()`` does). Writes a JSON report.

Gates: on an H200, 65536 tracks in at most 20 ms of device time and a masked
regeneration at most 1.05x a full one; on CPU, valid courses at least 10x
faster than CarRacing (the aim: 100x).
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import warp as wp

from track_gen.course import Course
from track_gen.pipeline import presets

sys.path.insert(0, str(Path(__file__).parent))
from timing import captured, median_seconds, replay_seconds, runs  # noqa: E402

H200_FULL_MS = 20.0
MASKED_RATIO = 1.05
CPU_SPEEDUP = 10.0


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def graph_seconds(fn, device: str, reps: int) -> float:
    """Device time of one replay of ``fn`` captured in a graph."""
    return replay_seconds(captured(fn, device), device, reps)


def bench_device(device: str, size: int) -> dict[str, Any]:
    course = Course.track(presets.track(num_envs=size, device=device), seeds=0)
    reps = 5 if device != "cpu" or size <= 1024 else 1
    one = np.zeros(size, np.int32)
    one[size // 2] = 1
    mask = wp.array(one, dtype=wp.int32, device=device)
    gen = course.generator
    row: dict[str, Any] = {"device": device, "num_envs": size,
                           "invalid_fraction": float((course.result.valid.numpy() == 0).mean())}
    row["full_s"] = median_seconds(lambda: gen.generate(advance=True), device, reps)
    row["masked_one_env_s"] = median_seconds(lambda: gen.generate(advance=True, mask=mask), device, reps)
    if device != "cpu":
        row["full_device_s"] = graph_seconds(lambda: gen.enqueue(advance=True), device, reps)
        row["masked_one_env_device_s"] = graph_seconds(lambda: gen.enqueue(advance=True, mask=mask), device, reps)
    row["courses_per_s"] = size / row["full_s"]
    row["valid_courses_per_s"] = row["courses_per_s"] * (1 - row["invalid_fraction"])
    log(f"{device} E={size}: {json.dumps(row)}")
    return row


def carracing_valid_tracks_per_s(resets: int = 30) -> dict[str, Any]:
    """Gymnasium CarRacing ``reset()`` rate: each reset builds one valid track,
    retrying failed attempts internally."""
    try:
        import gymnasium as gym

        env = gym.make("CarRacing-v3")
    except Exception as exc:  # not installed (needs box2d and pygame)
        return {"error": f"{type(exc).__name__}: {exc}"[:200]}
    env.reset(seed=0)
    t0 = time.perf_counter()
    for i in range(resets):
        env.reset(seed=i + 1)
    dt = time.perf_counter() - t0
    return {"valid_tracks_per_s": resets / dt, "resets": resets, "gymnasium": gym.__version__}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sizes", default="64,1024,16384,65536")
    parser.add_argument("--cpu-sizes", default="64,1024,16384",
                        help="sizes on the CPU device (65536 takes ~15 s a generation there)")
    parser.add_argument("--out", default=None, help="report path (default benchmarks/out/track_gen.json)")
    parser.add_argument("--publish", action="store_true",
                        help="write the committed report, benchmarks/results/track_gen.json")
    args = parser.parse_args()
    devices, pairs = runs(args.sizes, args.cpu_sizes)
    rows = [bench_device(device, size) for device, size in pairs]
    peer = carracing_valid_tracks_per_s()
    gates = []
    cpu_best = max((r["valid_courses_per_s"] for r in rows if r["device"] == "cpu"), default=None)
    if cpu_best and "valid_tracks_per_s" in peer:
        speedup = cpu_best / peer["valid_tracks_per_s"]
        gates.append(dict(gate=f"CPU valid courses/s >= {CPU_SPEEDUP}x CarRacing (aim 100x)",
                          value=speedup, passed=speedup >= CPU_SPEEDUP))
    for r in rows:
        if r["device"] != "cpu" and r["num_envs"] == 65536:
            ms = 1e3 * r["full_device_s"]
            gates.append(dict(gate=f"65536 tracks <= {H200_FULL_MS} ms device time", value=ms,
                              passed=ms <= H200_FULL_MS))
            ratio = r["masked_one_env_device_s"] / r["full_device_s"]
            gates.append(dict(gate=f"masked regeneration <= {MASKED_RATIO}x a full one", value=ratio,
                              passed=ratio <= MASKED_RATIO))
    report = {
        "benchmark": "track_gen generation",
        "environment": {"python": platform.python_version(), "warp": wp.config.version,
                        "numpy": np.__version__, "platform": platform.platform(),
                        "devices": {d: wp.get_device(d).name for d in devices},
                        "processor": platform.processor()},
        "spec": "presets.track defaults (8 control points, ds 0.05 m, N_max 512, 64 x 64 SDF), seeds=0",
        "results": rows, "peer_carracing": peer, "gates": gates,
    }
    out = Path(args.out or ("benchmarks/results/" if args.publish else "benchmarks/out/") + "track_gen.json")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=2) + "\n")
    print(f"wrote {out}")
    for g in gates:
        print(f"{g['gate']}: {g['value']:.2f} {'yes' if g['passed'] else 'NO'}")
    for r in rows:
        print(f"{r['device']:7s} E={r['num_envs']:6d} full {1e3 * r['full_s']:9.1f} ms  masked(1) "
              f"{1e3 * r['masked_one_env_s']:8.1f} ms  {r['valid_courses_per_s']:9.0f} valid courses/s  "
              f"invalid {r['invalid_fraction']:.2%}")
    if "valid_tracks_per_s" in peer:
        print(f"CarRacing reset(): {peer['valid_tracks_per_s']:.0f} valid tracks/s")


if __name__ == "__main__":
    main()
