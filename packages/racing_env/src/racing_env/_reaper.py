"""The evaluating process's reaper: a small process of its own session
that kills the isolated children's process groups still alive when the
evaluating process ends, however it ends (SIGKILL included, when none of
its code runs). The kernel kills the children themselves then
(``PR_SET_PDEATHSIG``); the reaper takes what they started, which stays in
their groups (`racing_env._seccomp` refuses ``setsid`` and ``setpgid``
there).

The evaluating process tells it ``+PGID`` when a child starts and
``-PGID`` once it has killed that group itself; the end of its pipe (the
evaluating process gone: the kernel closes the pipe) is the signal to
kill the groups left.
"""

from __future__ import annotations

import atexit
import os
import subprocess
import sys
import threading

__all__ = ["REAPER"]

#: The reaper's code (run with ``python -I -S -c``: nothing imported but the standard library's core).
_CODE = r"""
import os, signal, sys
signal.signal(signal.SIGINT, signal.SIG_IGN)
groups = set()
for line in sys.stdin.buffer:
    try:
        sign, group = line[:1], int(line[1:])
    except ValueError:
        continue
    if sign == b"+":
        groups.add(group)
    elif sign == b"-":
        groups.discard(group)
for group in groups:
    try:
        os.killpg(group, signal.SIGKILL)
    except OSError:
        pass
"""


class _Reaper:
    """This process's reaper, started on first use (again after a fork, or
    if it has died: the groups registered are told to the new one)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._process: subprocess.Popen | None = None
        self._owner = 0
        self._groups: set[int] = set()
        atexit.register(self._close)
        # A forked copy of this process must not hold the pipe open: the reaper waits for its end.
        os.register_at_fork(after_in_child=self._forget)

    def pid(self) -> int:
        """The reaper's process id (started if need be)."""
        with self._lock:
            return self._running().pid

    def watch(self, group: int) -> None:
        """Kill process group ``group`` if this process ends before `release`."""
        with self._lock:
            self._groups.add(group)
            self._tell(f"+{group}\n")

    def release(self, group: int) -> None:
        """Forget ``group`` (this process has killed it)."""
        with self._lock:
            self._groups.discard(group)
            self._tell(f"-{group}\n")

    def _running(self) -> subprocess.Popen:
        if self._process is None or self._owner != os.getpid() or self._process.poll() is not None:
            if self._owner != os.getpid():
                self._groups.clear()  # a forked copy: the groups are the parent's
            self._process = subprocess.Popen([sys.executable, "-I", "-S", "-c", _CODE], stdin=subprocess.PIPE,
                                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                             start_new_session=True)
            self._owner = os.getpid()
            self._send("".join(f"+{group}\n" for group in self._groups))
        return self._process

    def _tell(self, line: str) -> None:
        self._running()
        if not self._send(line):  # it died since: a new one, told every group
            self._process.wait()
            self._running()

    def _send(self, text: str) -> bool:
        if not text:
            return True
        try:
            self._process.stdin.write(text.encode())
            self._process.stdin.flush()
        except OSError:
            return False
        return True

    def _forget(self) -> None:
        """In a forked child: close the copy of the pipe, keep no groups."""
        if self._process is not None and self._process.stdin is not None:
            try:
                self._process.stdin.close()  # this copy's descriptor only; nothing is buffered
            except OSError:
                pass
        self._process, self._owner, self._groups = None, 0, set()
        self._lock = threading.Lock()  # another thread may have held it at the fork

    def _close(self) -> None:
        """At a normal exit: end the pipe and wait for the reaper to finish."""
        with self._lock:
            if self._process is not None and self._owner == os.getpid():
                try:
                    self._process.stdin.close()
                except OSError:
                    pass
                try:
                    self._process.wait(timeout=5.0)
                except subprocess.TimeoutExpired:
                    self._process.kill()


#: The reaper of this process's isolated children.
REAPER = _Reaper()
