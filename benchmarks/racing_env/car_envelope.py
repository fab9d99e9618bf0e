"""The car's envelope, measured on the real step: what forward, braking,
lateral and combined accelerations the MuJoCo car holds at each speed
(`racing_env.envelope.measure_envelope`: MuJoCo C in float64, the env's
``dt``, substeps and action mapping, on the flat ground plane).

    python benchmarks/racing_env/car_envelope.py [--short] [--out FILE | --publish]

Writes a JSON report (environment, versions, source hashes, the car's
config and its hash, the schedule, the measured tables and the g-g
polygons, wall time) and its picture beside it (the same name, ``.png``):
the lateral limit against speed, the forward and braking limits against
speed at each heading, the g-g polygons. The default is the full schedule
on one CPU core, written to ``benchmarks/out/car_envelope.json``;
``--publish`` writes it as the committed report,
``benchmarks/results/car_envelope.json``; ``--short`` is the tests'
schedule, written to ``benchmarks/out/car_envelope_short.json``.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

from protocol import (ROOT, add_report_arguments, environment, logger, process_seconds,  # noqa: E402
                      report_path, shown, source_hashes)

from racing_env import car  # noqa: E402
from racing_env.config import ProjectConfig  # noqa: E402
from racing_env.envelope import FULL_SCHEDULE, SHORT_SCHEDULE, Envelope, config_hash, measure_envelope  # noqa: E402

#: The speeds the report's summary names, m/s.
SUMMARY_SPEEDS = (10.0, 20.0, 30.0)


def tyre_model(config: ProjectConfig) -> dict[str, Any]:
    """What the compiled model says of the tyres' friction (the references
    the lateral limit is read against)."""
    import mujoco

    model = car.build_model(config)
    g = float(np.linalg.norm(model.opt.gravity))
    mu = float(model.geom_friction[model.geom("rear_left_tyre").id, 0])
    pyramidal = model.opt.cone == mujoco.mjtCone.mjCONE_PYRAMIDAL
    return {
        "cone": "pyramidal" if pyramidal else "elliptic",
        "contact_dimension": int(model.geom_condim[model.geom("rear_left_tyre").id]),
        "sliding_friction": mu,
        "gravity_mps2": g,
        "mu_g_mps2": mu * g,
        "mu_g_on_the_diagonal_mps2": mu * g / math.sqrt(2) if pyramidal else mu * g,
    }


def summary(envelope: Envelope) -> dict[str, Any]:
    speeds = [v for v in SUMMARY_SPEEDS if envelope.speeds_mps[0] <= v <= envelope.speeds_mps[-1]]
    heading0 = int(np.argmin(np.abs(envelope.headings_rad)))
    return {
        "lateral_mps2_at": {f"{v:g}": envelope.lateral_at(v) for v in speeds},
        "lateral_mps2_range": [float(np.nanmin(envelope.lateral_mps2)), float(np.nanmax(envelope.lateral_mps2))],
        "forward_mps2_range": [float(np.nanmin(envelope.forward_mps2)), float(np.nanmax(envelope.forward_mps2))],
        "braking_mps2_range": [float(np.nanmin(envelope.braking_mps2)), float(np.nanmax(envelope.braking_mps2))],
        "forward_mps2_range_heading_0": [float(envelope.forward_by_heading_mps2[heading0].min()),
                                         float(envelope.forward_by_heading_mps2[heading0].max())],
        "braking_mps2_range_heading_0": [float(envelope.braking_by_heading_mps2[heading0].min()),
                                         float(envelope.braking_by_heading_mps2[heading0].max())],
    }


def draw(envelope: Envelope, tyres: dict[str, Any], path: Path) -> None:
    """Lateral limit against speed; forward and braking limits by heading;
    the g-g polygons."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (lateral, straight, gg) = plt.subplots(1, 3, figsize=(15, 4.6))
    v = envelope.speeds_mps
    lateral.plot(v, envelope.lateral_mps2, "o-", label="held around a whole circle")
    lateral.axhline(tyres["mu_g_mps2"], color="k", lw=0.8, ls="--", label="mu g")
    lateral.axhline(tyres["mu_g_on_the_diagonal_mps2"], color="k", lw=0.8, ls=":",
                    label="mu g / sqrt 2 (pyramidal cone, diagonal)")
    lateral.set(xlabel="speed (m/s)", ylabel="a_y max (m/s^2)", title="lateral limit (ramp-steer)", ylim=(0, 11))
    lateral.legend(fontsize=8, loc="lower right")
    for k, heading in enumerate(envelope.headings_rad):
        label = f"heading {math.degrees(heading):.1f} deg"
        line = straight.plot(v, envelope.forward_by_heading_mps2[k], "o-", ms=3, label=f"forward, {label}")[0]
        straight.plot(v, -envelope.braking_by_heading_mps2[k], "s--", ms=3, color=line.get_color(),
                      label=f"braking, {label}")
    straight.axhline(0, color="k", lw=0.5)
    straight.set(xlabel="speed (m/s)", ylabel="a_x (m/s^2)", title="straight-line limits (full throttle, full brake)")
    straight.legend(fontsize=7, loc="center right")
    for speed, polygon in zip(envelope.gg_speeds_mps, envelope.gg):
        gg.plot(polygon[:, 1], polygon[:, 0], ".-", label=f"{speed:g} m/s")
    circle = np.linspace(0, 2 * np.pi, 200)
    gg.plot(tyres["mu_g_mps2"] * np.cos(circle), tyres["mu_g_mps2"] * np.sin(circle), "k--", lw=0.6, label="mu g")
    gg.set(xlabel="a_y (m/s^2)", ylabel="a_x (m/s^2)", aspect="equal",
           title=f"g-g at heading {math.degrees(envelope.gg_heading_rad):.0f} deg")
    gg.legend(fontsize=8, loc="lower right")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--short", action="store_true", help="the tests' short schedule (seconds)")
    add_report_arguments(parser, "car_envelope")
    args = parser.parse_args()
    if args.publish and args.short:
        parser.error("argument --publish: the committed report is the full schedule; drop --short")
    out = args.out or (ROOT / "benchmarks/out/car_envelope_short.json" if args.short
                       else report_path(args, "car_envelope"))
    log = logger("car_envelope")
    config = ProjectConfig()
    schedule = SHORT_SCHEDULE if args.short else FULL_SCHEDULE
    log(f"measuring the envelope of ProjectConfig() {config_hash(config)[:12]} "
        f"({'short' if args.short else 'full'} schedule)")
    start = time.perf_counter()
    envelope = measure_envelope(config, schedule, log=log)
    measure_s = time.perf_counter() - start
    tyres = tyre_model(config)
    report = {
        "protocol": "car_envelope",
        "environment": environment(),
        "source_sha256": source_hashes(__file__),
        "device": "cpu (MuJoCo C, float64, one core)",
        "cpus": os.cpu_count(),
        "config": dataclasses.asdict(config),
        "config_sha256": envelope.config_sha256,
        "config_sha256_of": "json.dumps(dataclasses.asdict(config), sort_keys=True): every ProjectConfig field",
        "schedule_name": "short" if args.short else "full",
        "schedule": schedule.to_dict(),
        "tyre_model": tyres,
        "summary": summary(envelope),
        "envelope": json.loads(envelope.to_json()),
        "measure_wall_s": measure_s,
        "process_wall_s": process_seconds(),
    }
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=1) + "\n")
    log(f"wrote {shown(out)} ({measure_s:.0f} s of measuring)")
    try:
        draw(envelope, tyres, out.with_suffix(".png"))
        log(f"drew {out.with_suffix('.png').name}")
    except ImportError as error:
        log(f"no picture ({error})")
    print(json.dumps(report["summary"], indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
