"""A learned controller on Level 1's Test tracks, batched against one
episode at a time: the same episodes, and how long the command takes.

    python benchmarks/racing_stack/batched_eval.py [--plugin DIR] [--tracks N] [--compare N]
        [--out FILE] [--publish]

The plugin is the committed release policy (``benchmarks/results/ppo_level1/plugin``:
its weights and settings) with this version's learned controller, which
has the batched form (`racing_stack.learned.controller`), copied into a
temporary folder with its ``device`` set to ``cuda`` on a GPU (every
world's row in one call there; ``cpu`` without one); ``--plugin`` names
another exported PPO plugin.

1. **The command.** ``python -m racing_stack.evaluate --split test --batched``
   on the first ``--tracks`` Test tracks (all 1,000 at the default; the
   batched controller isolated in one child process, Level 1's default), a
   fresh process, its wall time end to end (imports, compiles and the
   pool's load included; the pool is built into the cache first, apart),
   twice: first with the compile caches as they are (cold on a fresh
   machine: Warp's kernels and JAX's programs built on disk), then with
   them warm, as after any earlier run or training on the machine.
2. **The same actions.** `racing_stack.evaluate.evaluate` drives the first
   ``--compare`` Test tracks (20 on a GPU, 2 on the CPU) batched, in this
   process, in waves of half as many worlds (each world's state starts
   anew between them), and every call's row of every world also goes
   through a per-episode `Controller` of that world's episode (made when
   the episode starts, from the same observation, as the Runner makes
   one): each of its actions is compared bit for bit with the batched
   one, and no call may fail. This holds the controller to the
   per-episode one on any device, whatever the env does.
3. **The same episodes.** The same tracks one episode at a time (a
   `Controller` an episode) and batched again; every track's outcome and
   lap time are compared. On the CPU they must be equal bit for bit; on a
   GPU the outcomes equal, the laps reported beside the env's own spread
   (`repeat`: the two batched runs against each other). The command's
   episodes on these tracks (isolated: the child's kept tracks and its
   replies) are compared with the batched run's too (``isolated``; bit
   for bit on the CPU). MJX-Warp's
   physics does not repeat itself on a GPU (its contacts and constraint
   forces are summed through atomic operations in whatever order the GPU
   runs them; upstream google-deepmind/mujoco_warp#562), and a lap turns
   the last bit into whole calls, so no lap gate can hold there: the same
   path twice drives laps several calls apart. Warp's own deterministic
   mode is no way out (mujoco_warp does not support it: it can drop
   contacts, google-deepmind/mujoco_warp#1635; on an H100 two runs under
   it still drove laps 3 calls apart, at 4x the time).

Gates (one GPU, named in the report): outcomes equal batched and one at
a time; every action of the shadowed batched run equal to the
per-episode controller's, bit for bit; the warm command within
`GATE_COMMAND_S` for all 1,000 Test tracks. Without CUDA a small smoke
runs every phase on ``cpu_reference`` with 2 tracks (no gate evaluated;
the actions, the comparison, the repeat and the isolated command's
episodes must still hold bit for bit) into
``benchmarks/out/batched_eval_cpu.json``; on a GPU
``benchmarks/out/batched_eval.json``, or with ``--publish`` the committed
``benchmarks/results/batched_eval.json``.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from collections.abc import Iterator, Mapping
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "racing_env"))

import numpy as np  # noqa: E402
import torch  # noqa: E402
from protocol import environment, gate, logger, shown, source_hashes  # noqa: E402

from racing_env.plugins import Plugin  # noqa: E402
from racing_stack import evaluate  # noqa: E402
from racing_stack._cli import check_outputs  # noqa: E402
from racing_stack.pools import materialize_prefix  # noqa: E402
from racing_stack.ppo.export import CONTROLLER  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
RELEASE = ROOT / "benchmarks/results/ppo_level1/plugin"
#: The command's wall time on all 1,000 Test tracks, its caches warm (s).
GATE_COMMAND_S = 60.0
#: Test tracks the comparison drives on a GPU unless told: the per-episode
#: reference calls the learned plugin one world at a time on the host (100
#: tracks took over 380 s on an H100).
GPU_COMPARE = 20
log = logger("batched-eval")


def plugin_copy(source: Path, folder: Path, device: str) -> Path:
    """``source``'s weights and config.toml (its ``device``, the one
    setting a plugin's user may edit, set to ``device``) beside this
    version's learned controller, in ``folder``."""
    target = folder / source.name
    target.mkdir()
    shutil.copyfile(source / "weights.pt", target / "weights.pt")
    lines = (source / "config.toml").read_text().splitlines()
    (target / "config.toml").write_text("\n".join(f'device = "{device}"' if re.match(r"device\s*=", line) else line
                                                  for line in lines) + "\n")
    shutil.copyfile(CONTROLLER, target / "controller.py")
    return target


def compared(one: dict[str, Any], many: dict[str, Any], exact: bool,
             names: tuple[str, str] = ("one_at_a_time", "batched")) -> dict[str, Any]:
    """The two runs' episodes, track by track: outcomes that differ, the
    largest lap-time difference (s, and in the env's calls: a lap's
    ``steps``), the tracks whose laps differ, and (``exact``) whether every
    episode's record is the same, bit for bit; each run's success rate and
    seconds under its name in ``names``."""
    by_track = {e["track_id"]: e for e in many["episodes"]}
    outcomes, worst, calls, tracks = 0, 0.0, 0, 0
    for e in one["episodes"]:
        other = by_track[e["track_id"]]
        if e["termination_reason"] != other["termination_reason"]:
            outcomes += 1
        elif e["lap_time_s"] is not None:
            worst = max(worst, abs(e["lap_time_s"] - other["lap_time_s"]))
            calls = max(calls, abs(e["steps"] - other["steps"]))
            tracks += e["steps"] != other["steps"]
    same = sorted(json.dumps(e, sort_keys=True) for e in one["episodes"]) == \
        sorted(json.dumps(by_track[e["track_id"]], sort_keys=True) for e in one["episodes"])
    return {"episodes": len(one["episodes"]), "outcomes_differing": outcomes, "max_lap_difference_s": worst,
            "max_lap_difference_calls": calls, "tracks_whose_laps_differ": tracks,
            "bitwise_equal": same if exact else None,
            "success_rate": {names[0]: one["summary"]["success_rate"], names[1]: many["summary"]["success_rate"]},
            "seconds": {names[0]: one["seconds"], names[1]: many["seconds"]}}


def _row(stacked: Mapping[str, Any], k: int) -> dict[str, Any]:
    """Row ``k`` of a stacked observation or info: one world's, as the Runner hands a `Controller` it."""
    return {key: value if isinstance(value, str) else np.asarray(value)[k] for key, value in stacked.items()}


def shadowed(batch_class: type, controller_class: type, tally: dict[str, Any]) -> type:
    """``batch_class`` whose every call's row of every world also goes
    through a ``controller_class`` of that world's episode (made in
    `start`, from the same observation): ``tally`` counts the rows
    compared (``"rows"``), those whose two actions differ in any bit
    (``"differing"``), and keeps the largest difference (``"max_abs"``)."""

    class Shadowed(batch_class):
        def __init__(self, config, worlds):
            super().__init__(config, worlds)
            self.shadows: dict[int, Any] = {}

        def start(self, worlds, obs, info):
            super().start(worlds, obs, info)
            for k, w in enumerate(worlds):
                self.shadows[int(w)] = controller_class(_row(obs, k), _row(info, k), self.config)

        def compute_controls(self, worlds, obs, info):
            actions = super().compute_controls(worlds, obs, info)
            for k, w in enumerate(worlds):
                one = np.asarray(self.shadows[int(w)].compute_control(_row(obs, k), _row(info, k)))
                row = np.asarray(actions[k])
                tally["rows"] += 1
                if one.dtype != row.dtype or one.shape != row.shape or one.tobytes() != row.tobytes():
                    tally["differing"] += 1
                    gap = np.abs(one.astype(np.float64) - row)
                    tally["max_abs"] = max(tally["max_abs"], float(np.max(np.where(np.isnan(gap), np.inf, gap))))
            return actions

    return Shadowed


@contextlib.contextmanager
def shadowing(tally: dict[str, Any]) -> Iterator[None]:
    """Inside, every plugin loaded in this process gets its batched
    controller `shadowed` by its per-episode one (``tally``'s counts)."""
    original = Plugin._classes

    def classes(plugin: Plugin) -> tuple[type, type | None]:
        one, batch = original(plugin)
        return one, None if batch is None else shadowed(batch, one, tally)

    Plugin._classes = classes
    try:
        yield
    finally:
        Plugin._classes = original


def command_seconds(plugin: Path, tracks: int, backend: str, out: Path) -> tuple[float, dict[str, Any]]:
    """``python -m racing_stack.evaluate --batched`` on the first ``tracks``
    Test tracks, a fresh process: its wall seconds and its result."""
    argv = [sys.executable, "-m", "racing_stack.evaluate", "--split", "test", "--tracks", str(tracks), "--batched",
            "--backend", backend, "--controller", str(plugin), "--out", str(out)]
    start = time.perf_counter()
    run = subprocess.run(argv, capture_output=True, text=True, timeout=3600)
    seconds = time.perf_counter() - start
    if run.returncode != 0:
        raise RuntimeError(f"evaluate exited {run.returncode}: {run.stderr[-2000:]}")
    return seconds, json.loads(out.read_text())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--plugin", type=Path, default=RELEASE,
                        help="an exported PPO plugin (its weights and settings)")
    parser.add_argument("--tracks", type=int, default=None, help="Test tracks of the timed command (1,000)")
    parser.add_argument("--compare", type=int, default=None,
                        help=f"Test tracks driven both ways ({GPU_COMPARE} on a GPU, 2 on the CPU)")
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("--publish", action="store_true", help="write benchmarks/results/batched_eval.json (GPU only)")
    args = parser.parse_args()
    gpu = torch.cuda.is_available()
    if args.publish and not gpu:
        parser.error("--publish needs a CUDA GPU")
    for flag, value in (("--tracks", args.tracks), ("--compare", args.compare)):
        if value is not None and not 1 <= value <= 1000:
            parser.error(f"argument {flag}: must be in [1, 1000], got {value}")
    if not (args.plugin / "weights.pt").is_file() or not (args.plugin / "config.toml").is_file():
        parser.error(f"argument --plugin: {str(args.plugin)!r} holds no exported plugin (weights.pt, config.toml)")
    backend = "mjx_warp" if gpu else "cpu_reference"
    tracks, compare = (args.tracks or 1000, args.compare or GPU_COMPARE) if gpu else \
        (args.tracks or 2, args.compare or 2)
    if tracks < compare:  # the command's episodes on the compared tracks are compared too
        parser.error(f"argument --tracks: the command's tracks ({tracks}) must hold the compared ones ({compare})")
    folder = "benchmarks/results/" if args.publish else "benchmarks/out/"
    out = args.out or ROOT / (folder + ("batched_eval.json" if gpu else "batched_eval_cpu.json"))
    check_outputs(parser, {"--out": out}, {"--out": {".json"}})
    report: dict[str, Any] = {"protocol": "batched evaluation", "environment": environment(),
                              "device": torch.cuda.get_device_name() if gpu else "cpu",
                              "source_sha256": source_hashes(__file__),
                              "plugin": shown(args.plugin),
                              "backend": backend, "compared_tracks": compare, "command_tracks": tracks}
    materialize_prefix("test", max(tracks, compare))  # the pool in the cache, apart from every timing
    with tempfile.TemporaryDirectory() as scratch:
        plugin = plugin_copy(args.plugin, Path(scratch), "cuda" if gpu else "cpu")
        seconds = {}
        for run in ("first", "warm"):
            log(f"evaluate --batched on {tracks} Test tracks, a fresh process ({run})")
            seconds[run], result = command_seconds(plugin, tracks, backend, Path(scratch) / "result.json")
            log(f"  {seconds[run]:.1f} s, success {result['summary']['success_rate']}")
        log(f"{compare} Test tracks batched, every row also through its episode's Controller ({backend})")
        tally = {"rows": 0, "differing": 0, "max_abs": 0.0}
        with shadowing(tally):  # in waves of half the tracks: each world's state starts anew mid-run
            shadowed_run = evaluate.evaluate(plugin, split="test", tracks=compare, backend=backend, isolate=False,
                                             batched=True, worlds=max(1, compare // 2))
        report["actions"] = {**tally, "episodes": len(shadowed_run["episodes"]),
                             "controller_errors": shadowed_run["summary"]["controller_errors"]}
        log(f"  {report['actions']}")
        log(f"{compare} Test tracks one episode at a time, then batched")
        runs = {name: evaluate.evaluate(plugin, split="test", tracks=compare, backend=backend, isolate=False,
                                        batched=name != "one") for name in ("one", "batched")}
        report["comparison"] = compared(runs["one"], runs["batched"], exact=not gpu)
        log(f"  {report['comparison']}")
        report["repeat"] = compared(shadowed_run, runs["batched"], exact=True, names=("shadowed", "batched"))
        log(f"  the shadowed batched run against the batched one (the env's own spread): {report['repeat']}")
        report["isolated"] = compared(runs["batched"], {**result, "seconds": seconds["warm"]}, exact=True,
                                      names=("batched", "command"))
        log(f"  the command's episodes (isolated) against the batched run's in this process: {report['isolated']}")
    report["command"] = {"seconds": seconds["warm"], "seconds_first": seconds["first"],
                         "episodes": len(result["episodes"]), "success_rate": result["summary"]["success_rate"],
                         "lap_time_s": result["summary"]["lap_time_s"]}
    c, a = report["comparison"], report["actions"]
    report["gates"] = [] if not gpu else [
        gate("outcomes differing, batched against one at a time", c["outcomes_differing"], "== 0",
             c["outcomes_differing"] == 0),
        gate("actions differing from the per-episode controller's on the same observations", a["differing"],
             f"== 0 (of {a['rows']:,} rows, no controller error)",
             a["rows"] > 0 and a["differing"] == 0 and a["controller_errors"] == 0),
        gate(f"evaluate --batched on {tracks} Test tracks, end to end, caches warm (s)", round(seconds["warm"], 1),
             f"<= {GATE_COMMAND_S} (1,000 tracks)", tracks == 1000 and seconds["warm"] <= GATE_COMMAND_S)]
    report["passed"] = gpu and all(g["passed"] for g in report["gates"])
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=2) + "\n")
    for g in report["gates"]:
        log(f"  {'PASS' if g['passed'] else 'FAIL'} {g['name']}: {g['value']} (gate {g['threshold']})")
    log(f"wrote {out}")
    if not gpu and not (c["bitwise_equal"] and report["repeat"]["bitwise_equal"] and report["isolated"]["bitwise_equal"]
                        and a["rows"] > 0 and a["differing"] == 0 and a["controller_errors"] == 0):
        sys.exit("batched-eval: on the CPU the batched actions and episodes must equal the per-episode ones, "
                 "a repeat's and the isolated command's bit for bit")


if __name__ == "__main__":
    main()
