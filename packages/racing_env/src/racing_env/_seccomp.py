"""The isolated child's signal guard: a seccomp filter (Linux, x86-64 and
aarch64) that refuses, with ``EPERM``, the system calls by which a plugin
could end, stop or interrupt the evaluating process or those around it:

- signals (``kill``, ``tgkill``, ``rt_sigqueueinfo``,
  ``rt_tgsigqueueinfo``) and process handles (``pidfd_open``) aimed at
  the evaluating process, its ancestors, the members of its process
  group and its session leader as they are when the child starts, its
  reaper (`racing_env._reaper`), the
  evaluator's group as a whole and every process at once (``kill(-1)``);
- ``tkill`` (a thread by its id alone), ``ptrace`` and
  ``process_vm_readv``/``process_vm_writev`` (another process's memory),
  whatever their target;
- ``setsid`` and ``setpgid``: every process the plugin starts stays in
  the child's session and process group, which the parent kills whole.

Everything else, the plugin's signals to itself and to the processes it
started included, is allowed. The filter holds for every thread of the
child (``SECCOMP_FILTER_FLAG_TSYNC``) and for whatever it starts, and
cannot be lifted (``PR_SET_NO_NEW_PRIVS``). Standard library only (ctypes).
"""

from __future__ import annotations

import ctypes
import errno
import os
import platform
import sys

__all__ = ["guard_signals", "protected"]

# The system call numbers by architecture: the filter checks the architecture first.
_ARCHES = {
    "x86_64": {"audit": 0xC000003E, "seccomp": 317,
               "targeted": {"kill": 62, "tgkill": 234, "rt_sigqueueinfo": 129, "rt_tgsigqueueinfo": 297,
                            "pidfd_open": 434},
               "refused": {"tkill": 200, "ptrace": 101, "process_vm_readv": 310, "process_vm_writev": 311,
                           "setsid": 112, "setpgid": 109}},
    "aarch64": {"audit": 0xC00000B7, "seccomp": 277,
                "targeted": {"kill": 129, "tgkill": 131, "rt_sigqueueinfo": 138, "rt_tgsigqueueinfo": 240,
                             "pidfd_open": 434},
                "refused": {"tkill": 130, "ptrace": 117, "process_vm_readv": 270, "process_vm_writev": 271,
                            "setsid": 157, "setpgid": 154}},
}
_LD_W_ABS, _JEQ_K, _JGE_K, _RET_K = 0x20, 0x15, 0x35, 0x06
_RET_ALLOW, _RET_EPERM = 0x7FFF0000, 0x00050000 | errno.EPERM
_X32_BIT = 0x40000000
_PR_SET_NO_NEW_PRIVS, _PR_SET_SECCOMP, _SECCOMP_MODE_FILTER = 38, 22, 2
_SECCOMP_SET_MODE_FILTER, _SECCOMP_FILTER_FLAG_TSYNC = 1, 1


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
    ``parent``: it, its ancestors, its session leader, the members of its
    process group (now), its group (negated), -1 (every process) and the
    processes ``also``, as the unsigned 32-bit values the filter compares."""
    found = _stat(parent)
    if found is None:
        return []
    _, group, session = found
    targets = {parent, session, -group, -1, *also}
    pid = parent
    while pid > 1:  # the ancestors: ending one (a shell, a CI runner, `timeout`) ends the run
        stat = _stat(pid)
        if stat is None:
            break
        pid = stat[0]
        targets.add(pid)
    for name in os.listdir("/proc"):
        if name.isdigit():
            stat = _stat(int(name))
            if stat is not None and stat[1] == group:
                targets.add(int(name))
    targets -= {0, os.getpid(), -os.getpgrp()}  # the caller itself and its own group (0 too) stay its own
    return sorted(t & 0xFFFFFFFF for t in targets)


def _program(arch: dict, targets: list[int]) -> list[tuple[int, int, int, int]]:
    """The BPF program: (code, jump if true, jump if false, k) each."""
    targeted, refused = list(arch["targeted"].values()), list(arch["refused"].values())
    deny = ("deny",)
    body: list = [(_LD_W_ABS, 0, 0, 4), (_JEQ_K, None, deny, arch["audit"]),  # another ABI: refused
                  (_LD_W_ABS, 0, 0, 0), (_JGE_K, deny, None, _X32_BIT)]
    body += [(_JEQ_K, ("check",), None, nr) for nr in targeted]
    body += [(_JEQ_K, deny, None, nr) for nr in refused]
    body += [(_RET_K, 0, 0, _RET_ALLOW), ("label", "check"),
             (_LD_W_ABS, 0, 0, 16)]  # args[0], its low 32 bits (a pid_t)
    body += [(_JEQ_K, deny, None, t) for t in targets]
    body += [(_RET_K, 0, 0, _RET_ALLOW), ("label", "deny"), (_RET_K, 0, 0, _RET_EPERM)]
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
    if len(targets) > 200:
        targets = targets[:200]  # a process group that large: the first 200, the group itself still refused
    program = _program(arch, targets)
    instructions = (_Instruction * len(program))(*program)
    prog = _Program(len(program), instructions)
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(_PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
        return f"prctl(PR_SET_NO_NEW_PRIVS) failed: {os.strerror(ctypes.get_errno())}"
    syscall = libc.syscall
    syscall.restype = ctypes.c_long
    if syscall(ctypes.c_long(arch["seccomp"]), ctypes.c_long(_SECCOMP_SET_MODE_FILTER),
               ctypes.c_long(_SECCOMP_FILTER_FLAG_TSYNC), ctypes.byref(prog)) == 0:
        return None
    first = os.strerror(ctypes.get_errno())
    # A kernel without seccomp(2) (before 3.17): the calling thread's filter by prctl (the child has no other thread
    # that runs Python).
    if libc.prctl(_PR_SET_SECCOMP, _SECCOMP_MODE_FILTER, ctypes.byref(prog), 0, 0) == 0:
        return None
    return f"the seccomp filter was refused ({first}; prctl: {os.strerror(ctypes.get_errno())})"
