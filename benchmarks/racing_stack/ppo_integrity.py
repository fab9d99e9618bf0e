"""PPO's zero-copy data path checked slot by slot against a host-copy
reference, from a cold start and under injected delays, and what the
checks and the guard cost.

    python benchmarks/racing_stack/ppo_integrity.py [--path fixed|unheld] [--runs 10] [--updates 20]
        [--worlds 8192] [--tracks 1024] [--throughput-updates 10] [--before FILE] [--out FILE] [--publish]

Every update of a checked run collects its rollout as training does and
compares each of its crossings bit for bit with what the producer wrote
(`racing_stack.integrity.tapped`: a copy on the producer's stream, a copy
at the consumer's read); then it trains on the rollout as usual (GAE,
optimisation, the guard). The GPU preset's shapes (``--worlds``
worlds, 32 steps), validation off, the first ``--tracks`` Train tracks.

1. Cold: the process starts with empty Warp, Triton, JAX, CUDA and
   track-pool caches (fresh temporary folders), and its first run of
   ``--updates`` updates is checked with no delay: the condition in which
   the data path without held crossings corrupted updates 2-3.
2. Stress: ``--runs`` runs (fresh trainers, seeds 1..N) of ``--updates``
   checked updates with a delay injected on both sides of every crossing:
   Torch's stream sleeps after each view is made (its reads come late, so
   a buffer given back too early is rewritten first), and JAX's stream
   runs a matrix product chain before each step (it writes late, so a read
   not ordered after the write comes first). With ``--path unheld`` the
   two delays also run apart, two runs each, to say which hazard shows.
3. Throughput: the steady update rate of the fixed, guarded path against
   the fixed unguarded one and the unheld, unguarded one (the data path
   before the fix), in ``--throughput-blocks`` alternating rounds of
   ``--throughput-updates`` updates each.
4. Determinism: one rollout from one state through the zero-copy path and
   through the host, and through the host twice: where the GPU env itself
   differs from run to run (why the reference is taken per crossing).

``--path unheld`` runs phases 1-2 on the data path before the fix (each
crossing's buffers left to Python's reference counts, as `to_torch` and
`to_jax` alone do): the reproduction. ``--before FILE`` folds such a
report into this one.

Gates (one H200, ``--path fixed``): 0 corrupt runs of N >= 10 stressed
runs plus the cold one; 0 crossings that delivered other bytes; the guard
never stops a run; throughput >= 0.95 of the same run's rate on the data
path before the fix. Without CUDA it runs a tiny smoke (no gate) into
``benchmarks/out/ppo_integrity_cpu.json``; on a GPU
``benchmarks/out/ppo_integrity.json``, or with ``--publish`` the committed
``benchmarks/results/ppo_integrity.json``.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def cold_caches() -> dict[str, str]:
    """Point every compile and pool cache at a fresh temporary folder (before
    JAX, Warp or Triton is imported); returns the variables set."""
    base = Path(tempfile.mkdtemp(prefix="ppo_integrity_cold_"))
    names = {"WARP_CACHE_PATH": "warp", "TRITON_CACHE_DIR": "triton", "JAX_COMPILATION_CACHE_DIR": "jax",
             "CUDA_CACHE_PATH": "cuda", "RACING_STACK_CACHE": "pools"}
    for name, folder in names.items():
        os.environ[name] = str(base / folder)
    return {name: os.environ[name] for name in names}


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--path", choices=("fixed", "unheld"), default="fixed")
    parser.add_argument("--runs", type=int, default=10, help="stressed runs (0: none)")
    parser.add_argument("--updates", type=int, default=20, help="checked updates per run")
    parser.add_argument("--worlds", type=int, default=8192)
    parser.add_argument("--tracks", type=int, default=1024)
    parser.add_argument("--throughput-updates", type=int, default=10, help="updates per timed block (0: none)")
    parser.add_argument("--throughput-blocks", type=int, default=4, help="alternating timed rounds")
    parser.add_argument("--sleep-us", type=float, default=200.0, help="Torch's sleep after each view (us)")
    parser.add_argument("--busy-ms", type=float, default=1.0, help="JAX's busy time before each step (ms)")
    parser.add_argument("--before", type=Path, default=None, help="an --path unheld report to fold in")
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("--publish", action="store_true", help="write benchmarks/results/ppo_integrity.json")
    args = parser.parse_args(argv)
    for name in ("runs", "updates", "worlds", "tracks", "throughput_updates"):
        if getattr(args, name) < (1 if name in ("updates", "worlds", "tracks") else 0):
            parser.error(f"--{name.replace('_', '-')} is too small: {getattr(args, name)}")
    return args


ARGS = parse() if __name__ == "__main__" else None
CACHES = cold_caches() if __name__ == "__main__" else {}

sys.path.insert(0, str(ROOT / "benchmarks" / "racing_env"))

import dataclasses  # noqa: E402
import json  # noqa: E402
import statistics  # noqa: E402
import time  # noqa: E402
from typing import Any  # noqa: E402

import jax  # noqa: E402
import torch  # noqa: E402
from protocol import environment, gate, logger, source_hashes  # noqa: E402

from racing_stack.integrity import check_rollout, jax_busy, stressed, tapped, torch_sleep_cycles_per_us  # noqa: E402
from racing_stack.interop import Handover, HostCopy, to_jax, to_torch  # noqa: E402
from racing_stack.ppo import PRESETS, GuardError, Trainer, make_env  # noqa: E402

log = logger("ppo-integrity")
COMMITTED_TPS = 1_399_209  # benchmarks/results/ppo_v0.1/ppo_level1.json at 8,192 worlds


class Unheld(Handover):
    """The data path before the fix: each crossing's buffers live as long
    as Python's references to them, so a view made and dropped in one
    statement gives its buffer back while its reader is still queued."""

    def to_torch(self, array: jax.Array) -> torch.Tensor:
        return to_torch(array)

    def to_jax(self, tensor: torch.Tensor) -> jax.Array:
        return to_jax(tensor)


def checked_run(env, config, crossing: type[Handover], updates: int, seed: int, tmp: Path) -> dict[str, Any]:
    """A fresh trainer's first ``updates`` updates, each rollout's crossings
    compared bit for bit with what was written (`tapped`), each update
    guarded as in training."""
    trainer = Trainer(dataclasses.replace(config, seed=seed), env, tmp / f"run{seed}_{crossing.__name__}")
    trainer.crossing = tapped(crossing)(trainer.device)
    per_update, stopped = [], None
    for _ in range(updates):
        trainer.collect()
        found = trainer.crossing.compare()
        advantage, returns = trainer.advantages()
        losses = trainer.optimise(advantage, returns)
        per_update.append({"update": trainer.update + 1, **found, "mean_reward": trainer.episodes()["mean_reward"],
                           "value_loss": losses["value_loss"]})
        if found["mismatched_crossings"]:
            log(f"  update {trainer.update + 1}: {found['mismatched_crossings']} of {found['crossings']} crossings "
                f"delivered other bytes ({found['mismatched_bytes']} bytes)")
        try:
            trainer.guard(advantage, returns, losses)
        except GuardError as error:
            stopped = str(error)
            log(f"  guard: {error}")
            break
        trainer.update += 1
    wrong = sum(u["mismatched_bytes"] for u in per_update)
    corrupt = [u["update"] for u in per_update if u["mismatched_crossings"]]
    log(f"run seed {seed} ({crossing.__name__}): {wrong} bytes delivered wrong, corrupt updates {corrupt}, "
        f"guard {'stopped it' if stopped else 'passed'}")
    return {"seed": seed, "crossing": crossing.__name__, "updates": updates, "mismatched_bytes": wrong,
            "mismatched_crossings": sum(u["mismatched_crossings"] for u in per_update),
            "crossings": sum(u["crossings"] for u in per_update), "corrupt_updates": corrupt,
            "guard_stopped": stopped, "per_update": per_update}


def determinism(env, config, tmp: Path) -> dict[str, Any]:
    """One rollout from one state twice: through the zero-copy crossings
    and the host, then through the host twice; where they differ and by
    how much (the env's own run-to-run noise on this device)."""
    trainer = Trainer(config, env, tmp / "determinism")
    probe = {}
    for name, crossing in (("zero_copy_vs_host", Handover), ("host_vs_host", HostCopy)):
        trainer.crossing = crossing(trainer.device)
        found = check_rollout(trainer)
        probe[name] = {"mismatched_slots": found["slots"], "fields": found["fields"]}
        log(f"determinism, {name}: {found['slots']} of {config.steps * config.worlds} slots differ, largest "
            f"difference {max(f['max_abs_diff'] for f in found['fields'].values()):.3g}")
    return probe


def throughput(env, config, blocks: int, updates: int, tmp: Path) -> dict[str, Any]:
    """Steady update rates (transitions/s, the median of each variant's
    updates, a block's first update left out) of three trainers on one env,
    in ``blocks`` rounds of ``updates`` updates each: the fixed path with
    its guard (what training runs), the fixed path unguarded, and the
    unheld unguarded path (the data path before the fix)."""
    variants = {"fixed_guarded": Trainer(config, env, tmp / "tps_fixed_guarded"),
                "fixed_unguarded": Trainer(config, env, tmp / "tps_fixed_unguarded"),
                "unheld_unguarded": Trainer(config, env, tmp / "tps_unheld_unguarded")}
    variants["fixed_unguarded"].guard = lambda *args: None
    variants["unheld_unguarded"].guard = lambda *args: None
    variants["unheld_unguarded"].crossing = Unheld(variants["unheld_unguarded"].device)
    rates: dict[str, list[float]] = {name: [] for name in variants}
    fresh = variants["fixed_guarded"].rollout.state()  # a block starts anew: no pending reset, the same holds
    for block in range(blocks):
        for name, trainer in variants.items():
            trainer.rollout.restore(fresh, trainer.env.reset(seed=block)[0])  # the trainers share the env
            trainer.ahead = False  # a rollout its last block collected ahead is another env's: collected anew
            timed = [trainer._one_update()["transitions_per_s"] for _ in range(updates)]
            rates[name] += timed[1:]
    steady = {name: statistics.median(v) for name, v in rates.items()}
    return {"blocks": blocks, "updates_per_block": updates, "transitions_per_s": rates,
            "median_transitions_per_s": steady, "ratio": steady["fixed_guarded"] / steady["unheld_unguarded"],
            "guard_ratio": steady["fixed_guarded"] / steady["fixed_unguarded"],
            "holding_ratio": steady["fixed_unguarded"] / steady["unheld_unguarded"]}


def main(args: argparse.Namespace) -> None:
    cuda = torch.cuda.is_available() and jax.default_backend() == "gpu"
    if cuda:
        config = dataclasses.replace(PRESETS["gpu"], worlds=args.worlds, tracks=args.tracks, validate_every=0,
                                     updates=max(args.updates, args.throughput_blocks * args.throughput_updates + 1))
        out = args.out or ROOT / "benchmarks" / ("results" if args.publish else "out") / "ppo_integrity.json"
    else:  # a smoke of the code path, no gate
        config = dataclasses.replace(PRESETS["cpu"], worlds=4, steps=8, tracks=4, max_episode_steps=24,
                                     validate_every=0, minibatches=2, updates=50)
        args.runs, args.updates = min(args.runs, 1), min(args.updates, 2)
        args.throughput_updates, args.throughput_blocks = 2, 2
        out = args.out or ROOT / "benchmarks" / "out" / "ppo_integrity_cpu.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    report: dict[str, Any] = {"benchmark": "ppo_integrity", "path": args.path, "environment": environment(),
                              "sources": source_hashes(__file__), "cold_caches": CACHES,
                              "config": config.to_json(), "args": {k: str(v) for k, v in vars(args).items()}}

    def write() -> None:
        out.write_text(json.dumps(report, indent=1, default=str) + "\n")

    tmp = Path(tempfile.mkdtemp(prefix="ppo_integrity_runs_"))
    base = Handover if args.path == "fixed" else Unheld
    began = time.perf_counter()
    env = make_env(config)
    report["setup_s"] = time.perf_counter() - began
    log(f"env of {config.worlds} worlds on {config.tracks} Train tracks in {report['setup_s']:.0f} s (cold caches)")
    report["cold"] = checked_run(env, config, base, args.updates, 0, tmp)
    write()
    runs = []
    if args.runs:
        sleep = int(args.sleep_us * torch_sleep_cycles_per_us()) if cuda else 0
        busy, busy_ms = jax_busy(args.busy_ms) if cuda else (None, 0.0)
        report["stress"] = {"torch_sleep_cycles": sleep, "torch_sleep_us": args.sleep_us, "jax_busy_ms": busy_ms}
        kinds = [("both", sleep, busy)] * args.runs
        if args.path == "unheld":
            kinds += [("torch_sleep_only", sleep, None)] * 2 + [("jax_busy_only", 0, busy)] * 2
        for seed, (kind, cycles, work) in enumerate(kinds, start=1):
            run = checked_run(env, config, stressed(base, cycles, work), args.updates, seed, tmp)
            runs.append({"delays": kind, **run})
            report["stress"]["runs"] = runs
            write()
    if args.throughput_updates and args.path == "fixed":
        report["throughput"] = throughput(env, config, args.throughput_blocks, args.throughput_updates, tmp)
        report["throughput"]["committed_ppo_level1_transitions_per_s"] = COMMITTED_TPS
        log(f"throughput: {report['throughput']['median_transitions_per_s']}")
    if args.before is not None:
        report["before_fix"] = json.loads(args.before.read_text())
    if args.path == "fixed":
        report["determinism"] = determinism(env, config, tmp)
        write()
    checked = [report["cold"], *(r for r in runs if r["delays"] == "both")]
    report["summary"] = {"checked_runs": len(checked), "corrupt_runs": sum(bool(r["corrupt_updates"]) for r in checked),
                         "mismatched_crossings": sum(r["mismatched_crossings"] for r in checked),
                         "mismatched_bytes": sum(r["mismatched_bytes"] for r in checked),
                         "guard_stops": sum(r["guard_stopped"] is not None for r in checked),
                         "by_delays": {kind: sum(bool(r["corrupt_updates"]) for r in runs if r["delays"] == kind)
                                       for kind in {r["delays"] for r in runs}}}
    if cuda and args.path == "fixed":
        s = report["summary"]
        report["gates"] = [
            gate("checked runs (cold + stressed)", s["checked_runs"], ">= 11", s["checked_runs"] >= 11),
            gate("corrupt runs", s["corrupt_runs"], "== 0", s["corrupt_runs"] == 0),
            gate("crossings that delivered other bytes", s["mismatched_crossings"], "== 0",
                 s["mismatched_crossings"] == 0),
            gate("guard stops", s["guard_stops"], "== 0", s["guard_stops"] == 0),
        ]
        if "throughput" in report:
            ratio = report["throughput"]["ratio"]
            report["gates"].append(gate("steady rate: fixed and guarded / unheld and unguarded (before the fix)",
                                        ratio, ">= 0.95", ratio >= 0.95))
    report["wall_s"] = time.perf_counter() - began
    write()
    log(f"report: {out}  summary {report['summary']}")


if __name__ == "__main__":
    main(ARGS)
