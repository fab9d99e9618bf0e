"""The isolated child's signal guard: a seccomp filter (Linux, x86-64 and
aarch64) that refuses, with ``EPERM``, the system calls by which a plugin
could end, stop or interrupt the evaluating process or those around it:

- signals (``kill``, ``tgkill``, ``rt_sigqueueinfo``,
  ``rt_tgsigqueueinfo``) and process handles (``pidfd_open``) aimed at
  the evaluating process and its threads, its ancestors, the members of
  its process group and its session leader as they are when the child
  starts, its reaper (`racing_env._reaper`), the evaluator's group as a
  whole and every process at once (``kill(-1)``);
- ``tkill`` (a thread by its id alone), ``pidfd_send_signal`` (a handle
  may come from opening ``/proc/PID``), ``ptrace`` and
  ``process_vm_readv``/``process_vm_writev`` (another process's memory),
  whatever their target;
- ``prlimit64`` on another process (an ``RLIMIT_CPU`` signals it);
  ``fcntl`` ``F_SETOWN``/``F_SETOWN_EX`` and ``ioctl`` ``FIOSETOWN``/
  ``SIOCSPGRP`` (a file's events signalling a process), and ``TIOCSTI``
  (typing into a terminal);
- ``setsid`` and ``setpgid``: every process the plugin starts stays in
  the child's session and process group, which the parent kills whole.

Everything else, the plugin's signals to itself and to the processes it
started included, is allowed. The filter holds for every thread of the
child (``SECCOMP_FILTER_FLAG_TSYNC``) and for whatever it starts, and
cannot be lifted (``PR_SET_NO_NEW_PRIVS``). Standard library only (ctypes).
As root the child first gives up every capability for good, and the
evaluating process makes itself not dumpable (`hide_memory`), so that
no child can open its memory (``/proc/PID/mem``). It is a guard against
signals, not a sandbox: the Runner page says what stays open (files the
evaluator later runs, the machine's resources).
"""

from __future__ import annotations

import ctypes
import errno
import os
import platform
import sys

__all__ = ["guard_signals", "hide_memory", "protected"]

# The system call numbers by architecture: the filter checks the architecture first.
_ARCHES = {
    "x86_64": {"audit": 0xC000003E, "seccomp": 317, "prlimit64": 302, "fcntl": 72, "ioctl": 16, "capset": 126,
               "targeted": {"kill": 62, "tgkill": 234, "rt_sigqueueinfo": 129, "rt_tgsigqueueinfo": 297,
                            "pidfd_open": 434},
               "refused": {"tkill": 200, "ptrace": 101, "process_vm_readv": 310, "process_vm_writev": 311,
                           "setsid": 112, "setpgid": 109, "pidfd_send_signal": 424}},
    "aarch64": {"audit": 0xC00000B7, "seccomp": 277, "prlimit64": 261, "fcntl": 25, "ioctl": 29, "capset": 91,
                "targeted": {"kill": 129, "tgkill": 131, "rt_sigqueueinfo": 138, "rt_tgsigqueueinfo": 240,
                             "pidfd_open": 434},
                "refused": {"tkill": 130, "ptrace": 117, "process_vm_readv": 270, "process_vm_writev": 271,
                            "setsid": 157, "setpgid": 154, "pidfd_send_signal": 424}},
}
#: fcntl commands that make a file's events signal a process (F_SETOWN, F_SETOWN_EX).
_FCNTL_OWNERS = (8, 15)
#: ioctl requests that do the same (FIOSETOWN, SIOCSPGRP) or type into a terminal (TIOCSTI).
_IOCTL_REFUSED = (0x8901, 0x8902, 0x5412)
#: The most pids the filter compares (its jumps reach 255 instructions).
_MAX_TARGETS = 240
_LD_W_ABS, _JEQ_K, _JGE_K, _RET_K = 0x20, 0x15, 0x35, 0x06
_RET_ALLOW, _RET_EPERM = 0x7FFF0000, 0x00050000 | errno.EPERM
_X32_BIT = 0x40000000
_PR_SET_NO_NEW_PRIVS, _PR_SET_SECCOMP, _SECCOMP_MODE_FILTER = 38, 22, 2
_SECCOMP_SET_MODE_FILTER, _SECCOMP_FILTER_FLAG_TSYNC = 1, 1
_PR_SET_DUMPABLE, _PR_CAPBSET_DROP, _PR_SET_SECUREBITS, _PR_CAP_AMBIENT, _PR_CAP_AMBIENT_CLEAR_ALL = 4, 24, 28, 47, 4
#: SECBIT_NOROOT, NO_SETUID_FIXUP and KEEP_CAPS_LOCKED, each locked: root regains no capability by exec.
_SECUREBITS = 0b101111
_CAPABILITY_VERSION_3 = 0x20080522
#: Offsets in the kernel's ``struct seccomp_data``: the call's number, its architecture, the low 32 bits of its
#: first and second arguments (little-endian).
_NR, _ARCH, _ARG0, _ARG1 = 0, 4, 16, 24


class _Instruction(ctypes.Structure):
    _fields_ = [("code", ctypes.c_ushort), ("jt", ctypes.c_ubyte), ("jf", ctypes.c_ubyte), ("k", ctypes.c_uint32)]


class _Program(ctypes.Structure):
    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.POINTER(_Instruction))]


def _stat(pid: int) -> tuple[int, int, int] | None:
    """(parent, process group, session) of process ``pid``; None if it is gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as file:
            fields = file.read().rsplit(b")", 1)[1].split()
    except (OSError, IndexError):
        return None
    return int(fields[1]), int(fields[2]), int(fields[3])


def protected(parent: int, also: tuple[int, ...] = ()) -> list[int]:
    """The ``pid`` arguments the filter refuses for the evaluating process
    ``parent``, as the unsigned 32-bit values it compares, the most
    important first (a list cut at `_MAX_TARGETS` keeps them): it, its
    group (negated), -1 (every process), the processes ``also``, its
    session leader, its threads' ids (a thread's id signals its whole
    process), its ancestors and the members of its process group, as they
    are now. Empty where ``parent``'s /proc entry cannot be read."""
    found = _stat(parent)
    if found is None:
        return []
    _, group, session = found
    targets = [parent, -group, -1, *also, session]
    try:
        targets += [int(tid) for tid in os.listdir(f"/proc/{parent}/task") if tid.isdigit()]
    except OSError:
        pass
    pid = parent
    while pid > 1:  # the ancestors: ending one (a shell, a CI runner, `timeout`) ends the run
        stat = _stat(pid)
        if stat is None:
            break
        pid = stat[0]
        targets.append(pid)
    for name in os.listdir("/proc"):
        if name.isdigit():
            stat = _stat(int(name))
            if stat is not None and stat[1] == group:
                targets.append(int(name))
    mine = {0, os.getpid(), -os.getpgrp()}  # the caller itself and its own group (0 too) stay its own
    kept = list(dict.fromkeys(t & 0xFFFFFFFF for t in targets if t not in mine))
    return kept[:_MAX_TARGETS]


def _program(arch: dict, targets: list[int]) -> list[tuple[int, int, int, int]]:
    """The BPF program: (code, jump if true, jump if false, k) each. The
    checks of arguments come after the dispatch on the call's number, the
    pids last, so that every jump is forward and short."""
    deny = ("deny",)
    body: list = [(_LD_W_ABS, 0, 0, _ARCH), (_JEQ_K, None, deny, arch["audit"]),  # another ABI: refused
                  (_LD_W_ABS, 0, 0, _NR), (_JGE_K, deny, None, _X32_BIT)]
    body += [(_JEQ_K, ("pids",), None, nr) for nr in arch["targeted"].values()]
    body += [(_JEQ_K, deny, None, nr) for nr in arch["refused"].values()]
    body += [(_JEQ_K, ("self",), None, arch["prlimit64"]), (_JEQ_K, ("fcntl",), None, arch["fcntl"]),
             (_JEQ_K, ("ioctl",), None, arch["ioctl"]), (_RET_K, 0, 0, _RET_ALLOW),
             ("label", "deny"), (_RET_K, 0, 0, _RET_EPERM)]
    # prlimit64 on this process only (0 or its pid): another's limits can signal it (RLIMIT_CPU)
    body += [("label", "self"), (_LD_W_ABS, 0, 0, _ARG0), (_JEQ_K, 2, 0, 0), (_JEQ_K, 1, 0, os.getpid()),
             (_RET_K, 0, 0, _RET_EPERM), (_RET_K, 0, 0, _RET_ALLOW)]
    body += [("label", "fcntl"), (_LD_W_ABS, 0, 0, _ARG1)]
    body += [(_JEQ_K, ("deny_pid",), None, cmd) for cmd in _FCNTL_OWNERS] + [(_RET_K, 0, 0, _RET_ALLOW)]
    body += [("label", "ioctl"), (_LD_W_ABS, 0, 0, _ARG1)]
    body += [(_JEQ_K, ("deny_pid",), None, cmd) for cmd in _IOCTL_REFUSED] + [(_RET_K, 0, 0, _RET_ALLOW)]
    body += [("label", "pids"), (_LD_W_ABS, 0, 0, _ARG0)]
    body += [(_JEQ_K, ("deny_pid",), None, t) for t in targets]
    body += [(_RET_K, 0, 0, _RET_ALLOW), ("label", "deny_pid"), (_RET_K, 0, 0, _RET_EPERM)]
    labels, out = {}, []
    for item in body:
        if item[0] == "label":
            labels[item[1]] = len(out)
        else:
            out.append(item)
    program = []
    for i, (code, jt, jf, k) in enumerate(out):
        jumps = [labels[j[0]] - i - 1 if isinstance(j, tuple) else (j or 0) for j in (jt, jf)]
        if not all(0 <= j < 256 for j in jumps):
            raise ValueError("the filter's jumps do not fit its instructions")
        program.append((code, jumps[0], jumps[1], k))
    return program


def hide_memory() -> None:
    """Make this process (the evaluating one) not dumpable, so that no
    process without ``CAP_SYS_PTRACE`` (an isolated child has none) can
    open its memory (``/proc/PID/mem``) or attach to it, whatever its
    user; no core dump is written for it either. Linux only; elsewhere,
    nothing."""
    if sys.platform.startswith("linux"):
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_DUMPABLE, 0, 0, 0, 0)


def _drop_capabilities(libc: ctypes.CDLL, arch: dict) -> str | None:
    """As root: give up every capability, for good (the bounding set
    emptied, the secure bits locked so that an exec regains none), so
    that a root plugin cannot open a process's memory the kernel guards
    (`hide_memory`). None, or why not."""
    if os.geteuid() != 0:
        return None
    if libc.prctl(_PR_SET_SECUREBITS, _SECUREBITS, 0, 0, 0) != 0:
        return f"prctl(PR_SET_SECUREBITS) failed: {os.strerror(ctypes.get_errno())}"
    for cap in range(64):
        if libc.prctl(_PR_CAPBSET_DROP, cap, 0, 0, 0) != 0 and ctypes.get_errno() != errno.EINVAL:
            return f"prctl(PR_CAPBSET_DROP, {cap}) failed: {os.strerror(ctypes.get_errno())}"
    libc.prctl(_PR_CAP_AMBIENT, _PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0)
    header = (ctypes.c_uint32 * 2)(_CAPABILITY_VERSION_3, 0)
    data = (ctypes.c_uint32 * 6)()  # effective, permitted, inheritable: twice 32 bits, all zero
    if libc.syscall(ctypes.c_long(arch["capset"]), header, data) != 0:
        return f"capset failed: {os.strerror(ctypes.get_errno())}"
    return None


def guard_signals(parent: int, also: tuple[int, ...] = ()) -> str | None:
    """Install the filter in this process (the isolated child, before any
    plugin code runs) for the evaluating process ``parent`` (and the
    processes ``also``: its reaper). None when it
    holds; else why not (another system or architecture, a kernel or
    container that refuses seccomp filters), the child then running
    without it."""
    machine = platform.machine().lower()
    arch = _ARCHES.get({"amd64": "x86_64", "arm64": "aarch64"}.get(machine, machine))
    if not sys.platform.startswith("linux") or arch is None:
        return f"no seccomp filter on {sys.platform} {machine}"
    targets = protected(parent, also)
    if not targets:
        return f"/proc/{parent} cannot be read: the processes to protect are unknown"
    program = _program(arch, targets)
    instructions = (_Instruction * len(program))(*program)
    prog = _Program(len(program), instructions)
    libc = ctypes.CDLL(None, use_errno=True)
    dropped = _drop_capabilities(libc, arch)
    if dropped is not None:
        return dropped
    if libc.prctl(_PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
        return f"prctl(PR_SET_NO_NEW_PRIVS) failed: {os.strerror(ctypes.get_errno())}"
    syscall = libc.syscall
    syscall.restype = ctypes.c_long
    done = syscall(ctypes.c_long(arch["seccomp"]), ctypes.c_long(_SECCOMP_SET_MODE_FILTER),
                   ctypes.c_long(_SECCOMP_FILTER_FLAG_TSYNC), ctypes.byref(prog))
    if done == 0:
        return None
    if done > 0:  # TSYNC names the thread it could not synchronise
        return f"the seccomp filter could not reach thread {done} of the child"
    code = ctypes.get_errno()
    if code not in (errno.ENOSYS, errno.EINVAL):
        return f"the seccomp filter was refused ({os.strerror(code)})"
    # A kernel without seccomp(2) or its TSYNC flag: the calling thread's filter by prctl (the child runs the
    # plugin on this thread; what it starts inherits the filter).
    if libc.prctl(_PR_SET_SECCOMP, _SECCOMP_MODE_FILTER, ctypes.byref(prog), 0, 0) == 0:
        return None
    return f"the seccomp filter was refused ({os.strerror(code)}; prctl: {os.strerror(ctypes.get_errno())})"
