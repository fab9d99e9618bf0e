"""The leaderboard at the limit: the controllers we ship and the released
PPO plugin through the Runner on Level 1's Test tracks, each lap over that
track's lap at the limit (``benchmarks/results/min_time_laps.json``).

    python benchmarks/racing_env/limits.py [--tracks 1000] [--honest-tracks 50] [--workers W]
        [--backend cpu_reference|mjx_warp] [--worlds N] [--controllers NAME ...] [--out FILE | --publish]

The controllers (`CONTROLLERS`): pure pursuit (the reference plugin), pure
pursuit at the hand-tuned gains of the PPO benchmark's prior
(``TUNED_PURSUIT``), the racing-line plugin (`racing_env.plugins.RACELINE`)
and the PPO benchmark's released plugin
(``benchmarks/results/ppo_level1/plugin``). The Runner drives them in
``--workers`` processes at once (default: every CPU; trusted plugins, no
isolation), each job a chunk of a split's rows, each row once
(``track_indices``) from rest on the start line, on ``--backend``: the
MuJoCo C reference (``cpu_reference``, the default: float64, one world a
process) or ``mjx_warp`` with ``--worlds`` worlds a process (on a GPU the
processes share it; Level 0's one episode a controller always on one
world).

An episode's yardstick is the **standing** T_lim: the lap at the limit
from rest at the start back to it, as an episode drives it (the flying
T_lim, which starts at speed, is reported beside it). Per controller: the
success, off-track, timeout and invalid-action rates, the median lap, and
the median and 90th percentile of its laps over T_lim.

Gates:

1. The estimate is honest: on Level 0's track (its T_lim computed here)
   and the first ``--honest-tracks`` Validation tracks, no completed lap
   of any controller, the racing line at its most aggressive setting
   (`AGGRESSIVE`: the profile's own speed, full drive) included, is faster
   than 0.97 x T_lim.
2. The racing-line controller laps >= 99.5 % of the Test tracks driven,
   with a median lap <= 1.10 x T_lim.
3. The whole run, one command, takes <= 15 minutes (``command_wall_s``,
   on the machine that ran it: ``cpus`` and ``workers`` say which).

Writes ``benchmarks/out/limits.json`` (``--out`` elsewhere; ``--publish``
the committed ``benchmarks/results/limits.json``, the whole leaderboard
only) and a picture beside it (``.png``): the first Test track with the racing line
coloured by speed and each controller's path, and the distribution of
lap / T_lim per controller.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import dataclasses
import functools
import json
import multiprocessing
import os
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

from racing_env.config import ProjectConfig

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks/racing_stack"))

from protocol import (add_report_arguments, environment, gate, logger, process_seconds, report_path,  # noqa: E402
                      shown, source_hashes)

from racing_stack._files import save_figure, write_atomic  # noqa: E402

LAPS = ROOT / "benchmarks/results/min_time_laps.json"
PPO_PLUGIN = ROOT / "benchmarks/results/ppo_level1/plugin"
#: The racing line at its most aggressive: the profile's own speeds and the action's full drive.
AGGRESSIVE = {"speed_fraction": 1.0, "drive_accel_mps2": ProjectConfig().max_acceleration_mps2}
#: Gate 1: no completed lap under this share of T_lim (from rest).
HONEST_SHARE = 0.97
#: Gate 2: the racing-line controller's Test success and median lap / T_lim.
RACELINE_SUCCESS, RACELINE_MEDIAN = 0.995, 1.10
#: Gate 3: the whole command's wall time, s.
WALL_S = 15 * 60.0
#: Rows a worker drives in one job (on ``mjx_warp``, at least ``--worlds``).
CHUNK = 20
#: The controllers whose calls cost the most, dearest first (the learned
#: policy's network, then the racing line's start); the others follow.
SLOWEST_FIRST = ("ppo_level1", "raceline_at_the_limit", "raceline")
log = logger("limits")


def controllers() -> dict[str, tuple[Path, dict[str, Any]]]:
    """Each controller's plugin directory and the settings it overrides in the plugin's ``config.toml``."""
    from ppo_level1 import TUNED_PURSUIT  # its imports (Torch, the trainer) only where a controller is loaded

    from racing_env.plugins import PURSUIT, RACELINE

    return {"pure_pursuit": (PURSUIT, {}), "tuned_pursuit": (PURSUIT, dataclasses.asdict(TUNED_PURSUIT)),
            "raceline": (RACELINE, {}), "raceline_at_the_limit": (RACELINE, AGGRESSIVE),
            "ppo_level1": (PPO_PLUGIN, {})}


#: Which controllers drive the Test tracks (the aggressive racing line drives only gate 1's tracks).
LEADERBOARD = ("pure_pursuit", "tuned_pursuit", "raceline", "ppo_level1")


@functools.cache
def plugin(name: str):
    """The controller's plugin with its overrides (loaded once per process)."""
    from racing_env.plugins import freeze, load_plugin

    directory, overrides = controllers()[name]
    loaded = load_plugin(directory)
    return dataclasses.replace(loaded, settings=freeze({**loaded.settings, **overrides}))


@functools.cache
def env(split: str, tracks: int, backend: str = "cpu_reference", worlds: int = 1):
    """An env of ``worlds`` worlds on the split's first ``tracks`` rows ("level0": Level 0's track)."""
    from racing_env import LEVEL_0, ProjectConfig, VecCarRacingEnv, level0_track
    from racing_stack import levels

    if split == "level0":
        return VecCarRacingEnv(worlds, config=ProjectConfig(), level=LEVEL_0, backend=backend, track=level0_track())
    return levels.level_env(worlds, split=split, tracks=tracks, backend=backend)


def drive(job: tuple[str, str, int, list[int], str, int]) -> list[dict[str, Any]]:
    """One worker job: ``(controller, split, the split's rows loaded, rows to drive, backend, worlds)``;
    each row once."""
    import torch

    from racing_env.runner import run

    torch.set_num_threads(1)
    name, split, tracks, rows, backend, worlds = job
    world = env(split, tracks, backend, 1 if split == "level0" else min(worlds, len(rows)))
    if split == "level0":
        result = run(plugin(name), world, episodes=1, seed=0)
    else:
        result = run(plugin(name), world, seed=0, track_indices=rows)
    return [{"track_id": int(e.track_id), "reason": e.termination_reason, "lap_completed": bool(e.lap_completed),
             "lap_time_s": float(e.lap_time_s), "progress": float(e.progress), "steps": int(e.steps),
             "error": e.error} for e in result.episodes]


def limits_of(split: str, tracks: int) -> dict[int, dict[str, float]]:
    """T_lim (flying and standing, s) of the split's first ``tracks`` tracks from the committed
    report, checked against the pool's geometry hashes; ``"level0"``: computed here."""
    if split == "level0":
        from racing_env import level0_track
        from racing_env.envelope import Envelope
        from racing_env.plugins import RACELINE
        from racing_env.raceline import min_time_lap

        track = level0_track()
        lap = min_time_lap(track, Envelope.from_json((RACELINE / "envelope.json").read_text()))
        return {int(track.track_id): {"t_lim_s": lap.lap_time_s, "t_lim_standing_s": lap.standing_lap_time_s}}
    from racing_stack import pools

    pool = pools.materialize_prefix(split, tracks, progress=log)
    records = json.loads(LAPS.read_text())["splits"][split]["tracks"][:tracks]
    ids, hashes = [int(i) for i in np.asarray(pool.track_id)], list(pool.geometry_hashes)
    if len(records) < tracks or [(r["track_id"], r["geometry_hash"]) for r in records] != list(zip(ids, hashes)):
        raise SystemExit(f"{LAPS.relative_to(ROOT)} does not hold the {split} pool's first {tracks} tracks as "
                         "the cache builds them: recompute it (make benchmark-min-time-laps)")
    return {r["track_id"]: {"t_lim_s": r["t_lim_s"], "t_lim_standing_s": r["t_lim_standing_s"]} for r in records}


def summarize(episodes: list[dict[str, Any]], limits: dict[int, dict[str, float]]) -> dict[str, Any]:
    """A controller's episodes on a split: the outcomes and its laps over T_lim (from rest, and flying)."""
    laps = [e for e in episodes if e["lap_completed"]]
    reasons = [e["reason"] for e in episodes]

    def spread(values: list[float]) -> dict[str, float] | None:
        if not values:
            return None
        return {"median": float(np.median(values)), "p90": float(np.percentile(values, 90)),
                "min": float(np.min(values)), "max": float(np.max(values))}

    return {"tracks": len(episodes), "success_rate": len(laps) / len(episodes),
            **{f"{r}_rate": reasons.count(r) / len(episodes) for r in ("off_track", "timeout", "invalid_action")},
            "median_lap_s": float(np.median([e["lap_time_s"] for e in laps])) if laps else None,
            "lap_over_t_lim": spread([e["lap_time_s"] / limits[e["track_id"]]["t_lim_standing_s"] for e in laps]),
            "lap_over_flying_t_lim": spread([e["lap_time_s"] / limits[e["track_id"]]["t_lim_s"] for e in laps]),
            "errors": sorted({e["error"] for e in episodes if e["error"]})[:5]}


def drive_all(jobs: list[tuple[str, str, int, list[int], str, int]], workers: int) -> dict[tuple[str, str], list]:
    """Every job in ``workers`` processes; the episodes by (controller, split), in row order."""
    found: dict[tuple[str, str], list] = {}
    total, done = sum(max(1, len(j[3])) for j in jobs), 0
    context = multiprocessing.get_context("spawn")  # never fork a process that has started JAX
    start = time.perf_counter()
    with concurrent.futures.ProcessPoolExecutor(max_workers=workers, mp_context=context) as executor:
        futures = {executor.submit(drive, job): job for job in jobs}
        for future in concurrent.futures.as_completed(futures):
            name, split, _, rows, _, _ = futures[future]
            try:
                found.setdefault((name, split), []).extend(future.result())
            except Exception as error:  # a worker that failed (not an episode: the Runner keeps those)
                executor.shutdown(wait=False, cancel_futures=True)
                raise SystemExit(f"limits: {name} on {split} rows {rows[:1]}..{rows[-1:]} failed: "
                                 f"{type(error).__name__}: {error}") from None
            done += max(1, len(rows))
            log(f"{done}/{total} episodes ({time.perf_counter() - start:.0f} s)")
    return {key: sorted(found[key], key=lambda e: e["track_id"]) for key in found}


def paths_on(row: int, names: list[str]) -> dict[str, np.ndarray]:
    """Each controller's rear-axle path [T, 2] (m) on Test row ``row``, driven once more here."""
    from racing_env.runner import challenge_values

    world = env("test", row + 1)
    paths = {}
    for name in names:
        obs, info = world.reset(seed=0, options={"track_indices": np.array([row])})
        one = {k: np.asarray(v)[0] for k, v in obs.items()}
        controller = plugin(name).load_class()(one, {}, plugin(name).config(challenge_values(world)))
        points = [one["position"]]
        for _ in range(world.level.max_episode_steps):
            obs, _, terminated, truncated, _ = world.step(np.asarray(controller.compute_control(one))[None])
            one = {k: np.asarray(v)[0] for k, v in obs.items()}
            points.append(one["position"])
            if terminated[0] or truncated[0]:
                break
        paths[name] = np.asarray(points, np.float64)
    return paths


def draw(report: dict[str, Any], path: Path) -> None:
    """The first Test track: its racing line coloured by speed and each controller's path; the
    distribution of lap / T_lim (from rest) per controller on the Test tracks."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.collections import LineCollection

    from racing_env.runner import challenge_values

    names = list(report["controllers"])
    world = env("test", 1)
    obs, _ = world.reset(seed=0, options={"track_indices": np.array([0])})
    one = {k: np.asarray(v)[0] for k, v in obs.items()}
    lap = plugin("raceline").load_class()(one, {}, plugin("raceline").config(challenge_values(world))).lap
    count = int(one["track_mask"].sum())
    fig, (plan, ratios) = plt.subplots(1, 2, figsize=(15, 6), gridspec_kw={"width_ratios": [1.3, 1]})
    for edge in ("left_boundary", "right_boundary"):
        loop = np.vstack([one[edge][:count], one[edge][:1]])
        plan.plot(loop[:, 0], loop[:, 1], color="0.35", lw=1)
    points = np.vstack([lap.line.points_m, lap.line.points_m[:1]])
    speed = lap.profile.speed_mps
    lines = LineCollection(np.stack([points[:-1], points[1:]], axis=1), cmap="viridis", linewidths=4, alpha=0.8)
    lines.set_array(0.5 * (speed + np.roll(speed, -1)))
    plan.add_collection(lines)
    fig.colorbar(lines, ax=plan, label="the line's speed at the limit (m/s)", shrink=0.8)
    for k, (name, trail) in enumerate(paths_on(0, names).items()):
        plan.plot(trail[:, 0], trail[:, 1], color=f"C{k}", lw=1, label=name.replace("_", " "))
    plan.set(aspect="equal", xlabel="x (m)", ylabel="y (m)",
             title=f"Test track {report['tracks']['test']['track_id'][0]}: T_lim from rest "
                   f"{lap.standing_lap_time_s:.2f} s")
    plan.legend(fontsize=8, loc="upper right")
    bins = np.linspace(0.95, 1.8, 69)
    for k, name in enumerate(names):
        test = report["tracks"]["test"]
        values = [lap_s / limit for lap_s, limit in zip(test[name]["lap_s"], test["t_lim_standing_s"])
                  if lap_s is not None]
        ratios.hist(values, bins=bins, color=f"C{k}", alpha=0.55, label=f"{name.replace('_', ' ')} "
                    f"({len(values)} laps)")
    ratios.axvline(1.0, color="k", lw=0.8)
    ratios.axvline(HONEST_SHARE, color="crimson", lw=0.8, ls="--")
    ratios.set(xlabel="lap / T_lim from rest", ylabel="tracks", title=f"{report['tracks']['test']['count']} Test "
                                                                       "tracks through the Runner")
    ratios.legend(fontsize=8)
    fig.tight_layout()
    save_figure(fig, path)
    plt.close(fig)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tracks", type=int, default=1000, help="the first N Test tracks (default all 1,000)")
    parser.add_argument("--honest-tracks", type=int, default=50,
                        help="gate 1's Validation tracks, beside Level 0's (default 50)")
    parser.add_argument("--workers", type=int, default=min(os.cpu_count() or 1, 256),
                        help="worker processes (default: every CPU)")
    parser.add_argument("--backend", choices=("cpu_reference", "mjx_warp"), default="cpu_reference",
                        help="the physics (default cpu_reference: MuJoCo C)")
    parser.add_argument("--worlds", type=int, default=1, help="worlds a process on mjx_warp (default 1)")
    parser.add_argument("--controllers", nargs="+", choices=LEADERBOARD, default=list(LEADERBOARD),
                        help="the leaderboard's controllers (default all)")
    add_report_arguments(parser, "limits")
    args = parser.parse_args()
    for flag, value, top in (("--tracks", args.tracks, 1000), ("--honest-tracks", args.honest_tracks, 1000),
                             ("--workers", args.workers, 256), ("--worlds", args.worlds, 1000)):
        if not 1 <= value <= top:
            parser.error(f"argument {flag}: must be in [1, {top}], got {value}")
    if args.publish and (args.tracks, args.honest_tracks, args.controllers) != (1000, 50, list(LEADERBOARD)):
        parser.error("argument --publish: the committed leaderboard is every controller on all 1,000 Test tracks "
                     "and 50 Validation tracks; drop --tracks, --honest-tracks and --controllers")
    args.out = report_path(args, "limits")
    if args.out.suffix != ".json":
        parser.error(f"argument --out: must end in .json, got {args.out}")
    if args.backend == "cpu_reference" and args.worlds != 1:
        parser.error(f"argument --worlds: cpu_reference runs one world, got {args.worlds}")
    if args.backend == "mjx_warp":
        os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")  # the worker processes share one GPU
    chunk = max(CHUNK, args.worlds)
    limits = {"test": limits_of("test", args.tracks), "validation": limits_of("validation", args.honest_tracks),
              "level0": limits_of("level0", 1)}
    honest = [*args.controllers, "raceline_at_the_limit"]
    jobs = [(name, "test", args.tracks, rows) for name in args.controllers
            for rows in np.array_split(np.arange(args.tracks), -(-args.tracks // chunk))]
    jobs += [(name, "validation", args.honest_tracks, rows) for name in honest
             for rows in np.array_split(np.arange(args.honest_tracks), -(-args.honest_tracks // chunk))]
    jobs += [(name, "level0", 1, []) for name in honest]
    jobs = [(name, split, n, [int(r) for r in rows], args.backend, args.worlds) for name, split, n, rows in jobs]
    # The dearest jobs first, so that the last ones to finish are short.
    jobs.sort(key=lambda job: (SLOWEST_FIRST.index(job[0]) if job[0] in SLOWEST_FIRST else len(SLOWEST_FIRST),
                               -len(job[3])))
    log(f"{len(args.controllers)} controllers on {args.tracks} Test tracks, {len(honest)} on Level 0 and "
        f"{args.honest_tracks} Validation tracks; {args.workers} worker processes")
    episodes = drive_all(jobs, args.workers)
    report: dict[str, Any] = {
        "protocol": "limits", "environment": environment(), "source_sha256": source_hashes(__file__),
        "backend": args.backend, "worlds_per_process": args.worlds,
        "runner": "the Runner in each worker process, no isolation, each row once from rest",
        "t_lim": {"file": str(LAPS.relative_to(ROOT)),
                  "envelope_sha256": json.loads(LAPS.read_text())["envelope"]["config_sha256"],
                  "of": "lap_over_t_lim: the lap over T_lim from rest (t_lim_standing_s), as an episode drives "
                        "it; lap_over_flying_t_lim: over the flying lap (t_lim_s)"},
        "cpus": os.cpu_count(), "workers": args.workers,
        "controllers": {name: {"plugin": shown(controllers()[name][0]),
                               "overrides": controllers()[name][1],
                               "test": summarize(episodes[name, "test"], limits["test"])}
                        for name in args.controllers},
        "honest": {name: {split: summarize(episodes[name, split], limits[split]) for split in ("level0", "validation")}
                   for name in honest},
    }
    test_ids = sorted(limits["test"])
    report["tracks"] = {"test": {"count": len(test_ids), "track_id": test_ids,
                                 "t_lim_standing_s": [limits["test"][i]["t_lim_standing_s"] for i in test_ids],
                                 **{name: {"lap_s": [e["lap_time_s"] if e["lap_completed"] else None
                                                     for e in episodes[name, "test"]],
                                           "reason": [e["reason"] for e in episodes[name, "test"]]}
                                    for name in args.controllers}}}
    fastest = min(((e["lap_time_s"] / limits[split][e["track_id"]]["t_lim_standing_s"], name, split, e["track_id"])
                   for name in honest for split in ("level0", "validation") for e in episodes[name, split]
                   if e["lap_completed"]), default=(None, None, None, None))
    report["fastest_honest_lap"] = dict(zip(("lap_over_t_lim", "controller", "split", "track_id"), fastest))
    # No lap at all proves nothing: the gate fails.
    report["gates"] = [gate("no_lap_under_0.97_t_lim", fastest[0], HONEST_SHARE,
                            fastest[0] is not None and fastest[0] >= HONEST_SHARE)]
    if "raceline" in args.controllers:
        own = report["controllers"]["raceline"]["test"]
        median = None if own["lap_over_t_lim"] is None else own["lap_over_t_lim"]["median"]
        report["gates"] += [gate("raceline_test_success", own["success_rate"], RACELINE_SUCCESS,
                                 own["success_rate"] >= RACELINE_SUCCESS),
                            gate("raceline_median_lap_over_t_lim", median, RACELINE_MEDIAN,
                                 median is not None and median <= RACELINE_MEDIAN)]
    args.out.parent.mkdir(parents=True, exist_ok=True)
    write(report, args)  # the numbers first: a picture that fails loses none of them
    try:
        draw(report, args.out.with_suffix(".png"))
    except Exception as error:
        log(f"the picture failed: {type(error).__name__}: {error}")
    wall = process_seconds()
    report["command_wall_s"] = wall
    report["gates"].append(gate("command_wall_s", wall, WALL_S, wall is not None and wall <= WALL_S))
    write(report, args)
    for name, body in report["controllers"].items():
        test = body["test"]
        log(f"{name}: success {test['success_rate']:.3f}, median lap {test['median_lap_s']}, "
            f"lap / T_lim {test['lap_over_t_lim']}")
    for g in report["gates"]:
        log(f"  {'PASS' if g['passed'] else 'FAIL'} {g['name']}: {g['value']} (gate {g['threshold']})")
    partial = "" if args.tracks == 1000 else ": a prefix of the Test tracks; only the whole leaderboard can pass"
    log(f"wrote {shown(args.out)} ({'passed' if report['passed'] else 'not passed' + partial})")


def write(report: dict[str, Any], args: argparse.Namespace) -> None:
    """The report, its ``passed`` from the gates so far (the whole leaderboard, every gate met)."""
    report["passed"] = args.tracks == 1000 and len(report["gates"]) == 4 and all(g["passed"] for g in report["gates"])
    write_atomic(args.out, (json.dumps(report, indent=1, allow_nan=False) + "\n").encode())


if __name__ == "__main__":
    main()
