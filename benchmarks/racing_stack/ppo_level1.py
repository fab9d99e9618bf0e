"""PPO from the GPU env to a controller plugin, in one run: train on Level
1's Train pool, choose and confirm the policy on Validation, check it on
all 1,000 Validation tracks against pure pursuit's laps there, and (unless
``--dev``) evaluate it and pure pursuit with the Runner on Test.

    python benchmarks/racing_stack/ppo_level1.py [--out FILE] [--train-seconds 330]
        [--eval-tracks 100] [--worlds 8192] [--seed 0] [--dev] [--set NAME=VALUE ...]

1. Training: `racing_stack.ppo` at the GPU preset (``--worlds`` worlds, the
   full Train pool), validated with early exit on Validation rows 0-499
   every ``validate_every`` updates, stopped after ``--train-seconds`` of
   wall time (then its last policy is validated too; the validation env's
   calls are compiled before the clock starts, as the training env's are
   by its first update); transitions/s end
   to end per update (env + policy + GAE + update; a validation is not part
   of an update), their median after the first two (compiles).
2. Phases: one more update timed phase by phase with the device
   synchronised between them, and an env-only run of the same worlds
   (before anything else shares the device). Then the chosen policy is
   exported as a plugin (a ``--dev`` run's too, so its Validation failures
   can be replayed).
3. Unless ``--dev``, the Runner drives the exported plugin and pure
   pursuit once on each of the first ``--eval-tracks`` Test tracks
   (``mjx_warp``, one world a track; Torch on one CPU thread), each in a
   child process (``python -m racing_stack.evaluate``), beside the
   Validation checks below: each Runner is one host thread's work, and
   the checks are the device's. The learned plugin goes through its
   batched controller (``--batched``: every world's observation in one
   call a step). On a GPU the Runner drives a copy of the exported plugin
   with ``device = "cuda"`` (the one setting a plugin's user may edit):
   every world's row in one network call, another rounding than the CPU's
   (the batched benchmark holds its laps within one env call of the
   per-episode controller's). On the CPU it drives the exported plugin
   (``device = "cpu"``), whose batched controller computes each row as
   the per-episode controller does, bit for bit. Test is looked at only
   here.
4. Validation, 1,000 tracks: the chosen policy on every Validation track
   through the trainer's on-device validation under the full Level timeout
   (the episodes the Runner drives with the exported plugin: a GPU test
   holds them equal), rows 0-499 then rows 500-999 on the training's
   500-world validation env, against pure pursuit's committed per-track
   laps (``benchmarks/v0.1/pursuit_level1_validation.json``). Rows 500-999
   played no part in choosing the policy: they are also reported alone
   (the confirmation). Each completed lap over its track's T_lim from
   rest (``benchmarks/results/min_time_laps.json``; no gate). The edge
   check drives the same tracks twice more with Gaussian noise of 1 % of
   each action's half range on every call
   (two noise seeds): the tracks that fail in any of the three passes were
   driven at the edge, where another float path (the Runner's) may fail
   them too (no gate). The standing starts: the chosen policy's
   acceleration at each of those tracks' first call, and how many hold
   the car (not above 0: a brake at a standstill holds it) (no gate).
   Unless ``--dev``, pure pursuit tuned by hand
   (`TUNED_PURSUIT`) drives the same tracks (the prior of a residual
   policy whose correction is zeroed): what tuning alone gives, beside
   what learning gives (no gate). Their ``seconds`` are measured beside
   the Runners' children (unless ``--dev``). The Runners' results are read
   last.

Gates (one H200): no update stopped by the trainer's guard (corrupt
data: the integrity gate of training you can trust); training >=
1,000,000 transitions/s end to end with >= 4,096 worlds; validations
(the cut policy's included) and checkpoints under 10 % of the training's
wall time; Validation (1,000 tracks): success >= 99 % and the median of
the per-track ratios of the learned lap to pure pursuit's <= 0.90 (10 %
faster on the same tracks); unless ``--dev``, on Test: success >= pure
pursuit's and the median lap faster.

``recipe`` in the report says which policy it is: ``"end-to-end"``, or
``"residual on pure pursuit"`` (``--set features.prior={} --set
residual=R``: a correction on the reference controller's action, the
second recipe the PPO page reports beside the first).
A gate that is not met is reported with its margin. The report (JSON, its
learning curve as PNG beside it) is written after every phase, so a run
cut short keeps what it measured. Without CUDA it runs a tiny smoke (no
gate evaluated; its Validation episodes end after `SMOKE_EPISODE_STEPS`
calls, so what it costs does not hang on whether its policy drives) into
``benchmarks/out/ppo_level1_cpu.json``; on a GPU ``benchmarks/out/ppo_level1.json``, or with ``--publish`` the committed
``benchmarks/results/ppo_level1.json``.
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import dataclasses
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "racing_env"))

import jax  # noqa: E402
import numpy as np  # noqa: E402
import torch  # noqa: E402
from protocol import EnvStepper, environment, gate, logger, process_seconds, source_hashes  # noqa: E402

from racing_env.plugins import PURSUIT  # noqa: E402
from racing_stack._cli import check_outputs  # noqa: E402
from racing_stack.pools import SPLITS  # noqa: E402
from racing_stack.ppo.export import export_plugin  # noqa: E402
from racing_stack.ppo import PRESETS, RUN_FILES, PPOConfig, Trainer, draw_curve, make_env, make_validation_env  # noqa: E402
from racing_stack.ppo.networks import ActorCritic, prior_alone  # noqa: E402
from racing_stack.ppo.validation import standing_starts, validate  # noqa: E402
from racing_stack.prior import PursuitPrior  # noqa: E402
from racing_stack.features import LocalTrack  # noqa: E402

GATE_TPS = 1_000_000
GATE_WORLDS = 4096
GATE_VALIDATION_SUCCESS = 0.99
GATE_VALIDATION_LAP_RATIO = 0.90
GATE_OVERHEAD_SHARE = 0.10
#: The CPU smoke's Validation timeout (control steps, 3 s): Level 1's own, driven by a policy that holds
#: the car at the start, costs minutes a pass on a CPU.
SMOKE_EPISODE_STEPS = 150
#: Pure pursuit's committed laps on the 1,000 Validation tracks.
PURSUIT_VALIDATION = Path(__file__).resolve().parents[1] / "v0.1" / "pursuit_level1_validation.json"
#: Each Validation track's lap at the limit (T_lim; ``make benchmark-min-time-laps``).
LIMIT_LAPS = Path(__file__).resolve().parents[1] / "results" / "min_time_laps.json"
#: Pure pursuit tuned by hand (`prior_gains.py`: 100 % of Validation at 0.89 of the reference's laps on the CPU),
#: reported beside the learned policy on Validation (no gate): what tuning alone gives.
TUNED_PURSUIT = PursuitPrior(lateral_accel_mps2=5.5, max_speed_mps=26.0, drive_accel_mps2=3.0)
#: The edge check: the chosen policy drives the Validation tracks again with Gaussian noise of this fraction
#: of each action dimension's half range on every call, once per seed (no gate).
EDGE_NOISE = 0.01
EDGE_SEEDS = (1, 2)
log = logger("ppo")


def sync() -> None:
    """Wait for every stream of the device (JAX's and Torch's)."""
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def phases(trainer: Trainer, env_only_tps: float) -> dict[str, Any]:
    """One update, timed phase by phase with the device synchronised."""
    times = {}
    sync()
    t0 = time.perf_counter()
    trainer.collect()
    sync()
    times["rollout_s"] = time.perf_counter() - t0
    t0 = time.perf_counter()
    advantage, returns = trainer.advantages()
    sync()
    times["gae_s"] = time.perf_counter() - t0
    t0 = time.perf_counter()
    trainer.optimise(advantage, returns)
    sync()
    times["update_s"] = time.perf_counter() - t0
    transitions = trainer.config.steps * trainer.config.worlds
    env_s = min(times["rollout_s"], transitions / env_only_tps)
    total = times["rollout_s"] + times["gae_s"] + times["update_s"]
    return {**times, "env_s_estimated": env_s, "policy_s_estimated": times["rollout_s"] - env_s,
            "fractions": {"env": env_s / total, "policy": (times["rollout_s"] - env_s) / total,
                          "gae": times["gae_s"] / total, "update": times["update_s"] / total}}


def summary(result: dict[str, Any]) -> dict[str, Any]:
    s = result["summary"]
    return {"episodes": s["episodes"], "success_rate": s["success_rate"], "off_track_rate": s["off_track_rate"],
            "timeout_rate": s["timeout_rate"], "lap_time_s": s["lap_time_s"], "seconds": result["seconds"],
            "controller_errors": s["controller_errors"]}


def check_run_dir(parser: argparse.ArgumentParser, run_dir: Path, flag: str) -> None:
    """Refuse, as a usage error naming ``flag``, a run folder this command
    would replace that holds something else than a training run: a file, or
    a folder holding files but none of a run's (`RUN_FILES`). A new, empty
    or run's folder is replaced."""
    try:
        if run_dir.exists() and not run_dir.is_dir():
            parser.error(f"argument {flag}: the run's folder {str(run_dir)!r} is a file")
        foreign = run_dir.is_dir() and any(run_dir.iterdir()) and not any((run_dir / name).exists()
                                                                         for name in RUN_FILES)
    except OSError as error:  # unreadable, a name too long
        parser.error(f"argument {flag}: the run's folder {str(run_dir)!r} cannot be used ({error.strerror or error})")
    if foreign:
        parser.error(f"argument {flag}: the run's folder {str(run_dir)!r} holds files but no training run "
                     f"(none of {', '.join(RUN_FILES)}), and this command replaces it: give a new, empty or "
                     f"run's folder")


def start_runner(plugin: Path, tracks: int, out: Path, batched: bool = False) -> subprocess.Popen:
    """The Runner driving ``plugin`` once on each of the first ``tracks``
    Test tracks (``python -m racing_stack.evaluate``, the plugin in that
    process, ``mjx_warp`` with one world a track, Torch on one thread) in a
    child process, which runs beside this one and hears SIGINT
    (`sigint_heard`); its result goes to ``out`` (`runner_result` reads
    it), its output to ``out``'s ``.log`` sibling. ``batched``: the
    plugin's `BatchController` drives every world in one call a step
    (``--batched``; the exported plugin's, on its ``cpu`` device, computes
    each world's row as its per-episode controller does, bit for bit)."""
    with out.with_suffix(".log").open("w") as output, sigint_heard():
        return subprocess.Popen([sys.executable, "-m", "racing_stack.evaluate", "--controller", str(plugin),
                                 "--level", "1", "--split", "test", "--tracks", str(tracks), "--backend", "mjx_warp",
                                 "--worlds", str(tracks), "--no-isolate", "--out", str(out)]
                                + (["--batched"] if batched else []),
                                stdout=output, stderr=subprocess.STDOUT, env={**os.environ, "OMP_NUM_THREADS": "1"})


@contextlib.contextmanager
def sigint_heard() -> Iterator[None]:
    """While a child starts: SIGINT caught here, not ignored, so that the
    child hears it as a terminal's Ctrl-C gives it (an exec gives a caught
    signal its default action, but keeps an ignored one ignored: a
    benchmark started in the background ignores SIGINT, and its children
    would inherit that), and `stop_runner` can interrupt it. Not a
    ``preexec_fn``: that forks and runs Python in a JAX process, which JAX
    warns of."""
    ignored = signal.getsignal(signal.SIGINT) == signal.SIG_IGN
    if ignored:
        signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        yield
    finally:
        if ignored:
            signal.signal(signal.SIGINT, signal.SIG_IGN)


def runner_result(child: subprocess.Popen, out: Path) -> dict[str, Any]:
    """The `summary` of a `start_runner` child's result, once it has ended
    (exit status 0, or 1: every episode ended with a controller error, and
    the result says so).

    Raises:
        RuntimeError: the child failed otherwise (its exit status, and where
            its output is).
    """
    status = child.wait()
    if status not in (0, 1):
        raise RuntimeError(f"the Runner's child process exited with status {status}; "
                           f"its output is in {out.with_suffix('.log')}")
    return summary(json.loads(out.read_text()))


def stop_runner(child: subprocess.Popen, grace_s: float = 5.0) -> None:
    """End a `start_runner` child that is still running: interrupted first
    (as by Ctrl-C: it writes the episodes that had ended), killed after
    ``grace_s``."""
    if child.poll() is None:
        child.send_signal(signal.SIGINT)
        try:
            child.wait(grace_s)
        except subprocess.TimeoutExpired:
            child.kill()
            child.wait()


def edge_check(policy: ActorCritic, trainer: Trainer, config: PPOConfig, clean: list) -> dict[str, Any]:
    """The tracks of ``clean`` (the policy's episodes on Validation rows
    0 to 2 x ``validation_tracks`` - 1) driven again under action noise
    (`EDGE_NOISE`, once per seed of `EDGE_SEEDS`): a lap that noise of 1 %
    ends was driven at the edge, where a rounding difference (another
    device, the Runner's float path) may end it too. Returns each pass's
    success rate and failed tracks, and how many tracks failed in any
    pass (the clean one included) and in all of them."""
    n = config.validation_tracks
    t0 = time.perf_counter()
    failed = [{e.track_id for e in clean if not e.lap_completed}]
    passes = []
    for seed in EDGE_SEEDS:
        episodes = [e for rows in (range(n), range(n, 2 * n))
                    for e in validate(policy, trainer.validation, config, trainer.crossing, list(rows),
                                      early_exit=False, action_noise=EDGE_NOISE, noise_seed=seed)]
        failed.append({e.track_id for e in episodes if not e.lap_completed})
        passes.append({"noise_seed": seed, "success_rate": float(np.mean([e.lap_completed for e in episodes])),
                       "failed_tracks": sorted(failed[-1])})
    return {"action_noise": EDGE_NOISE, "tracks": len(clean), "passes": passes,
            "failed_in_any": len(set.union(*failed)), "failed_in_all": len(set.intersection(*failed)),
            "seconds": time.perf_counter() - t0}


def starts(policy: ActorCritic, trainer: Trainer, config: PPOConfig) -> dict[str, Any]:
    """The chosen policy's acceleration at the standing start of each of
    Validation rows 0 to 2 x ``validation_tracks`` - 1 (`standing_starts`:
    the first call of the episodes it is validated on): how many starts
    hold the car (not above 0 m/s²: it never pulls away), their median and
    the five lowest with their tracks."""
    n = config.validation_tracks
    ids, actions = zip(*(standing_starts(policy, trainer.validation, config, trainer.crossing, list(rows))
                         for rows in (range(n), range(n, 2 * n))))
    track, accel = np.concatenate(ids), np.concatenate(actions)[:, 1]
    return {"tracks": len(track), "holding": int((accel <= 0).sum()), "median_mps2": float(np.median(accel)),
            "lowest": [{"track_id": int(track[i]), "acceleration_mps2": float(accel[i])}
                       for i in np.argsort(accel, kind="stable")[:5]]}


def against_pursuit(episodes: list, pursuit: dict[int, dict[str, Any]]) -> dict[str, Any]:
    """The learned policy's Validation episodes beside pure pursuit's on the
    same tracks (``pursuit``: track id -> its committed episode)."""
    laps = [e.lap_time_s for e in episodes if e.lap_completed]
    ratios = [e.lap_time_s / pursuit[e.track_id]["lap_time_s"] for e in episodes
              if e.lap_completed and pursuit[e.track_id]["lap_completed"]]
    theirs = [pursuit[e.track_id]["lap_time_s"] for e in episodes if pursuit[e.track_id]["lap_completed"]]
    reasons = [e.termination_reason for e in episodes]
    return {"tracks": len(episodes), "success_rate": float(np.mean([e.lap_completed for e in episodes])),
            "off_track": reasons.count("off_track"), "timeout": reasons.count("timeout"),
            "failures": [{"track_id": e.track_id, "reason": e.termination_reason, "progress": e.progress,
                          "steps": e.steps} for e in episodes if not e.lap_completed],
            "median_lap_s": float(np.median(laps)) if laps else None,
            "p90_lap_s": float(np.percentile(laps, 90)) if laps else None,
            "pursuit_success_rate": float(np.mean([pursuit[e.track_id]["lap_completed"] for e in episodes])),
            "pursuit_median_lap_s": float(np.median(theirs)) if theirs else None,
            "median_lap_ratio_to_pursuit": (float(np.median(laps)) / float(np.median(theirs))
                                            if laps and theirs else None),
            "median_per_track_ratio": float(np.median(ratios)) if ratios else None,
            "max_per_track_ratio": float(np.max(ratios)) if ratios else None}


def over_limit(episodes: list) -> dict[str, Any]:
    """The completed Validation laps over each track's T_lim from rest (the
    lap at the limit an episode could drive, `LIMIT_LAPS`): median, 90th
    percentile, least (no gate yet)."""
    limits = {t["track_id"]: t["t_lim_standing_s"]
              for t in json.loads(LIMIT_LAPS.read_text())["splits"]["validation"]["tracks"]}
    ratios = [e.lap_time_s / limits[e.track_id] for e in episodes if e.lap_completed]
    if not ratios:
        return {"laps": 0, "median": None, "p90": None, "min": None}
    return {"laps": len(ratios), "median": float(np.median(ratios)), "p90": float(np.percentile(ratios, 90)),
            "min": float(np.min(ratios))}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=None,
                        help="report path (default benchmarks/out/ppo_level1.json)")
    parser.add_argument("--publish", action="store_true",
                        help="write the committed report, benchmarks/results/ppo_level1.json (GPU only)")
    parser.add_argument("--dev", action="store_true", help="no export, no Runner, no Test: for experiments")
    parser.add_argument("--train-seconds", type=float, default=330.0)
    parser.add_argument("--eval-tracks", type=int, default=100)
    parser.add_argument("--worlds", type=int, default=8192)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--set", action="append", default=[], metavar="NAME=VALUE",
                        help="override a setting of the GPU preset (as train-ppo's --set; in the report's config)")
    parser.add_argument("--run-dir", type=Path, default=None,
                        help="the training run's folder (default: the report's path without .json)")
    args = parser.parse_args()
    if args.dev and args.publish:
        parser.error("--dev runs are not published")
    if not 0.0 < args.train_seconds < float("inf"):
        parser.error(f"argument --train-seconds: must be finite and > 0, got {args.train_seconds}")
    if not 1 <= args.eval_tracks <= SPLITS["test"].size:
        parser.error(f"argument --eval-tracks: must be in [1, {SPLITS['test'].size}] (the Test split's tracks), "
                     f"got {args.eval_tracks}")
    gpu = jax.default_backend() == "gpu"
    config = PRESETS["gpu"]
    for flag, name in (("--worlds", "worlds"), ("--seed", "seed")):
        try:
            config = dataclasses.replace(config, **{name: getattr(args, name)})
        except (TypeError, ValueError) as error:
            parser.error(f"argument {flag}: {error}")
    if not gpu:
        config = dataclasses.replace(PRESETS["cpu"], worlds=4, steps=8, minibatches=2, tracks=4, updates=100_000,
                                     validate_every=2, validation_tracks=2, max_episode_steps=50, stagger_steps=4,
                                     validation_steps=60, seed=args.seed)
        args.train_seconds, args.eval_tracks = 5.0, 2
    try:
        config = config.override(args.set)
    except (TypeError, ValueError) as error:
        parser.error(f"argument --set: {error}")
    if 2 * config.validation_tracks > SPLITS["validation"].size:
        parser.error(f"--set validation_tracks: selection and confirmation need 2 x {config.validation_tracks} "
                     f"Validation rows, the split has {SPLITS['validation'].size}")
    folder = "benchmarks/results/" if gpu and args.publish else "benchmarks/out/"
    out = args.out or Path(folder + ("ppo_level1.json" if gpu else "ppo_level1_cpu.json"))
    run_dir = args.run_dir or out.with_suffix("")
    check_run_dir(parser, run_dir, "--run-dir" if args.run_dir else "--out")  # before check_outputs makes folders
    check_outputs(parser, {"--out": out}, {"--out": {".json"}})
    pursuit = {e["track_id"]: e for e in json.loads(PURSUIT_VALIDATION.read_text())["episodes"]}
    report: dict[str, Any] = {"protocol": "PPO Level 1", "dev": args.dev, "environment": environment(),
                              "source_sha256": source_hashes(__file__),
                              "recipe": "residual on pure pursuit" if config.residual else "end-to-end",
                              "config": config.to_json(),
                              "validation_max_episode_steps": None if gpu else SMOKE_EPISODE_STEPS,
                              "train_seconds": args.train_seconds, "eval_tracks": args.eval_tracks,
                              "selection_rows": [0, config.validation_tracks],
                              "confirmation_rows": [config.validation_tracks, 2 * config.validation_tracks]}

    def write() -> None:
        report["command_wall_s"] = process_seconds()  # so far: the last write's is the whole command's
        report["gates"] = gates(report, config, args.dev) if gpu else []
        report["passed"] = gpu and len(report["gates"]) == (5 if args.dev else 7) and \
            all(g["passed"] for g in report["gates"])
        out.write_text(json.dumps(_finite(report), indent=2, allow_nan=False) + "\n")

    log(f"env: {config.worlds} worlds on the Train pool")
    t0 = time.perf_counter()
    try:
        env = make_env(config)
        validation = make_validation_env(config, max_episode_steps=None if gpu else SMOKE_EPISODE_STEPS)
    except ValueError as error:  # e.g. more worlds than this machine's memory holds: refused before any
        parser.error(f"the envs cannot be built: {error}")
    shutil.rmtree(run_dir, ignore_errors=True)  # a run's folder (check_run_dir): this run replaces it
    trainer = Trainer(config, env, run_dir, validation=validation)
    if config.validate_every:
        trainer.compile_validation()  # a compile is setup, like the training env's
    report["setup_s"] = time.perf_counter() - t0
    log(f"training {config.updates} updates, for at most {args.train_seconds:.0f} s")
    t0 = time.perf_counter()
    try:
        rows = trainer.run(seconds=args.train_seconds)
    except Exception as error:  # the report says why the run stopped
        report["error"] = f"{type(error).__name__}: {error}"
        write()
        raise
    after_cut = None
    if config.validate_every and not np.isfinite(rows[-1]["validation_success_rate"]):
        # Cut by the time budget: the last policy is a candidate too (its validation is overhead too).
        after_cut = {"update": trainer.update, **trainer.validate_and_keep()}
    wall = time.perf_counter() - t0
    steady = [r["transitions_per_s"] for r in rows[2:]] or [r["transitions_per_s"] for r in rows]
    best = None if trainer.best is None else {k: v for k, v in trainer.best.items() if k != "policy"}
    updating = sum(r["seconds"] for r in rows)
    report["training"] = {"updates": len(rows), "transitions": rows[-1]["transitions"], "seconds": updating,
                          "wall_s": wall, "overhead_share": 1.0 - updating / wall,
                          "overhead": dict(trainer.overhead),
                          "median_transitions_per_s_after_2": float(np.median(steady)),
                          "validations": [{k: r[k] for k in ("update", "validation_success_rate",
                                                             "validation_median_lap_time_s",
                                                             "validation_mean_progress")}
                                          for r in rows if np.isfinite(r["validation_success_rate"])]
                          + ([after_cut] if after_cut else []),
                          "exported": best, "last": rows[-1], "log": str(run_dir / "log.csv")}
    draw_curve(run_dir / "log.csv", out.with_suffix(".png"))
    write()
    log(f"trained {len(rows)} updates, {report['training']['median_transitions_per_s_after_2']:,.0f} transitions/s")
    chosen = copy.deepcopy(trainer.best_policy())  # the timed update below must not change what is measured
    # Timed before the Runners start, which share the device and the host with what follows.
    stepper = EnvStepper(trainer.env)
    stepper.run(5)
    env_steps = 100 if gpu else 4
    env_tps = env_steps * config.worlds / stepper.run(env_steps)
    report["env_only_transitions_per_s"] = env_tps
    report["phases"] = phases(trainer, env_tps)
    # A dev run's too (its failures can be replayed); named after the run, as train-ppo names its plugin.
    plugin = export_plugin(chosen, config, run_dir / "plugin", name=run_dir.resolve().name)
    report["plugin"] = str(plugin)
    log("exported the last policy (no validation)" if best is None else
        f"exported update {best['update']}'s policy (validation success {best['validation_success_rate']:.3f})")
    write()
    runners: dict[str, tuple[subprocess.Popen, Path]] = {}
    scratch = Path(tempfile.mkdtemp(prefix="ppo_level1_"))
    try:
        if not args.dev:
            # A SIGTERM (a time limit's) ends this process through the finally below, so the children end too.
            signal.signal(signal.SIGTERM, lambda number, frame: sys.exit(128 + number))
            learned = export_plugin(chosen, config, scratch / plugin.name, device="cuda",
                                    name=run_dir.resolve().name) if gpu else plugin
            report["test_plugin_device"] = "cuda" if gpu else "cpu"  # the exported plugin's copy the Runner drove
            for name, driven in (("learned", learned), ("pursuit", PURSUIT)):
                runner_out = run_dir / f"{name}_test.json"
                child = start_runner(driven, args.eval_tracks, runner_out, batched=name == "learned")
                runners[name] = child, runner_out
            log(f"the Runner drives the learned plugin and pure pursuit on the first {args.eval_tracks} Test "
                f"tracks, each in a child process, beside the Validation checks")
        n = config.validation_tracks
        t0 = time.perf_counter()
        selection = validate(chosen, trainer.validation, config, trainer.crossing, list(range(n)), early_exit=False)
        confirmation = validate(chosen, trainer.validation, config, trainer.crossing, list(range(n, 2 * n)),
                                early_exit=False)
        report["confirmation"] = against_pursuit(confirmation, pursuit)
        report["validation_all"] = {**against_pursuit(selection + confirmation, pursuit),
                                    "lap_over_t_lim": over_limit(selection + confirmation),
                                    "seconds": time.perf_counter() - t0}
        log(f"confirmation (rows {n}-{2 * n - 1}): {report['confirmation']['success_rate']:.3f} success")
        log(f"all {2 * n} Validation tracks: "
            f"{ {k: v for k, v in report['validation_all'].items() if k != 'failures'} }")
        report["standing_starts"] = starts(chosen, trainer, config)
        log(f"standing starts: {report['standing_starts']['holding']} of {2 * n} hold the car, median "
            f"{report['standing_starts']['median_mps2']:.2f} m/s2")
        report["validation_edge"] = edge_check(chosen, trainer, config, selection + confirmation)
        edge = report["validation_edge"]
        log(f"edge check (action noise {EDGE_NOISE}): success {[p['success_rate'] for p in edge['passes']]}, "
            f"{edge['failed_in_any']} tracks failed in any pass, {edge['failed_in_all']} in all")
        if not args.dev:
            episodes = drive_prior(TUNED_PURSUIT, trainer.validation, config, trainer.crossing, trainer.device,
                                   list(range(2 * n)))
            report["validation_all"]["tuned_pursuit"] = {"gains": dataclasses.asdict(TUNED_PURSUIT),
                                                         **against_pursuit(episodes, pursuit)}
            tuned = report["validation_all"]["tuned_pursuit"]
            log(f"tuned pursuit on the same tracks: {tuned['success_rate']:.3f} success, "
                f"median per-track ratio {tuned['median_per_track_ratio']}")
        write()
        if runners:
            report["evaluation"] = {"test": {}}
            for name, (child, runner_out) in runners.items():
                report["evaluation"]["test"][name] = runner_result(child, runner_out)
                log(f"{name} on test: {report['evaluation']['test'][name]}")
                write()
    finally:
        for child, _ in runners.values():
            stop_runner(child)  # this run stopped first: its children must not outlive it
        shutil.rmtree(scratch, ignore_errors=True)
    if report["command_wall_s"] is not None:
        log(f"the command took {report['command_wall_s']:.0f} s (setup {report['setup_s']:.0f} s)")
    for g in report["gates"]:
        log(f"  {'PASS' if g['passed'] else 'FAIL'} {g['name']}: {g['value']} (gate {g['threshold']})"
            + (f", margin {g['margin']}" if "margin" in g else ""))


def drive_prior(prior: PursuitPrior, env, config, crossing, device: torch.device, rows: list[int]) -> list:
    """Pure pursuit at ``prior``'s gains alone (`prior_alone`: a residual
    policy whose correction is zeroed) on the pool rows ``rows`` of the
    validation ``env``, as many at a time as it has worlds, through the
    trainer's validation under the full timeout; its episodes in ``rows``' order."""
    drives = dataclasses.replace(config, features=LocalTrack(prior=prior), residual=1.0)
    space = env.single_action_space
    driver = prior_alone(drives.features.size, space.low, space.high).to(device)
    n = env.num_envs
    return [e for start in range(0, len(rows), n)
            for e in validate(driver, env, drives, crossing, rows[start:start + n], early_exit=False)]


def _finite(value: Any) -> Any:
    """``value`` with every non-finite float as None (JSON has no NaN)."""
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_finite(v) for v in value]
    if isinstance(value, (float, np.floating)):
        return float(value) if np.isfinite(value) else None
    if isinstance(value, np.integer):
        return int(value)
    return value


def gates(report: dict[str, Any], config, dev: bool) -> list[dict[str, Any]]:
    """The gates measured so far: throughput once trained, Validation's
    once all 1,000 tracks were driven, Test's (not in ``dev``) once both
    controllers drove Test."""
    stops = int(report.get("error", "").startswith("GuardError"))
    out = [gate("guard_stops", stops, 0, stops == 0)]
    if "training" not in report:
        return out
    tps = report["training"]["median_transitions_per_s_after_2"]
    out.append({**gate("training_transitions_per_s", tps, GATE_TPS,
                       tps >= GATE_TPS and config.worlds >= GATE_WORLDS), "margin": tps - GATE_TPS})
    share = report["training"]["overhead_share"]
    out.append({**gate("validation_and_checkpoint_share_of_training_wall_time", share, GATE_OVERHEAD_SHARE,
                       share < GATE_OVERHEAD_SHARE), "margin": GATE_OVERHEAD_SHARE - share})
    every = report.get("validation_all")
    if every is None:
        return out
    rate = every["success_rate"]
    out.append({**gate("validation_success_rate", rate, GATE_VALIDATION_SUCCESS, rate >= GATE_VALIDATION_SUCCESS),
                "margin": rate - GATE_VALIDATION_SUCCESS})
    ratio = every["median_per_track_ratio"]
    out.append({**gate("validation_median_per_track_lap_ratio_to_pursuit", ratio, GATE_VALIDATION_LAP_RATIO,
                       ratio is not None and ratio <= GATE_VALIDATION_LAP_RATIO),
                "margin": None if ratio is None else GATE_VALIDATION_LAP_RATIO - ratio})
    test = report.get("evaluation", {}).get("test", {})
    if dev or "pursuit" not in test:
        return out
    learned, pursuit = test["learned"], test["pursuit"]
    out.append({**gate("test_success_rate_at_least_pursuit", learned["success_rate"], pursuit["success_rate"],
                       learned["success_rate"] >= pursuit["success_rate"]),
                "margin": learned["success_rate"] - pursuit["success_rate"]})
    mine, theirs = learned["lap_time_s"]["median"], pursuit["lap_time_s"]["median"]
    out.append({**gate("test_median_lap_faster_than_pursuit", mine, theirs,
                       mine is not None and theirs is not None and mine < theirs),
                "margin": None if mine is None or theirs is None else theirs - mine})
    return out


if __name__ == "__main__":
    sys.exit(main())
