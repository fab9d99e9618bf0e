"""The M5 TrackPool protocol of racing_env, in one run.

    python benchmarks/racing_env/m5_track_pool.py [--out FILE] [--worlds 1024]
        [--steps 10000] [--epochs 3] [--rounds 5] [--reset-events 65536]

On a CUDA device (the formal run, ``mjx_warp``, Level 1):

1. The pool: Level 1's full Train split (10,000 tracks), materialized into
   the local cache (built on the CPU when the cache lacks it) and verified,
   every geometry hash, against the committed manifest.
2. Two envs of ``--worlds`` worlds on the same config, Level and backend:
   one on the whole Train pool (its own SeedSequence domain-2 choice at
   every reset and autoreset), and the fixed-track baseline on Train row 0.
3. Epochs E0 (warm-up: first compile, the allocators' one-time growth) and
   E1..E``--epochs`` (measured), each with its own reset seed: both envs
   reset, then ``--steps`` steps of each under the same cycled random
   in-range actions (so worlds leave the track and autoreset onto new
   pool rows all the time) in ``--rounds`` interleaved rounds (pool round,
   fixed round, again), each env reporting its median round. The ratio
   gated is pool / fixed over all measured rounds together.
4. Memory after every epoch: process VRAM (``nvidia-smi``, also sampled
   through the epochs by a background thread), the arrays Python holds,
   JAX's allocator (pool and peak gated; bytes in use reported) and Warp's
   memory pool (current, high-water mark); none may grow after E0.
5. JIT-cache stability: JAX backend compiles and Warp graph captures
   counted through the measured epochs: none may happen.
6. Health run on the pool env: zero actions for the Level's timeout + 2
   steps; every world times out once and autoresets once, onto its own
   domain-2 row; no other outcome; every public value finite.
7. Reset reference: ``--reset-events`` requested resets (random worlds
   sent a NaN action, so they end as ``invalid_action`` and reset by
   NEXT_STEP on the next call; zero actions elsewhere); every reset row's
   episode seed, controller seed, track id and track length are checked
   against the host NumPy SeedSequence reference, its reward and flags
   against the contract, and every terminal row's track id against the
   episode it ends.
8. Transfer guards (both directions) around an active step and a
   mixed-world autoreset step of the pool env.
9. Privacy: every reset, step and autoreset output carries exactly the
   public observation and info fields; a probe controller run by the
   Runner on the Train pool records that it receives host NumPy values of
   those fields only and a config of the plugin's and the Challenge's keys
   only.
10. Source binding: sha256 of every package source file and of this
    protocol, the committed manifest's sha256 and benchmark version.

Gates (one H200): pool / fixed-track throughput >= 0.97; zero growth of
process VRAM, held arrays, allocator pool, allocator peak and Warp's pool
after E0; zero
compiles and captures after E0; every health, reference, transfer, privacy
and source check passes. The report passes only when every gate passes;
its picture (throughput per epoch, process VRAM over time) is written
beside it as ``.png``.
Without CUDA it runs a small ``mjx_warp`` smoke on Warp's CPU device on the
first 64 Train tracks (evaluating no throughput or memory gate) and writes
``benchmarks/out/m5_track_pool_cpu.json``; on a GPU it writes
``benchmarks/out/m5_track_pool_report.json``, or with ``--publish`` the
committed ``benchmarks/v0.1/m5_track_pool_report.json``.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
import warp as wp  # noqa: E402
from protocol import (  # noqa: E402
    ACTION_BATCHES,
    CaptureCounter,
    EnvStepper,
    VramSampler,
    environment,
    gate,
    health_run,
    logger,
    shown,
    source_hashes,
    transfer_guards,
)

from racing_env import BENCHMARK_VERSION, LEVEL_1, Level, ProjectConfig, TrackPool, VecCarRacingEnv, seeds  # noqa: E402
from racing_env.plugins import CHALLENGE_KEYS, load_plugin  # noqa: E402
from racing_env.runner import challenge_values, run  # noqa: E402
from racing_env.types import INFO_FIELDS, OBSERVATION_FIELDS  # noqa: E402
from racing_stack import pools  # noqa: E402

GATE_POOL_SHARE = 0.97
#: Reset seed of epoch k: EPOCH_SEED + k.
EPOCH_SEED = 100
#: Reset seed of the reset-reference run.
REFERENCE_SEED = 7
log = logger("m5")

PROBE = '''
import json
import numpy as np
from racing_env import Controller


def describe(tree):
    return {k: (type(v).__module__ + "." + type(v).__name__, list(np.shape(v)), str(getattr(v, "dtype", "")))
            for k, v in tree.items()}


class Probe(Controller):
    """Records what it is given, then drives straight."""

    def __init__(self, obs, info, config):
        super().__init__(obs, info, config)
        self.log = open(config["controller"]["log"], "a")
        self.write("init", obs=describe(obs), info=describe(info), config=sorted(config))

    def write(self, call, **fields):
        self.log.write(json.dumps({"call": call, **fields}) + "\\n")
        self.log.flush()

    def compute_control(self, obs, info=None):
        self.write("compute_control", obs=describe(obs), info=describe(info))
        return np.zeros(2, np.float32)

    def step_callback(self, action, obs, reward, terminated, truncated, info):
        self.write("step_callback", obs=describe(obs), info=describe(info),
                   scalars=[type(x).__name__ for x in (reward, terminated, truncated)])
'''


def load_train_pool(size: int | None) -> tuple[TrackPool, dict[str, Any]]:
    """The Train pool from the cache, verified against the committed manifest
    (``size`` None), or its first ``size`` tracks built here and checked
    against the manifest's first entries (the CPU smoke)."""
    t0 = time.perf_counter()
    manifest_path = pools.MANIFESTS / f"{pools.pool_name('train')}.json"
    manifest = json.loads(manifest_path.read_text())
    pool = pools.materialize_prefix("train", size, progress=log)
    return pool, {
        "split": "train",
        "tracks": len(pool),
        "rows_verified_against_manifest": len(pool),
        "manifest": shown(manifest_path),
        "manifest_sha256": hashlib.sha256(manifest_path.read_bytes()).hexdigest(),
        "manifest_benchmark_version": manifest["benchmark_version"],
        "pool_benchmark_version": pool.benchmark_version,
        "lap_m": {"min": float(jnp.min(pool.track_length)), "max": float(jnp.max(pool.track_length))},
        "seconds": time.perf_counter() - t0,
    }


def build_envs(worlds: int, pool: TrackPool, level: Level) -> tuple[dict[str, VecCarRacingEnv], dict[str, Any]]:
    """The pool env and the fixed-track env (Train row 0), each reset and
    stepped once (its compiles, timed)."""
    envs, times = {}, {}
    for name, source in (("pool", {"track_pool": pool}), ("fixed", {"track": pool.track(0)})):
        t0 = time.perf_counter()
        env = VecCarRacingEnv(worlds, config=ProjectConfig(), level=level, backend="mjx_warp", **source)
        t1 = time.perf_counter()
        jax.block_until_ready(env.reset(seed=EPOCH_SEED))
        t2 = time.perf_counter()
        jax.block_until_ready(env.step(jnp.zeros((worlds, 2), jnp.float32)))
        times[name] = {"creation_s": t1 - t0, "reset_compile_s": t2 - t1,
                       "first_step_compile_s": time.perf_counter() - t2}
        envs[name] = env
    return envs, times


class CompileCounter:
    """JAX backend compiles (``jax.monitoring`` events) while active."""

    EVENT = "/jax/core/compile/backend_compile_duration"

    def __init__(self) -> None:
        self.count = 0
        self.active = False
        jax.monitoring.register_event_duration_secs_listener(self._listen)

    def _listen(self, event: str, duration: float, **kwargs: Any) -> None:
        if self.active and event == self.EVENT:
            self.count += 1


def memory() -> dict[str, Any]:
    """The device's memory now: the arrays Python holds (count, bytes), JAX's
    allocator statistics (bytes) and Warp's memory pool (bytes), CUDA only."""
    stats = jax.devices()[0].memory_stats() or {}
    device = wp.get_device("cuda:0")
    live = jax.live_arrays()
    return {
        "live_arrays": len(live),
        "live_array_bytes": sum(x.nbytes for x in live),
        "jax_bytes_in_use": stats.get("bytes_in_use"),
        "jax_pool_bytes": stats.get("pool_bytes", stats.get("bytes_reserved")),
        "jax_peak_bytes_in_use": stats.get("peak_bytes_in_use"),
        "warp_mempool_current": wp.get_mempool_used_mem_current(device),
        "warp_mempool_high": wp.get_mempool_used_mem_high(device),
    }


#: Memory figures whose growth after E0 is reported but not gated: XLA's
#: bytes in use also counts its own small transient buffers (it moved by a
#: few kB of 707 MB between epochs on an H200 while the arrays Python holds,
#: the allocator's pool and its peak stayed exactly flat).
UNGATED_MEMORY = ("jax_bytes_in_use",)


def epochs(envs: dict[str, VecCarRacingEnv], count: int, steps: int, rounds: int, gpu: bool,
           sampler: VramSampler | None) -> dict[str, Any]:
    """E0 and ``count`` measured epochs of both envs, interleaved by rounds."""
    steppers = {name: EnvStepper(env) for name, env in envs.items()}
    per_round = max(1, steps // rounds)
    compiles = CompileCounter()
    out: list[dict[str, Any]] = []
    for k in range(count + 1):
        measured = k > 0
        for env in envs.values():
            env.reset(seed=EPOCH_SEED + k)
        times: dict[str, list[float]] = {name: [] for name in steppers}
        compiles.count, compiles.active = 0, True
        start = time.perf_counter()
        with CaptureCounter() as captures:
            for _ in range(rounds):
                for name, stepper in steppers.items():
                    times[name].append(stepper.run(per_round))
        end = time.perf_counter()
        compiles.active = False
        epoch: dict[str, Any] = {"epoch": f"E{k}", "measured": measured, "seed": EPOCH_SEED + k,
                                 "steps": per_round * rounds, "rounds": rounds, "start_s": start, "end_s": end,
                                 "jax_compiles": compiles.count, "graph_captures": captures.count}
        for name, stepper in steppers.items():
            median = float(np.median(times[name]))
            epoch[name] = {"round_seconds": times[name], "median_round_seconds": median,
                           "transitions_per_s": per_round * stepper.worlds / median,
                           "final_nonfinite": stepper.final_nonfinite()}
        epoch["pool_share_of_fixed"] = epoch["pool"]["transitions_per_s"] / epoch["fixed"]["transitions_per_s"]
        if gpu:
            epoch["memory"] = {**memory(), "process_vram_mib": sampler.read() if sampler else None}
        log(f"E{k}: pool {epoch['pool']['transitions_per_s']:.0f}, fixed {epoch['fixed']['transitions_per_s']:.0f} "
            f"transitions/s ({epoch['pool_share_of_fixed']:.3f}); compiles {compiles.count}, "
            f"captures {captures.count}")
        out.append(epoch)
    measured_rounds = {name: [t for e in out[1:] for t in e[name]["round_seconds"]] for name in steppers}
    tps = {name: per_round * envs[name].num_envs / float(np.median(r)) for name, r in measured_rounds.items()}
    return {"epochs": out, "measured_transitions_per_s": tps,
            "measured_transitions": per_round * rounds * count * envs["pool"].num_envs,
            "pool_share_of_fixed": tps["pool"] / tps["fixed"]}


def memory_growth(epoch_list: list[dict[str, Any]], samples: list[tuple[float, int]]) -> dict[str, Any]:
    """Each memory figure after every measured epoch less its value after E0;
    process VRAM also from the background samples taken after E0."""
    after_e0 = epoch_list[0]["memory"]
    growth = {key: max(e["memory"][key] - after_e0[key] for e in epoch_list[1:])
              for key, value in after_e0.items() if value is not None}
    e0 = [m for t, m in samples if epoch_list[0]["start_s"] <= t <= epoch_list[0]["end_s"]]
    later = [m for t, m in samples if t > epoch_list[0]["end_s"]]
    growth["process_vram_sampled_mib"] = (max(later) - later[0]) if later else None
    return {"after_e0": after_e0, "growth_after_e0": growth,
            "e0_expansion_mib": (e0[-1] - e0[0]) if e0 else None,
            "peak_sampled_process_vram_mib": max(m for _, m in samples) if samples else None,
            "samples": len(samples)}


def reset_reference(env: VecCarRacingEnv, pool: TrackPool, events: int) -> dict[str, Any]:
    """``events`` requested resets, every row checked against the host
    SeedSequence reference (the env's episode counters are not read: world
    w's k-th reset starts its episode k)."""
    rng = np.random.default_rng(11)
    ids = np.asarray(pool.track_id)
    lengths = np.asarray(pool.track_length)
    n = env.num_envs
    obs, info = env.reset(seed=REFERENCE_SEED)
    host = jax.device_get({k: v for k, v in info.items() if k != "benchmark_version"})
    host_obs = jax.device_get({"track_length": obs["track_length"]})
    episode = np.zeros(n, np.int64)
    track_of = np.asarray(host["track_id"]).copy()
    mismatches: list[dict[str, Any]] = []
    checked = 0

    def check(world: int, row_info: dict[str, Any], row_length: float, flags: tuple[float, bool, bool]) -> None:
        nonlocal checked
        k = int(episode[world])
        want = {
            "episode_seed": seeds.host_seed_word(REFERENCE_SEED, seeds.EPISODE_DOMAIN, world, k),
            "controller_seed": seeds.host_seed_word(REFERENCE_SEED, seeds.CONTROLLER_DOMAIN, world, k),
        }
        row = seeds.host_pool_row(seeds.host_seed_word(REFERENCE_SEED, seeds.TRACK_DOMAIN, world, k), len(pool))
        want["track_id"] = int(ids[row])
        got = {key: int(row_info[key]) for key in want}
        ok = got == want and row_length == float(lengths[row]) and flags == (0.0, False, False)
        ok = ok and int(row_info["termination_reason"]) == 0 and not bool(row_info["lap_completed"])
        checked += 1
        if not ok and len(mismatches) < 20:
            mismatches.append({"world": world, "episode": k, "got": got, "want": want, "flags": list(flags)})

    for w in range(n):
        check(w, {key: v[w] for key, v in host.items()}, float(host_obs["track_length"][w]), (0.0, False, False))
    pending = np.zeros(n, bool)
    requested = observed = terminal_mismatches = calls = 0
    while observed < events:
        quota = events - requested
        spoil = ~pending & (rng.random(n) < 0.5)
        spoil[np.cumsum(spoil) > quota] = False
        requested += int(spoil.sum())
        actions = np.zeros((n, 2), np.float32)
        actions[spoil] = np.nan
        obs, reward, terminated, truncated, info = env.step(actions)
        calls += 1
        host = jax.device_get({k: v for k, v in info.items() if k != "benchmark_version"})
        reward, terminated, truncated, length = jax.device_get(
            (reward, terminated, truncated, obs["track_length"]))
        for w in np.flatnonzero(pending):
            episode[w] += 1
            observed += 1
            check(int(w), {key: v[w] for key, v in host.items()}, float(length[w]),
                  (float(reward[w]), bool(terminated[w]), bool(truncated[w])))
            track_of[w] = host["track_id"][w]
        ended = np.asarray(terminated) | np.asarray(truncated)
        wrong_end = ended & (np.asarray(host["track_id"]) != track_of)
        wrong_end |= ended != spoil  # only the requested worlds end
        terminal_mismatches += int(wrong_end.sum())
        pending = ended
    return {"requested_reset_events": requested, "observed_reset_events": observed,
            "rows_checked_with_initial_reset": checked, "calls": calls, "mismatches": len(mismatches),
            "first_mismatches": mismatches, "terminal_rows_wrong": terminal_mismatches,
            "distinct_tracks_drawn": int(len(set(track_of.tolist()))), "pool_tracks": len(pool)}


def privacy(envs: dict[str, VecCarRacingEnv], pool: TrackPool, level: Level) -> dict[str, Any]:
    """Exactly the public fields in every env output, and a probe controller
    run by the Runner on the pool records only public host values."""
    env = envs["pool"]
    public_obs = set(OBSERVATION_FIELDS)
    public_info = set(INFO_FIELDS)
    outputs = [env.reset(seed=3)]
    spoiled = jnp.zeros((env.num_envs, 2), jnp.float32).at[::3].set(jnp.nan)
    outputs += [env.step(spoiled)[::4], env.step(spoiled)[::4]]  # (obs, info): a terminal and an autoreset call
    env_fields_ok = all(set(o) == public_obs and set(i) == public_info for o, i in outputs)
    with tempfile.TemporaryDirectory() as tmp:
        plugin_dir = Path(tmp) / "probe"
        plugin_dir.mkdir()
        (plugin_dir / "controller.py").write_text(PROBE)
        log_path = Path(tmp) / "calls.jsonl"
        (plugin_dir / "config.toml").write_text(f"log = {json.dumps(str(log_path))}\n")
        short = Level(level_id=level.level_id, name="m5-privacy", max_episode_steps=20)
        probe_env = VecCarRacingEnv(4, config=ProjectConfig(), level=short, backend="mjx_warp", track_pool=pool)
        result = run(load_plugin(plugin_dir), probe_env, episodes=6, seed=9)
        calls = [json.loads(line) for line in log_path.read_text().splitlines()]
    expected_config = {"controller", *challenge_values(probe_env)}
    bad: list[str] = []
    for call in calls:
        for field in ("obs", "info"):
            if field in call:
                keys, want = set(call[field]), public_obs if field == "obs" else public_info
                if keys != want:
                    bad.append(f"{call['call']} {field} keys {sorted(keys ^ want)}")
                for key, (kind, _, _) in call[field].items():
                    if not (kind.startswith("numpy.") or kind == "builtins.str"):
                        bad.append(f"{call['call']} {field}[{key}] is {kind}")
        if "config" in call and set(call["config"]) != expected_config:
            bad.append(f"config keys {call['config']}")
    return {"env_outputs_checked": len(outputs), "env_fields_exact": env_fields_ok,
            "controller_calls": len(calls), "episodes": len(result.episodes),
            "controller_errors": result.summary["controller_errors"],
            "challenge_keys_subset": set(challenge_values(probe_env)) <= set(CHALLENGE_KEYS),
            "violations": bad[:20], "violation_count": len(bad)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", help="report path (default benchmarks/out/m5_track_pool_report.json)")
    parser.add_argument("--publish", action="store_true",
                        help="write the committed report, benchmarks/v0.1/m5_track_pool_report.json (GPU only)")
    parser.add_argument("--worlds", type=int, default=1024)
    parser.add_argument("--steps", type=int, default=10_000)
    parser.add_argument("--epochs", type=int, default=3, help="measured epochs after E0")
    parser.add_argument("--rounds", type=int, default=5, help="interleaved timing rounds per epoch")
    parser.add_argument("--reset-events", type=int, default=65_536)
    args = parser.parse_args()
    gpu = jax.default_backend() == "gpu"
    level = LEVEL_1
    pool_size = None
    if not gpu:
        args.worlds, args.steps, args.epochs, args.rounds, args.reset_events = 4, 10, 1, 2, 64
        pool_size = 64
        level = Level(level_id=LEVEL_1.level_id, name="m5-cpu-smoke", max_episode_steps=8)
    if args.out is None:
        folder = "benchmarks/v0.1/" if gpu and args.publish else "benchmarks/out/"
        args.out = folder + ("m5_track_pool_report.json" if gpu else "m5_track_pool_cpu.json")
    report: dict[str, Any] = {"protocol": "M5", "environment": environment(), "source_sha256": source_hashes(__file__),
                              "config": {"project": ProjectConfig().__dict__, "level": level.__dict__,
                                         "backend": "mjx_warp", "worlds": args.worlds, "steps": args.steps,
                                         "epochs": args.epochs, "rounds": args.rounds,
                                         "reset_events": args.reset_events, "epoch_seeds": EPOCH_SEED,
                                         "actions": f"{ACTION_BATCHES} uniform random in-range batches, cycled",
                                         "fixed_track": "Train row 0"}}
    log("the Train pool")
    pool, report["pool"] = load_train_pool(pool_size)
    log(f"pool: {report['pool']}")
    log(f"building the pool and fixed-track envs: {args.worlds} worlds")
    envs, report["compile"] = build_envs(args.worlds, pool, level)
    log(f"compile {report['compile']}")
    sampler = VramSampler() if gpu else None
    if sampler is not None:
        sampler.__enter__()
    timed = epochs(envs, args.epochs, args.steps, args.rounds, gpu, sampler)
    if sampler is not None:
        sampler.__exit__()
        timed["memory"] = memory_growth(timed["epochs"], sampler.samples)
    report["timed"] = timed
    log("health run")
    report["health"] = health_run(envs["pool"])
    log(f"health {report['health']}")
    log(f"reset reference: {args.reset_events} requested resets")
    report["reset_reference"] = reset_reference(envs["pool"], pool, args.reset_events)
    log(f"reference {report['reset_reference']}")
    report["transfer_guards"] = transfer_guards(envs["pool"])
    report["transfer_guards"]["directions"] = "host-to-device and device-to-host" if gpu else "host-to-device only"
    log("privacy")
    report["privacy"] = privacy(envs, pool, level)
    log(f"privacy {report['privacy']}")
    report["gates"] = gates(report, args, gpu)
    report["passed"] = gpu and all(g["passed"] for g in report["gates"])
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=2, default=float) + "\n")
    log(f"wrote {out}: passed={report['passed']}" + ("" if gpu else " (a smoke run: only a GPU run can pass)"))
    if gpu:
        try:
            draw(report, sampler.samples, out.with_suffix(".png"))
            log(f"drew {out.with_suffix('.png')}")
        except ImportError as error:
            log(f"no picture ({error})")
    for g in report["gates"]:
        log(f"  {'PASS' if g['passed'] else 'FAIL'} {g['name']}: {g['value']} (gate {g['threshold']})")


def draw(report: dict[str, Any], samples: list[tuple[float, int]], path: Path) -> None:
    """Throughput per epoch (pool and fixed track) and process VRAM over the epochs."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    epoch_list = report["timed"]["epochs"]
    fig, (left, right) = plt.subplots(1, 2, figsize=(12, 4.2))
    x = np.arange(len(epoch_list))
    for offset, name, colour in ((-0.2, "pool", "tab:blue"), (0.2, "fixed", "tab:gray")):
        values = [e[name]["transitions_per_s"] / 1e3 for e in epoch_list]
        label = "10,000-track Train pool" if name == "pool" else "fixed track (Train row 0)"
        left.bar(x + offset, values, 0.4, color=colour, label=label)
    for k, e in enumerate(epoch_list):
        left.text(k, e["pool"]["transitions_per_s"] / 1e3 * 1.01, f"{e['pool_share_of_fixed']:.3f}", ha="center")
    left.set(xticks=x, xticklabels=[e["epoch"] for e in epoch_list], ylabel="thousand transitions/s",
             title=f"{report['config']['worlds']:,} worlds: pool / fixed = "
                   f"{report['timed']['pool_share_of_fixed']:.3f}")
    left.legend(loc="lower right", fontsize=8)
    t0 = epoch_list[0]["start_s"]
    right.plot([t - t0 for t, _ in samples], [m for _, m in samples], lw=1.2)
    for e in epoch_list:
        right.axvline(e["end_s"] - t0, color="k", lw=0.6, ls="--")
        right.text(0.5 * (e["start_s"] + e["end_s"]) - t0, 0.93, e["epoch"], ha="center",
                   transform=right.get_xaxis_transform())
    right.set(xlabel="s since E0 began", ylabel="process VRAM (MiB)", title="process VRAM through the epochs")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def gates(report: dict[str, Any], args: argparse.Namespace, gpu: bool) -> list[dict[str, Any]]:
    timed, health, ref, priv, pool = (report[k] for k in ("timed", "health", "reset_reference", "privacy", "pool"))
    measured = timed["epochs"][1:]
    out = []
    if gpu:
        share = timed["pool_share_of_fixed"]
        out.append(gate("pool_share_of_fixed_track", share, GATE_POOL_SHARE, share >= GATE_POOL_SHARE))
        full = pools.SPLITS["train"].size
        out.append(gate("full_train_pool", pool["tracks"], full, pool["tracks"] == full))
        out.append(gate("worlds", args.worlds, 1024, args.worlds == 1024))
        for key, value in timed["memory"]["growth_after_e0"].items():
            if key not in UNGATED_MEMORY:
                out.append(gate(f"growth_after_e0_{key}", value, 0, value == 0))
    compiles = sum(e["jax_compiles"] for e in measured)
    out.append(gate("jax_compiles_after_e0", compiles, 0, compiles == 0))
    captures = sum(e["graph_captures"] for e in measured)
    out.append(gate("graph_captures_after_e0", captures, 0, captures == 0))
    nonfinite = health["nonfinite_public_values"] + sum(
        e[name]["final_nonfinite"] for e in timed["epochs"] for name in ("pool", "fixed"))
    out.append(gate("nonfinite_public_values", nonfinite, 0, nonfinite == 0))
    every = health["worlds"]
    out.append(gate("health_every_world_times_out_once", health["worlds_timed_out_once"], every,
                    health["worlds_timed_out_once"] == every and health["timeouts"] == every))
    out.append(gate("health_every_world_autoresets_once", health["worlds_reset_once"], every,
                    health["worlds_reset_once"] == every and health["autoresets"] == every))
    unexpected = health["success"] + health["off_track"] + health["invalid_action"]
    out.append(gate("health_no_other_outcome", unexpected, 0, unexpected == 0))
    out.append(gate("reset_events_observed", ref["observed_reset_events"], args.reset_events,
                    ref["observed_reset_events"] == ref["requested_reset_events"] == args.reset_events))
    out.append(gate("reset_rows_match_host_reference", ref["mismatches"], 0, ref["mismatches"] == 0))
    out.append(gate("terminal_rows_keep_their_track", ref["terminal_rows_wrong"], 0, ref["terminal_rows_wrong"] == 0))
    for name in ("active_step", "mixed_autoreset_step"):
        passed = report["transfer_guards"][name]["passed"]
        out.append(gate(f"transfer_guard_{name}", passed, True, passed))
    out.append(gate("privacy_env_fields_exact", priv["env_fields_exact"], True, priv["env_fields_exact"]))
    out.append(gate("privacy_controller_sees_public_host_values_only", priv["violation_count"], 0,
                    priv["violation_count"] == 0 and priv["controller_calls"] > 0 and priv["controller_errors"] == 0
                    and priv["challenge_keys_subset"]))
    bound = (pool["rows_verified_against_manifest"] == pool["tracks"]
             and pool["manifest_benchmark_version"] == pool["pool_benchmark_version"] == BENCHMARK_VERSION
             and len(report["source_sha256"]) > 0)
    out.append(gate("source_and_pool_binding", bound, True, bound))
    return out


if __name__ == "__main__":
    sys.exit(main())
