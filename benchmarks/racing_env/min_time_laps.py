"""A lap at the limit for every Level 1 Validation and Test track: the
racing line and the speed profile of `racing_env.raceline.min_time_lap`
under the car's committed envelope (``benchmarks/results/car_envelope.json``).

    python benchmarks/racing_env/min_time_laps.py [--check] [--tracks N] [--workers W] [--out FILE | --publish]

Writes ``benchmarks/out/min_time_laps.json`` (``--publish``: the committed
``benchmarks/results/min_time_laps.json``): per track its id, the
geometry hash of its arrays (the pool manifest's), T_lim (the flying lap),
the standing lap (from rest at the start, as an episode drives it), the
line's length, the length weight of the fastest line and the clearance the
line keeps to the boundaries (an independent NumPy distance to the
boundary polylines, less the car's half-width); then per split a summary,
committed controllers' laps (pure pursuit's, the PPO benchmark plugin's)
over T_lim on the tracks they drove, the envelope's
config hash, the method's settings, versions and source hashes; and a
picture beside it (``.png``): one Validation track with its line coloured
by speed, the speed along the lap, committed controllers' laps over T_lim.

The pools come from the cache as ``racing_stack.pools.materialize``
builds and verifies them (minutes to build on a CPU the first time).
``--tracks N`` takes the first N tracks of each split (built, not loaded,
when N is small). ``--check`` recomputes and compares with the committed
report instead of writing one: the same tracks (ids and geometry hashes),
the same envelope and settings, every T_lim, standing lap and line length
within ``--rtol`` (exit status 1 when one differs, naming it).
"""

from __future__ import annotations

import argparse
import concurrent.futures
import functools
import hashlib
import json
import multiprocessing
import os
import platform
import sys
import time
from importlib.metadata import version
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
REPORT = ROOT / "benchmarks/results/min_time_laps.json"
ENVELOPE = ROOT / "benchmarks/results/car_envelope.json"
#: Committed laps of controllers through the Runner, by controller and split: the
#: reference pure pursuit, and the PPO benchmark's plugin (benchmarks/results/ppo_level1/plugin).
REFERENCE_LAPS = {
    "pure_pursuit": {"validation": ROOT / "benchmarks/v0.1/pursuit_level1_validation.json",
                     "test": ROOT / "benchmarks/results/ppo_level1/pursuit_test.json"},
    "ppo_level1_plugin": {"test": ROOT / "benchmarks/results/ppo_level1/learned_test.json"},
}
SPLITS = ("validation", "test")
#: What a track's record holds, and which of its numbers --check compares.
COMPARED = ("t_lim_s", "t_lim_standing_s", "line_length_m")


def log(message: str) -> None:
    print(f"[min_time_laps {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def distance_to_loop(points: np.ndarray, loop: np.ndarray) -> np.ndarray:
    """[M]: each point's distance to the closed polyline ``loop`` [N, 2]."""
    start, end = loop[None], np.roll(loop, -1, axis=0)[None]
    along, offset = end - start, points[:, None, :] - start
    t = np.clip(np.sum(offset * along, axis=-1) / np.sum(along * along, axis=-1), 0.0, 1.0)
    gap = offset - t[..., None] * along
    return np.sqrt(np.min(np.sum(gap * gap, axis=-1), axis=1))


def envelope_text() -> str:
    return json.dumps(json.loads(ENVELOPE.read_text())["envelope"])


@functools.cache
def committed_envelope():
    """The committed envelope (read once per process)."""
    from racing_env.envelope import Envelope

    return Envelope.from_json(envelope_text())


def one_track(row: dict[str, np.ndarray]) -> dict[str, Any]:
    """One track's lap at the limit (run in a worker process)."""
    from racing_env.raceline import LineSettings, min_time_lap

    settings = LineSettings()
    lap = min_time_lap(row, committed_envelope(), settings)
    count = int(row["track_mask"].sum())
    points = lap.line.points_m
    clearance = min(distance_to_loop(points, row[name][:count].astype(np.float64)).min()
                    for name in ("left_boundary", "right_boundary"))
    speed = lap.profile.speed_mps
    tried = dict(lap.tried)
    return {
        "t_lim_s": round(lap.lap_time_s, 6),
        "t_lim_standing_s": round(lap.standing_lap_time_s, 6),
        "t_min_curvature_s": round(tried[0.0], 6) if 0.0 in tried else None,
        "line_length_m": round(lap.length_m, 6),
        "centerline_length_m": round(float(row["track_length"]), 6),
        "length_weight_per_m2": lap.line.length_weight_per_m2,
        "min_speed_mps": round(float(speed.min()), 4),
        "max_speed_mps": round(float(speed.max()), 4),
        "clearance_m": round(float(clearance) - settings.car_half_width_m, 4),
        "linearisations": lap.line.linearisations,
        "settled": lap.line.settled,
    }


def load_rows(split: str, tracks: int | None) -> tuple[list[dict[str, np.ndarray]], list[int], list[str]]:
    """The split's first ``tracks`` rows (all when None) as host arrays, with ids and geometry hashes."""
    from racing_stack import pools

    pool = pools.materialize_prefix(split, tracks, progress=log)
    host = {name: np.asarray(getattr(pool, name)) for name in
            ("centerline", "left_boundary", "right_boundary", "track_mask", "track_length")}
    rows = [{name: value[i] for name, value in host.items()} for i in range(len(pool))]
    return rows, [int(i) for i in np.asarray(pool.track_id)], list(pool.geometry_hashes)


def percentiles(values: list[float]) -> dict[str, float]:
    arr = np.asarray(values, np.float64)
    return {"median": float(np.median(arr)), "p10": float(np.percentile(arr, 10)),
            "p90": float(np.percentile(arr, 90)), "min": float(arr.min()), "max": float(arr.max())}


def lap_ratios(path: Path | None, records: list[dict[str, Any]]) -> dict[str, Any] | None:
    """A controller's committed laps (from rest, through the Runner) over T_lim, on the tracks both have."""
    if path is None or not path.exists():
        return None
    laps = {e["track_id"]: e["lap_time_s"] for e in json.loads(path.read_text())["episodes"] if e["lap_completed"]}
    shared = [r for r in records if r["track_id"] in laps]
    if not shared:
        return None
    return {
        "file": str(path.relative_to(ROOT)),
        "tracks": len(shared),
        "lap_s": percentiles([laps[r["track_id"]] for r in shared]),
        "over_t_lim": percentiles([laps[r["track_id"]] / r["t_lim_s"] for r in shared]),
        "over_t_lim_standing": percentiles([laps[r["track_id"]] / r["t_lim_standing_s"] for r in shared]),
    }


def summary(records: list[dict[str, Any]]) -> dict[str, Any]:
    return {
        "tracks": len(records),
        "t_lim_s": percentiles([r["t_lim_s"] for r in records]),
        "t_lim_standing_s": percentiles([r["t_lim_standing_s"] for r in records]),
        "line_length_m": percentiles([r["line_length_m"] for r in records]),
        "line_over_centerline_length": percentiles([r["line_length_m"] / r["centerline_length_m"]
                                                    for r in records]),
        "t_lim_over_min_curvature": percentiles([r["t_lim_s"] / r["t_min_curvature_s"] for r in records
                                                 if r["t_min_curvature_s"] is not None] or [float("nan")]),
        "mean_speed_mps": percentiles([r["line_length_m"] / r["t_lim_s"] for r in records]),
        "max_speed_mps": percentiles([r["max_speed_mps"] for r in records]),
        "min_clearance_m": min(r["clearance_m"] for r in records),
        "length_weights_chosen": {f"{w:g}": int(n) for w, n in zip(*np.unique([r["length_weight_per_m2"]
                                                                                for r in records],
                                                                               return_counts=True))},
        "unsettled_lines": sum(not r["settled"] for r in records),
    }


def source_hashes() -> dict[str, str]:
    files = [ROOT / "packages/racing_env/src/racing_env/raceline.py",
             ROOT / "packages/racing_env/src/racing_env/envelope.py", Path(__file__).resolve()]
    return {str(f.relative_to(ROOT)): hashlib.sha256(f.read_bytes()).hexdigest() for f in files}


def environment() -> dict[str, str]:
    import racing_env
    import racing_stack

    return {"python": platform.python_version(), "platform": platform.platform(), "numpy": np.__version__,
            "scipy": version("scipy"), "threadpoolctl": version("threadpoolctl"),
            "racing_env": racing_env.__version__, "racing_stack": racing_stack.__version__}


def compute(tracks: int | None, workers: int) -> dict[str, Any]:
    from racing_env import BENCHMARK_VERSION
    from racing_env.config import ProjectConfig
    from racing_env.envelope import config_hash
    from racing_env.raceline import LineSettings

    envelope = committed_envelope()
    if envelope.config_sha256 != config_hash(ProjectConfig()):
        raise SystemExit(f"{ENVELOPE.relative_to(ROOT)} measured another car (config {envelope.config_sha256[:12]}, "
                         f"ProjectConfig() is {config_hash(ProjectConfig())[:12]}): remeasure it first "
                         "(make benchmark-car-envelope)")
    start = time.perf_counter()
    loaded = {split: load_rows(split, tracks) for split in SPLITS}
    load_s = time.perf_counter() - start
    log(f"pools loaded in {load_s:.0f} s; {workers} worker processes")
    report_splits: dict[str, Any] = {}
    context = multiprocessing.get_context("spawn")  # never fork a process that has started JAX
    start = time.perf_counter()
    with concurrent.futures.ProcessPoolExecutor(max_workers=workers, mp_context=context) as executor:
        for split, (rows, ids, hashes) in loaded.items():
            records = []
            for k, result in enumerate(executor.map(one_track, rows, chunksize=8)):
                records.append({"track_id": ids[k], "geometry_hash": hashes[k], **result})
                if (k + 1) % 100 == 0 or k + 1 == len(rows):
                    log(f"{split}: {k + 1}/{len(rows)} tracks ({time.perf_counter() - start:.0f} s)")
            report_splits[split] = {"summary": summary(records),
                                    "controllers": {name: lap_ratios(files.get(split), records)
                                                    for name, files in REFERENCE_LAPS.items()},
                                    "tracks": records}
    compute_s = time.perf_counter() - start
    settings = LineSettings()
    return {
        "protocol": "min_time_laps",
        "benchmark_version": BENCHMARK_VERSION,
        "level_id": 1,
        "environment": environment(),
        "source_sha256": source_hashes(),
        "envelope": {"file": str(ENVELOPE.relative_to(ROOT)), "config_sha256": envelope.config_sha256,
                     "speeds_mps": [float(envelope.speeds_mps[0]), float(envelope.speeds_mps[-1])]},
        "settings": settings.to_dict(),
        "method": ("racing_env.raceline.min_time_lap: minimum-curvature line (Gauss-Newton, each step "
                   "scipy.optimize.lsq_linear within the boundaries less car_half_width_m + margin_m), the "
                   "fastest of the lines that also weigh their length; quasi-steady-state speed profile "
                   "under the envelope (corner limits, friction ellipse, forward and backward passes, closed "
                   "lap). t_lim_s: the flying lap; t_lim_standing_s: from rest at point 0 back to it."),
        "t_min_curvature_s_of": "the flying lap on the minimum-curvature line (length weight 0)",
        "clearance_m_of": "the least distance from the line's points to either boundary polyline, less "
                          "car_half_width_m: the margin kept (settings.margin_m asked)",
        "cpus": os.cpu_count(),
        "workers": workers,
        "tracks_per_split": tracks,
        "load_wall_s": load_s,
        "compute_wall_s": compute_s,
        "splits": report_splits,
    }


def check(report: dict[str, Any], committed: dict[str, Any], rtol: float) -> list[str]:
    """Where ``report`` differs from ``committed`` (its first tracks when ``report`` holds fewer)."""
    problems = []
    for key in ("benchmark_version", "envelope", "settings"):
        if report[key] != committed[key]:
            problems.append(f"{key} differs: {report[key]!r} != committed {committed[key]!r}")
    worst = 0.0
    for split in SPLITS:
        mine, theirs = report["splits"][split]["tracks"], committed["splits"][split]["tracks"]
        if len(mine) > len(theirs):
            problems.append(f"{split}: {len(mine)} tracks, the committed report has {len(theirs)}")
        for a, b in zip(mine, theirs):
            if (a["track_id"], a["geometry_hash"]) != (b["track_id"], b["geometry_hash"]):
                problems.append(f"{split}: track {a['track_id']} ({a['geometry_hash'][:12]}) where the committed "
                                f"report has {b['track_id']} ({b['geometry_hash'][:12]})")
                break
            for name in COMPARED:
                gap = abs(a[name] - b[name]) / abs(b[name])
                worst = max(worst, gap)
                if gap > rtol:
                    problems.append(f"{split}: track {a['track_id']} {name} {a[name]} != committed {b[name]} "
                                    f"(relative gap {gap:.2e} > {rtol:g})")
    log(f"largest relative gap from the committed report: {worst:.2e}")
    return problems


def draw(report: dict[str, Any], path: Path) -> None:
    """One Validation track's line coloured by speed, its speed along the lap, pure pursuit over T_lim."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.collections import LineCollection

    from racing_env.raceline import min_time_lap

    rows, ids, _ = load_rows("validation", 1)
    row = rows[0]
    lap = min_time_lap(row, committed_envelope())
    count = int(row["track_mask"].sum())
    fig, (plan, along, ratios) = plt.subplots(1, 3, figsize=(17, 5.2), gridspec_kw={"width_ratios": [1.2, 1.2, 1]})
    for name in ("left_boundary", "right_boundary"):
        edge = np.vstack([row[name][:count], row[name][:1]])
        plan.plot(edge[:, 0], edge[:, 1], color="0.35", lw=1)
    center = np.vstack([row["centerline"][:count], row["centerline"][:1]])
    plan.plot(center[:, 0], center[:, 1], color="0.6", lw=0.6, ls="--", label="centerline")
    points = np.vstack([lap.line.points_m, lap.line.points_m[:1]])
    segments = np.stack([points[:-1], points[1:]], axis=1)
    speed = lap.profile.speed_mps
    lines = LineCollection(segments, cmap="viridis", linewidths=2.5)
    lines.set_array(0.5 * (speed + np.roll(speed, -1)))
    plan.add_collection(lines)
    plan.plot(*lap.line.points_m[0], "o", color="crimson", ms=5, label="start")
    fig.colorbar(lines, ax=plan, label="speed (m/s)", shrink=0.8)
    plan.set(aspect="equal", title=f"Validation track {ids[0]}: T_lim {lap.lap_time_s:.2f} s "
                                   f"(from rest {lap.standing_lap_time_s:.2f} s)", xlabel="x (m)", ylabel="y (m)")
    plan.legend(fontsize=8, loc="upper right")
    arc = np.append(lap.line.arc_m, lap.length_m)
    along.plot(arc, np.append(speed, speed[0]), label="flying lap (T_lim)")
    along.plot(arc, lap.profile.standing_speed_mps, label="from rest (an episode's lap)")
    along.plot(arc, np.append(lap.profile.corner_speed_mps, lap.profile.corner_speed_mps[0]), color="0.6", lw=0.8,
               ls=":", label="corner limit")
    along.set(xlabel="arc length along the line (m)", ylabel="speed (m/s)", title="speed profile",
              ylim=(0, 1.1 * speed.max()))
    along.legend(fontsize=8, loc="lower right")
    bins = np.linspace(0.9, 1.8, 46)
    for (name, split), style in zip([(n, s) for n, files in REFERENCE_LAPS.items() for s in files], "C0 C1 C2".split()):
        source = REFERENCE_LAPS[name][split]
        if not source.exists():
            continue
        laps = {e["track_id"]: e["lap_time_s"] for e in json.loads(source.read_text())["episodes"]
                if e["lap_completed"]}
        values = [laps[r["track_id"]] / r["t_lim_standing_s"] for r in report["splits"][split]["tracks"]
                  if r["track_id"] in laps]
        ratios.hist(values, bins=bins, color=style, alpha=0.6, density=True,
                    label=f"{name.replace('_', ' ')}, {split} ({len(values)} tracks)")
    ratios.axvline(1.0, color="k", lw=0.8)
    ratios.set(xlabel="a controller's lap / T_lim from rest", ylabel="share of tracks (density)",
               title="committed laps against the limit")
    ratios.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def dumps(report: dict[str, Any]) -> str:
    """The report as JSON, each track's record on a line of its own."""
    lines = {}
    for split, body in report["splits"].items():
        lines[split] = ",\n".join("    " + json.dumps(record) for record in body["tracks"])
        body["tracks"] = f"@tracks:{split}@"
    text = json.dumps(report, indent=1)
    for split, body in report["splits"].items():
        text = text.replace(f'"@tracks:{split}@"', "[\n" + lines[split] + "\n   ]")
    return text + "\n"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--check", action="store_true", help="recompute and compare with the committed report")
    parser.add_argument("--tracks", type=int, default=None, help="the first N tracks of each split (default all)")
    parser.add_argument("--workers", type=int, default=os.cpu_count() or 1, help="processes (default: the CPUs)")
    parser.add_argument("--rtol", type=float, default=1e-4, help="--check's relative tolerance (default 1e-4)")
    outputs = parser.add_mutually_exclusive_group()
    outputs.add_argument("--out", type=Path, default=None,
                         help="the report (default benchmarks/out/min_time_laps.json; with --tracks "
                              "benchmarks/out/min_time_laps_N.json)")
    outputs.add_argument("--publish", action="store_true",
                         help="write the committed report, benchmarks/results/min_time_laps.json (every track)")
    args = parser.parse_args()
    if args.publish and (args.tracks is not None or args.check):
        parser.error("argument --publish: the committed report is every track, not checked; drop --tracks and --check")
    if args.tracks is not None and args.tracks < 1:
        parser.error(f"--tracks must be >= 1, got {args.tracks}")
    if args.workers < 1:
        parser.error(f"--workers must be >= 1, got {args.workers}")
    start = time.perf_counter()
    report = compute(args.tracks, args.workers)
    report["command_wall_s"] = time.perf_counter() - start
    if args.check:
        problems = check(report, json.loads(REPORT.read_text()), args.rtol)
        for problem in problems:
            log(f"MISMATCH {problem}")
        log("the committed report holds" if not problems else f"{len(problems)} mismatches")
        return 1 if problems else 0
    out = args.out or (REPORT if args.publish else
                       ROOT / f"benchmarks/out/min_time_laps{'' if args.tracks is None else f'_{args.tracks}'}.json")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(dumps(dict(report, splits={k: dict(v) for k, v in report["splits"].items()})))
    log(f"wrote {out}")
    try:
        draw(report, out.with_suffix(".png"))
        log(f"drew {out.with_suffix('.png').name}")
    except ImportError as error:
        log(f"no picture ({error})")
    print(json.dumps({split: {"t_lim_s": body["summary"]["t_lim_s"], "controllers": body["controllers"]}
                      for split, body in report["splits"].items()}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
