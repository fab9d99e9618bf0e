"""Benchmark the runtime step and the recorded RL step with auto-reset.

    python benchmarks/track_gen/step.py [--sizes 1024,65536] [--out FILE | --publish]

For each device (``cpu``, and ``cuda:0`` when present) and batch size E:
``course.step()`` eagerly and under graph replay; the whole recorded RL step
(a trivial sim, ``course.step()``, a reward-and-done kernel, a masked
regeneration, a respawn kernel) replayed; and the replay cost of the masked
regeneration alone with an all-zero mask against one masked env. Writes a
JSON report.

Gates (an H200, device time under graph replay): ``step()`` for 65536 envs
under 100 us; the regeneration part of a replay whose mask is all zero under
20 us (the conditional skip). On CPU the regeneration is recorded
unconditionally, so the all-zero replay costs a (masked, empty) generation:
the report says which.
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
from pathlib import Path
from typing import Any

import numpy as np
import warp as wp

from track_gen.course import Course
from track_gen.pipeline import presets

sys.path.insert(0, str(Path(__file__).parent))
from timing import captured, median_seconds, replay_seconds, runs  # noqa: E402

STEP_US = 100.0
EMPTY_REGEN_US = 20.0


@wp.kernel
def drive(center: wp.array2d(dtype=wp.vec3), count: wp.array(dtype=wp.int32),
          idx: wp.array(dtype=wp.int32), pos: wp.array(dtype=wp.vec3)):
    """A trivial sim: every agent moves 2 course-line points ahead."""
    e = wp.tid()
    n = wp.max(count[e], 1)
    i = (idx[e] + 2) % n
    idx[e] = i
    pos[e] = wp.where(count[e] > 0, center[e, i], wp.vec3(0.0))


@wp.kernel
def reward_and_done(valid: wp.array(dtype=wp.int32), oob: wp.array(dtype=wp.int32),
                    passed: wp.array(dtype=wp.int32), laps: wp.array(dtype=wp.int32),
                    reward: wp.array(dtype=wp.float32), done: wp.array(dtype=wp.int32)):
    e = wp.tid()
    ok = valid[e] != 0
    reward[e] = wp.where(ok, 10.0 * float(passed[e]) - 5.0 * float(oob[e]), 0.0)
    done[e] = wp.where(ok and laps[e] < 1 and oob[e] == 0, 0, 1)


@wp.kernel
def respawn(mask: wp.array(dtype=wp.int32), center: wp.array2d(dtype=wp.vec3),
            idx: wp.array(dtype=wp.int32), pos: wp.array(dtype=wp.vec3)):
    e = wp.tid()
    if mask[e] != 0:
        idx[e] = 0
        pos[e] = center[e, 0]


def bench(device: str, size: int, reps: int) -> dict[str, Any]:
    course = Course.track(presets.track(num_envs=size, device=device), seeds=0)
    r = course.result
    pos = wp.zeros(size, dtype=wp.vec3, device=device)
    quat = wp.full(size, wp.quat_identity(), dtype=wp.quatf, device=device)
    he = wp.full(size, wp.vec2f(0.02, 0.01), dtype=wp.vec2f, device=device)
    idx = wp.zeros(size, dtype=wp.int32, device=device)
    reward = wp.zeros(size, dtype=wp.float32, device=device)
    done = course.inputs["regen_mask"]
    course.bind(position=pos, orientation=quat, half_extents=he)
    wp.launch(respawn, size, [course.generator.everyone, r.center, idx, pos], device=device)
    course.step()

    def rl_step() -> None:
        wp.launch(drive, size, [r.center, r.count, idx, pos], device=device)
        res = course.step()
        wp.launch(reward_and_done, size, [res.valid, res.contacts.oob, res.events.passed, res.events.laps,
                                          reward, done], device=device)
        course.regenerate(mask=done, advance=True)
        wp.launch(respawn, size, [done, r.center, idx, pos], device=device)

    zero = wp.zeros(size, dtype=wp.int32, device=device)
    one = wp.array(np.eye(1, size, size // 2, dtype=np.int32)[0], dtype=wp.int32, device=device)
    step_graph = captured(course.step, device)
    rl_graph = captured(rl_step, device)
    empty_graph = captured(lambda: course.regenerate(mask=zero, advance=True), device)
    one_graph = captured(lambda: course.regenerate(mask=one, advance=True), device)
    row = {
        "device": device, "num_envs": size,
        "step_eager_s": median_seconds(course.step, device, reps),
        "step_replay_s": replay_seconds(step_graph, device, reps),
        "rl_step_replay_s": replay_seconds(rl_graph, device, reps),
        "regen_all_zero_replay_s": replay_seconds(empty_graph, device, reps),
        "regen_one_env_replay_s": replay_seconds(one_graph, device, reps),
        "regen_eager_all_zero_s": median_seconds(lambda: course.regenerate(mask=zero), device, reps),
        "regeneration_recorded": ("behind a conditional node (skipped when no env is masked)"
                                  if wp.get_device(device).is_cuda and wp.is_conditional_graph_supported()
                                  else "unconditionally (a full masked generation per replay)"),
    }
    print(f"{device} E={size}: " + json.dumps(row), file=sys.stderr, flush=True)
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sizes", default="1024,65536")
    parser.add_argument("--cpu-sizes", default="1024",
                        help="sizes on the CPU device (its grid kernels make 65536 take seconds a replay)")
    parser.add_argument("--out", default=None, help="report path (default benchmarks/out/track_gen_step.json)")
    parser.add_argument("--publish", action="store_true",
                        help="write the committed report, benchmarks/results/track_gen_step.json")
    args = parser.parse_args()
    devices, pairs = runs(args.sizes, args.cpu_sizes)
    rows = [bench(d, size, 20 if d != "cpu" else 3) for d, size in pairs]
    gates = []
    for r in rows:
        if r["device"] != "cpu" and r["num_envs"] == 65536:
            gates.append(dict(gate=f"step() for 65536 envs < {STEP_US} us (replay)", value=1e6 * r["step_replay_s"],
                              passed=1e6 * r["step_replay_s"] < STEP_US))
            gates.append(dict(gate=f"all-zero regeneration replay < {EMPTY_REGEN_US} us",
                              value=1e6 * r["regen_all_zero_replay_s"],
                              passed=1e6 * r["regen_all_zero_replay_s"] < EMPTY_REGEN_US))
    report = {"benchmark": "track_gen runtime step",
              "environment": {"python": platform.python_version(), "warp": wp.config.version,
                              "platform": platform.platform(), "devices": {d: wp.get_device(d).name for d in devices}},
              "timing": ("eager: median wall time per call, synchronised; replay: device time of one "
                         "wp.capture_launch (CUDA events around 20 back-to-back replays; wall time on cpu)"),
              "results": rows, "gates": gates}
    out = Path(args.out or ("benchmarks/results/" if args.publish else "benchmarks/out/") + "track_gen_step.json")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=2) + "\n")
    print(f"wrote {out}")
    for r in rows:
        print(f"{r['device']:7s} E={r['num_envs']:6d} step eager {1e3 * r['step_eager_s']:8.2f} ms, replay "
              f"{1e3 * r['step_replay_s']:8.2f} ms; RL step replay {1e3 * r['rl_step_replay_s']:8.2f} ms; "
              f"regen replay all-zero {1e3 * r['regen_all_zero_replay_s']:8.2f} ms, one env "
              f"{1e3 * r['regen_one_env_replay_s']:8.2f} ms")
    for g in gates:
        print(f"{g['gate']}: {g['value']:.1f} {'yes' if g['passed'] else 'NO'}")


if __name__ == "__main__":
    main()
