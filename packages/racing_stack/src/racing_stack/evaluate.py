"""``evaluate``: the Runner's command line. A controller plugin on a Level's
tracks, a JSON result and, optionally, its picture.

    python -m racing_stack.evaluate [--controller DIR] [--level 0|1]
        [--split train|validation|test] [--tracks N] [--episodes N]
        [--backend cpu_reference|mjx_warp] [--worlds N] [--seed N]
        [--isolate | --no-isolate] [--call-timeout S] [--start-timeout S] [--memory-limit MB]
        [--batched] [--out FILE] [--plot FILE] [--reference FILE] [--render] [--record FILE] [--verbose]

Level 1 drives every track of the split once (or its first ``--tracks``),
from the verified pool in the cache (built there on first use, as
``materialize-track-pool`` does, and rebuilt where the cached one is
damaged: a line on stderr says when it builds one, and names the damage;
a pool that fails verification is an error naming the split and the
row). Level 0 drives its one fixed track ``--episodes`` times. Each of
those two options is its Level's alone: given on the other Level it is a
usage error. ``mjx_warp`` (the default) on a machine where JAX sees no
GPU runs on the CPU, and a line on stderr says how much slower.
``--plot`` draws the lap time of every track against its length,
coloured by outcome, and against a reference result (``--reference``, a
JSON result of another controller on the same tracks) where one is
given. ``--render`` and ``--record`` draw world 0's episodes (a window;
an animated GIF or MP4). Progress goes to stderr, the JSON summary to
stdout (Warp's banner, module lines and no-NVIDIA-driver line only with
``--verbose``).

``--isolate`` (the default on Level 1; ``--no-isolate`` the default on
Level 0) runs each episode's controller in its own child process, with a
wall-clock limit per call (``--call-timeout``, default 5 s;
``--start-timeout``, default 60 s, for an episode's start: the process, the
plugin's import and its constructor) and a memory limit
(``--memory-limit``, default 4096 MiB); a hang, an exit, a crash or a
memory blow-up ends that episode as ``invalid_action`` with the error
recorded, and the run goes on. Without it the plugin is trusted code in
this process. ``--batched`` drives the plugin's
`racing_env.controller.BatchController` (the exported PPO plugins have
one) with every world's observation in one call a step; isolated, it runs
in one child process under the same limits per call. With ``--out FILE``, each episode is appended to
``FILE``'s ``.episodes.jsonl`` sibling as it ends (one JSON object a line),
and ``FILE`` gets the whole result at the end. A named pipe that a process
reads may be ``--out``: it is opened before the run and written after it.

The summary is printed before any file is written, so no failed write can
lose it. A failed write of the episodes file (a full disk) is said once on
stderr, naming it, and the run goes on; a failed write of ``--out``,
``--plot`` or ``--record`` after the run is a line on stderr naming the
file, and exit status 1.

Exit status: 0 after a run (whatever the controller scored); 1 when every
episode ended with a controller error (it raised, called ``sys.exit()``, or
returned no valid action; the result and the summary are still written),
or when ``--out``, ``--plot`` or ``--record`` could not be written; 2 for
a usage error (a bad option, plugin, pool or output file), refused before
anything runs; 130 after Ctrl-C during the run: the result of the episodes
that had ended is still written and printed, with ``"interrupted": true``.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import sys
import threading
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from racing_env.backend_names import BACKEND_NAMES, CPU_REFERENCE, MJX_WARP

from racing_stack._cli import (SEED_END, Interrupted, add_verbose_argument, check_outputs, ctrl_c_not_lost, float_in,
                               int_in, quiet_warp, report_interrupted, said_controller_errors, say_gpu_backend_on_cpu,
                               say_not_written, write_output)
from racing_stack._files import save_figure
from racing_stack._journal import Journal
from racing_stack.viewing import add_view_arguments, check_view_arguments, open_view

if TYPE_CHECKING:
    from racing_env.isolation import Isolation
    from racing_env.render import EpisodeView

__all__ = ["ISOLATED_WORLDS", "Interrupted", "evaluate", "draw", "episodes_file", "main"]

#: The default worlds of an isolated run on ``mjx_warp`` at most: each
#: world's controller is a process of its own (and one starting ahead).
ISOLATED_WORLDS = 16

#: What the command prints of a result (its JSON summary).
_SUMMARY_KEYS = ("plugin", "backend", "worlds", "level", "split", "summary", "seconds")
#: Outcome colours of the picture.
_COLOURS = {"success": "tab:green", "off_track": "tab:red", "timeout": "tab:orange", "invalid_action": "tab:purple"}


def evaluate(controller: Path | None = None, level: int = 1, split: str = "validation", tracks: int | None = None,
             episodes: int = 1, backend: str = MJX_WARP, worlds: int | None = None, seed: int = 0,
             progress=None, view=None, isolate: bool | None = None, isolation=None,
             record=None, on_build=None, batched: bool = False) -> dict[str, Any]:
    """Run the plugin and return the Runner's JSON result, with the level,
    split and every driven track's length (m) under ``"track_length_m"``
    (keyed by track id).

    Args:
        controller: a plugin directory (default: the pure-pursuit reference).
        level: 0 (the fixed track) or 1 (a generated split).
        split: Level 1's split.
        tracks: Level 1: drive only the split's first N tracks (None on
            Level 0, which has one fixed track).
        episodes: Level 0: episodes on the fixed track (1 on Level 1,
            which drives each track once).
        backend: ``"cpu_reference"`` (one world) or ``"mjx_warp"``.
        worlds: worlds at once (default: 1 on cpu_reference, else as many
            as there are tracks, at most 1,024, or `ISOLATED_WORLDS`
            isolated one episode at a time: a process a world; batched, one
            child serves every world).
        seed: the env's root reset seed.
        progress: called as ``progress(ended, total)``.
        view: a `racing_env.render.EpisodeView` for world 0's episodes.
        isolate: each episode's controller in a child process (the
            plugin's code never runs here); None: on Level 1 only.
        isolation: its limits (a `racing_env.isolation.Isolation`; None: the defaults).
        record: called with each ended episode's `racing_env.runner.EpisodeResult`.
        on_build: called with one line before a split's pool is built
            (`racing_stack.pools.materialize_prefix`'s).
        batched: drive the plugin's BatchController, every world in one
            call a step (`racing_env.runner.run`'s; isolated, in one child).

    Raises:
        ValueError: a bad level, split, count (or one of the other
            Level's) or a pool that fails verification;
            `racing_env.plugins.PluginError` for a bad plugin.
        Interrupted: Ctrl-C during the run (a `KeyboardInterrupt`), with
            the partial result.
    """
    import jax.numpy as jnp
    from racing_env import LEVEL_0, LEVEL_1, level0_track
    from racing_env.backends import backend_type
    from racing_env.isolation import Isolation
    from racing_env.plugins import PURSUIT, load_plugin
    from racing_env.runner import RunInterrupted, run

    from racing_stack.levels import level_env
    from racing_stack.pools import SPLITS

    if level not in (0, 1):
        raise ValueError(f"level must be 0 or 1, got {level!r}")
    if level == 0 and tracks is not None:
        raise ValueError(f"tracks is Level 1's (a split's first N tracks): Level 0 has one fixed track, driven "
                         f"episodes times, got tracks={tracks!r}")
    if level == 1 and episodes != 1:
        raise ValueError(f"episodes is Level 0's: Level 1 drives each track of its split once (tracks sets how "
                         f"many), got episodes={episodes!r}")
    if isolate is None:
        isolate = level == 1
    isolation = (isolation or Isolation()) if isolate else None
    plugin = load_plugin(controller or PURSUIT, import_code=not isolate)
    if isolation is not None:
        _check_beside_imports(plugin.directory, isolation, backend_type(backend), batched)
    if level == 0:
        source, total, rows = {"track": level0_track()}, episodes, None
    else:
        if split not in SPLITS:
            raise ValueError(f"split must be one of {sorted(SPLITS)}, got {split!r}")
        size = SPLITS[split].size
        count = size if tracks is None else tracks
        if not 1 <= count <= size:
            raise ValueError(f"tracks must be in [1, {size}] for split {split!r}, got {count}")
        source, total, rows = {"split": split}, count, list(range(count))
    if worlds is None:
        worlds = 1 if backend_type(backend).one_world else \
            min(total, ISOLATED_WORLDS if isolate and not batched else 1024)
    env = level_env(worlds, LEVEL_0 if level == 0 else LEVEL_1, backend=backend, on_build=on_build, **source)
    stopped = None
    try:
        if rows is None:
            result = run(plugin, env, episodes=total, seed=seed, progress=progress, view=view,
                         isolation=isolation, record=record, batched=batched)
        else:
            result = run(plugin, env, seed=seed, progress=progress, track_indices=rows, view=view,
                         isolation=isolation, record=record, batched=batched)
    except RunInterrupted as stop:
        result, stopped = stop.result, stop
    out = result.to_json()
    out["level"] = level
    out["split"] = None if level == 0 else split
    driven = [0] if rows is None else rows
    lengths = env.track_pool.track_length[jnp.asarray(driven)].tolist()
    ids = env.track_pool.track_id[jnp.asarray(driven)].tolist()
    out["track_length_m"] = {str(i): float(length) for i, length in zip(ids, lengths)}
    if stopped is not None:
        raise Interrupted(out) from stopped
    return out


def _check_beside_imports(directory: Path, isolation, backend, batched: bool = False) -> None:
    """`racing_env.isolation.check_plugin` in a thread while this one
    imports the backend's engine (``backend.preload()``: about 5 s each of
    a learned plugin's check and MuJoCo Warp's import on an H100 host), so
    that the two overlap; nothing is built before the check has passed.
    ``batched`` (`evaluate`'s): the check also asks for the plugin's
    BatchController, so that a plugin without one is refused before a
    track pool is built.

    Raises:
        PluginError: as `check_plugin`.
    """
    from racing_env.isolation import check_plugin

    outcome: list[BaseException | None] = []

    def check() -> None:
        try:
            check_plugin(directory, isolation, batched)
        except BaseException as error:  # noqa: BLE001 - handed to the caller's thread
            outcome.append(error)
        else:
            outcome.append(None)

    # A daemon: a Ctrl-C (or a failed import) here does not wait for the check, whose child
    # `check_plugin` closes when the check ends, or the run's reaper kills at this process's exit.
    # The child is the thread's: it must not outlive the check (its parent-death signal follows
    # the thread that started it).
    thread = threading.Thread(target=check, name="plugin check", daemon=True)
    thread.start()
    backend.preload()
    thread.join()
    if outcome[0] is not None:
        raise outcome[0]


def episodes_file(out: Path) -> Path:
    """Where the episodes of a run with ``--out out`` are appended as they
    end: ``out`` with the suffix ``.episodes.jsonl``."""
    return out.with_suffix(".episodes.jsonl")


def draw(result: dict[str, Any], path: Path, reference: dict[str, Any] | None = None) -> None:
    """The result as a picture: lap time against track length per episode,
    coloured by outcome (a failed episode drawn at its progress x 100 % on a
    second axis), and lap time against the reference's on the same tracks."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    episodes = result["episodes"]
    lengths = result["track_length_m"]
    panels = 2 if reference is not None else 1
    fig, axes = plt.subplots(1, panels, figsize=(6.5 * panels, 4.8), squeeze=False)
    ax = axes[0, 0]
    for reason, colour in _COLOURS.items():
        mine = [e for e in episodes if e["termination_reason"] == reason]
        if not mine:
            continue
        x = [lengths[str(e["track_id"])] for e in mine]
        y = [e["lap_time_s"] if e["lap_completed"] else float("nan") for e in mine]
        if reason == "success":
            ax.scatter(x, y, s=9, c=colour, label=f"{reason} ({len(mine)})")
        else:
            ax.scatter(x, [0.0] * len(x), s=14, c=colour, marker="x", label=f"{reason} ({len(mine)})")
    s = result["summary"]
    rate = 100.0 * (s["success_rate"] or 0.0)
    median = s["lap_time_s"]["median"]
    title = f"{_plugin_name(result)}: {rate:.1f} % laps"
    if median is not None:
        title += f", median {median:.1f} s"
    ax.set(xlabel="track length (m)", ylabel="lap time (s); failures at 0", title=title)
    ax.legend(fontsize=8)
    if reference is not None:
        ax = axes[0, 1]
        theirs = {e["track_id"]: e for e in reference["episodes"] if e["lap_completed"]}
        pairs = [(theirs[e["track_id"]]["lap_time_s"], e["lap_time_s"]) for e in episodes
                 if e["lap_completed"] and e["track_id"] in theirs]
        if pairs:
            ref, mine = zip(*pairs)
            ax.scatter(ref, mine, s=9)
            low, high = min(ref + mine), max(ref + mine)
            ax.plot([low, high], [low, high], "k--", lw=1, label="equal")
            ax.legend(fontsize=8)
        ax.set(xlabel=f"{_plugin_name(reference)} lap time (s)", ylabel="lap time (s)",
               title=f"both lapped: {len(pairs)} tracks")
    fig.tight_layout()
    save_figure(fig, path)
    plt.close(fig)


def _plugin_name(result: dict[str, Any]) -> str:
    """What the picture calls a result's plugin: its ``plugin_name``
    (`racing_env.plugins.Plugin.name`), or for a result written before
    results had one, its directory's name."""
    name = result.get("plugin_name")
    return name if isinstance(name, str) and name.strip() else Path(result["plugin"]).name


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="evaluate", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--controller", type=Path, default=None,
                        help="a controller plugin directory (default: the pure-pursuit reference)")
    parser.add_argument("--level", type=int, choices=(0, 1), default=1,
                        help="0: Level 0's one fixed track; 1: a split's generated tracks (default 1)")
    parser.add_argument("--split", default="validation",
                        help="Level 1's split: train, validation or test (default validation)")
    parser.add_argument("--tracks", type=int_in(1), default=None,
                        help="Level 1 only: the split's first N tracks (default: all of them)")
    parser.add_argument("--episodes", type=int_in(1), default=None,
                        help="Level 0 only: episodes on its fixed track (default 1)")
    parser.add_argument("--backend", choices=BACKEND_NAMES, default=MJX_WARP,
                        help=f"the physics: {MJX_WARP} (default; any number of worlds, on the GPU where there is "
                             f"one) or {CPU_REFERENCE} (MuJoCo C on the CPU, one world)")
    parser.add_argument("--worlds", type=int_in(1), default=None,
                        help=f"worlds at once (default: 1 on {CPU_REFERENCE}; on {MJX_WARP} one a track, at most "
                             f"1,024, or {ISOLATED_WORLDS} isolated without --batched: a process a world)")
    parser.add_argument("--seed", type=int_in(0, SEED_END, "2**32"), default=0,
                        help="the env's root reset seed, in [0, 2**32) (default 0)")
    parser.add_argument("--isolate", action=argparse.BooleanOptionalAction, default=None,
                        help="each controller in a child process (default: on for Level 1, off for Level 0)")
    parser.add_argument("--call-timeout", type=float_in(0, 3600), default=None, metavar="S",
                        help="isolated: the wall-clock limit of one controller call, s (default 5)")
    parser.add_argument("--start-timeout", type=float_in(0, 3600), default=None, metavar="S",
                        help="isolated: the limit of an episode's start (process, import, constructor), s (default 60)")
    parser.add_argument("--memory-limit", type=int_in(1024), default=None, metavar="MB",
                        help="isolated: a controller process's memory limit (RLIMIT_DATA), MiB (default 4096)")
    parser.add_argument("--batched", action="store_true",
                        help="drive the plugin's BatchController, every world in one call a step (isolated: in "
                             "one child process)")
    parser.add_argument("--out", type=Path, default=None,
                        help="write the JSON result here (episodes appended to its .episodes.jsonl as they end)")
    parser.add_argument("--plot", type=Path, default=None,
                        help="draw the result here, in the format its suffix names (.png, .pdf, .svg, ...)")
    parser.add_argument("--reference", type=Path, default=None, help="a reference JSON result for the picture")
    parser.add_argument("--from-result", type=Path, default=None,
                        help="read an existing JSON result instead of running: its summary printed, drawn with "
                             "--plot, copied with --out")
    add_view_arguments(parser)
    add_verbose_argument(parser)
    args = parser.parse_args(argv)
    _check_options(parser, args)
    check_view_arguments(parser, args)
    if args.from_result is None and args.level == 1:  # Level 0's one track needs no pool
        from racing_stack.pools import cache_dir_for

        cache_dir_for(parser)  # an empty $RACING_STACK_CACHE would build the pools into the working folder
    from matplotlib.backend_bases import FigureCanvasBase
    from racing_env import ProjectConfig
    from racing_env.isolation import Isolation
    from racing_env.plugins import PluginError, load_plugin
    from racing_env.render import RECORD_SUFFIXES

    if args.controller is not None and args.from_result is None:
        try:  # its files only: an isolated run imports its code in a child
            load_plugin(args.controller, import_code=False)
        except PluginError as error:
            parser.error(f"argument --controller: {error}")

    pictures = {f".{kind}" for kind in FigureCanvasBase.get_supported_filetypes()}
    journal_path = None if args.out is None or _special(args.out) else episodes_file(args.out)
    pipes = check_outputs(parser, {"--out": args.out, "--out's episodes": journal_path, "--plot": args.plot,
                                   "--record": args.record}, {"--plot": pictures, "--record": RECORD_SUFFIXES},
                          pipes=("--out", "--out's episodes"))
    # Whatever ends the command closes what it holds open: a pipe (its reader sees the end), the view.
    with contextlib.ExitStack() as held:
        for pipe in pipes.values():
            held.enter_context(pipe)
        limits = {name: value for name, value in (("call_timeout_s", args.call_timeout),
                                                  ("start_timeout_s", args.start_timeout),
                                                  ("memory_limit_mb", args.memory_limit)) if value is not None}
        try:
            isolation = Isolation(**limits)
        except ValueError as error:  # beyond what the child's limit can hold
            parser.error(f"argument --memory-limit: {error}")
        reference = None if args.reference is None else _read_result(parser, "--reference", args.reference,
                                                                      drawn=False)
        quiet_warp(args.verbose)
        status, journal, view = 0, None, None
        if args.from_result is not None:
            result = _read_result(parser, "--from-result", args.from_result, drawn=True)
        else:
            try:
                view = open_view(args, ProjectConfig())
            except (ValueError, RuntimeError, ImportError) as error:
                print(f"evaluate: {error}", file=sys.stderr)
                return 2
            if view is not None:
                held.enter_context(view)
            if journal_path is not None:
                journal = Journal(journal_path, "evaluate", pipes.get("--out's episodes"))
            ran = _run(args, isolation, view, journal)
            if ran is None:
                return 2
            result, status = ran
        printed = {k: result[k] for k in _SUMMARY_KEYS}
        if result.get("interrupted"):
            printed["interrupted"] = True
        print(json.dumps(printed, indent=2), flush=True)  # before any file: a failed write cannot lose it
        if journal is not None:
            journal.finish(result["episodes"])
        # Each write: what it is, where, how, and what the line saying it was written adds.
        writes: list[tuple[str, Path, Callable[[], object], Callable[[], str]]] = []
        if args.out is not None:
            text = json.dumps(result, indent=1) + "\n"
            beside = "" if journal is None else f" (its episodes, one a line, in {str(journal_path)!r})"
            writes.append(("the result", args.out, lambda: write_output(args.out, text, pipes.get("--out")),
                           lambda: beside))
        if args.plot is not None:
            writes.append(("the picture", args.plot, lambda: draw(result, args.plot, reference), lambda: ""))
        if view is not None and view.record is not None:
            writes.append(("the recording", view.record, view.close,
                           lambda: f" ({view.frames_recorded} frames at {view.record_fps:g} frames/s)"))
        with contextlib.redirect_stdout(sys.stderr):
            for what, path, write, said in writes:
                try:
                    write()
                except (OSError, RuntimeError) as error:  # a full disk, a pipe whose reader left, ffmpeg's failure
                    say_not_written("evaluate", what, path, error)
                    status = status or 1
                else:
                    print(f"evaluate: wrote {what} to {str(path)!r}{said()}", file=sys.stderr)
    return status


def _run(args: argparse.Namespace, isolation: Isolation, view: EpisodeView | None,
         journal: Journal | None) -> tuple[dict[str, Any], int] | None:
    """Run the options' plugin: its result and the exit status (0; 1 when
    every episode ended with a controller error; 130 after Ctrl-C, the
    result partial), world 0's episodes drawn to ``view`` (left open) and
    each ended episode written to ``journal``; None after saying why the
    plugin or the options cannot run (a usage error)."""
    from racing_env.plugins import PluginError

    def progress(ended: int, total: int) -> None:
        if ended == total or ended % max(1, total // 20) == 0:
            print(f"evaluate: {ended}/{total} episodes ended", file=sys.stderr)

    status = 0
    try:
        # stdout carries the JSON summary only: what the libraries print goes to stderr.
        # A Ctrl-C dropped in a GC callback is raised again.
        with contextlib.redirect_stdout(sys.stderr), ctrl_c_not_lost():
            say_gpu_backend_on_cpu("evaluate", args.backend)
            record = None if journal is None else (lambda episode: journal.write(dataclasses.asdict(episode)))
            result = evaluate(args.controller, args.level, args.split, args.tracks, args.episodes,
                              args.backend, args.worlds, args.seed, progress, view, args.isolate,
                              isolation, record, on_build=lambda line: print(f"evaluate: {line}", file=sys.stderr),
                              batched=args.batched)
    except PluginError as error:  # the plugin, or its BatchController that --batched asks for
        flag = "--batched" if args.batched and "BatchController" in str(error) else "--controller"
        print(f"evaluate: argument {flag}: {error}", file=sys.stderr)
        return None
    except ValueError as error:
        print(f"evaluate: {error}", file=sys.stderr)
        return None
    except Interrupted as stop:
        result, status = report_interrupted("evaluate", stop)
    return result, status or said_controller_errors("evaluate", result)


def _check_options(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """Refuse, as a usage error naming it, an option this run would ignore
    or could not meet: ``--tracks`` on Level 0, ``--episodes`` on Level 1,
    a split that does not exist or has fewer tracks, more worlds than
    episodes (or than one on a one-world backend), an isolated
    controller's limit on a run that is not isolated; then give
    ``--episodes`` its default, 1."""
    from racing_env.backends import backend_type

    from racing_stack.pools import SPLITS

    if args.level == 0 and args.tracks is not None:
        parser.error("argument --tracks: Level 1 only (a split's first N tracks): Level 0 has one fixed track; "
                     "--episodes N drives it N times")
    if args.level == 1 and args.episodes is not None:
        parser.error("argument --episodes: Level 0 only (runs of its fixed track): Level 1 drives each track of "
                     "its split once; --tracks N drives the first N")
    if args.episodes is None:
        args.episodes = 1
    episodes = args.episodes
    if args.level == 1:
        if args.split not in SPLITS:
            parser.error(f"argument --split: must be one of {', '.join(SPLITS)}, got {args.split!r}")
        size = SPLITS[args.split].size
        if args.tracks is not None and args.tracks > size:
            parser.error(f"argument --tracks: the {args.split} split holds {size} tracks, got {args.tracks}")
        episodes = args.tracks or size
    if args.worlds is not None:
        if backend_type(args.backend).one_world and args.worlds != 1:
            parser.error(f"argument --worlds: {args.backend} runs one world, got {args.worlds}")
        if args.worlds > episodes:
            parser.error(f"argument --worlds: at most one world an episode ({episodes} in this run), got {args.worlds}")
    isolated = args.isolate if args.isolate is not None else args.level == 1
    for flag, value in (("--call-timeout", args.call_timeout), ("--start-timeout", args.start_timeout),
                        ("--memory-limit", args.memory_limit)):
        if value is not None and not isolated:
            why = "--no-isolate" if args.isolate is False else "Level 0 runs unisolated unless --isolate"
            parser.error(f"argument {flag}: limits an isolated controller, and this run is not isolated ({why})")


def _special(out: Path) -> bool:
    """Whether ``out`` is no file of its own (/dev/null, a pipe), which gets
    no episodes file beside it (a name the system refuses is left to
    `check_outputs`)."""
    try:
        return out.exists() and not out.is_file()
    except OSError:
        return False


def _read_result(parser: argparse.ArgumentParser, flag: str, path: Path, drawn: bool) -> dict[str, Any]:
    """The JSON result in ``path``, or a usage error naming ``flag``: a
    regular file holding a result whose episodes give what `draw` reads
    (and, where the result itself is ``drawn``, its summary and track
    lengths; else it is a reference: its plugin)."""
    try:
        if not path.is_file():  # a pipe would wait for a writer
            raise OSError(f"{str(path)!r} is not a regular file")
        result = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError, RecursionError) as error:
        parser.error(f"argument {flag}: cannot read a JSON result from {str(path)!r} ({error})")
    problem = _result_problem(result, drawn)
    if problem:
        parser.error(f"argument {flag}: {str(path)!r} is not an evaluate result ({problem})")
    return result


def _result_problem(result: Any, drawn: bool) -> str | None:
    """What keeps ``result`` (parsed JSON) from being a result `draw` can
    read (``drawn``) or use as a reference, or None."""
    if not isinstance(result, dict):
        return "not a JSON object"
    keys = (*_SUMMARY_KEYS, "episodes", "track_length_m") if drawn else ("plugin", "episodes")
    missing = [k for k in keys if k not in result]
    if missing:
        return f"no {', '.join(missing)}"
    if not isinstance(result["plugin"], str):
        return "plugin is not a string"
    episodes = result["episodes"]
    real = (int, float)
    fields = {"track_id": int, "termination_reason": str, "lap_completed": bool, "lap_time_s": (*real, type(None))}
    if not isinstance(episodes, list) or not all(
            isinstance(e, dict) and all(isinstance(e.get(k), kind) for k, kind in fields.items())
            and (isinstance(e["lap_time_s"], real) or not e["lap_completed"]) for e in episodes):
        return f"episodes must be a list of objects with {', '.join(fields)} (a lap time where lapped)"
    if not drawn:
        return None
    lengths, summary = result["track_length_m"], result["summary"]
    if not isinstance(lengths, dict) or not all(isinstance(lengths.get(str(e["track_id"])), real) for e in episodes):
        return "track_length_m must give each episode's track length"
    if not (isinstance(summary, dict) and isinstance(summary.get("success_rate"), (*real, type(None)))
            and isinstance(summary.get("lap_time_s"), dict)
            and isinstance(summary["lap_time_s"].get("median"), (*real, type(None)))):
        return "summary must hold success_rate and lap_time_s's median"
    return None


if __name__ == "__main__":
    sys.exit(main())
