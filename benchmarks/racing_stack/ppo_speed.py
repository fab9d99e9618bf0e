"""PPO's speed against the env's own: how much of the env's rate the
trainer keeps, where an update's time goes, and how soon a policy laps.

    python benchmarks/racing_stack/ppo_speed.py [--worlds 8192 65536] [--paths eager/highest graph/high ...]
        [--updates 8] [--warmup-updates 2] [--profile] [--skill-worlds 8192 32768 65536] [--skill-seeds 0 1]
        [--skill-seconds 60] [--set NAME=VALUE ...] [--out FILE] [--publish]

1. Throughput, at each of ``--worlds`` (one env a world count, the GPU
   preset's wrappers and reward, the full Train pool):
   - the env alone: ``env.step`` under cycled random actions, then the
     same with the training's reward and feature wrappers after every
     step (one jitted call, as a rollout makes it): the rate the trainer
     is held to, in this process, on these worlds;
   - each ``--paths`` variant (``update_path/matmul_precision[/lagN][/compiled][/jax]``,
     N the `PPOConfig.policy_lag`, compiled: `PPOConfig.compiled`, jax:
     `PPOConfig.act_in_jax`): a
     trainer on that env, ``--warmup-updates`` updates (the first two
     compile and capture; more take the run past the start, whose worlds
     are mostly held braked), then ``--updates`` updates timed end to end
     (rollout, GAE, optimisation, the guard's read, the episodes' read),
     their median transitions/s;
   - the env alone on the trainer's own calls: the next ``--updates``
     updates run with every action they send kept (a copy a call, so
     they are not the timed ones), then the env, restored to its
     snapshot before them, steps those very actions with the wrappers:
     the physics of the trainer's calls (the env's cost depends on what
     the cars do: held cars are cheaper than the cycled random actions,
     a driving policy's dearer), without policy and learner; the gate's
     ratio is the timed updates' rate to this replay's;
   - one more update timed phase by phase with the device synchronised
     between phases (rollout, GAE, optimisation);
   - with ``--profile``, once every variant is timed (a profile can slow
     the launches after it): Torch's profiler over one optimisation and
     one rollout of each variant, on a trainer of its own: the kernels,
     their device time, the host time, the 25 longest kernels and the
     launch-bound ones (under 5 us a launch); then one whole update's
     timeline (`timeline`: how long the device was busy in it, each
     stream's share, the host's waits; ``--trace`` keeps its Chrome trace).
2. Time to skill, at each of ``--skill-worlds`` for each of
   ``--skill-seeds``, each run alone: a trainer of the best variant
   validates with early exit on Validation rows 0-499 every
   ``validate_every`` updates (``round(200,000 / worlds)`` unless set),
   from the first update whose training episodes lapped at
   ``--validate-from`` (0.5) or more; training seconds are the wall time
   of the updates (compiles included; pool and env building, the
   validations and the check below not: the clock stops, the device
   idle, while they measure the policy; their time is reported apart,
   as ``validation_and_check_s``). At the first validation of at least
   99 %, the policy drives the first 2 x ``validation_tracks`` Validation
   tracks (all 1,000 at the preset) to their end and
   its laps are compared with pure pursuit's committed ones; the run stops
   when that check passes (or after ``--skill-seconds`` of training). The
   curve of Validation success against training seconds is drawn beside
   the report.

Gates (one GPU, named in the report): end to end >= 0.85 of the env
replaying the trainer's own calls with its wrappers at every ``--worlds``
count (its fastest variant); time to
skill <= 30 s of training for every seed at one world count (the one
whose slowest seed is fastest: the preset's choice), with >= 99 % of all
1,000 Validation tracks lapped at a median per-track ratio <= 0.80 of
pure pursuit's laps. The report passes only with both kinds of gate. Without CUDA a tiny smoke
runs every phase on the CPU (no gate evaluated) into
``benchmarks/out/ppo_speed_cpu.json``; on a GPU
``benchmarks/out/ppo_speed.json``, or with ``--publish`` the committed
``benchmarks/results/ppo_speed.json``.
"""

from __future__ import annotations

import argparse
import dataclasses
import gc
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "racing_env"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import jax  # noqa: E402
import numpy as np  # noqa: E402
import torch  # noqa: E402
from ppo_level1 import PURSUIT_VALIDATION, _finite, against_pursuit, phases, sync  # noqa: E402
from protocol import EnvStepper, environment, gate, logger, source_hashes  # noqa: E402

from racing_stack._cli import check_outputs  # noqa: E402
from racing_stack.ppo import PRESETS, PPOConfig, Trainer, make_env, make_validation_env  # noqa: E402
from racing_stack.ppo.env_step import Clock, after_step  # noqa: E402
from racing_stack.ppo.validation import validate  # noqa: E402

GATE_RATIO = 0.85
GATE_SKILL_S = 30.0
GATE_SKILL_SUCCESS = 0.99
GATE_SKILL_RATIO = 0.80
log = logger("ppo-speed")


class WrappedEnvStepper(EnvStepper):
    """The env under cycled random actions with the training's reward and
    feature wrappers after every step (`racing_stack.ppo.rollout`'s one
    jitted call), no policy: the rate a rollout is held to."""

    name = "env_with_wrappers"

    def __init__(self, env, config: PPOConfig) -> None:
        super().__init__(env)
        self.config = config
        self.endings = config.reward.start(env.num_envs)
        self.clock = Clock(jax.numpy.zeros(env.num_envs, jax.numpy.int32), jax.numpy.zeros(env.num_envs, bool))
        self.weight = jax.device_put(np.float32(1.0))

    def run(self, steps: int) -> float:
        cfg, start = self.config, time.perf_counter()
        for _ in range(steps):
            action = self.actions[self.calls % len(self.actions)]
            obs, reward, terminated, truncated, info = self.env.step(action)
            self.out = after_step(cfg.reward, cfg.features, self.endings, self.clock, reward, obs,
                                   info["termination_reason"], info["lap_time_s"], terminated, truncated, action,
                                   self.weight)
            self.endings, self.clock = self.out[1], self.out[2]
            self.calls += 1
        jax.block_until_ready(self.out)
        return time.perf_counter() - start


class RecordingEnv:
    """``env`` as a trainer's rollout steps it, keeping a copy of every
    action it is stepped with (one small device copy a call: the rollout's
    action is a view of Torch's buffer, which the next step overwrites)."""

    def __init__(self, env) -> None:
        self.env, self.actions = env, []

    def step(self, action: jax.Array):
        self.actions.append(jax.numpy.array(action, copy=True))
        return self.env.step(action)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.env, name)


def replayed_rate(env, config: PPOConfig, start: dict[str, np.ndarray], actions: list[jax.Array],
                  repeats: int = 3) -> float:
    """Transitions/s of ``env`` with the training's wrappers stepping
    ``actions``, the calls a trainer's rollouts made, from ``start``, the
    env's snapshot before them: the same physics as the trainer's (the
    env's cost depends on what the cars do), no policy and no learner;
    the median of ``repeats`` replays, the env left where the trainer's
    calls left it."""
    stepper = WrappedEnvStepper(env, config)
    stepper.actions = actions
    seconds = []
    for _ in range(repeats):
        env.restore(start)
        sync()
        stepper.calls = 0
        seconds.append(stepper.run(len(actions)))
    return len(actions) * env.num_envs / float(np.median(seconds))


def variant_config(config: PPOConfig, variant: str) -> PPOConfig:
    """``config`` on a variant ``update_path/matmul_precision[/lagN][/compiled][/jax][/serial]``
    (N: `PPOConfig.policy_lag`; ``compiled``: `PPOConfig.compiled`;
    ``jax``: `PPOConfig.act_in_jax`; ``serial``: `serial`'s, not a setting).

    Raises:
        ValueError: a variant of other parts, or one the config refuses.
    """
    parts = variant.split("/")
    flags = parts[2:-1] if serial(variant) else parts[2:]
    lags = [f for f in flags if f.startswith("lag") and f[3:].isdigit()]
    order = [*lags[:1], "compiled", "jax"]  # one name a variant: its parts in this order
    if len(parts) < 2 or flags != [f for f in order if f in flags]:
        raise ValueError("a variant is update_path/matmul_precision[/lagN][/compiled][/jax][/serial], "
                         "e.g. graph/bf16/compiled/jax")
    return dataclasses.replace(config, update_path=parts[0], matmul_precision=parts[1],
                               policy_lag=int(lags[0][3:]) if lags else 0, compiled="compiled" in flags,
                               act_in_jax="jax" in flags)


def serial(variant: str) -> bool:
    """Whether a variant ends in ``/serial``: its trainer reads each
    update's results before it launches the next rollout
    (`racing_stack.ppo.train.Trainer.pipelined` off; the same numbers)."""
    return variant.endswith("/serial")


def env_rates(env, config: PPOConfig, steps: int, repeats: int = 3) -> dict[str, float]:
    """Transitions/s of the env alone and with its wrappers, each compiled
    first, the median of ``repeats`` runs of ``steps`` calls."""
    rates = {}
    env.reset(seed=config.seed)
    for stepper in (EnvStepper(env), WrappedEnvStepper(env, config)):
        stepper.run(3)
        rates[stepper.name] = float(np.median([steps * env.num_envs / stepper.run(steps) for _ in range(repeats)]))
    return rates


def profiled(trainer: Trainer) -> dict[str, Any]:
    """One optimisation and one rollout of ``trainer`` under Torch's
    profiler: the kernels each launched, their device time, the host
    time, the 25 kernels of most device time (ms), and the kernels that
    take under 5 us each on average (launch-bound: their count and time)."""
    out = {}
    activities = [torch.profiler.ProfilerActivity.CPU]
    if torch.cuda.is_available():
        activities.append(torch.profiler.ProfilerActivity.CUDA)
    for phase in ("optimise", "rollout"):
        trainer.collect()
        advantage, returns = trainer.advantages()
        sync()
        with torch.profiler.profile(activities=activities) as prof:
            if phase == "optimise":
                trainer.optimise(advantage, returns)
            else:
                trainer.collect()
            sync()
        events = prof.key_averages()
        # The kernels themselves: an operator's device time repeats its kernels'.
        device = [e for e in events if e.device_type == torch.autograd.DeviceType.CUDA]
        device.sort(key=lambda e: e.self_device_time_total, reverse=True)
        kernels = sum(e.count for e in device)
        out[phase] = {"kernels_launched": int(kernels),
                      "device_ms": sum(e.self_device_time_total for e in device) / 1e3,
                      "host_ms": sum(e.self_cpu_time_total for e in events) / 1e3,
                      "short_kernels": short_kernels(device),
                      "top": [{"name": e.key[:80], "calls": e.count, "device_ms": e.self_device_time_total / 1e3}
                              for e in device[:25]]}
    return out


def timeline(trainer: Trainer, trace: Path | None = None) -> dict[str, Any]:
    """One whole update of ``trainer`` (`Trainer._one_update`: with a
    policy lag, the next rollout collected beside the optimisation) under
    the profiler's trace, the device synchronised before and after: its
    wall time (ms), the time the device was busy (the union of its
    kernels', copies' and fills' intervals, every stream's, JAX's too), the
    kernel time of each stream, and the host's waits for the device (the
    runtime's and the driver's synchronising calls). A device busy for
    nearly all the wall time bounds the update; one idle for much of it
    waits on the host. ``trace``: also keep the Chrome trace there."""
    trainer._one_update()
    sync()
    with tempfile.TemporaryDirectory() as folder:
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU,
                                                torch.profiler.ProfilerActivity.CUDA]) as prof:
            start = time.perf_counter()
            trainer._one_update()
            sync()
            wall = time.perf_counter() - start
        path = trace or Path(folder) / "trace.json"
        prof.export_chrome_trace(str(path))
        events = json.loads(path.read_text())["traceEvents"]
    device = sorted((e["ts"], e["ts"] + e["dur"], e.get("tid")) for e in events
                    if e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset") and "dur" in e)
    busy, end = 0.0, -np.inf
    for a, b, _ in device:
        busy += max(0.0, b - max(a, end))
        end = max(end, b)
    streams: dict[str, float] = {}
    for a, b, tid in device:
        streams[str(tid)] = streams.get(str(tid), 0.0) + (b - a) / 1e3
    waits = [e for e in events if e.get("cat") in ("cuda_runtime", "cuda_driver") and "dur" in e
             and "ynchronize" in e.get("name", "")]
    span = (end - device[0][0]) / 1e3 if device else 0.0  # the first start to the last end
    return {"wall_ms": wall * 1e3, "device_busy_ms": busy / 1e3, "device_span_ms": span,
            "stream_kernel_ms": streams, "host_sync_calls": len(waits),
            "host_sync_ms": sum(e["dur"] for e in waits) / 1e3}


def short_kernels(device: list) -> dict[str, float]:
    """Of the profiler's kernel rows ``device``, those under 5 us a launch on
    average: how many launches and their device time (ms)."""
    short = [e for e in device if e.self_device_time_total < 5.0 * e.count]
    return {"launches": int(sum(e.count for e in short)),
            "device_ms": sum(e.self_device_time_total for e in short) / 1e3}


def throughput(env, config: PPOConfig, variants: list[str], updates: int, profile: bool,
               env_steps: int, trace: Path | None = None, warmup: int = 2) -> dict[str, Any]:
    """The env's rates and each variant's, at ``env``'s worlds: every
    variant timed first (after ``warmup`` updates, the first two its
    compiles), the env calls of the next as many updates replayed alone
    (`replayed_rate`), then (``profile``) each profiled on a trainer of
    its own, so that no timing follows a profile (the profiler can slow
    the launches after it), after as many warm-up updates as the timed
    one (the cars driving as they were in the timing)."""
    result: dict[str, Any] = {"worlds": config.worlds, "env": env_rates(env, config, env_steps), "variants": {}}
    baseline = result["env"][WrappedEnvStepper.name]
    for timing in ([True, False] if profile else [True]):
        for variant in variants:
            cfg = variant_config(config, variant)
            with tempfile.TemporaryDirectory() as out:
                trainer = Trainer(cfg, env, Path(out), progress=lambda row: None)
                trainer.pipelined = trainer.pipelined and not serial(variant)
                warm = [trainer._one_update() for _ in range(warmup)]
                if timing:
                    rows = [trainer._one_update() for _ in range(updates)]
                    tps = float(np.median([r["transitions_per_s"] for r in rows]))
                    # The next as many updates, their env calls kept (the copies slow them: not timed), replayed.
                    sync()
                    start, trainer.rollout.env = env.snapshot(), RecordingEnv(env)
                    recorded, scanned = [], []
                    for _ in range(updates):
                        recorded.append(trainer._one_update())
                        if cfg.act_in_jax:  # the env's actions of the rollout the update collected (a host copy)
                            scanned += list(jax.numpy.asarray(trainer.rollout.sent.cpu().numpy()))
                    sync()
                    actions, trainer.rollout.env, end = trainer.rollout.env.actions or scanned, env, env.snapshot()
                    replayed = replayed_rate(env, cfg, start, actions)
                    again = env.snapshot()
                    result["variants"][variant] = {
                        "compile_s": sum(r["seconds"] for r in warm[:2]), "warmup_updates": len(warm),
                        "median_transitions_per_s": tps, "ratio_to_env_with_wrappers": tps / baseline,
                        "env_replayed_transitions_per_s": replayed, "ratio_to_env_replayed": tps / replayed,
                        "recorded_transitions_per_s": float(np.median([r["transitions_per_s"] for r in recorded])),
                        # Whether the replay ended in the state the trainer's calls did, bit for bit.
                        "replay_ends_equal": all(np.array_equal(end[k], again[k]) for k in end),
                        "phases": phases(trainer, baseline),
                        "last_losses": {k: rows[-1][k] for k in ("policy_loss", "value_loss", "approx_kl")},
                        "mean_speed_mps": float(np.mean([r["mean_speed_mps"] for r in rows + recorded]))}
                    ratio = result["variants"][variant]["ratio_to_env_replayed"]
                    log(f"{config.worlds} worlds, {variant}: {tps:,.0f} transitions/s, {tps / baseline:.3f} of the "
                        f"env with its wrappers ({baseline:,.0f}/s), {ratio:.3f} of the env replaying its calls "
                        f"({replayed:,.0f}/s)")
                else:
                    result["variants"][variant]["profile"] = profiled(trainer)
                    kept = None if trace is None else trace.with_name(
                        f"{trace.stem}_{config.worlds}_{variant.replace('/', '_')}.json")
                    result["variants"][variant]["profile"]["update"] = timeline(trainer, kept)
                del trainer
            gc.collect()
            if torch.cuda.is_available():
                torch.cuda.empty_cache()
    best = max(result["variants"], key=lambda v: result["variants"][v]["median_transitions_per_s"])
    result["best"] = best
    result["best_ratio"] = result["variants"][best]["ratio_to_env_replayed"]
    return result


def time_to_skill(config: PPOConfig, budget_s: float, pursuit: dict[int, dict[str, Any]],
                  validate_from: float) -> dict[str, Any]:
    """One training run until its policy passes the skill check (or
    ``budget_s`` of training): its curve and the check (module docstring).

    The training clock runs through the updates alone (compiles
    included): it stops, with the device idle, before a validation or a
    check and starts again after it (a validation measures the policy; it
    changes nothing of the training). Validations are due every
    ``config.validate_every`` updates once an update's training episodes
    have lapped at ``validate_from`` or more (a policy whose own episodes
    lap less does not validate at 99 %); their wall time is reported
    apart."""
    t0 = time.perf_counter()
    env, validation = make_env(config), make_validation_env(config)
    setup_s = time.perf_counter() - t0
    curve, checks, trained, validating, started, training, took = [], [], 0.0, 0.0, None, [], []
    every = config.validate_every
    with tempfile.TemporaryDirectory() as out:
        trainer = Trainer(dataclasses.replace(config, validate_every=0), env, Path(out), progress=lambda row: None,
                          validation=validation)
        trainer.compile_validation()
        reached = None
        while trained < budget_s and trainer.update < config.updates and reached is None:
            start = time.perf_counter()
            row = trainer._one_update()
            took.append(row["seconds"])
            if started is None and (validate_from <= 0 or row["success_rate"] >= validate_from):
                started = trainer.update
            due = started is not None and trainer.update % every == 0
            if due:
                sync()  # what the update launched is part of its time
            trained += time.perf_counter() - start
            if trainer.update % every == 0:
                training.append({"update": trainer.update, "training_s": trained,
                                 **{k: row[k] for k in ("success_rate", "off_track_rate", "mean_speed_mps",
                                                        "crash_weight", "approx_kl", "learning_rate")}})
            if not due:
                continue
            start = time.perf_counter()
            rate = trainer.validate_and_keep()["validation_success_rate"]
            curve.append({"update": trainer.update, "training_s": trained, "validation_success_rate": rate,
                          "training_success_rate": row["success_rate"]})
            if rate >= GATE_SKILL_SUCCESS:
                n = config.validation_tracks
                episodes = [e for rows in (range(n), range(n, 2 * n)) for e in
                            validate(trainer.policy, validation, config, trainer.crossing, list(rows), False)]
                check = {"update": trainer.update, "training_s": trained, **against_pursuit(episodes, pursuit)}
                check.pop("failures", None)
                checks.append(check)
                log(f"  update {trainer.update} at {trained:.1f} s: all {2 * n} Validation tracks "
                    f"{check['success_rate']:.3f}, ratio {check['median_per_track_ratio']}")
                if check["success_rate"] >= GATE_SKILL_SUCCESS and \
                        (check["median_per_track_ratio"] or np.inf) <= GATE_SKILL_RATIO:
                    reached = trained
            sync()
            validating += time.perf_counter() - start
        result = {"worlds": config.worlds, "seed": config.seed, "validate_every": every,
                  "validate_from_training_success": validate_from, "first_validated_update": started,
                  "policy_lag": config.policy_lag, "setup_s": setup_s, "training_s": trained,
                  "validation_and_check_s": validating, "validations": trainer.overhead["validations"],
                  "updates": trainer.update, "time_to_skill_s": reached, "curve": curve, "checks": checks,
                  "training": training,
                  # An update's own seconds after the first two (compiles), as the throughput rows time them.
                  "update_s_median": float(np.median(took[2:])) if len(took) > 2 else None}
        del trainer
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
    return result


def draw(report: dict[str, Any], path: Path) -> None:
    """Validation success against training seconds, one line a run."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.2))
    for run in report.get("skill", []):
        xs = [p["training_s"] for p in run["curve"]]
        ys = [p["validation_success_rate"] for p in run["curve"]]
        ax.plot(xs, ys, marker=".", label=f"{run['worlds']:,} worlds, seed {run['seed']}")
    ax.axhline(GATE_SKILL_SUCCESS, color="grey", lw=0.8, ls="--")
    ax.axvline(GATE_SKILL_S, color="grey", lw=0.8, ls=":")
    ax.set(xlabel="training seconds (updates only, compiles included; validations apart)",
           ylabel="Validation success (rows 0-499, early exit)", ylim=(0, 1.02),
           title=f"PPO time to skill ({report['device']})")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def gates(report: dict[str, Any]) -> list[dict[str, Any]]:
    out = [gate(f"end to end / env replaying its calls at {t['worlds']} worlds ({t['best']})",
                round(t["best_ratio"], 3), f">= {GATE_RATIO}", t["best_ratio"] >= GATE_RATIO)
           for t in report["throughput"]]
    by_worlds: dict[int, list[dict[str, Any]]] = {}
    for run in report.get("skill", []):
        by_worlds.setdefault(run["worlds"], []).append(run)
    if by_worlds:
        times = {w: [r["time_to_skill_s"] for r in runs] for w, runs in by_worlds.items()}
        best = min(times, key=lambda w: max(np.inf if t is None else t for t in times[w]))
        worst = max(np.inf if t is None else t for t in times[best])
        out.append(gate(f"time to skill, every seed, at {best} worlds (s of training)",
                        None if not np.isfinite(worst) else round(worst, 1), f"<= {GATE_SKILL_S}",
                        worst <= GATE_SKILL_S))
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--worlds", type=int, nargs="*", default=[8192, 65536])
    parser.add_argument("--paths", nargs="+", default=["eager/highest", "graph/highest", "eager/high", "graph/high"],
                        help="update_path/matmul_precision[/lagN][/compiled][/jax][/serial] variants (serial: the "
                             "next rollout launched after an update's results are read)")
    parser.add_argument("--updates", type=int, default=8, help="timed updates a variant")
    parser.add_argument("--warmup-updates", type=int, default=2,
                        help="updates a variant runs before the timed ones (>= 2: the first two compile)")
    parser.add_argument("--profile", action="store_true",
                        help="profile one optimisation, one rollout and one whole update a variant")
    parser.add_argument("--trace", type=Path, default=None,
                        help="with --profile, keep each variant's Chrome trace of one update beside this name")
    parser.add_argument("--skill-worlds", type=int, nargs="*", default=[8192, 32768, 65536])
    parser.add_argument("--skill-seeds", type=int, nargs="*", default=[0, 1])
    parser.add_argument("--skill-seconds", type=float, default=60.0, help="training seconds a skill run may take")
    parser.add_argument("--skill-path", default=None,
                        help="the skill runs' update_path/matmul_precision (default: the fastest measured here)")
    parser.add_argument("--validate-every", type=int, default=None,
                        help="updates between a skill run's validations (default round(200,000 / worlds))")
    parser.add_argument("--validate-from", type=float, default=0.5,
                        help="a skill run validates once an update's training episodes lapped at this rate (0-1)")
    parser.add_argument("--set", action="append", default=[], metavar="NAME=VALUE",
                        help="override a setting of the GPU preset (as train-ppo's --set)")
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("--publish", action="store_true", help="write benchmarks/results/ppo_speed.json (GPU only)")
    args = parser.parse_args()
    gpu = jax.default_backend() == "gpu" and torch.cuda.is_available()
    for variant in args.paths + ([args.skill_path] if args.skill_path else []):
        try:
            variant_config(PRESETS["cpu"], variant)
        except (TypeError, ValueError) as error:
            parser.error(f"argument --paths: {variant!r}: {error}")
    if any(w < 1 for w in args.worlds + args.skill_worlds) or args.updates < 1 or not 0 < args.skill_seconds < 1e6 \
            or not 2 <= args.warmup_updates < 2**31 \
            or (args.validate_every is not None and not 1 <= args.validate_every < 2**31) \
            or not 0 <= args.validate_from <= 1:
        parser.error("--worlds, --skill-worlds, --updates and --validate-every must be >= 1, --warmup-updates "
                     ">= 2, --skill-seconds in (0, 1e6), --validate-from in [0, 1]")
    config = PRESETS["gpu"]
    env_steps = 50
    if not gpu:
        config = dataclasses.replace(PRESETS["cpu"], worlds=4, steps=4, minibatches=2, tracks=4, updates=100_000,
                                     validation_tracks=2, max_episode_steps=30, stagger_steps=2, validation_steps=30)
        args.worlds, args.skill_worlds, args.skill_seeds = [4], [4], args.skill_seeds[:1]
        args.updates, args.skill_seconds, env_steps = 2, 3.0, 3
        args.validate_every = args.validate_every or 1  # the first update validates: the curve has a point
        args.validate_from = 0.0
    try:
        config = dataclasses.replace(config.override(args.set), validate_every=0)
    except (TypeError, ValueError) as error:
        parser.error(f"argument --set: {error}")
    if args.publish and not gpu:
        parser.error("--publish needs a CUDA GPU")
    folder = "benchmarks/results/" if args.publish else "benchmarks/out/"
    out = args.out or Path(folder + ("ppo_speed.json" if gpu else "ppo_speed_cpu.json"))
    check_outputs(parser, {"--out": out}, {"--out": {".json"}})
    pursuit = {e["track_id"]: e for e in json.loads(PURSUIT_VALIDATION.read_text())["episodes"]}
    report: dict[str, Any] = {"protocol": "PPO speed", "environment": environment(),
                              "device": torch.cuda.get_device_name() if gpu else "cpu",
                              "source_sha256": source_hashes(__file__), "config": config.to_json(),
                              "paths": args.paths, "timed_updates": args.updates,
                              "warmup_updates": args.warmup_updates, "throughput": [], "skill": []}

    def write() -> None:
        report["gates"] = gates(report) if gpu else []
        # Formal only with both kinds of gate: every throughput and the time to skill.
        complete = len(report["gates"]) == len(report["throughput"]) + 1 and bool(report["throughput"])
        report["passed"] = gpu and complete and all(g["passed"] for g in report["gates"])
        out.write_text(json.dumps(_finite(report), indent=2, allow_nan=False) + "\n")

    for worlds in args.worlds:
        cfg = dataclasses.replace(config, worlds=worlds)
        log(f"throughput at {worlds} worlds")
        try:
            env = make_env(cfg)
        except ValueError as error:  # e.g. more worlds than this machine's memory holds: refused before any run
            parser.error(f"the envs cannot be built: {error}")
        report["throughput"].append(throughput(env, cfg, args.paths, args.updates, args.profile, env_steps,
                                               args.trace, args.warmup_updates))
        del env
        gc.collect()
        write()
    best = args.skill_path or (report["throughput"][0]["best"] if report["throughput"] else "eager/highest")
    for worlds in args.skill_worlds:
        for seed in args.skill_seeds:
            every = args.validate_every or max(1, round(200_000 / worlds))
            cfg = dataclasses.replace(variant_config(config, best), worlds=worlds, seed=seed, validate_every=every)
            log(f"time to skill at {worlds} worlds, seed {seed} ({best}, validating every {every} updates)")
            report["skill"].append(time_to_skill(cfg, args.skill_seconds, pursuit, args.validate_from))
            log(f"  time to skill: {report['skill'][-1]['time_to_skill_s']}")
            draw(report, out.with_suffix(".png"))
            write()
    write()
    for g in report["gates"]:
        log(f"  {'PASS' if g['passed'] else 'FAIL'} {g['name']}: {g['value']} (gate {g['threshold']})")


if __name__ == "__main__":
    main()
