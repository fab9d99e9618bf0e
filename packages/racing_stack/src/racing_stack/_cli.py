"""What the command lines share: the checks before any work (a bad number
or an output file that cannot be written is a usage error, exit 2, naming
its flag), the writes after it (`write_output`: a failed one is a line
on stderr, not a traceback), the end of a run that Ctrl-C stopped (its
partial result, exit 130) and a Ctrl-C that is not lost
(`ctrl_c_not_lost`)."""

from __future__ import annotations

import argparse
import contextlib
import errno
import math
import os
import signal
import sys
import tempfile
import threading
import warnings
from collections.abc import Callable, Collection, Iterator, Mapping
from pathlib import Path
from typing import Any, TextIO

__all__ = ["SEED_END", "INTERRUPTED_STATUS", "Interrupted", "int_in", "float_in", "check_outputs", "check_folder",
           "folder_path", "write_output", "say_not_written", "add_verbose_argument", "quiet_warp",
           "say_gpu_backend_on_cpu",
           "report_interrupted", "ctrl_c_not_lost", "keep_early_ctrl_c"]

#: Reset seeds are one uint32 SeedSequence word: ``[0, 2**32)``.
SEED_END = 2**32
#: A command's exit status after Ctrl-C (128 + SIGINT, what a shell reports).
INTERRUPTED_STATUS = 130


class Interrupted(KeyboardInterrupt):
    """Ctrl-C stopped a command's run (`evaluate`, `sim`): ``result`` is its
    JSON result of the episodes that had ended (``"interrupted": true``)."""

    def __init__(self, result: dict[str, Any]) -> None:
        super().__init__(f"interrupted after {len(result['episodes'])} ended episodes")
        self.result = result


def report_interrupted(prog: str, stop: Interrupted) -> tuple[dict[str, Any], int]:
    """Say on stderr that Ctrl-C stopped ``prog``'s run; returns the partial
    result to write and print, and the exit status (`INTERRUPTED_STATUS`)."""
    print(f"{prog}: interrupted; the result holds the episodes that had ended, {len(stop.result['episodes'])} "
          '("interrupted": true)', file=sys.stderr)
    return stop.result, INTERRUPTED_STATUS


#: While `keep_early_ctrl_c`'s recorder is installed: (the recorder, the hook it wraps).
_early: list[tuple[Callable[[Any], None], Callable[[Any], None]]] = []
#: Set when the recorder saw a Ctrl-C dropped.
_dropped_early = threading.Event()


def keep_early_ctrl_c() -> None:
    """From now until the first `ctrl_c_not_lost` block begins, remember a
    Ctrl-C that Python drops (as that block would see it); the block then
    raises it at once. A command's start imports JAX, which registers a
    garbage collector callback, and then much else: a Ctrl-C pressed then
    could land in the callback and be dropped before any block is there
    to see it, and the command would run to its end. ``racing_stack``
    calls this when it is imported to run one of its modules (``python
    -m racing_stack.<command>``), before the command's imports."""
    if _early:
        return
    wrapped = sys.unraisablehook

    def record(unraisable: Any) -> None:
        try:
            wrapped(unraisable)
        finally:  # seen even if printing it is interrupted
            if isinstance(unraisable.exc_value, KeyboardInterrupt):
                _dropped_early.set()

    _early.append((record, wrapped))
    sys.unraisablehook = record


def _take_early_ctrl_c() -> bool:
    """Remove `keep_early_ctrl_c`'s recorder; whether it saw a drop."""
    if _early:
        record, wrapped = _early.pop()
        if sys.unraisablehook is record:
            sys.unraisablehook = wrapped
    dropped = _dropped_early.is_set()
    _dropped_early.clear()
    return dropped


@contextlib.contextmanager
def ctrl_c_not_lost() -> Iterator[None]:
    """Within the block, a Ctrl-C (SIGINT) that Python drops is raised
    again. Python raises `KeyboardInterrupt` in whatever code runs next,
    and one raised inside a garbage collector callback (JAX registers
    one), a ``__del__`` or a weakref callback is printed ("Exception
    ignored ...", a traceback) and dropped: without the guard the command
    would run on as if the key had not been pressed. The guard sees the
    drop (through `sys.unraisablehook`, without the traceback: the
    Ctrl-C is not lost, so its drop is not news) and sends the main thread
    SIGINT again (a real signal: it also wakes a blocking wait), so that
    the next code raises it. A Ctrl-C that was not dropped is raised once,
    as by Python's own handler, so the code that handles it (a partial
    result written, a recording closed) is not cut short by a repeat; one
    that C code clears without reporting it is not seen (the Runner stops
    on the `SystemError` CPython makes of one inside a C callback). Once
    the block has ended by a `KeyboardInterrupt`, later Ctrl-Cs are
    ignored (the command is on its way out). Nothing changes where SIGINT
    is not Python's default (ignored in a background job, or handled by
    the caller) or off the main thread. A Ctrl-C dropped before the block
    while `keep_early_ctrl_c` was watching is raised in the block, at once."""
    if threading.current_thread() is not threading.main_thread() or \
            signal.getsignal(signal.SIGINT) is not signal.default_int_handler:
        yield
        return
    early = _take_early_ctrl_c()
    pressed, redo, in_hook, ended = (threading.Event() for _ in range(4))
    print_unraisable = sys.unraisablehook
    main = threading.main_thread().ident

    def handler(signum: int, frame: Any) -> None:
        if ended.is_set():  # pressed while the block is being left
            return
        pressed.set()
        if in_hook.is_set():  # raised inside the hook it would be dropped unseen: raised again after it
            redo.set()
            return
        raise KeyboardInterrupt

    def dropped(unraisable: Any) -> None:
        in_hook.set()
        try:
            if pressed.is_set() and isinstance(unraisable.exc_value, KeyboardInterrupt):
                redo.set()  # raised again (not from here: the handler would raise inside this hook), no traceback
            else:  # anything else, a KeyboardInterrupt of other code's too: Python's report
                print_unraisable(unraisable)
        finally:
            in_hook.clear()

    def again() -> None:
        while redo.wait() and not ended.is_set():
            redo.clear()
            signal.pthread_kill(main, signal.SIGINT)

    stopped = False
    signal.signal(signal.SIGINT, handler)
    sys.unraisablehook = dropped
    threading.Thread(target=again, name="ctrl-c-again", daemon=True).start()
    if early:
        pressed.set()
        redo.set()
    try:
        yield
    except KeyboardInterrupt:
        stopped = True
        raise
    finally:
        ended.set()
        redo.set()
        if sys.unraisablehook is dropped:
            sys.unraisablehook = print_unraisable
        signal.signal(signal.SIGINT, (lambda signum, frame: None) if stopped else signal.default_int_handler)


def int_in(low: int, end: int | None = None, end_text: str | None = None) -> Callable[[str], int]:
    """An argparse ``type``: an integer in ``[low, end)`` (no upper bound
    when ``end`` is None; ``end_text`` spells it in the message)."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"must be an integer, got {text!r}") from None
        if value < low or (end is not None and value >= end):
            bound = f"[{low}, {end_text or end})" if end is not None else f">= {low}"
            raise argparse.ArgumentTypeError(f"must be {'in ' if end is not None else ''}{bound}, got {value}")
        return value

    return parse


def float_in(low: float, high: float, *, low_open: bool = True) -> Callable[[str], float]:
    """An argparse ``type``: a finite number in ``(low, high]`` (``[low,
    high]`` where not ``low_open``)."""

    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"must be a number, got {text!r}") from None
        above_low = low < value if low_open else low <= value
        if not (math.isfinite(value) and above_low and value <= high):
            raise argparse.ArgumentTypeError(f"must be in {'(' if low_open else '['}{low:g}, {high:g}], got {text}")
        return value

    return parse


def add_verbose_argument(parser: argparse.ArgumentParser) -> None:
    """Add ``--verbose``: Warp's banner, its line per loaded module and its no-driver line."""
    parser.add_argument("--verbose", action="store_true",
                        help="also print Warp's banner, a line per loaded kernel module and its no-driver line "
                             "(stderr)")


def quiet_warp(verbose: bool) -> None:
    """Warp's info messages (its banner at initialisation, a line per
    loaded module) only when ``verbose``; its warnings and errors always,
    but for its line that a machine has no NVIDIA driver (`track_gen._warp.NO_DRIVER`: a
    CPU machine's normal state, which the commands say in their own
    words where it matters), kept only when ``verbose``.

    Warp 1.18 reads ``warp.config.log_level`` (``warp.config.quiet`` is
    gone and does nothing); call this before anything initialises Warp: it
    initialises Warp itself, so that track_gen and racing_env, which lower
    Warp's default level while it is not initialised, keep this one.
    """
    import warp as wp

    from track_gen._warp import NO_DRIVER, init_without  # here: importing track_gen is no part of --help

    wp.config.log_level = wp.LOG_INFO if verbose else wp.LOG_WARNING
    if verbose:
        wp.set_logger(_WarpToStderr())  # stdout carries the commands' results alone
        wp.init()
    else:
        init_without(NO_DRIVER, wp.init)


class _WarpToStderr:
    """A Warp logger (`warp.set_logger`) that writes its debug and info
    messages (the banner, the line per loaded module) to stderr, where
    Warp's own writes them to stdout; warnings and errors as Warp's own."""

    def debug(self, message: str) -> None:
        sys.stderr.write(message + "\n")

    def info(self, message: str) -> None:
        sys.stderr.write(message + "\n")

    def warning(self, message: str, category=None, stacklevel: int = 1) -> None:
        warnings.warn(message, category, stacklevel=stacklevel + 1)

    def error(self, message: str) -> None:
        sys.stderr.write("Warp Error: " + message + "\n")


def say_gpu_backend_on_cpu(prog: str, backend: str) -> None:
    """Say on stderr, in one line, that ``backend`` (one of
    `racing_env.backend_names.BACKEND_NAMES`) runs on the CPU, and how much
    slower, where it steps on a GPU (`racing_env.backends.Backend.uses_gpu`)
    and JAX has none here (as `racing_env.physics` picks its device); say
    nothing otherwise. Imports JAX.

    The numbers are `docs/racing_env/backends.md`'s and, for one world,
    ``sim``'s lap of seed 42 on a 2-core CPU (46 s on ``mjx_warp``, 10 s on
    ``cpu_reference``).
    """
    from racing_env.backends import backend_type

    if not backend_type(backend).uses_gpu:
        return
    import jax

    if jax.default_backend() == "gpu":
        return
    print(f"{prog}: no GPU here, so {backend} steps on the CPU: 10-30 ms a step whatever the worlds (a GPU steps "
          "1,024 of them in ~1.4 ms), ~5x slower than cpu_reference with one world; --backend cpu_reference runs "
          "MuJoCo C on the CPU instead", file=sys.stderr)


def folder_path(text: str) -> Path:
    """An argparse ``type``: a folder's path (an empty one would be the
    working folder)."""
    if not text.strip():
        raise argparse.ArgumentTypeError(f"must name a folder, got {text!r}")
    return Path(text)


def check_folder(parser: argparse.ArgumentParser, flag: str, folder: Path) -> None:
    """Refuse, as a usage error naming ``flag``, a folder to write in that
    is a file, lies under a file, cannot be
    written in (it, or its nearest existing parent where it is still to be
    made: a temporary file is written there and removed) or that the system
    refuses (a name too long)."""
    try:
        nearest = folder.absolute()
        while not nearest.exists():
            nearest = nearest.parent
        if not nearest.is_dir():
            parser.error(f"argument {flag}: {str(nearest)!r} is a file, not a folder")
        with tempfile.TemporaryFile(dir=nearest):
            pass
    except OSError as error:
        parser.error(f"argument {flag}: cannot write in {str(folder)!r} ({error.strerror or error})")


def check_outputs(parser: argparse.ArgumentParser, outputs: Mapping[str, Path | None],
                  suffixes: Mapping[str, Collection[str]] | None = None,
                  pipes: Collection[str] = ()) -> dict[str, TextIO]:
    """Refuse, as a usage error naming the flag, an output file (flag ->
    path; None: not asked for) without one of its flag's ``suffixes``
    (lower case, with the dot), that is a folder, not a regular file or
    cannot be written, a new one whose folder is a file or cannot be written
    in, a path the system refuses (a name too long), and two outputs that
    are one file; then create the missing folders.

    The folder check writes and removes a temporary file there (or in its
    nearest existing parent, where the folder is still to be made), so a
    read-only file system or missing permission is found, root included.

    A named pipe is an output only of the flags in ``pipes``, whose caller
    writes it through `write_output`: it is opened here, without waiting,
    and kept open to be written, never opened only to be probed (closing
    it would end the input of the process reading it, which would leave,
    and the write after the run would then wait forever for a reader). A
    pipe that no process reads is refused, and so is a pipe given to any
    other flag (its writer opens it by name and would wait for a reader).

    Returns:
        The pipes opened (flag -> a text file to write); the caller writes
        and closes each (`write_output`).
    """
    given = {flag: path for flag, path in outputs.items() if path is not None}
    for flag, path in given.items():
        try:
            _check_output(parser, flag, path, sorted((suffixes or {}).get(flag, ())), flag in pipes)
        except OSError as error:  # a name too long, a loop of links: the system's own refusal
            parser.error(f"argument {flag}: {str(path)!r} cannot be used ({error.strerror or error})")
    seen: dict[str, str] = {}
    for flag, path in given.items():
        same = seen.setdefault(os.path.realpath(path), flag)  # a loop of links resolves to itself, no error
        if same != flag:
            parser.error(f"arguments {same} and {flag} name one file, {str(path)!r}: each needs its own")
    for path in given.values():
        path.absolute().parent.mkdir(parents=True, exist_ok=True)
    opened: dict[str, TextIO] = {}
    for flag, path in given.items():
        if flag in pipes and path.is_fifo():
            try:
                opened[flag] = _open_pipe(path)
            except OSError as error:
                for file in opened.values():
                    file.close()
                if error.errno == errno.ENXIO:
                    parser.error(f"argument {flag}: {str(path)!r} is a pipe that no process reads")
                parser.error(f"argument {flag}: {str(path)!r} cannot be opened ({error.strerror or error})")
    return opened


def write_output(path: Path, text: str, pipe: TextIO | None = None) -> None:
    """Write ``text`` to the output ``path`` (created or emptied), or to
    ``pipe``, the pipe `check_outputs` opened for it, and close it.

    Raises:
        OSError: the write failed (a full disk, a pipe whose reader left).
    """
    file = path.open("w", encoding="utf-8") if pipe is None else pipe
    try:
        file.write(text)
        file.flush()
    except BaseException:
        with contextlib.suppress(OSError):  # closing flushes the unwritten text again: the first error is raised
            file.close()
        raise
    file.close()


def say_not_written(prog: str, what: str, path: Path, error: Exception) -> None:
    """Say on stderr, in one line, that ``prog`` could not write ``what`` to
    ``path``, and why (``error``)."""
    reason = getattr(error, "strerror", None) or str(error).partition("\n")[0] or type(error).__name__
    print(f"{prog}: could not write {what} to {str(path)!r} ({reason})", file=sys.stderr)


def _open_pipe(pipe: Path) -> TextIO:
    """``pipe`` opened to write text, without waiting for a reader.

    Raises:
        OSError: ENXIO where no process reads it, or the system's refusal.
    """
    fd = os.open(pipe, os.O_WRONLY | os.O_NONBLOCK)
    try:
        os.set_blocking(fd, True)  # a full pipe's writes wait for its reader
        return open(fd, "w", encoding="utf-8")
    except BaseException:
        os.close(fd)
        raise


def _check_output(parser: argparse.ArgumentParser, flag: str, path: Path, allowed: list[str], pipe: bool) -> None:
    """`check_outputs` for one output (``pipe``: it may be a named pipe)."""
    if allowed and path.suffix.lower() not in allowed:
        parser.error(f"argument {flag}: must end in one of {', '.join(allowed)}, got {str(path)!r}")
    if path.is_dir():
        parser.error(f"argument {flag}: {str(path)!r} is a folder, not a file")
    if path.is_symlink() and not path.exists():
        try:
            os.stat(path)  # a loop of links raises here (OSError: the caller's usage error)
        except FileNotFoundError:
            pass  # a link to a file still to be made: writing makes it
    if path.exists():
        if path.is_fifo() and not pipe:
            parser.error(f"argument {flag}: {str(path)!r} is a pipe; {flag} is written to a file only")
        if not (path.is_file() or path.is_char_device() or path.is_fifo()):  # /dev/null, /dev/stdout are fine
            parser.error(f"argument {flag}: {str(path)!r} is not a file")
        if not os.access(path, os.W_OK):
            parser.error(f"argument {flag}: {str(path)!r} exists and cannot be written")
        return
    folder = path.absolute().parent
    while not folder.exists():
        folder = folder.parent
    if not folder.is_dir():
        parser.error(f"argument {flag}: {str(folder)!r} is a file, not a folder")
    try:
        with tempfile.TemporaryFile(dir=folder):
            pass
    except OSError as error:
        parser.error(f"argument {flag}: cannot write in {str(folder)!r} ({error.strerror or error})")


def said_controller_errors(prog: str, result: dict[str, Any]) -> int:
    """1, after a line on stderr with the first one, when every episode of
    a run's JSON ``result`` ended with a controller error (none drove:
    the plugin is broken, not the driving); else 0."""
    errors = result["summary"]["controller_errors"]
    if not errors or errors != result["summary"]["episodes"]:
        return 0
    first = next(e["error"] for e in result["episodes"])
    print(f"{prog}: every episode ({errors}) ended with a controller error; the first:\n{first}", file=sys.stderr)
    return 1
