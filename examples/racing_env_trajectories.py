"""Draw a few worlds' trajectories on their tracks (the racing_env docs' picture).

    python examples/racing_env_trajectories.py [--out FILE | --publish] [--seconds 60]

Four track_gen courses (seeds 42..45, generated on Warp's CPU device) become
a TrackPool through the integration layer's bridge; the reference
pure-pursuit driver (`racing_env.pursuit`) drives one world on each at 8, 12,
16 and 20 m/s on the ``cpu_reference`` backend for up to 60 s of simulated
time or until the episode ends. Each panel shows the road, the path of the
rear axle, a dot every second and a cross where the episode ended, with the
outcome in its title.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

from racing_env import Level, ProjectConfig, VecCarRacingEnv  # noqa: E402
from racing_env.pursuit import pursuit  # noqa: E402
from racing_stack.bridge import pool_from_course  # noqa: E402
from track_gen.course import Course  # noqa: E402
from track_gen.pipeline import presets  # noqa: E402

REASONS = {0: "running", 1: "lap completed", 2: "off track", 3: "invalid action", 4: "timeout"}
SPEEDS = (8.0, 12.0, 16.0, 20.0)


def drive(env: VecCarRacingEnv, row: int, speed: float, seconds: float):
    """Rear-axle path [T, 2] and the episode's last info of one world."""
    obs, info = env.reset(seed=row, options={"track_indices": [row]})
    path = [np.asarray(obs["position"][0])]
    for _ in range(int(seconds / env.config.control_dt_s)):
        obs, _, terminated, truncated, info = env.step(pursuit(obs, speed_mps=speed))
        path.append(np.asarray(obs["position"][0]))
        if bool(terminated[0]) or bool(truncated[0]):
            break
    return np.array(path), info, float(obs["track_progress"][0])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    outputs = parser.add_mutually_exclusive_group()
    outputs.add_argument("--out", default=None, help="the picture (default examples/out/racing_env_trajectories.png)")
    outputs.add_argument("--publish", action="store_true", help="write the docs' picture, docs/assets/")
    parser.add_argument("--seconds", type=float, default=60.0, help="the longest episode, s (in (0, 3600], default 60)")
    args = parser.parse_args()
    if not 0 < args.seconds <= 3600:  # NaN and inf too
        parser.error(f"argument --seconds: must be in (0, 3600], got {args.seconds}")
    folder = Path("docs/assets" if args.publish else "examples/out")
    out = Path(args.out) if args.out else folder / "racing_env_trajectories.png"
    try:  # before any work: a folder that cannot be made is a usage error
        out.parent.mkdir(parents=True, exist_ok=True)
    except OSError as error:
        parser.error(f"argument --out: cannot make the folder {str(out.parent)!r} ({error.strerror or error})")
    course = Course.track(presets.track(num_envs=len(SPEEDS), device="cpu"), seeds=42)
    pool = pool_from_course(course, level_id=1, split="picture")
    level = Level(level_id=1, name="picture", max_episode_steps=int(args.seconds * 50) + 10)
    env = VecCarRacingEnv(1, config=ProjectConfig(), level=level, backend="cpu_reference", track_pool=pool)
    fig, axes = plt.subplots(1, len(SPEEDS), figsize=(5 * len(SPEEDS), 5))
    for row, (ax, speed) in enumerate(zip(axes, SPEEDS)):
        track = pool.track(row % len(pool))
        n = track.num_points
        path, info, progress = drive(env, row % len(pool), speed, args.seconds)
        for side in (track.left_boundary[:n], track.right_boundary[:n]):
            loop = np.vstack([side, side[:1]])
            ax.plot(loop[:, 0], loop[:, 1], color="0.45", lw=0.8)
        ax.plot(path[:, 0], path[:, 1], color="tab:red", lw=1.4)
        ax.plot(path[::50, 0], path[::50, 1], ".", color="tab:red", ms=4)
        ax.plot(path[-1, 0], path[-1, 1], "x", color="k", ms=9, mew=2)
        reason = REASONS[int(info["termination_reason"][0])]
        ax.set_title(f"track {int(info['track_id'][0])} at {speed:.0f} m/s:\n{reason}, progress {progress:.2f}")
        ax.set_aspect("equal")
        ax.axis("off")
        print(f"row {row}: {speed} m/s, {reason}, progress {progress:.3f}, {len(path) - 1} steps")
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
