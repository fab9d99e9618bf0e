"""Pure pursuit at other gains on Validation: how fast the classical
controller alone laps when it is tuned, the baseline a residual policy
starts from and the learned controller is measured against.

    python benchmarks/racing_stack/prior_gains.py [--tracks 1000] [--gains NAME=VALUE,...]...
        [--out benchmarks/out/prior_gains.json] [--publish]

Each ``--gains`` (a comma-separated list of `racing_stack.prior.PursuitPrior`
fields; empty: the reference's own gains) drives every one of the first
``--tracks`` Validation tracks once through the trainer's validation
(the episodes the Runner drives, under Level 1's full timeout), as a
residual policy whose correction is zeroed, so that its action is the
prior's (`PursuitPrior`, batched in JAX) exactly. The default runs the
reference's gains and two faster tunings.

Gate: the reference's gains reproduce pure pursuit's committed laps
(``benchmarks/v0.1/pursuit_level1_validation.json``, driven by the
``pursuit`` plugin through the Runner) on every track: the same outcome,
and a lap within one control step (0.02 s, float32 against float64
deciding the step of a crossing). Runs on whatever JAX device
there is (the CPU drives 1,000 tracks in about 7 minutes per gains);
``--publish`` writes the committed ``benchmarks/results/prior_gains.json``.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "racing_env"))

import torch  # noqa: E402
from ppo_level1 import PURSUIT_VALIDATION, TUNED_PURSUIT, against_pursuit, drive_prior  # noqa: E402
from protocol import environment, gate, logger, source_hashes  # noqa: E402

from racing_stack.interop import Handover  # noqa: E402
from racing_stack.ppo import PPOConfig, make_validation_env  # noqa: E402
from racing_stack.prior import PursuitPrior  # noqa: E402

#: The reference's gains, then two tunings: the corners' lateral acceleration and the top speed raised (the first
#: is the release benchmark's tuned pursuit).
DEFAULT_PRIORS = (PursuitPrior(), TUNED_PURSUIT,
                  PursuitPrior(lateral_accel_mps2=6.5, max_speed_mps=28.0, drive_accel_mps2=3.5))
#: A lap of the reference's gains may differ from the plugin's by this much (s): one control step (0.02 s, with
#: the float32 lap times' rounding), float32 against float64 deciding the step of a crossing.
PARITY_S = 0.021
log = logger("prior_gains")


def parse_gains(text: str) -> PursuitPrior:
    """``NAME=VALUE,...`` as a `PursuitPrior` (empty: its defaults)."""
    pairs = [item.split("=", 1) for item in text.split(",") if item.strip()]
    if any(len(p) != 2 for p in pairs):
        raise ValueError(f"--gains must be NAME=VALUE,..., got {text!r}")
    try:
        return PursuitPrior(**{name.strip(): float(value) for name, value in pairs})
    except TypeError as error:
        raise ValueError(f"--gains {text!r}: {error}") from None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tracks", type=int, default=1000, help="Validation rows 0 to N-1")
    parser.add_argument("--gains", action="append", default=None, help="NAME=VALUE,... (repeatable)")
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("--publish", action="store_true", help="write benchmarks/results/prior_gains.json")
    args = parser.parse_args()
    if not 1 <= args.tracks <= 1000:
        parser.error(f"--tracks must be in [1, 1000], got {args.tracks}")
    try:
        priors = [parse_gains(text) for text in args.gains] if args.gains else list(DEFAULT_PRIORS)
    except ValueError as error:
        parser.error(str(error))
    out = args.out or Path("benchmarks/results/prior_gains.json" if args.publish else "benchmarks/out/prior_gains.json")
    device = torch.device("cuda", 0) if torch.cuda.is_available() else torch.device("cpu")
    probe = PPOConfig(validation_tracks=args.tracks)
    env = make_validation_env(probe, args.tracks)
    pursuit = {e["track_id"]: e for e in json.loads(PURSUIT_VALIDATION.read_text())["episodes"]}
    report: dict[str, Any] = {"protocol": "pure pursuit at other gains", "environment": environment(),
                              "source_sha256": source_hashes(__file__), "tracks": args.tracks, "runs": []}
    crossing = Handover(device)
    out.parent.mkdir(parents=True, exist_ok=True)
    for prior in priors:
        t0 = time.perf_counter()
        episodes = drive_prior(prior, env, probe, crossing, device, list(range(args.tracks)))
        result = {"gains": dataclasses.asdict(prior), **against_pursuit(episodes, pursuit),
                  "seconds": time.perf_counter() - t0}
        if prior == PursuitPrior():
            same = all(e.termination_reason == pursuit[e.track_id]["termination_reason"] for e in episodes)
            worst = max((abs(e.lap_time_s - pursuit[e.track_id]["lap_time_s"]) for e in episodes
                         if e.lap_completed and pursuit[e.track_id]["lap_completed"]), default=0.0)
            result["largest_lap_difference_s"], result["same_outcomes"] = worst, same
            report.setdefault("gates", []).append(
                gate("reference_gains_reproduce_pursuit_laps_s", worst, PARITY_S, same and worst <= PARITY_S))
        report["runs"].append(result)
        changed = {k: v for k, v in result["gains"].items() if v != getattr(PursuitPrior(), k)}
        log(f"{changed or 'the reference gains'}: {result['success_rate']:.3f} success, {result['off_track']} off "
            f"track, median per-track ratio {result['median_per_track_ratio']}")
        report["passed"] = bool(report.get("gates")) and all(g["passed"] for g in report["gates"])
        out.write_text(json.dumps(report, indent=2) + "\n")


if __name__ == "__main__":
    main()
