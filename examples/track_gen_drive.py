"""Drive a batch of agents around their tracks with a scripted policy, with
respawns and regenerations happening, and draw it.

    python examples/track_gen_drive.py [--out DIR | --publish] [--steps 240] [--envs 4]

Each agent follows its course line a few points per step, weaving left and
right; one whose box leaves the track respawns on the same course, one that
finishes a lap (or whose course is invalid) gets a new course. Writes
``track_gen_drive.gif`` (an animation) and ``track_gen_drive.png`` (a strip of
frames) into ``examples/out/`` (``--publish``: the docs' ``docs/assets/``),
and prints the events it saw and where it wrote.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np
import warp as wp

from track_gen.course import Course
from track_gen.pipeline import presets


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    outputs = parser.add_mutually_exclusive_group()
    outputs.add_argument("--out", default=None, help="folder for the pictures (default examples/out)")
    outputs.add_argument("--publish", action="store_true", help="write the docs' pictures, docs/assets/")
    parser.add_argument("--steps", type=int, default=240, help="steps to drive (>= 1, default 240)")
    parser.add_argument("--envs", type=int, default=4, help="agents, one course each (>= 1, default 4)")
    parser.add_argument("--verbose", action="store_true",
                        help="let Warp print its banner, its module loads and its no-driver line")
    args = parser.parse_args()
    for flag, value in (("--steps", args.steps), ("--envs", args.envs)):
        if value < 1:
            parser.error(f"argument {flag}: must be >= 1, got {value}")
    out = Path(args.out or ("docs/assets" if args.publish else "examples/out"))
    try:  # before any work: a folder that cannot be made is a usage error
        out.mkdir(parents=True, exist_ok=True)
    except OSError as error:
        parser.error(f"argument --out: cannot make the folder {str(out)!r} ({error.strerror or error})")
    if args.verbose:  # importing track_gen lowered Warp's default level; a level set now is the user's
        wp.config.log_level = wp.LOG_INFO
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.animation import FuncAnimation, PillowWriter

    E = args.envs
    course = Course.track(presets.track(num_envs=E, device="cpu", width=0.3), seeds=21)
    r = course.result
    pos = wp.zeros(E, dtype=wp.vec3, device="cpu")
    quat = wp.full(E, wp.quat_identity(), dtype=wp.quatf, device="cpu")
    he = wp.full(E, wp.vec2f(0.02, 0.01), dtype=wp.vec2f, device="cpu")
    course.bind(position=pos, orientation=quat, half_extents=he)
    rng = np.random.default_rng(0)
    index = np.zeros(E)
    speed = rng.uniform(2.0, 3.0, E)            # course-line points per step
    weave = np.resize([0.05, 0.08, 0.14, 0.06], E)  # lateral amplitude (m): env 2 leaves the track
    frames, events = [], {"respawns": 0, "new courses": 0, "checkpoints": 0}
    for step in range(args.steps):
        count = r.count.numpy()
        index = (index + speed) % count
        i = index.astype(int)
        center, normal = r.center.numpy(), r.normal.numpy()
        lateral = weave * np.sin(0.15 * step + np.arange(E))
        p = center[np.arange(E), i] + lateral[:, None] * normal[np.arange(E), i]
        pos.assign(np.nan_to_num(p).astype(np.float32))
        res = course.step()
        valid = res.valid.numpy() != 0
        oob = (res.contacts.oob.numpy() != 0) & valid
        events["checkpoints"] += int(res.events.passed.numpy().sum())
        frames.append((center.copy(), r.left.numpy().copy(), r.right.numpy().copy(), count.copy(),
                       p.copy(), oob.copy(), r.generation.numpy().copy(), res.events.laps.numpy().copy()))
        finished = (res.events.laps.numpy() >= 1) | ~valid
        crashed = oob & ~finished
        if crashed.any():
            course.inputs["reset_mask"].assign(crashed.astype(np.int32))
            course.reset(course.inputs["reset_mask"])
            index[crashed] = 0
            events["respawns"] += int(crashed.sum())
        if finished.any():
            course.inputs["regen_mask"].assign(finished.astype(np.int32))
            course.regenerate(mask=course.inputs["regen_mask"], advance=True)
            index[finished] = 0
            events["new courses"] += int(finished.sum())
    print(events)

    def draw(axes, frame, step):
        center, left, right, count, p, oob, gen, laps = frame
        for e, ax in enumerate(axes):
            ax.clear()
            ax.set_axis_off()
            n = count[e]
            loop = np.r_[np.arange(n), 0]
            ax.plot(left[e, loop, 0], left[e, loop, 1], color="#333333", lw=0.8)
            ax.plot(right[e, loop, 0], right[e, loop, 1], color="#333333", lw=0.8)
            ax.scatter(p[e, 0], p[e, 1], s=18, color="#c0392b" if oob[e] else "#2980b9", zorder=3)
            ax.set_title(f"env {e}: course {gen[e]}" + (" (out)" if oob[e] else ""), fontsize=7)
            ax.set_aspect("equal")

    out = Path(args.out or ("docs/assets" if args.publish else "examples/out"))
    out.mkdir(parents=True, exist_ok=True)
    fig, axes = plt.subplots(1, E, figsize=(2.2 * E, 2.4), squeeze=False)
    axes = axes[0]
    keep = list(range(0, len(frames), 4))
    anim = FuncAnimation(fig, lambda k: draw(axes, frames[keep[k]], keep[k]), frames=len(keep))
    anim.save(out / "track_gen_drive.gif", writer=PillowWriter(fps=12), dpi=60)
    plt.close(fig)
    strip = np.linspace(0, len(frames) - 1, 4).astype(int)
    fig, grid = plt.subplots(len(strip), E, figsize=(2.2 * E, 2.3 * len(strip)), squeeze=False)
    for row, k in zip(grid, strip):
        draw(row, frames[k], k)
        row[0].text(-0.1, 0.5, f"step {k}", transform=row[0].transAxes, rotation=90, va="center", fontsize=8)
    fig.suptitle("a scripted policy: out-of-track agents respawn (red), finished laps get new courses", fontsize=9)
    fig.tight_layout()
    fig.savefig(out / "track_gen_drive.png", dpi=80)
    plt.close(fig)
    print(f"wrote {out / 'track_gen_drive.gif'} and {out / 'track_gen_drive.png'}")


if __name__ == "__main__":
    main()
