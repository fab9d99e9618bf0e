"""Device time of each kernel of one full generation and one step.

    python benchmarks/track_gen/kernels.py [--num-envs 65536] [--out FILE | --publish]

Where a generation's or a step's time goes, kernel by kernel, on the first
CUDA device (Warp's kernel timing: CUDA events around each launch). Writes a
JSON report with the median of ``--reps`` runs per kernel, slowest first.
"""

from __future__ import annotations

import argparse
import collections
import json
import statistics
from pathlib import Path

import warp as wp

from track_gen.course import Course
from track_gen.pipeline import presets


def kernel_times(fn, reps: int) -> dict[str, float]:
    """Median device seconds per kernel name over ``reps`` calls of ``fn``."""
    fn()
    samples: dict[str, list[float]] = collections.defaultdict(list)
    for _ in range(reps):
        wp.timing_begin(cuda_filter=wp.TIMING_KERNEL)
        fn()
        per_call: dict[str, float] = collections.defaultdict(float)
        for result in wp.timing_end():
            per_call[result.name] += result.elapsed / 1e3
        for name, seconds in per_call.items():
            samples[name].append(seconds)
    times = {name: statistics.median(v) for name, v in samples.items()}
    return dict(sorted(times.items(), key=lambda kv: -kv[1]))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--num-envs", type=int, default=65536)
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--out", default=None, help="report path (default benchmarks/out/track_gen_kernels.json)")
    parser.add_argument("--publish", action="store_true",
                        help="write the committed report, benchmarks/results/track_gen_kernels.json")
    args = parser.parse_args()
    wp.init()
    device = "cuda:0"
    e = args.num_envs
    course = Course.track(presets.track(num_envs=e, device=device), seeds=0)
    pos = wp.array(course.result.center.numpy()[:, 0], dtype=wp.vec3, device=device)
    quat = wp.full(e, wp.quat_identity(), dtype=wp.quatf, device=device)
    he = wp.full(e, wp.vec2f(0.02, 0.01), dtype=wp.vec2f, device=device)
    course.bind(position=pos, orientation=quat, half_extents=he)
    course.step()
    report = {"device": wp.get_device(device).name, "num_envs": e, "warp": wp.config.version,
              "generation_s": kernel_times(lambda: course.generator.enqueue(advance=True), args.reps),
              "step_s": kernel_times(course.step, args.reps)}
    out = Path(args.out or ("benchmarks/results/" if args.publish else "benchmarks/out/") + "track_gen_kernels.json")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=2) + "\n")
    print(f"wrote {out}")
    for part in ("generation_s", "step_s"):
        total = sum(report[part].values())
        print(f"{part[:-2]}: {1e3 * total:.3f} ms in kernels")
        for name, seconds in report[part].items():
            print(f"  {1e6 * seconds:10.1f} us  {name}")


if __name__ == "__main__":
    main()
