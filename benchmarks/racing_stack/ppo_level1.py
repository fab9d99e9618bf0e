"""PPO from the GPU env to a controller plugin, in one run: train on Level
1's Train pool, export the best validated policy, evaluate it and the
pure-pursuit reference with the Runner on Level 1's Test and Validation
tracks.

    python benchmarks/racing_stack/ppo_level1.py [--out FILE] [--train-seconds 200]
        [--eval-tracks 100] [--worlds 8192] [--set NAME=VALUE ...]

1. Training: `racing_stack.ppo` at the GPU preset (``--worlds`` worlds, the
   full Train pool, Level 1's timeout, leaving the track costing 5.0, 600
   updates with the step size falling linearly to 1/600 of its first
   value, validated on the first 100 Validation tracks every 40 updates),
   stopped early if ``--train-seconds`` of wall time run out (then its last
   policy is validated too); transitions/s end to end per update (env +
   policy + GAE + update; a validation is not part of an update), their
   median after the first two (compiles).
2. Phases: one more update timed phase by phase with the device
   synchronised between them (rollout, GAE, optimisation), and an env-only
   run of the same worlds under random actions in the same process: the
   rollout's env share is estimated from it, the policy's is the rest.
3. Export: the best validated policy as a plugin (``controller.py``,
   ``config.toml``, ``weights.pt``).
4. Evaluation: the Runner drives the learned plugin and the pure-pursuit
   reference once on each of the first ``--eval-tracks`` tracks of Test,
   then of Validation (``mjx_warp``, one world a track; Torch on one CPU
   thread, since a controller's batch of one gains nothing from more).
   The exported policy was picked on the first 100 Validation tracks, so
   the Validation figures are optimistic; Test is the held-out one.

Gates (one H200): training >= 1,000,000 transitions/s end to end with >=
4,096 worlds; on Test, the learned controller's success rate >= the
reference's and its median lap time faster. A gate that is not met is
reported with its margin. The report (JSON, its learning curve as PNG
beside it) is written after every phase, with the gates measured so far,
so a run cut short keeps what it measured. Without CUDA it runs a tiny smoke (no gate evaluated) into
``benchmarks/out/ppo_level1_cpu.json``; on a GPU
``benchmarks/out/ppo_level1.json``, or with ``--publish`` the committed
``benchmarks/results/ppo_level1.json``.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import shutil
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "racing_env"))

import jax  # noqa: E402
import numpy as np  # noqa: E402
import torch  # noqa: E402
from protocol import EnvStepper, environment, gate, logger, source_hashes  # noqa: E402

from racing_env.plugins import PURSUIT  # noqa: E402
from racing_stack import evaluate  # noqa: E402
from racing_stack.export import export_plugin  # noqa: E402
from racing_stack.ppo import PRESETS, Trainer, draw_curve, make_env, make_validation_env  # noqa: E402

GATE_TPS = 1_000_000
GATE_WORLDS = 4096
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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=None,
                        help="report path (default benchmarks/out/ppo_level1.json)")
    parser.add_argument("--publish", action="store_true",
                        help="write the committed report, benchmarks/results/ppo_level1.json (GPU only)")
    parser.add_argument("--train-seconds", type=float, default=200.0)
    parser.add_argument("--eval-tracks", type=int, default=100)
    parser.add_argument("--worlds", type=int, default=8192)
    parser.add_argument("--set", action="append", default=[], metavar="NAME=VALUE",
                        help="override a setting of the GPU preset (as train-ppo's --set; in the report's config)")
    parser.add_argument("--run-dir", type=Path, default=None,
                        help="the training run's folder (default: the report's path without .json)")
    args = parser.parse_args()
    gpu = jax.default_backend() == "gpu"
    config = dataclasses.replace(PRESETS["gpu"], worlds=args.worlds)
    if not gpu:
        config = dataclasses.replace(PRESETS["cpu"], worlds=4, steps=8, minibatches=2, tracks=4, updates=100_000,
                                     validate_every=2, validation_tracks=2, max_episode_steps=50)
        args.train_seconds, args.eval_tracks = 5.0, 2
    try:
        config = config.override(args.set)
    except ValueError as error:
        parser.error(str(error))
    folder = "benchmarks/results/" if gpu and args.publish else "benchmarks/out/"
    out = args.out or Path(folder + ("ppo_level1.json" if gpu else "ppo_level1_cpu.json"))
    out.parent.mkdir(parents=True, exist_ok=True)
    run_dir = args.run_dir or out.with_suffix("")
    shutil.rmtree(run_dir, ignore_errors=True)
    report: dict[str, Any] = {"protocol": "PPO Level 1", "environment": environment(),
                              "source_sha256": source_hashes(__file__), "config": config.to_json(),
                              "train_seconds": args.train_seconds, "eval_tracks": args.eval_tracks,
                              # The Runner's Validation figures include the tracks the policy was picked on.
                              "validation_rows_used_for_selection": config.validation_tracks}

    def write() -> None:
        report["gates"] = gates(report, config) if gpu else []
        report["passed"] = gpu and len(report["gates"]) == 3 and all(g["passed"] for g in report["gates"])
        out.write_text(json.dumps(_finite(report), indent=2, allow_nan=False) + "\n")

    log(f"env: {config.worlds} worlds on the Train pool")
    t0 = time.perf_counter()
    trainer = Trainer(config, make_env(config), run_dir, validation=make_validation_env(config))
    report["setup_s"] = time.perf_counter() - t0
    log(f"training {config.updates} updates, for at most {args.train_seconds:.0f} s")
    t0 = time.perf_counter()
    rows = trainer.run(seconds=args.train_seconds)
    after_cut = None
    if config.validate_every and not np.isfinite(rows[-1]["validation_success_rate"]):
        # Cut by the time budget: the last policy is a candidate too.
        after_cut = {"update": trainer.update, **trainer.validate_and_keep()}
    steady = [r["transitions_per_s"] for r in rows[2:]] or [r["transitions_per_s"] for r in rows]
    best = None if trainer.best is None else {k: v for k, v in trainer.best.items() if k != "policy"}
    report["training"] = {"updates": len(rows), "transitions": rows[-1]["transitions"],
                          "seconds": sum(r["seconds"] for r in rows), "wall_s": time.perf_counter() - t0,
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
    stepper = EnvStepper(trainer.env)
    stepper.run(5)
    env_steps = 100 if gpu else 4
    env_tps = env_steps * config.worlds / stepper.run(env_steps)
    report["env_only_transitions_per_s"] = env_tps
    report["phases"] = phases(trainer, env_tps)
    write()
    plugin = export_plugin(trainer.best_policy(), config, run_dir / "plugin")
    report["plugin"] = str(plugin)
    log("exported the last policy (no validation)" if best is None else
        f"exported update {best['update']}'s policy (validation success {best['validation_success_rate']:.2f})")
    report["evaluation"] = {}
    torch.set_num_threads(1)
    for split in ("test", "validation"):
        for name, directory in (("learned", plugin), ("pursuit", PURSUIT)):
            log(f"evaluating {name} on {split}")
            result = evaluate.evaluate(directory, level=1, split=split, tracks=args.eval_tracks,
                                       backend="mjx_warp", worlds=args.eval_tracks)
            report["evaluation"].setdefault(split, {})[name] = summary(result)
            log(f"{name} on {split}: {report['evaluation'][split][name]}")
            write()
    for g in report["gates"]:
        log(f"  {'PASS' if g['passed'] else 'FAIL'} {g['name']}: {g['value']} (gate {g['threshold']})"
            + (f", margin {g['margin']}" if "margin" in g else ""))


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


def gates(report: dict[str, Any], config) -> list[dict[str, Any]]:
    """The gates measured so far: throughput once trained, the Test gates
    once both controllers drove Test."""
    if "training" not in report:
        return []
    tps = report["training"]["median_transitions_per_s_after_2"]
    out = [{**gate("training_transitions_per_s", tps, GATE_TPS, tps >= GATE_TPS and config.worlds >= GATE_WORLDS),
            "margin": tps - GATE_TPS}]
    test = report.get("evaluation", {}).get("test", {})
    if "pursuit" not in test:
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
