"""Weak scaling of PPO across the GPUs of one host: the end-to-end training
rate with ``--worlds`` worlds on each GPU (8,192 and 65,536) on 1, 2, 4 and 8
GPUs (those the machine has), each run under ``torchrun`` (`train-ppo`'s
trainer, one process per GPU), with the gradients' all-reduce timed apart;
and the learning curve of a 2-GPU run beside 1-GPU runs of the same total
worlds.

    python benchmarks/racing_stack/ppo_scaling.py [--out FILE] [--publish] [--updates 40]
        [--worlds 8192 65536] [--curve-updates 150]

Each run: the GPU preset without validation, ``--updates`` updates; its
rate is the median transitions/s (every process's worlds) of the updates
after the first 5 (compiles). In the same processes, after training, an
all-reduce of a buffer the size of the gradients is timed (median of 50,
the device synchronised); an update does ``epochs x minibatches`` of them,
so their share of an update is estimated from that.

The curve: mean reward per update (smoothed over 10 updates) of a 2-GPU
run of 8,192 worlds each against a 1-GPU run of 16,384 (seed 0), for
``--curve-updates``; the run-to-run spread is the same 1-GPU run with seed
1.

Gates (H200s): efficiency = rate on N GPUs / (N x rate on 1) >= 0.90 at 2
and 4 GPUs and >= 0.85 at 8, for each worlds per GPU; the 2-GPU curve's
largest gap to the seed-0 curve at most 1.5 x the largest gap between the
two seeds'. A row that needs more GPUs than the machine has is listed
under ``not_run``. Without CUDA it runs a smoke: 1 and 2 gloo processes of
2 worlds, 3 updates (no gate), into ``benchmarks/out/ppo_scaling_cpu.json``;
on GPUs ``benchmarks/out/ppo_scaling.json``, or with ``--publish`` the
committed ``benchmarks/results/ppo_scaling.json``.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "racing_env"))
os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")  # this process's JAX must leave the GPUs to the runs

import numpy as np  # noqa: E402
from protocol import environment, gate, logger, source_hashes  # noqa: E402

GPUS = (1, 2, 4, 8)
EFFICIENCY = {2: 0.90, 4: 0.90, 8: 0.85}
CURVE_SPREAD = 1.5
SKIP = 5
log = logger("ppo_scaling")


def worker(args: argparse.Namespace) -> None:
    """One process of a run (under torchrun): train, time the all-reduce,
    and (the lead) write the run's row to ``args.row``."""
    import torch

    from racing_stack.ppo import PRESETS, Trainer, make_env
    from racing_stack.ppo.distributed import start, stop

    group, worlds = start(), args.worlds[0]
    try:
        cuda = torch.cuda.is_available()
        if cuda:
            # float32 matmuls, as the committed scaling report's runs (several processes train eagerly anyway).
            config = dataclasses.replace(PRESETS["gpu"], worlds=worlds, updates=args.updates, validate_every=0,
                                         checkpoint_every=args.updates, seed=args.seed, update_path="eager",
                                         matmul_precision="highest")
        else:
            config = dataclasses.replace(PRESETS["cpu"], worlds=worlds, updates=args.updates, steps=8,
                                         minibatches=2, tracks=4, max_episode_steps=24, stagger_steps=12,
                                         validate_every=0, checkpoint_every=args.updates, seed=args.seed)
        with tempfile.TemporaryDirectory() as out:
            trainer = Trainer(config, make_env(config, group), Path(out), progress=lambda row: None, group=group)
            rows = trainer.run()
        size = sum(p.numel() for p in trainer.policy.parameters())
        buffer = torch.zeros(size, device=trainer.device)
        times = []
        for _ in range(50 if cuda else 5):
            if cuda:
                torch.cuda.synchronize()
            t0 = time.perf_counter()
            group.sum(buffer)
            if cuda:
                torch.cuda.synchronize()
            times.append(time.perf_counter() - t0)
        if group.lead:
            steady = [r["transitions_per_s"] for r in rows[SKIP:]] or [r["transitions_per_s"] for r in rows]
            update_s = float(np.median([r["seconds"] for r in rows[SKIP:]] or [r["seconds"] for r in rows]))
            allreduce_s = float(np.median(times))
            Path(args.row).write_text(json.dumps({
                "gpus": group.size, "worlds_per_gpu": config.worlds, "seed": config.seed, "updates": len(rows),
                "transitions_per_s": float(np.median(steady)), "update_s": update_s,
                "gradient_values": size, "allreduce_s": allreduce_s,
                "allreduce_share_estimated": config.epochs * config.minibatches * allreduce_s / update_s
                if group.size > 1 else 0.0,
                "mean_reward": [r["mean_reward"] for r in rows]}))
    finally:
        stop()


def launch(gpus: int, worlds: int, updates: int, seed: int) -> dict[str, Any]:
    """One run of ``gpus`` processes; its row (or its error)."""
    with tempfile.TemporaryDirectory() as tmp:
        row = Path(tmp) / "row.json"
        command = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={gpus}",
                   __file__, "--worker", "--worlds", str(worlds), "--updates", str(updates), "--seed", str(seed),
                   "--row", str(row)]
        log(f"{gpus} process(es) x {worlds} worlds, {updates} updates, seed {seed}")
        t0 = time.perf_counter()
        done = subprocess.run(command, capture_output=True, text=True, env={**os.environ, "OMP_NUM_THREADS": "1"})
        if done.returncode != 0 or not row.exists():
            return {"gpus": gpus, "worlds_per_gpu": worlds, "seed": seed,
                    "error": (done.stdout + done.stderr)[-3000:]}
        return {**json.loads(row.read_text()), "wall_s": time.perf_counter() - t0}


def smoothed(values: list[float], width: int = 10) -> np.ndarray:
    x = np.asarray(values, float)
    return np.convolve(x, np.ones(width) / width, mode="valid") if x.size >= width else x


def gates(report: dict[str, Any]) -> list[dict[str, Any]]:
    """Efficiency per measured row, and the curve's once its runs exist."""
    out = []
    rows = [r for r in report["runs"] if "error" not in r]
    for r in rows:
        one = next((o for o in rows if o["gpus"] == 1 and o["worlds_per_gpu"] == r["worlds_per_gpu"]), None)
        if r["gpus"] > 1 and one is not None:
            value = r["transitions_per_s"] / (r["gpus"] * one["transitions_per_s"])
            out.append(gate(f"efficiency_{r['gpus']}_gpus_{r['worlds_per_gpu']}_worlds", value,
                            EFFICIENCY[r["gpus"]], value >= EFFICIENCY[r["gpus"]]))
    curve = report.get("curve", {})
    if {"two_gpus", "one_gpu_seed0", "one_gpu_seed1"} <= set(curve) and \
            not any("error" in curve[k] for k in curve):
        two, base, other = (smoothed(curve[k]["mean_reward"]) for k in ("two_gpus", "one_gpu_seed0",
                                                                           "one_gpu_seed1"))
        spread = float(np.max(np.abs(other - base)))
        gap = float(np.max(np.abs(two - base)))
        out.append({**gate("curve_gap_2_gpus_over_seed_spread", gap / max(spread, 1e-9), CURVE_SPREAD,
                           gap <= CURVE_SPREAD * spread), "gap": gap, "spread": spread})
    return out


def gpu_count() -> int:
    """GPUs on the host, without initialising CUDA in this process."""
    try:
        listed = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return 0
    return sum(line.startswith("GPU ") for line in listed.stdout.splitlines()) if listed.returncode == 0 else 0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("--publish", action="store_true", help="write benchmarks/results/ppo_scaling.json (GPU only)")
    parser.add_argument("--updates", type=int, default=40)
    parser.add_argument("--curve-updates", type=int, default=150)
    parser.add_argument("--worlds", type=int, nargs="+", default=[8192, 65536])
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--seed", type=int, default=0, help=argparse.SUPPRESS)
    parser.add_argument("--row", type=Path, default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        return worker(args)
    gpus = gpu_count()
    folder = "benchmarks/results/" if gpus and args.publish else "benchmarks/out/"
    out = args.out or Path(folder + ("ppo_scaling.json" if gpus else "ppo_scaling_cpu.json"))
    out.parent.mkdir(parents=True, exist_ok=True)
    report: dict[str, Any] = {"protocol": "PPO weak scaling", "environment": environment(),
                              "source_sha256": source_hashes(__file__), "gpus_on_host": gpus, "runs": [],
                              "not_run": [], "curve": {}}

    def write() -> None:
        report["gates"] = gates(report) if gpus else []
        report["passed"] = bool(gpus) and bool(report["gates"]) and all(g["passed"] for g in report["gates"])
        out.write_text(json.dumps(report, indent=2) + "\n")

    if not gpus:  # the smoke: gloo processes on the CPU
        for n in (1, 2):
            report["runs"].append(launch(n, 2, 3, 0))
            write()
        failed = [r["error"] for r in report["runs"] if "error" in r]
        if failed:
            sys.exit(f"a smoke run failed:\n{failed[0]}")
        return
    for worlds in args.worlds:
        for n in GPUS:
            if n > gpus:
                report["not_run"].append({"gpus": n, "worlds_per_gpu": worlds,
                                          "why": f"the host has {gpus} GPU(s)"})
                continue
            report["runs"].append(launch(n, worlds, args.updates, 0))
            write()
    if gpus >= 2:
        report["curve"] = {"two_gpus": launch(2, 8192, args.curve_updates, 0),
                           "one_gpu_seed0": launch(1, 16384, args.curve_updates, 0),
                           "one_gpu_seed1": launch(1, 16384, args.curve_updates, 1)}
    else:
        report["not_run"].append({"curve": "2 GPUs against 1", "why": f"the host has {gpus} GPU(s)"})
    write()
    for g in report["gates"]:
        log(f"  {'PASS' if g['passed'] else 'FAIL'} {g['name']}: {g['value']} (gate {g['threshold']})")


if __name__ == "__main__":
    main()
