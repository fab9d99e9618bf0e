"""The episodes file of a run (``evaluate --out FILE``'s
``FILE.episodes.jsonl``): each episode as a JSON line as it ends, so that a
killed run leaves its ended episodes on disk. A write that fails is said
once and the run goes on without the file: its result holds every episode."""

from __future__ import annotations

import contextlib
import json
import os
import stat
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, TextIO

__all__ = ["Journal"]


class Journal:
    """Episodes appended to ``path`` (one JSON object a line, flushed) as
    they end.

    The file is opened at the first line, so a run refused before any
    episode ends leaves an earlier run's file as it was; ``pipe`` is the
    named pipe `racing_stack._cli.check_outputs` opened for it instead. A
    write that fails (a full disk, a pipe whose reader left) is said once
    on stderr, naming the file, and the journal writes nothing more: the
    run goes on, and its result holds every episode.

    Args:
        path: the file.
        prog: the command, which the warning names.
        pipe: ``path`` already opened to write, where it is a named pipe.
    """

    def __init__(self, path: Path, prog: str, pipe: TextIO | None = None) -> None:
        self.path = path
        self.prog = prog
        self.failed = False
        self._file = pipe
        self._lines = 0

    def write(self, episode: Mapping[str, Any]) -> None:
        """Append ``episode`` (an ended episode's JSON object) as one line."""
        if self.failed:
            return
        try:
            file = self._open()
            file.write(json.dumps(episode) + "\n")
            file.flush()
        except OSError as error:
            self._fail(error)
            return
        self._lines += 1

    def finish(self, episodes: Sequence[Mapping[str, Any]]) -> None:
        """Make the file hold exactly ``episodes`` (the result's: a Ctrl-C
        may have fallen between an episode's end and its line), then close
        it: a regular file is rewritten, a pipe or a device gets the lines
        it has not had."""
        if self.failed:
            return
        try:
            file = self._open()
            written = self._lines
            if stat.S_ISREG(os.fstat(file.fileno()).st_mode):
                file.seek(0)
                file.truncate()
                written = 0
            file.write("".join(json.dumps(e) + "\n" for e in episodes[written:]))
            file.close()
        except OSError as error:
            self._fail(error)

    def _open(self) -> TextIO:
        """The file, opened (created or emptied) at its first use."""
        if self._file is None:
            self._file = self.path.open("w", encoding="utf-8")
        return self._file

    def _fail(self, error: OSError) -> None:
        """Say that the file cannot be written, once, and close it."""
        self.failed = True
        print(f"{self.prog}: could not write the episodes file {str(self.path)!r} ({error.strerror or error}); "
              "the run goes on without it, its result holds every episode", file=sys.stderr)
        if self._file is not None:
            with contextlib.suppress(OSError):  # closing flushes the unwritten text again
                self._file.close()
