"""The PPO page's ledger rows of a round's ``--dev`` reports, so that a
round's outcome can be read (and its next step chosen) the moment it ends.

    python benchmarks/racing_stack/ppo_ledger.py DIR [--round LABEL]

One Markdown row per ``DIR/NAME.json`` (a `ppo_level1.py` report), in the
ledger's columns: round, run, the settings that differ from the GPU preset
at this checkout (dotted names, as ``--set`` takes them), updates and M
transitions, select / confirm / 1,000 (the chosen policy's validation on
rows 0-499, the confirmation on rows 500-999, all 1,000 Validation tracks),
off track and timeouts of the 1,000, and the median lap with the median
per-track ratio to pure pursuit. Each row is followed by a line with the
run's validations (update: success / median lap), its training rate and
overhead share, and where the report has one its edge check (success under
action noise per pass, and the tracks that failed in any pass, the clean
one included), and where it has them how many of its standing starts
hold the car. A report cut short shows what it has.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from racing_stack.ppo import PRESETS
from racing_stack.ppo.checkpoint import RETIRED
from racing_stack.ppo.config import flat


def settings(config: dict[str, Any]) -> str:
    """The report's settings that differ from the GPU preset's, ``name=value; ...``
    (a table the preset leaves out, as ``features.prior``, shows as
    ``name={}`` and then its fields that differ from their defaults)."""
    mine = {k: v for k, v in flat(config).items() if not (k in RETIRED and v is False)}  # off: as none ran
    preset = flat(json.loads(json.dumps(PRESETS["gpu"].to_json())))  # as a report holds it: tuples as lists
    tables = sorted(name for name, value in preset.items()
                    if value is None and any(key.startswith(name + ".") for key in mine))
    if tables:
        preset = flat(json.loads(json.dumps(PRESETS["gpu"].override([f"{name}={{}}" for name in tables]).to_json())))
    changed = [f"{name}={mine[name]!r}" for name in sorted(mine) if preset.get(name, object()) != mine[name]]
    return "; ".join([f"{name}={{}}" for name in tables] + changed) or "the preset"


def percent(rate: float | None) -> str:
    return "-" if rate is None else f"{100 * rate:.1f}"


def row(name: str, report: dict[str, Any], label: str) -> str:
    """The ledger row of one report and a line of its validations."""
    training = report.get("training", {})
    every = report.get("validation_all", {})
    chosen = training.get("exported", {}).get("validation_success_rate")
    rates = " / ".join(percent(r) for r in (chosen, report.get("confirmation", {}).get("success_rate"),
                                             every.get("success_rate")))
    lap = ("none" if every.get("median_lap_s") is None
           else f"{every['median_lap_s']:.2f} s ({every['median_per_track_ratio']:.2f})")
    transitions = training.get("transitions", 0) / 1e6
    line = (f"| {label} | {name} | {settings(report['config'])} | {training.get('updates', 0)}, {transitions:.0f} "
            f"| {rates} % | {every.get('off_track', '-')}, {every.get('timeout', '-')} | {lap} |")
    curve = " ".join(f"{v['update']}: {percent(v['validation_success_rate'])} / "
                     f"{v['validation_median_lap_time_s'] or 0:.1f} s" for v in training.get("validations", []))
    rate = training.get("median_transitions_per_s_after_2")
    share = training.get("overhead_share")
    edge = report.get("validation_edge")
    starts = report.get("standing_starts")
    extra = (f"  validations {curve or 'none'}; "
             + (f"{rate:,.0f} transitions/s" if rate is not None else "no rate")
             + (f", overhead {100 * share:.1f} %" if share is not None else "")
             + (f"; edge check {' / '.join(percent(p['success_rate']) for p in edge['passes'])} %, "
                f"{edge['failed_in_any']} tracks failed in any of {len(edge['passes']) + 1} passes"
                if edge else "")
             + (f"; {starts['holding']} of {starts['tracks']:,} standing starts hold the car" if starts else ""))
    return line + "\n" + extra


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("folder", type=Path)
    parser.add_argument("--round", default="?", help="the round column's label")
    args = parser.parse_args()
    reports = {path: json.loads(path.read_text()) for path in sorted(args.folder.glob("*.json"))}
    if not reports:
        parser.error(f"folder: no reports (*.json) in {args.folder}")
    for path, report in reports.items():
        if isinstance(report, dict) and "config" in report and "training" in report:
            print(row(path.stem, report, args.round))
        else:  # a round's other reports (speed, evaluation): no training row
            print(f"{path.name}: not a training report, left out", file=sys.stderr)


if __name__ == "__main__":
    main()
