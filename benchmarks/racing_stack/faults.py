"""Fault attacks on an evaluation: malicious isolated plugins, kills of the
evaluator at random moments, full disks and odd outputs; for each, the
expected outcome and the observed one.

    python benchmarks/racing_stack/faults.py [--quick] [--out FILE] [--publish]

Every attack runs ``python -m racing_stack.evaluate`` on Level 0
(``cpu_reference``, isolated, a call limit of 2 s) in a process and
session of its own, with a marker in its environment that every process
it starts inherits, and in the command line of every process an attacking
plugin starts. After each attack, once the evaluator has ended: every
live process that carries the marker (by environment or command line) or
belongs to the evaluator's session is left behind (and then killed).

1. **Malicious plugins** (each ends its episodes by raising once its
   attack is done, so an evaluation that survives exits 1, "every episode
   a controller error", with its summary on stdout, its result and its
   episodes file whole): every signal of the system to the evaluating
   process and to its process group, 14 of them (only where the child's
   signal guard holds: a probe decides, and each such attack checks it
   again in its own child) to every process at once; a signal through a
   process handle (from ``pidfd_open`` and from opening ``/proc/PID``),
   to its main thread and to another of its threads by id; SIGIO by
   ``F_SETOWN``; a CPU-time limit by ``prlimit``; ``ptrace``; writing its
   memory through ``/proc/PID/mem``; 30 sleeping
   processes; a double-forked daemon; ``start_new_session``; floods of
   stdout and stderr; closing the child's descriptors; stopping itself;
   a hang; an exit; a memory blow-up.
2. **The evaluator killed** (SIGKILL, SIGTERM, SIGINT) at seeded random
   moments of a run of 3 episodes whose controller starts sleeping
   processes: nothing left behind, every line of the episodes file whole,
   the result file absent or whole.
3. **Full disks and odd outputs**: ``--out``, ``--plot`` and a symbolic
   link on ``/dev/full``; a file-size limit; ``--out`` a directory, in a
   missing directory, a named pipe with and without a reader; a
   ``--record-fps`` that no GIF can hold.

Gates (CPU; the report names the machine): no run ended or stopped by a
plugin; no process left behind; no result lost (a completed run's summary
on stdout, its result and episodes files whole wherever they could be
written); every refusal named (a usage error or failed write names the
argument or the file). ``--quick`` runs one attack of each kind (CI runs
it); the full set writes ``benchmarks/out/faults.json``, or with
``--publish`` the committed ``benchmarks/results/faults.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import resource
import signal
import subprocess
import sys
import tempfile
import textwrap
import threading
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "racing_env"))

from protocol import environment, gate, logger, source_hashes  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
log = logger("faults")
#: Signals a plugin sends the evaluating process and its group: every one this system has.
SIGNALS = tuple(s.name for s in sorted(signal.Signals, key=int))
#: Those it also sends every process at once (``kill(-1)``, where the guard holds).
EVERYONE = ("SIGKILL", "SIGTERM", "SIGINT", "SIGSTOP", "SIGTSTP", "SIGHUP", "SIGQUIT", "SIGUSR1", "SIGUSR2",
            "SIGALRM", "SIGPIPE", "SIGSEGV", "SIGABRT", "SIGCONT")
#: tgkill's system call number (Python has no call for another process's thread).
TGKILL = {"x86_64": 234, "aarch64": 131}.get(os.uname().machine, 234)
#: The evaluator's limit (s): an attack that freezes it shows as a timeout.
EVALUATE_TIMEOUT_S = 120.0

PLUGIN = '''
import ctypes, json, os, signal, subprocess, sys, time
import numpy as np
from racing_env.controller import Controller

MARKER = {marker!r}


def note(**fields):
    with open({log!r}, "a") as f:
        f.write(json.dumps(fields) + "\\n")


def sleeper(**kwargs):
    return subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)", MARKER],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, **kwargs)


class Attacker(Controller):
    def __init__(self, obs, info, config):
        super().__init__(obs, info, config)
{init}

    def compute_control(self, obs, info=None):
        parent = os.getppid()
        try:
{body}
            note(attack="done")
        except OSError as error:
            note(attack="refused", errno=error.errno)
{after}
'''
RAISE = '        raise RuntimeError("the attack is over")'
DRIVE = '        return np.array([0.0, 1.0], np.float32)'


def plugin(folder: Path, marker: str, body: str, init: str = "pass", after: str = RAISE) -> Path:
    """A plugin folder whose controller runs ``body`` at its first call."""
    folder.mkdir(parents=True)
    indent = " " * 12
    (folder / "controller.py").write_text(PLUGIN.format(
        marker=marker, log=str(folder / "attack.log"), init=textwrap.indent(textwrap.dedent(init), " " * 8),
        body=textwrap.indent(textwrap.dedent(body), indent), after=after))
    (folder / "config.toml").write_text('name = "attacker"\n')
    return folder


def _stat(pid: str) -> list[str] | None:
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return f.read().rsplit(b")", 1)[1].decode().split()
    except OSError:
        return None


def marked(marker: str, session: int) -> list[dict[str, Any]]:
    """Live processes (no zombies) that carry ``marker`` in their
    environment or command line, or belong to ``session``."""
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        stat = _stat(pid)
        if stat is None or stat[0] == "Z" or int(pid) == os.getpid():
            continue
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
            environ = Path(f"/proc/{pid}/environ").read_bytes()
        except OSError:
            continue
        if marker.encode() in cmdline or marker.encode() in environ or int(stat[3]) == session:
            found.append({"pid": int(pid), "session": int(stat[3]), "command": cmdline.replace(b"\0", b" ").decode(
                errors="replace")[:120]})
    return found


def left_behind(marker: str, session: int, wait_s: float = 5.0) -> list[dict[str, Any]]:
    """What still runs ``wait_s`` after the evaluator ended (then killed)."""
    end = time.monotonic() + wait_s
    while (found := marked(marker, session)) and time.monotonic() < end:
        time.sleep(0.1)
    for p in found:
        try:
            os.kill(p["pid"], signal.SIGKILL)
        except OSError:
            pass
    return found


def evaluate(controller: Path, out: Path | str | None, marker: str, extra: list[str] | None = None,
             episodes: int = 2, kill: tuple[str, float] | None = None, fsize: int | None = None,
             reader: Path | None = None) -> dict[str, Any]:
    """One ``evaluate`` on Level 0 in a session of its own; what it did and left."""
    argv = [sys.executable, "-m", "racing_stack.evaluate", "--level", "0", "--episodes", str(episodes),
            "--backend", "cpu_reference", "--isolate", "--call-timeout", "2", "--controller", str(controller)]
    argv += ([] if out is None else ["--out", str(out)]) + (extra or [])

    def limits() -> None:
        if fsize is not None:
            resource.setrlimit(resource.RLIMIT_FSIZE, (fsize, fsize))

    read: dict[str, Any] = {}
    thread = None
    if reader is not None:
        def drain() -> None:
            with open(reader, "rb") as f:
                read["bytes"] = f.read()
        thread = threading.Thread(target=drain, daemon=True)
        thread.start()
    start = time.monotonic()
    process = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True,
                               env={**os.environ, "FAULTS_MARKER": marker}, preexec_fn=limits, cwd=ROOT)
    if kill is not None:
        time.sleep(kill[1])
        process.send_signal(getattr(signal, kill[0]))
    try:
        stdout, stderr = process.communicate(timeout=EVALUATE_TIMEOUT_S)
        timed_out = False
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        stdout, stderr = process.communicate()
        timed_out = True
    if thread is not None:
        thread.join(5.0)
    summary = None
    try:  # the command's JSON summary: its episodes and outcomes under "summary"
        summary = json.loads(stdout.decode(errors="replace"))["summary"]
    except (ValueError, KeyError, TypeError):
        pass
    return {"returncode": process.returncode, "timed_out": timed_out, "seconds": time.monotonic() - start,
            "summary": summary, "stderr_tail": stderr.decode(errors="replace")[-600:],
            "left_behind": left_behind(marker, process.pid), "read": read.get("bytes")}


def whole_files(out: Path) -> dict[str, Any]:
    """The result file and its episodes file: present, and whole."""
    journal = out.with_suffix(".episodes.jsonl")
    lines, whole = [], True
    if journal.exists():
        for line in journal.read_text().splitlines():
            try:
                lines.append(json.loads(line))
            except ValueError:
                whole = False
    result = None
    if out.exists():
        try:
            result = json.loads(out.read_text())
        except ValueError:
            result = "broken"
    return {"journal_lines": len(lines), "journal_whole": whole, "result": (
        None if result is None else "broken" if result == "broken" else len(result.get("episodes", [])))}


def plugin_attacks(guarded: bool) -> list[dict[str, Any]]:
    """The malicious plugins: name, body (``init``: the constructor's part)."""
    attacks = []
    for name in SIGNALS:
        attacks.append({"name": f"{name} to the evaluating process", "body": f"os.kill(parent, signal.{name})",
                        "refused": True})
        attacks.append({"name": f"{name} to the evaluating process's group",
                        "body": f"os.killpg(os.getpgid(parent), signal.{name})", "refused": True})
        if guarded and name in EVERYONE:  # sent only if the probe is refused in this very child
            attacks.append({"name": f"{name} to every process (kill(-1))", "refused": True,
                            "body": "try:\n    os.kill(-1, 0)\nexcept PermissionError:\n"
                                    f"    os.kill(-1, signal.{name})\n"
                                    "else:\n    raise RuntimeError('no guard here: not sent')"})
    attacks += [
        {"name": "SIGKILL through a process handle", "refused": True,
         "body": "fd = os.pidfd_open(parent)\nsignal.pidfd_send_signal(fd, signal.SIGKILL)"},
        {"name": "SIGKILL to the evaluating process's main thread (tgkill)", "refused": True,
         "body": "libc = ctypes.CDLL(None, use_errno=True)\n"
                 f"if libc.syscall({TGKILL}, parent, parent, 9) != 0:\n"
                 "    raise OSError(ctypes.get_errno(), 'tgkill')"},
        {"name": "SIGKILL to another thread of the evaluating process (kill by its id)", "refused": True,
         "body": "tids = [int(t) for t in os.listdir(f'/proc/{parent}/task') if int(t) != parent]\n"
                 "os.kill(tids[0], signal.SIGKILL)"},
        {"name": "SIGKILL through a handle from opening /proc/PID", "refused": True,
         "body": "signal.pidfd_send_signal(os.open(f'/proc/{parent}', os.O_RDONLY), signal.SIGKILL)"},
        {"name": "SIGIO to the evaluating process (F_SETOWN on a pipe)", "refused": True,
         "body": "import fcntl\nr, w = os.pipe()\nfcntl.fcntl(r, fcntl.F_SETOWN, parent)\n"
                 "fcntl.fcntl(r, fcntl.F_SETFL, os.O_ASYNC)\nos.write(w, b'x')"},
        {"name": "a CPU-time limit of 0 s on the evaluating process (prlimit)", "refused": True,
         "body": "import resource\nresource.prlimit(parent, resource.RLIMIT_CPU, (0, 0))"},
        {"name": "overwriting the evaluating process's memory (/proc/PID/mem)", "refused": True,
         "body": "fd = os.open(f'/proc/{parent}/mem', os.O_RDWR)\n"
                 "start = int(open(f'/proc/{parent}/maps').readline().split('-')[0], 16)\n"
                 "os.pwrite(fd, b'\\0' * 4096, start)"},
        {"name": "ptrace attach to the evaluating process", "refused": True,
         "body": "libc = ctypes.CDLL(None, use_errno=True)\n"
                 "if libc.ptrace(16, parent, 0, 0) != 0:\n"
                 "    raise OSError(ctypes.get_errno(), 'ptrace')"},
        {"name": "30 sleeping processes (a fork bomb within limits)", "refused": False,
         "body": "kept = [sleeper() for _ in range(30)]"},
        {"name": "a double-forked daemon (fork, setsid, fork)", "refused": True,
         "body": "if os.fork() == 0:\n"
                 "    try:\n        os.setsid()\n    except OSError:\n        pass\n"
                 "    sleeper()\n    os._exit(0)\n"
                 "os.wait()\nos.setsid()"},
        {"name": "a process in a session of its own (start_new_session)", "refused": True,
         "body": "sleeper(start_new_session=True)"},
        {"name": "a process in a group of its own (setpgid)", "refused": True,
         "body": "child = sleeper()\nos.setpgid(child.pid, child.pid)"},
        {"name": "a stdout flood (50 MB)", "refused": False, "body": "sys.stdout.write('x' * 50_000_000)"},
        {"name": "a stderr flood (50 MB)", "refused": False, "body": "sys.stderr.write('x' * 50_000_000)"},
        {"name": "closing every descriptor above 2", "refused": False, "body": "os.closerange(3, 65536)"},
        {"name": "closing stdin, stdout and stderr", "refused": False,
         "body": "for fd in (0, 1, 2):\n    os.close(fd)"},
        {"name": "SIGSTOP to itself", "refused": False, "body": "os.kill(os.getpid(), signal.SIGSTOP)"},
        {"name": "a hang", "refused": False, "body": "time.sleep(3600)"},
        {"name": "an exit (os._exit)", "refused": False, "body": "os._exit(3)"},
        {"name": "a memory blow-up", "refused": False, "body": "hoard = bytearray(64 << 30)"},
        {"name": "sleeping processes left at the constructor, then a hang", "refused": False,
         "init": "self.kept = [sleeper() for _ in range(3)]", "body": "time.sleep(3600)"},
    ]
    return attacks


def run_plugin_attack(attack: dict[str, Any], folder: Path, marker: str) -> dict[str, Any]:
    controller = plugin(folder / "plugin", marker, attack["body"], attack.get("init", "pass"))
    out = folder / "result.json"
    seen = evaluate(controller, out, marker)
    files = whole_files(out)
    notes = [json.loads(line) for line in (controller / "attack.log").read_text().splitlines()] \
        if (controller / "attack.log").exists() else []
    summary = seen["summary"] or {}
    survived = not seen["timed_out"] and seen["returncode"] == 1 and summary.get("episodes") == 2
    refused = [n for n in notes if n.get("attack") == "refused"]
    checks = {"run_survived": survived, "nothing_left_behind": not seen["left_behind"],
              "result_whole": files["result"] == 2 and files["journal_lines"] == 2 and files["journal_whole"],
              "refusal_named": (not attack["refused"]) or (bool(refused) and all(n["errno"] in (1, 13)
                                                                                  for n in refused))}
    expected = ("evaluate ends normally (exit 1: every episode a controller error), its summary on stdout, "
                "its result and episodes files whole, nothing left behind"
                + ("; the attack refused (EPERM, or EACCES for the memory)" if attack["refused"] else ""))
    return {"category": "plugin", "name": attack["name"], "expected": expected,
            "observed": {**{k: seen[k] for k in ("returncode", "timed_out", "seconds", "left_behind")},
                         "summary_episodes": summary.get("episodes"), "files": files, "attack_log": notes[:4],
                         "stderr_tail": seen["stderr_tail"][-300:]},
            "checks": checks, "passed": all(checks.values())}


def run_kill(sig: str, delay: float, folder: Path, marker: str) -> dict[str, Any]:
    controller = plugin(folder / "plugin", marker, "pass", init="self.kept = [sleeper() for _ in range(2)]",
                        after=DRIVE)
    out = folder / "result.json"
    seen = evaluate(controller, out, marker, episodes=3, kill=(sig, delay))
    files = whole_files(out)
    checks = {"nothing_left_behind": not seen["left_behind"], "journal_whole": files["journal_whole"],
              "result_absent_or_whole": files["result"] != "broken",
              "ended_as_told": not seen["timed_out"] and (seen["returncode"] == -getattr(signal, sig)
                                                          or (sig == "SIGINT" and seen["returncode"] == 130)
                                                          or seen["returncode"] == 0)}
    return {"category": "evaluator killed", "name": f"{sig} to the evaluator after {delay:.2f} s",
            "expected": "the evaluator ends by the signal (SIGINT: exit 130) or had finished; nothing left "
                        "behind; every line of the episodes file whole; no partial result file",
            "observed": {**{k: seen[k] for k in ("returncode", "timed_out", "seconds", "left_behind")},
                         "files": files, "stderr_tail": seen["stderr_tail"][-300:]},
            "checks": checks, "passed": all(checks.values())}


def run_output(name: str, folder: Path, marker: str) -> dict[str, Any]:
    controller = plugin(folder / "plugin", marker, "pass")
    extra, out, fsize, reader, expect_code, named = [], folder / "result.json", None, None, 1, None
    written = False
    if name == "--out /dev/full":
        out, named = "/dev/full", "/dev/full"
    elif name == "--out a link to /dev/full":
        out = folder / "link.json"
        out.symlink_to("/dev/full")
        named = str(out)
    elif name == "--plot /dev/full":  # no picture's suffix: refused before the run
        extra, expect_code, named = ["--plot", "/dev/full"], 2, "--plot"
    elif name == "--plot a link plot.png to /dev/full":
        (folder / "plot.png").symlink_to("/dev/full")
        extra, named = ["--plot", str(folder / "plot.png")], str(folder / "plot.png")
    elif name == "a file-size limit of 2 kB":
        fsize, named = 2048, str(out)
    elif name == "--out a directory":
        out, expect_code, named = folder, 2, "--out"
    elif name == "--out in a missing directory":  # made, as the command's help says
        out, written = folder / "missing" / "result.json", True
    elif name == "--out a named pipe with a reader":
        out = folder / "pipe.json"
        os.mkfifo(out)
        reader = out
    elif name == "--out a named pipe without a reader":
        out = folder / "lonely.json"
        os.mkfifo(out)
        expect_code, named = 2, "--out"
    elif name == "--record-fps 1e-5":
        extra, expect_code, named = ["--record", str(folder / "run.gif"), "--record-fps", "1e-5"], 2, "--record-fps"
    seen = evaluate(controller, out, marker, extra=extra, fsize=fsize, reader=reader)
    summary = seen["summary"] or {}
    checks = {"exit_as_expected": not seen["timed_out"] and seen["returncode"] == expect_code,
              "nothing_left_behind": not seen["left_behind"],
              "summary_on_stdout": expect_code == 2 or summary.get("episodes") == 2,
              "refusal_named": named is None or named in seen["stderr_tail"]}
    if written:
        files = whole_files(Path(out))
        checks["result_whole"] = files["result"] == 2 and files["journal_whole"]
    if reader is not None:
        try:
            checks["reader_got_the_result"] = len(json.loads(seen["read"] or b"")["episodes"]) == 2
        except (ValueError, KeyError, TypeError):
            checks["reader_got_the_result"] = False
    expected = (f"a usage error naming {named} (exit 2), nothing run" if expect_code == 2 else
                "the run, its summary on stdout, exit 1" + (f"; a line naming {named}" if named else "")
                + ("; the folder made, the result and episodes files whole in it" if written else ""))
    return {"category": "outputs", "name": name, "expected": expected,
            "observed": {**{k: seen[k] for k in ("returncode", "timed_out", "seconds", "left_behind")},
                         "summary_episodes": summary.get("episodes"), "stderr_tail": seen["stderr_tail"][-300:]},
            "checks": checks, "passed": all(checks.values())}


OUTPUTS = ("--out /dev/full", "--out a link to /dev/full", "--plot /dev/full", "--plot a link plot.png to /dev/full",
           "a file-size limit of 2 kB",
           "--out a directory", "--out in a missing directory", "--out a named pipe with a reader",
           "--out a named pipe without a reader", "--record-fps 1e-5")


def guard_holds(folder: Path, marker: str) -> bool:
    """Whether the isolated child's signal guard refuses ``kill(-1, 0)`` here."""
    controller = plugin(folder / "probe", marker, "os.kill(-1, 0)")
    evaluate(controller, None, marker, episodes=1)
    notes = (controller / "attack.log").read_text() if (controller / "attack.log").exists() else ""
    return '"errno": 1' in notes


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="one attack of each kind (CI)")
    parser.add_argument("--seed", type=int, default=0, help="the evaluator kills' random moments")
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("--publish", action="store_true", help="write benchmarks/results/faults.json")
    args = parser.parse_args()
    if not sys.platform.startswith("linux"):
        parser.error("the attacks read /proc: Linux only")
    if args.publish and args.quick:
        parser.error("--publish takes the full set, not --quick")
    out = args.out or ROOT / ("benchmarks/results/faults.json" if args.publish else "benchmarks/out/faults.json")
    rng = random.Random(args.seed)
    attacks: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory() as scratch:
        root = Path(scratch)
        marker = f"faults-{os.getpid()}-{time.time_ns()}"
        guarded = guard_holds(root / "guard", marker)
        log(f"the child's signal guard {'holds' if guarded else 'does not hold: kill(-1) attacks left out'}")
        plugins = plugin_attacks(guarded)
        kills = [(sig, round(rng.uniform(1.5, 9.0), 2)) for _ in range(5) for sig in ("SIGKILL", "SIGTERM", "SIGINT")]
        outputs = list(OUTPUTS)
        if args.quick:
            plugins = [a for a in plugins if a["name"] in ("SIGKILL to the evaluating process",
                                                           "SIGSTOP to the evaluating process's group",
                                                           "a double-forked daemon (fork, setsid, fork)",
                                                           "closing every descriptor above 2")]
            kills, outputs = kills[:2], ["--out /dev/full", "--out a named pipe with a reader"]
        jobs = [(run_plugin_attack, (a,)) for a in plugins] + [(run_kill, k) for k in kills] + \
            [(run_output, (o,)) for o in outputs]
        for i, (job, job_args) in enumerate(jobs):
            result = job(*job_args, root / f"attack{i}", marker)
            attacks.append(result)
            log(f"{'ok  ' if result['passed'] else 'FAIL'} {result['category']}: {result['name']} "
                f"({result['observed']['seconds']:.1f} s)")
    failing = {k: [a["name"] for a in attacks if not a["checks"].get(k, True)]
               for k in ("run_survived", "nothing_left_behind", "result_whole", "refusal_named")}
    lost = [a["name"] for a in attacks if not all(a["checks"].get(k, True) for k in (
        "result_whole", "journal_whole", "result_absent_or_whole", "summary_on_stdout", "reader_got_the_result"))]
    left = [a["name"] for a in attacks if a["observed"]["left_behind"]]
    named = [a["name"] for a in attacks if not a["checks"].get("refusal_named", True)]
    report = {"protocol": "faults", "environment": environment(), "source_sha256": source_hashes(__file__),
              "device": "cpu", "cpus": os.cpu_count(), "quick": args.quick, "signal_guard_holds": guarded,
              "attacks_run": len(attacks), "attacks": attacks,
              "gates": [gate("attacks run", len(attacks), f"{len(jobs)} (--quick: a few of each kind)" if args.quick
                             else ">= 60 (the full set)", len(attacks) == len(jobs) if args.quick
                             else len(attacks) >= 60),
                        gate("runs ended or stopped by a plugin", failing["run_survived"], "none",
                             not failing["run_survived"]),
                        gate("attacks that left a process behind", left, "none", not left),
                        gate("attacks that lost a result", lost, "none", not lost),
                        gate("refusals not named", named, "none", not named),
                        gate("every attack as expected", [a["name"] for a in attacks if not a["passed"]], "all",
                             all(a["passed"] for a in attacks))]}
    report["passed"] = all(g["passed"] for g in report["gates"])
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=2) + "\n")
    for g in report["gates"]:
        log(f"  {'PASS' if g['passed'] else 'FAIL'} {g['name']}: {g['value']} (gate {g['threshold']})")
    log(f"wrote {out}")
    sys.exit(0 if report["passed"] else 1)


if __name__ == "__main__":
    main()
