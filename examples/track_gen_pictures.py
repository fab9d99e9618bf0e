"""Draw the pictures of the track_gen docs and measure the invalid fraction.

    python examples/track_gen_pictures.py [--num-envs 4096] [--out DIR | --publish]

Writes ``track_gen_tracks.png``, ``track_gen_tracks_invalid.png`` and
``track_gen_gates.png`` (valid and invalid courses, fail bits labelled) into
``examples/out/`` (``--publish``: the docs' ``docs/assets/``), and
prints the rate of each fail bit at the default settings and with each knob
turned, and the crossing-bars rate of gate courses by bar width.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np

from track_gen.checks import NAMES
from track_gen.course import Course
from track_gen.draw import save_png
from track_gen.pipeline import presets


def rates(course: Course) -> dict[str, float]:
    fail = course.result.fail_mask.numpy()
    out = {"invalid": float((fail != 0).mean())}
    out.update({name: float(((fail & bit) != 0).mean()) for bit, name in NAMES.items() if bit != 8})
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--num-envs", type=int, default=4096, help="courses per setting (>= 1, default 4096)")
    outputs = parser.add_mutually_exclusive_group()
    outputs.add_argument("--out", default=None, help="folder for the pictures (default examples/out)")
    outputs.add_argument("--publish", action="store_true", help="write the docs' pictures, docs/assets/")
    args = parser.parse_args()
    if args.num_envs < 1:
        parser.error(f"argument --num-envs: must be >= 1, got {args.num_envs}")
    out = Path(args.out or ("docs/assets" if args.publish else "examples/out"))
    try:  # before any work: a folder that cannot be made is a usage error
        out.mkdir(parents=True, exist_ok=True)
    except OSError as error:
        parser.error(f"argument --out: cannot make the folder {str(out)!r} ({error.strerror or error})")
    settings = {
        "defaults": {},
        "radius_jitter=0.35": {"radius_jitter": 0.35},
        "n_control=12": {"n_control": 12},
        "width=0.6": {"width": 0.6},
        "n_max=200": {"n_max": 200},
        "angle_jitter=1.5": {"angle_jitter": 1.5},
    }
    print(f"| setting ({args.num_envs} envs, seeds=0) | invalid | " + " | ".join(NAMES[b] for b in (1, 2, 4)) + " |")
    print("|---|---|---|---|---|")
    for label, overrides in settings.items():
        course = Course.track(presets.track(num_envs=args.num_envs, device="cpu", **overrides), seeds=0)
        r = rates(course)
        print(f"| {label} | {r['invalid']:.2%} | {r['turning']:.2%} | {r['thickness']:.2%} | {r['truncation']:.2%} |")
        if label == "defaults":
            fail = course.result.fail_mask.numpy()
            bad = [int(e) for e in np.nonzero(fail)[0][:2]]
            good = [e for e in range(course.num_envs) if fail[e] == 0][: 8 - len(bad)]
    mixed = Course.track(presets.track(num_envs=64, device="cpu", angle_jitter=1.0), seeds=0)
    fail = mixed.result.fail_mask.numpy()
    envs = [e for e in range(64) if fail[e] == 0][:4] + [int(e) for e in np.nonzero(fail)[0][:4]]
    save_png(mixed, out / "track_gen_tracks_invalid.png", envs=envs,
             title="presets.track(num_envs=64, angle_jitter=1.0), seeds=0: valid and invalid")
    print(f"\n| gate_width ({args.num_envs} gate courses, seeds=7) | crossing bars |")
    print("|---|---|")
    for width in (0.1, 0.4, 0.7, 1.0):
        course = Course.gates(presets.gates(num_envs=args.num_envs, device="cpu", gate_width=width), seeds=7)
        print(f"| {width} | {(course.result.fail_mask.numpy() != 0).mean():.2%} |")
    gates = Course.gates(presets.gates(num_envs=64, device="cpu", gate_width=1.0), seeds=7)
    fail = gates.result.fail_mask.numpy()
    envs = [e for e in range(64) if fail[e] == 0][:6] + [int(e) for e in np.nonzero(fail)[0][:2]]
    save_png(gates, out / "track_gen_gates.png", envs=envs,
             title="Course.gates(presets.gates(num_envs=64, gate_width=1.0), seeds=7): valid and invalid")
    defaults = Course.track(presets.track(num_envs=args.num_envs, device="cpu"), seeds=0)
    save_png(defaults, out / "track_gen_tracks.png", envs=good + bad,
             title=f"presets.track(num_envs={args.num_envs}), seeds=0: {len(good)} valid envs, "
                   f"{len(bad)} invalid")
    print(f"wrote {out / 'track_gen_tracks.png'}, {out / 'track_gen_tracks_invalid.png'}, "
          f"{out / 'track_gen_gates.png'}")


if __name__ == "__main__":
    main()
