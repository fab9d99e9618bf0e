"""Replay an exported PPO plugin's policy on Validation tracks with two
rules for its deterministic action, through the trainer's validation (the
episodes the Runner drives, under Level 1's full timeout), and report each
rule's outcomes beside pure pursuit's committed laps.

    python benchmarks/racing_stack/ppo_replay.py PLUGIN_DIR [--tracks 1000] [--seed 1]
        [--rules mean clipped] [--action-noise 0.01 --noise-seed 1] [--out FILE]

Rules: ``mean`` is `ActorCritic.mean_action`, the mean of the clipped
draws (E[clip(u, -1, 1)]: what the env got on average in training; a
residual's draws clipped also where the sum with the prior's action
passes a bound); ``clipped`` is the policy's mean clipped to the bounds
(the rule before it); ``inner`` the mean of the draws clipped to
[-1, 1] alone, mapped to the env's action as a draw is (for a residual,
the prior added and the sum clipped to the bounds: its rule before
``mean`` took both clips; for a policy that acts alone, ``mean``).
``--action-noise S`` (with ``--noise-seed``) drives each rule under the
benchmark's edge-check noise instead (S of each action's half range).
``--seed`` is the reset seed of the run that trained the plugin (a
``--dev`` report's ``config.seed``), so that the episodes are the ones its
validation drove. Runs on whatever JAX and Torch device there is (the CPU
drives 1,000 tracks in minutes). The report (default
``benchmarks/out/ppo_replay.json``) holds, per rule, the success rate, the
off-track and timeout counts, the median lap and its per-track ratio to
pure pursuit's, every failure (track, reason, progress, steps) and a
histogram of the off-track failures' progress around the lap.
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import json
import sys
import time
import tomllib
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "racing_env"))

import numpy as np  # noqa: E402
import torch  # noqa: E402
from ppo_level1 import PURSUIT_VALIDATION, against_pursuit  # noqa: E402
from protocol import environment, logger, source_hashes  # noqa: E402

from racing_stack.interop import Handover  # noqa: E402
from racing_stack.ppo import PPOConfig, make_validation_env  # noqa: E402
from racing_stack.ppo.export import load_policy  # noqa: E402
from racing_stack.ppo.networks import ActorCritic, clipped_mean  # noqa: E402
from racing_stack.ppo.validation import check_noise, validate  # noqa: E402

RULES = ("mean", "clipped", "inner")
log = logger("ppo_replay")


class Driver:
    """A policy with another rule for its deterministic action; everything
    else (the bounds, for action noise) is the policy's."""

    def __init__(self, policy: ActorCritic) -> None:
        self.policy = policy

    def __getattr__(self, name: str) -> Any:
        return getattr(self.policy, name)


class ClippedMean(Driver):
    """A policy whose deterministic action is its mean clipped to the bounds."""

    def mean_action(self, x: torch.Tensor) -> torch.Tensor:
        return self.policy.env_action(self.policy.distribution(x).mean, x)


class InnerMean(Driver):
    """A policy whose deterministic action is the mean of its draws clipped
    to [-1, 1], mapped to the env's action as one draw is."""

    def mean_action(self, x: torch.Tensor) -> torch.Tensor:
        mean = self.policy.distribution(x).mean
        return self.policy.env_action(clipped_mean(mean, self.policy.log_std.exp()), x)


DRIVERS = {"mean": lambda policy: policy, "clipped": ClippedMean, "inner": InnerMean}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("plugin", type=Path)
    parser.add_argument("--tracks", type=int, default=1000, help="Validation rows 0 to N-1")
    parser.add_argument("--seed", type=int, default=1, help="the training run's reset seed")
    parser.add_argument("--rules", nargs="+", choices=RULES, default=["mean", "clipped"])
    parser.add_argument("--action-noise", type=float, default=0.0,
                        help="Gaussian noise on every action, a fraction of its half range (the benchmark's edge "
                             "check: 0.01)")
    parser.add_argument("--noise-seed", type=int, default=1)
    parser.add_argument("--out", type=Path, default=Path("benchmarks/out/ppo_replay.json"))
    args = parser.parse_args()
    try:
        check_noise(args.action_noise, args.noise_seed)
    except ValueError as error:
        parser.error(f"--action-noise, --noise-seed: {error}")
    device = torch.device("cuda", 0) if torch.cuda.is_available() else torch.device("cpu")
    probe = PPOConfig(validation_tracks=args.tracks, seed=args.seed)
    env = make_validation_env(probe, args.tracks)
    space = env.single_action_space
    settings = tomllib.loads((args.plugin / "config.toml").read_text())
    policy, features = load_policy(settings, args.plugin / "weights.pt", space.low, space.high, device)
    config = dataclasses.replace(probe, features=features)
    pursuit = {e["track_id"]: e for e in json.loads(PURSUIT_VALIDATION.read_text())["episodes"]}
    report: dict[str, Any] = {
        "protocol": "PPO plugin replay", "environment": environment(), "source_sha256": source_hashes(__file__),
        "plugin": str(args.plugin),
        "weights_sha256": hashlib.sha256((args.plugin / "weights.pt").read_bytes()).hexdigest(),
        "log_std": policy.log_std.detach().cpu().tolist(), "tracks": args.tracks, "seed": args.seed,
        "action_noise": args.action_noise, "noise_seed": args.noise_seed, "rules": {}}
    crossing = Handover(device)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    for rule in args.rules:
        driver = DRIVERS[rule](policy)
        t0 = time.perf_counter()
        episodes = validate(driver, env, config, crossing, list(range(args.tracks)), early_exit=False,
                            action_noise=args.action_noise, noise_seed=args.noise_seed)
        result = {**against_pursuit(episodes, pursuit), "seconds": time.perf_counter() - t0}
        off = [f["progress"] for f in result["failures"] if f["reason"] == "off_track"]
        result["off_track_progress_histogram"] = np.histogram(off, bins=10, range=(0.0, 1.0))[0].tolist()
        report["rules"][rule] = result
        log(f"{rule}: {result['success_rate']:.3f} success, {result['off_track']} off track, "
            f"{result['timeout']} timeouts, median lap {result['median_lap_s']}")
        args.out.write_text(json.dumps(report, indent=2) + "\n")


if __name__ == "__main__":
    main()
