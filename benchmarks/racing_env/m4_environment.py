"""The M4 environment-throughput protocol of racing_env, in one run.

    python benchmarks/racing_env/m4_environment.py [--out FILE] [--worlds 1024]
        [--steps 10000] [--scale-worlds 8192 65536] [--scale-steps 2000]
        [--rounds 5]

On a CUDA device (the formal run, ``mjx_warp``):

1. Tracks: track_gen generates courses on the GPU; the integration layer's
   bridge admits the valid ones as a TrackPool (on the device); world i of
   the headline run drives on pool row i, so 1,024 worlds use 1,024
   different validated tracks.
2. Timed run: ``--steps`` env steps of ``--worlds`` worlds without per-step
   host synchronisation (one ``block_until_ready`` per round), actions
   cycled from 64 random in-range batches held on the device.
3. Raw physics: the same car, worlds, substeps and calling pattern (one
   jitted, donated call per control step, the timed run's actions mapped
   to actuator controls by ``car.controls``) with no env logic; the env's
   share = env transitions/s / raw transitions/s. A second raw run under
   constant controls is reported beside it. The three are timed in
   ``--rounds`` interleaved rounds (env, raw, constant raw, again), and
   each reports its median round: at 1,024 worlds a step is bound by the
   host's dispatch, which drifts by tens of percent over a minute. A
   fourth, timed in the same rounds, loops the env's pure core
   (`racing_env.core.step`) on the device, a round's calls in one jitted
   ``fori_loop`` from a copy of the env's state: what a pure-JAX trainer
   runs (reported with its speed-up over the per-call env; no gate).
4. Health run: zero actions for the Level's timeout + 2 steps from a fresh
   seeded reset; every world must time out exactly once and autoreset on
   the next call; no success, off-track or invalid action; every public
   value finite at every step.
5. Transfer guards (``jax.transfer_guard("disallow")``, both directions on
   the GPU) around an active step and a mixed-world autoreset step.
6. Warp graph captures counted through the timed rounds: none may happen
   (the env, its raw twin and the constant-control twin alternate, as a
   training loop alternates the env with other device work).
7. Process VRAM sampled by a background thread (``nvidia-smi``) through the
   timed rounds: peak, and growth after the first tenth of them.
8. ``--scale-worlds``: the timed rounds and their raw-physics twins at more worlds
   (on rows drawn from the pool by SeedSequence domain 2).

Gates (one H200): >= 500,000 transitions/s at 1,024 worlds; >= 4,000,000 at
65,536; env >= 0.8 of raw physics at every size; no graph capture in the
timed rounds at any size; zero steady VRAM growth;
zero non-finite public values; every world times out and autoresets in the
health run; both transfer guards pass. The report passes only when every
gate passes. Without CUDA it runs a small ``mjx_warp`` smoke on Warp's CPU
device (evaluating no throughput gate) and writes
``benchmarks/out/m4_environment_cpu.json``; on a GPU it writes
``benchmarks/out/m4_environment_report.json``, or with ``--publish`` the
committed ``benchmarks/v0.1/m4_environment_report.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
import warp as wp  # noqa: E402
from protocol import (  # noqa: E402
    CoreScanStepper,
    ACTION_BATCHES,
    CaptureCounter,
    EnvStepper,
    VramSampler,
    environment,
    gate,
    health_run,
    logger,
    random_actions,
    source_hashes,
    transfer_guards,
    vram_summary,
)

from racing_env import LEVEL_0, Level, ProjectConfig, VecCarRacingEnv, car  # noqa: E402
from racing_env.physics import MjxWarpPhysics  # noqa: E402
from racing_stack.bridge import pool_from_course  # noqa: E402
from track_gen.course import Course  # noqa: E402
from track_gen.pipeline import presets  # noqa: E402

#: track_gen seeds of the benchmark's courses: TRACK_SEED + env index.
TRACK_SEED = 1_000_000
GATE_TPS_1024 = 500_000
GATE_TPS_65536 = 4_000_000
GATE_SHARE = 0.8
#: Level 1 of the benchmark: the Level 0 timeout on generated tracks.
LEVEL = Level(level_id=1, name="m4", max_episode_steps=LEVEL_0.max_episode_steps)
log = logger("m4")


def make_pool(num_tracks: int, device: str):
    """Generate courses on `device`; admit the valid ones and keep the first
    `num_tracks` of them (all on the device)."""
    t0 = time.perf_counter()
    generated = int(num_tracks * 1.1) + 16
    course = Course.track(presets.track(num_envs=generated, device=device), seeds=TRACK_SEED)
    pool = pool_from_course(course, level_id=LEVEL.level_id, split="m4")
    valid = len(pool)
    if valid < num_tracks:
        raise RuntimeError(f"only {valid} valid courses of {generated}; need {num_tracks}")
    return pool.take(range(num_tracks)), {"generated": generated, "valid": valid, "admitted": num_tracks,
                  "track_gen_seeds": f"{TRACK_SEED} + env index", "seconds": time.perf_counter() - t0}


class PhysicsStepper:
    """Raw MJX-Warp: the same car, worlds and substeps, one jitted donated
    call per control step (compiled like the env's step), no env logic.

    With `actions` (the env's own batches, cycled the same way) each call
    maps its action to actuator controls with `car.controls` inside the
    jitted call, so the physics sees what the env's worlds see, less the
    env: no validity or clipping, no Race Core, reward, termination or
    reset. With None the controls are one constant device array (steering
    0.1 rad, 300 N m on each rear wheel), every car driving the same arc.
    """

    def __init__(self, config: ProjectConfig, start_qpos: jax.Array, actions: list[jax.Array] | None) -> None:
        self.worlds = start_qpos.shape[0]
        physics = MjxWarpPhysics(config, self.worlds)
        self.data = physics.reset(physics.initial(), jnp.ones(self.worlds, bool), start_qpos)
        if actions is None:
            self.name = "physics_constant_controls"
            self.controls = "constant"
            self.inputs = [jnp.tile(jnp.array([[0.1, 0.1, 0.0, 0.0, 300.0, 300.0]], jnp.float32), (self.worlds, 1))]

            def body(data, ctrl):
                return physics.step(data, ctrl)
        else:
            self.name = "physics"
            self.controls = "the env run's random actions through car.controls"
            self.inputs = actions

            def body(data, action):
                return physics.step(data, car.controls(config, action, data.qvel))
        self.step = jax.jit(body, donate_argnums=(0,), out_shardings=self.data.qpos.sharding, keep_unused=True)
        self.calls = 0

    def run(self, steps: int) -> float:
        """Seconds for `steps` calls, dispatched back to back, one sync at the end."""
        start = time.perf_counter()
        for _ in range(steps):
            self.data = self.step(self.data, self.inputs[self.calls % len(self.inputs)])
            self.calls += 1
        jax.block_until_ready(self.data)
        return time.perf_counter() - start


def timed_runs(env: VecCarRacingEnv, steps: int, rounds: int, sampler: VramSampler | None) -> dict[str, Any]:
    """The env and its two raw-physics twins, each warmed up (first call
    timed) and then timed in `rounds` interleaved rounds of steps/rounds
    calls (env, raw, constant-control raw, then again), so slow drift of
    the host or the GPU falls on all three alike; each reports its median
    round. Warp graph captures during the rounds are counted: the three
    alternate, so a graph keyed on operand addresses would be captured
    again and again."""
    qpos = start_qpos_of(env)
    steppers = [EnvStepper(env), PhysicsStepper(env.config, qpos, random_actions(env, 0)),
                PhysicsStepper(env.config, qpos, None)]
    first = {s.name: s.run(1) for s in steppers}
    scan_error = None
    try:  # reported, not gated: a failure here must not cost the protocol's own runs
        scan = CoreScanStepper(env)
        first[scan.name] = scan.run(1)
        steppers.append(scan)
    except Exception as error:
        scan_error = f"{type(error).__name__}: {str(error)[:500]}"
    for s in steppers:
        s.run(20)
    per_round = max(1, steps // rounds)
    times: dict[str, list[float]] = {s.name: [] for s in steppers}
    start = time.perf_counter()
    with CaptureCounter() as captures:
        for _ in range(rounds):
            for s in steppers:
                times[s.name].append(s.run(per_round))
    end = time.perf_counter()
    result: dict[str, Any] = {"graph_captures_in_rounds": captures.count}
    for s in steppers:
        median = float(np.median(times[s.name]))
        result[s.name] = {
            "worlds": s.worlds,
            "rounds": rounds,
            "steps_per_round": per_round,
            "round_seconds": times[s.name],
            "median_round_seconds": median,
            "first_call_s": first[s.name],
            "transitions_per_s": per_round * s.worlds / median,
        }
        if isinstance(s, PhysicsStepper):
            result[s.name]["controls"] = s.controls
    result["env"]["env_steps_per_s"] = per_round / result["env"]["median_round_seconds"]
    result["env"]["final_nonfinite"] = steppers[0].final_nonfinite()
    if scan_error is None:
        result["core_scan"]["final_nonfinite"] = steppers[3].final_nonfinite()
        result["core_scan_speedup_over_env"] = (result["core_scan"]["transitions_per_s"]
                                                / result["env"]["transitions_per_s"])
    else:
        result["core_scan"] = {"error": scan_error}
    if sampler is not None:
        result["env"]["vram"] = vram_summary(sampler.samples, start, end)
    return result


def build_env(worlds: int, pool, level: Level) -> tuple[VecCarRacingEnv, dict[str, float]]:
    times = {}
    t0 = time.perf_counter()
    env = VecCarRacingEnv(worlds, config=ProjectConfig(), level=level, backend="mjx_warp", track_pool=pool)
    times["creation_s"] = time.perf_counter() - t0
    t0 = time.perf_counter()
    options = {"track_indices": np.arange(worlds) % len(pool)} if worlds <= len(pool) else None
    jax.block_until_ready(env.reset(seed=0, options=options))
    times["reset_compile_s"] = time.perf_counter() - t0
    t0 = time.perf_counter()
    jax.block_until_ready(env.step(jnp.zeros((worlds, 2), jnp.float32)))
    times["first_step_compile_s"] = time.perf_counter() - t0
    return env, times


def start_qpos_of(env: VecCarRacingEnv) -> jax.Array:
    """The start pose of every world's current track (for the raw run)."""
    start = env.params.tracks.start[env.core_state()[0].race.row]
    return car.start_qpos(env.config, start[:, 0], start[:, 1], start[:, 2])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", help="report path (default benchmarks/out/m4_environment_report.json)")
    parser.add_argument("--publish", action="store_true",
                        help="write the committed report, benchmarks/v0.1/m4_environment_report.json (GPU only)")
    parser.add_argument("--worlds", type=int, default=1024)
    parser.add_argument("--steps", type=int, default=10_000)
    parser.add_argument("--scale-worlds", type=int, nargs="*", default=[8192, 65536])
    parser.add_argument("--scale-steps", type=int, default=2_000)
    parser.add_argument("--rounds", type=int, default=5, help="interleaved timing rounds per size")
    args = parser.parse_args()
    gpu = jax.default_backend() == "gpu"
    if not gpu:
        wp.config.log_level = wp.LOG_WARNING  # no banner or module lines (Warp 1.18 ignores config.quiet)
        args.worlds, args.steps, args.scale_worlds, args.scale_steps, args.rounds = 4, 20, [], 0, 2
    if args.out is None:
        folder = "benchmarks/v0.1/" if gpu and args.publish else "benchmarks/out/"
        args.out = folder + ("m4_environment_report.json" if gpu else "m4_environment_cpu.json")
    device = "cuda:0" if gpu else "cpu"
    # The CPU smoke reaches its timeout after a few steps.
    level = LEVEL if gpu else Level(level_id=LEVEL.level_id, name="m4-cpu-smoke", max_episode_steps=8)
    report: dict[str, Any] = {"protocol": "M4", "environment": environment(), "source_sha256": source_hashes(__file__),
                              "config": {"project": ProjectConfig().__dict__, "level": level.__dict__,
                                         "backend": "mjx_warp", "worlds": args.worlds, "steps": args.steps,
                                         "scale_worlds": args.scale_worlds, "scale_steps": args.scale_steps,
                                         "rounds": args.rounds,
                                         "actions": f"{ACTION_BATCHES} uniform random in-range batches, cycled"}}
    log(f"generating {args.worlds} valid tracks on {device}")
    pool, generation = make_pool(args.worlds, device)
    report["tracks"] = {**generation, "track_ids": np.asarray(pool.track_id).tolist(),
                        "lap_m": {"min": float(jnp.min(pool.track_length)), "max": float(jnp.max(pool.track_length))}}

    log(f"building the env: {args.worlds} worlds")
    env, compile_times = build_env(args.worlds, pool, level)
    report["compile"] = compile_times
    log(f"compile {compile_times}")
    _, info = env.reset(seed=0, options={"track_indices": np.arange(args.worlds) % len(pool)})
    distinct = len(set(np.asarray(info["track_id"]).tolist()))
    report["tracks"]["distinct_tracks_in_timed_run"] = distinct
    sampler = VramSampler() if gpu else None
    if sampler is not None:
        sampler.__enter__()
    log("timed runs: env and raw physics, interleaved")
    runs = {args.worlds: timed_runs(env, args.steps, args.rounds, sampler)}
    if sampler is not None:
        sampler.__exit__()
    log(f"env {runs[args.worlds]['env']['transitions_per_s']:.0f}, "
        f"raw {runs[args.worlds]['physics']['transitions_per_s']:.0f} transitions/s")
    log("health run")
    report["health"] = health_run(env)
    log(f"health {report['health']}")
    report["transfer_guards"] = transfer_guards(env)
    report["transfer_guards"]["directions"] = "host-to-device and device-to-host" if gpu else "host-to-device only"
    del env
    failed: dict[int, str] = {}
    for worlds in args.scale_worlds:
        log(f"scale run: {worlds} worlds")
        try:
            big, times = build_env(worlds, pool, level)
            runs[worlds] = {"compile": times, **timed_runs(big, args.scale_steps, args.rounds, None)}
            del big
        except Exception as error:  # recorded: the gates of this size then fail
            failed[worlds] = f"{type(error).__name__}: {str(error)[:500]}"
            log(f"{worlds} failed: {failed[worlds]}")
            continue
        log(f"{worlds}: env {runs[worlds]['env']['transitions_per_s']:.0f}, "
            f"raw {runs[worlds]['physics']['transitions_per_s']:.0f} transitions/s")
    for run in runs.values():
        run["env_share_of_physics"] = run["env"]["transitions_per_s"] / run["physics"]["transitions_per_s"]
        run["env_share_of_constant_control_physics"] = (
            run["env"]["transitions_per_s"] / run["physics_constant_controls"]["transitions_per_s"])
    report["runs"] = {str(k): v for k, v in runs.items()}
    report["failed_runs"] = {str(k): v for k, v in failed.items()}

    health = report["health"]
    gates = []
    if gpu:
        headline = runs[args.worlds]["env"]
        gates.append(gate("transitions_per_s_1024", headline["transitions_per_s"], GATE_TPS_1024,
                          args.worlds == 1024 and headline["transitions_per_s"] >= GATE_TPS_1024))
        big = runs.get(65536)
        gates.append(gate("transitions_per_s_65536", big and big["env"]["transitions_per_s"], GATE_TPS_65536,
                          big is not None and big["env"]["transitions_per_s"] >= GATE_TPS_65536))
        for worlds, run in runs.items():
            gates.append(gate(f"env_share_of_physics_{worlds}", run["env_share_of_physics"], GATE_SHARE,
                              run["env_share_of_physics"] >= GATE_SHARE))
        for worlds, run in runs.items():
            count = run["graph_captures_in_rounds"]
            gates.append(gate(f"graph_captures_in_timed_rounds_{worlds}", count, 0, count == 0))
        for worlds in failed:
            gates.append(gate(f"run_{worlds}_completed", False, True, False))
        growth = headline["vram"]["steady_growth_mib"]
        gates.append(gate("steady_vram_growth_mib", growth, 0, growth == 0))
        gates.append(gate("distinct_validated_tracks", distinct, args.worlds, distinct == args.worlds == 1024))
    nonfinite = health["nonfinite_public_values"] + sum(
        r["env"]["final_nonfinite"] + r["core_scan"].get("final_nonfinite", 0) for r in runs.values())
    gates.append(gate("nonfinite_public_values", nonfinite, 0, nonfinite == 0))
    every = health["worlds"]
    gates.append(gate("health_every_world_times_out_once", health["worlds_timed_out_once"], every,
                      health["worlds_timed_out_once"] == every and health["timeouts"] == every))
    gates.append(gate("health_every_world_autoresets_once", health["worlds_reset_once"], every,
                      health["worlds_reset_once"] == every and health["autoresets"] == every))
    unexpected = health["success"] + health["off_track"] + health["invalid_action"]
    gates.append(gate("health_no_other_outcome", unexpected, 0, unexpected == 0))
    for name in ("active_step", "mixed_autoreset_step"):
        passed = report["transfer_guards"][name]["passed"]
        gates.append(gate(f"transfer_guard_{name}", passed, True, passed))
    report["gates"] = gates
    report["passed"] = gpu and all(g["passed"] for g in gates)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=2, default=float) + "\n")
    log(f"wrote {out}: passed={report['passed']}" + ("" if gpu else " (a smoke run: only a GPU run can pass)"))
    for g in gates:
        log(f"  {'PASS' if g['passed'] else 'FAIL'} {g['name']}: {g['value']} (gate {g['threshold']})")


if __name__ == "__main__":
    sys.exit(main())
