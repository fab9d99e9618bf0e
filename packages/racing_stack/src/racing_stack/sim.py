"""``sim``: one episode of a controller on a generated track, printed as JSON.

    python -m racing_stack.sim [--backend cpu_reference|mjx_warp] [--controller DIR]
        [--seed N] [--out FILE] [--render] [--record FILE.gif|FILE.mp4] [--verbose]

It generates and validates exactly track_gen seed 42 (a rejected seed is an
error, never retried), scales it to car metres with the bridge, builds one
world of ``ControllerLearning/CarRacing-v0`` on Level 1 and runs one episode
of the controller plugin (the neutral template by default, which reaches
the Level's timeout: it shows the API, not a driving result).
``--render`` shows the episode in a 2D window in real time, the
controller's ``render_callback`` drawn over the track; ``--record`` writes
it as an animated GIF or MP4 without a display. ``--backend mjx_warp``
where JAX sees no GPU runs on the CPU: a line on stderr says how much
slower.

A bad option, or an output file (``--out``, ``--record``) that cannot be
written, is a usage error (exit 2) naming it, before anything runs;
missing folders of the output files are made. ``--out`` may be a named
pipe that a process reads (opened before the run, written after it); a
failed write of it is a line on stderr naming it, after the result is
printed, and exit status 1; so is an episode that ended with a
controller error (the plugin raised or returned no valid action: the
first error on stderr, after the result). Exit status 130 after Ctrl-C
during the episode: the result of the episodes that had ended (none, unless
the one episode had) is still printed and written, with ``"interrupted":
true``, and so is the recording of the frames drawn. Warp's banner, its
line per loaded kernel module and its line that the machine has no NVIDIA
driver show only with ``--verbose``.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
from pathlib import Path

from racing_env.backend_names import BACKEND_NAMES, CPU_REFERENCE, MJX_WARP

from racing_stack._cli import (SEED_END, Interrupted, add_verbose_argument, check_outputs, ctrl_c_not_lost, int_in,
                               quiet_warp, report_interrupted, said_controller_errors, say_gpu_backend_on_cpu,
                               say_not_written, write_output)
from racing_stack.viewing import add_view_arguments, check_view_arguments, open_view

#: The track_gen seed ``sim`` drives on.
TRACK_SEED = 42


def build_track(backend: str):
    """Track seed 42 as a racing_env Track (track_gen on the GPU for
    ``mjx_warp`` when one is there, else on the CPU)."""
    import warp as wp
    from racing_env.backends import backend_type
    from track_gen.checks import describe
    from track_gen.course import Course
    from track_gen.pipeline import presets

    from racing_stack.bridge import track_from_course

    device = "cuda:0" if backend_type(backend).uses_gpu and wp.get_cuda_device_count() > 0 else "cpu"
    course = Course.track(presets.track(num_envs=1, device=device), seeds=TRACK_SEED)
    if int(course.result.valid.numpy()[0]) == 0:
        bits = describe(int(course.result.fail_mask.numpy()[0]))
        raise SystemExit(f"track_gen seed {TRACK_SEED} was rejected ({', '.join(bits)}); sim does not retry")
    return track_from_course(course, 0)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="sim", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--backend", choices=BACKEND_NAMES, default=CPU_REFERENCE,
                        help=f"the physics: {CPU_REFERENCE} (default; MuJoCo C on the CPU) or {MJX_WARP} (on the "
                             "GPU where there is one, else on the CPU, slower)")
    parser.add_argument("--controller", type=Path, default=None, help="a controller plugin directory "
                        "(default: the neutral template)")
    parser.add_argument("--seed", type=int_in(0, SEED_END, "2**32"), default=0,
                        help="the env's root reset seed, in [0, 2**32) (default 0)")
    parser.add_argument("--out", type=Path, default=None, help="also write the JSON result here")
    add_view_arguments(parser)
    add_verbose_argument(parser)
    args = parser.parse_args(argv)
    check_view_arguments(parser, args)
    from racing_env.render import RECORD_SUFFIXES

    pipes = check_outputs(parser, {"--out": args.out, "--record": args.record}, {"--record": RECORD_SUFFIXES},
                          pipes=("--out",))
    with contextlib.ExitStack() as held:  # a pipe opened for a refused run is closed: its reader sees the end
        for pipe in pipes.values():
            held.enter_context(pipe)
        quiet_warp(args.verbose)
        status = 0
        try:
            # stdout carries the JSON result only: what the libraries print goes to stderr. A Ctrl-C
            # dropped in a garbage collector callback is raised again.
            with contextlib.redirect_stdout(sys.stderr), ctrl_c_not_lost():
                result = _simulate(args)
        except Interrupted as stop:
            result, status = report_interrupted("sim", stop)
        if result is None:
            return 2
        text = json.dumps(result, indent=2)
        print(text, flush=True)  # before the file: a failed write cannot lose it
        status = status or said_controller_errors("sim", result)
        if args.out is not None:
            try:
                write_output(args.out, text + "\n", pipes.get("--out"))
            except OSError as error:
                say_not_written("sim", "the result", args.out, error)
                status = status or 1
    return status


def _simulate(args: argparse.Namespace) -> dict | None:
    """The episode's JSON result, or None after printing why the plugin or
    the drawing options are unusable.

    Raises:
        Interrupted: Ctrl-C during the episode, with the partial result.
    """
    from racing_env import LEVEL_1, ProjectConfig
    from racing_env.plugins import TEMPLATE, PluginError, load_plugin
    from racing_env.runner import RunInterrupted, run

    from racing_stack.levels import level_env

    config = ProjectConfig()
    try:
        plugin = load_plugin(args.controller or TEMPLATE)
    except PluginError as error:
        print(f"sim: argument --controller: {error}", file=sys.stderr)
        return None
    try:
        view = open_view(args, config)
    except (ValueError, RuntimeError, ImportError) as error:
        print(f"sim: {error}", file=sys.stderr)
        return None
    with contextlib.ExitStack() as stack:
        if view is not None:
            stack.enter_context(view)
        say_gpu_backend_on_cpu("sim", args.backend)
        track = build_track(args.backend)
        env = level_env(1, LEVEL_1, track=track, backend=args.backend)

        def progress(ended: int, total: int) -> None:
            print(f"sim: episode {ended}/{total} ended", file=sys.stderr)

        print(f"sim: track_gen seed {TRACK_SEED}, lap {float(track.track_length):.0f} m; {plugin.name} on "
              f"{args.backend} (Level 1, timeout {LEVEL_1.max_episode_steps} steps)", file=sys.stderr)
        stopped = None
        try:
            ran = run(plugin, env, episodes=1, seed=args.seed, progress=progress, view=view)
        except RunInterrupted as stop:
            ran, stopped = stop.result, stop
    result = ran.to_json()
    result["track_gen_seed"] = TRACK_SEED
    if view is not None and view.record is not None:
        result["recording"] = {"file": str(view.record), "frames": view.frames_recorded, "fps": view.record_fps}
        print(f"sim: wrote {view.record} ({view.frames_recorded} frames at {view.record_fps:g} frames/s)",
              file=sys.stderr)
    if stopped is not None:
        raise Interrupted(result) from stopped
    return result


if __name__ == "__main__":
    sys.exit(main())
