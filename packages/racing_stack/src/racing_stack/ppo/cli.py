"""``train-ppo``: PPO on Level 1's Train pool, exported as a plugin.

    python -m racing_stack.ppo [--preset cpu|gpu] [--out DIR] [--updates N] [--resume]
    torchrun --nproc-per-node N -m racing_stack.ppo ...   # one process per GPU, --worlds each
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib.util
import sys
from collections.abc import Callable
from pathlib import Path

from racing_stack import levels, pools
from racing_stack._cli import add_verbose_argument, check_folder, ctrl_c_not_lost, folder_path, quiet_warp
from racing_stack.ppo import checkpoint, distributed, train
from racing_stack.ppo.checkpoint import whole_config
from racing_stack.ppo.config import PRESETS, PPOConfig
from racing_stack.ppo.envs import make_env, make_validation_env
from racing_stack.ppo.export import export_plugin
from racing_stack.ppo.logs import draw_curve
from racing_stack.ppo.train import RUN_FILES, GuardError, Trainer

__all__ = ["finish", "main"]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="train-ppo", description=train.__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--preset", choices=sorted(PRESETS), default="cpu",
                        help="the settings to start from: cpu (a short run on the CPU) or gpu (the recipe that "
                             "learns Level 1, on one GPU) (default cpu)")
    parser.add_argument("--out", type=folder_path, default=Path("runs/ppo"), help="the run's folder (default runs/ppo)")
    parser.add_argument("--updates", type=int, default=None,
                        help="the run's number of updates (default: the preset's, "
                             + ", ".join(f"{name} {preset.updates}" for name, preset in sorted(PRESETS.items())) + ")")
    parser.add_argument("--resume", action="store_true",
                        help="continue from OUT/checkpoint.pt, to --updates (not the first run's --updates: "
                             "give it again)")
    parser.add_argument("--overwrite", action="store_true", help="delete the run already in OUT and start anew")
    parser.add_argument("--set", action="append", default=[], metavar="NAME=VALUE",
                        help="override a preset's setting, e.g. --set learning_rate=1e-4 "
                             "--set reward.off_track_penalty=4.0 (repeatable)")
    parser.add_argument("--timeout", type=float, default=600.0, metavar="S",
                        help="under torchrun: how long a process waits for the others in one exchange before "
                             "it stops with an error (default 600 s)")
    add_verbose_argument(parser)
    args = parser.parse_args(argv)
    config = _config(parser, args)
    pools.cache_dir_for(parser)  # an empty $RACING_STACK_CACHE would build the pools into the working folder
    if not 0 < args.timeout <= 86400:  # NaN and inf too
        parser.error(f"argument --timeout: must be in (0, 86400] seconds, got {args.timeout}")
    group = distributed.start(args.timeout)  # before JAX picks its GPU
    try:
        return _train(parser, args, config, group)
    finally:
        distributed.stop()


def _train(parser: argparse.ArgumentParser, args: argparse.Namespace, config: PPOConfig,
           group: distributed.Group) -> int:
    """The run of `main`, in this process of ``group``; its exit status."""
    resumed = _check_out(parser, args, whole_config(config, group))
    quiet_warp(args.verbose)
    say = (lambda text: print(f"train-ppo: {text}", file=sys.stderr, flush=True)) if group.lead else \
        (lambda text: None)
    if resumed == config.updates:
        say(f"the run in {args.out} was already complete (all {config.updates} updates): --resume trains nothing "
            "and only exports it again (the plugin, the curve, the video)")
    say(f"building the envs ({config.worlds} worlds on Level 1's Train pool"
        + (f", in each of {group.size} processes)" if group.size > 1 else ")"))
    trainer = None
    try:
        with ctrl_c_not_lost():  # a Ctrl-C raised inside a garbage collector callback is raised again
            try:
                validation = make_validation_env(config) if config.validate_every and group.lead else None
                trainer = Trainer(config, make_env(config, group), args.out, validation=validation, group=group)
            except ValueError as error:  # e.g. more worlds than this machine's memory holds: refused before any
                parser.error(f"the envs cannot be built: {error}")
            try:
                trainer.run(resume=args.resume, overwrite=args.overwrite)
            except ValueError as error:  # CorruptFile too
                if not args.resume or trainer.saved_update is not None:
                    raise
                parser.error(f"argument --resume: {error}")  # the checkpoint's fields, checked against the env
            except GuardError as error:
                say(str(error))
                return 1
            except OSError as error:
                say(f"{error}; {trainer.last_checkpoint()}")
                return 1
            except RuntimeError as error:  # another process stopped: the collective failed or timed out
                if group.size == 1:
                    raise
                print(f"train-ppo: process {group.rank} of {group.size} stopped at update {trainer.update}: the "
                      f"other processes stopped answering ({type(error).__name__}: {str(error)[:200]}); "
                      f"{trainer.last_checkpoint()}", file=sys.stderr)
                return 1
            if group.lead:
                if trainer.best is not None:
                    say(f"exporting update {trainer.best['update']}'s policy (validation success "
                        f"{trainer.best['validation_success_rate']:.3f})")
                try:
                    made = finish(trainer, say=say)
                except OSError as error:  # a full disk: each file is whole or as it was (written atomically)
                    say(f"the export failed: {error}; the run's last checkpoint (update {trainer.saved_update}) is "
                        "whole, the plugin, the curve or the video may not be: --resume, once there is room, "
                        "exports them again")
                    return 1
                for name, path in made.items():
                    say(f"{name} {path}")
    except KeyboardInterrupt:
        where = "before training" if trainer is None else f"at update {trainer.update}"
        if trainer is not None and trainer.saved_update is not None:
            then = f"--resume continues from the last checkpoint (update {trainer.saved_update})"
        elif args.resume:
            then = "its checkpoint is as it was: --resume continues from it"
        else:
            then = "no checkpoint was written yet: start it again (--overwrite replaces what it wrote)"
        print(f"train-ppo: interrupted {where}; {then}", file=sys.stderr)
        return 130
    return 0


#: What `finish` draws, the modules it needs, and the extra that brings them.
EXTRAS = {"curve": (("matplotlib",), "racing-stack[train]"), "video": (("pygame", "PIL"), "racing-stack[train]")}


def finish(trainer: Trainer, video_steps: int = 1500,
           say: Callable[[str], None] = lambda text: print(f"train-ppo: {text}", file=sys.stderr)) -> dict[str, Path]:
    """After a run: the best validated policy's plugin (``out/plugin``,
    named after the run, ``out``'s folder name, which the video's caption
    and `racing_stack.evaluate`'s picture show), the learning curve
    (``out/learning_curve.png``) and one recorded episode of the plugin on
    Train row 0 (``out/policy.gif``, at most ``video_steps`` steps). A
    picture whose modules are not installed (`EXTRAS`) is skipped, and
    ``say`` names it with the extra that brings it; the plugin is always
    exported.

    Returns:
        What was made, by name ("plugin", "curve", "video").
    """
    from racing_env.plugins import load_plugin

    out = trainer.out
    made = {"plugin": export_plugin(trainer.best_policy(), trainer.config, out / "plugin", name=out.resolve().name)}
    if _installed("curve", say):
        draw_curve(out / "log.csv", out / "learning_curve.png")
        made["curve"] = out / "learning_curve.png"
    if _installed("video", say):
        from racing_env.render import EpisodeView
        from racing_env.runner import run

        env = levels.level_env(1, levels.timed("ppo-video", video_steps), track=trainer.env.track_pool.track(0),
                               backend="cpu_reference")
        with EpisodeView(env.config.control_dt_s, record=out / "policy.gif", size=(480, 360)) as view:
            run(load_plugin(made["plugin"]), env, episodes=1, view=view)
        made["video"] = out / "policy.gif"
    return made


def _installed(picture: str, say: Callable[[str], None]) -> bool:
    """Whether the modules that draw ``picture`` (`EXTRAS`) are installed; if not, ``say`` names them."""
    modules, extra = EXTRAS[picture]
    missing = [m for m in modules if importlib.util.find_spec(m) is None]
    if missing:
        say(f"no {picture}: {', '.join(missing)} not installed (pip install '{extra}' brings it)")
    return not missing


def _config(parser: argparse.ArgumentParser, args: argparse.Namespace) -> PPOConfig:
    """The preset with ``--updates`` and ``--set`` applied; a bad one is a usage error naming its flag."""
    config = PRESETS[args.preset]
    if args.updates is not None:
        try:
            config = dataclasses.replace(config, updates=args.updates)
        except ValueError as error:
            parser.error(f"argument --updates: {error}")
    try:
        return config.override(args.set)
    except ValueError as error:
        parser.error(f"argument --set: {error}")


def _check_out(parser: argparse.ArgumentParser, args: argparse.Namespace, config: PPOConfig) -> int | None:
    """Refuse, before any work, an ``--out`` that cannot hold the run, a run
    there that would be overwritten, and a ``--resume`` that cannot resume.
    Returns the update ``--resume`` continues after where its checkpoint
    holds an int there (its fields are checked once the env is built);
    None otherwise, and without ``--resume``."""
    out: Path = args.out
    if args.resume and args.overwrite:
        parser.error("--resume and --overwrite exclude each other")
    check_folder(parser, "--out", out)  # a file, under a file, read-only, a name the system refuses
    if args.resume and not (out / "checkpoint.pt").is_file():
        parser.error(f"argument --resume: {out} holds no checkpoint.pt to continue from")
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as error:
        parser.error(f"argument --out: {out} cannot be created: {error.strerror}")
    found = [name for name in RUN_FILES if (out / name).exists()]
    if args.resume:
        try:
            state = checkpoint.read(out / "checkpoint.pt", config, distributed.Group())  # config is the whole run's
        except ValueError as error:  # CorruptFile too
            parser.error(f"argument --resume: {error}")
        except OSError as error:
            parser.error(f"argument --resume: {out / 'checkpoint.pt'} cannot be read: {error.strerror}")
        update = state.get("update")
        return update if type(update) is int else None
    if found and not args.overwrite:
        resumable = "pass --resume to continue it or " if "checkpoint.pt" in found else "it has no checkpoint; pass "
        parser.error(f"argument --out: {out} already holds a run ({', '.join(found)}): {resumable}--overwrite to "
                     "replace it")

