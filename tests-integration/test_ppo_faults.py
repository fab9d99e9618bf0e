"""train-ppo killed at random moments, many of them while a checkpoint is
being written, with SIGKILL, SIGTERM and SIGINT, and resumed until the run
completes: every resume works, a kill loses at most one checkpoint
interval, no temporary file stays behind, and the result is bitwise the
uninterrupted run's. A full disk stops a run with its last checkpoint
whole; resumed where there is room, it ends as the uninterrupted run.

Each run is a subprocess (``python -m racing_stack.ppo``): about 10 s of
imports and env building on a 2-core CPU before its first update (the
children share a JAX compilation cache, which halves that), 0.5 s an
update, about 14 s for the end of a run (plugin, curve, GIF); the
uninterrupted reference runs beside the first killed runs. The network
is wide (1024 x 1024: a 27 MB checkpoint, written in about 30 ms) so that
a kill can land inside a checkpoint write; the kill times are drawn from a
seeded generator, so the schedule is reproducible (where each kill lands
still depends on the machine's speed)."""

from __future__ import annotations

import csv
import os
import random
import re
import resource
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from racing_stack import checkpoints
from racing_stack.ppo import LOG_FIELDS

#: Updates of a run: room for every kill's progress (at most 2 updates each on this machine, 0.5 s an update).
UPDATES = 20
SETTINGS = ["worlds=4", "steps=8", "tracks=4", "max_episode_steps=24", "checkpoint_every=1", "validate_every=0",
            "hidden=(1024, 1024)"]
#: Kills before the run is let finish: SIGKILL, SIGTERM and SIGINT in turn, the last inside the export.
KILLS = 8
DATA_FIELDS = [k for k in LOG_FIELDS if k not in ("seconds", "transitions_per_s")]
#: The longest a child may take (a hung child fails the test instead of hanging it).
TIMEOUT_S = 180


@pytest.fixture(scope="module")
def child_env(tmp_path_factory):
    """The children's environment: a JAX compilation cache they share, and one
    compute thread each (the work is tiny; two multi-threaded children on two
    cores take twice as long as one, two single-threaded ones as long as one)."""
    cache = tmp_path_factory.mktemp("jax-cache")
    xla = " ".join([os.environ.get("XLA_FLAGS", ""), "--xla_cpu_multi_thread_eigen=false",
                    "intra_op_parallelism_threads=1"]).strip()
    return dict(os.environ, JAX_COMPILATION_CACHE_DIR=str(cache), JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS="0",
                JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES="0", OMP_NUM_THREADS="1", MKL_NUM_THREADS="1",
                PYTHONUNBUFFERED="1",
                XLA_FLAGS=xla)


#: ``python -m racing_stack.ppo`` with Python's Ctrl-C handler, whatever the parent ignores.
HEAR_CTRL_C = ("import runpy, signal, sys; signal.signal(signal.SIGINT, signal.default_int_handler); "
               "sys.argv[0] = 'train-ppo'; runpy.run_module('racing_stack.ppo', run_name='__main__')")


class Child:
    """One ``train-ppo`` subprocess, its output in a file."""

    def __init__(self, out: Path, flags: list[str], env: dict, log: Path, preexec_fn=None):
        self.out, self.log = out, log
        # Ctrl-C as a terminal delivers it: a test run started in the background ignores SIGINT, which
        # a child inherits and Python then keeps; the child restores Python's own handler first.
        argv = [sys.executable, "-c", HEAR_CTRL_C, "--preset", "cpu", "--out", str(out),
                "--updates", str(UPDATES)] + [a for s in SETTINGS for a in ("--set", s)] + flags
        with open(log, "wb") as f:
            self.process = subprocess.Popen(argv, stdout=f, stderr=subprocess.STDOUT, env=env, cwd=log.parent,
                                            preexec_fn=preexec_fn)
        self.started = time.monotonic()
        self.tmp = out / f".checkpoint.pt.{self.process.pid}.tmp"

    def wait(self) -> int:
        try:
            return self.process.wait(timeout=max(1.0, TIMEOUT_S - (time.monotonic() - self.started)))
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
            pytest.fail(f"train-ppo ran over {TIMEOUT_S} s: {self.text()[-3000:]}")

    def text(self) -> str:
        lines = self.log.read_text(errors="replace").splitlines()
        return "\n".join(line for line in lines if not line.startswith("Module "))

    def until(self, ready) -> bool:
        """Poll (every ~1 ms) until ``ready()``; False if the child exited first."""
        while not ready():
            if self.process.poll() is not None:
                return False
            if time.monotonic() - self.started > TIMEOUT_S:
                self.wait()
            time.sleep(0.001)
        return True

    def nth_checkpoint_write(self, n: int) -> bool:
        """Wait until this child starts its ``n``-th checkpoint write."""
        seen, present = 0, False

        def ready():
            nonlocal seen, present
            now = self.tmp.exists()
            seen += now and not present
            present = now
            return seen >= n

        return self.until(ready)

    def stop(self):
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait()


def complete_rows(path: Path) -> list[dict[str, str]]:
    """The rows of a log whose every column holds a number."""
    if not path.exists():
        return []
    rows = []
    with open(path, newline="", errors="replace") as f:
        for row in csv.DictReader(f):
            try:
                [float(row[k]) for k in LOG_FIELDS]
                rows.append(row)
            except (TypeError, ValueError, KeyError):
                pass
    return rows


def checkpointed(out: Path) -> int:
    """The update of ``out``'s checkpoint (0: none); it must load."""
    path = out / "checkpoint.pt"
    return checkpoints.load(path, "checkpoint")["update"] if path.exists() else 0


def temporary_files(out: Path) -> list[Path]:
    return sorted(out.rglob("*.tmp"))


def assert_same_result(out: Path, reference: Path):
    """The final policy and the log's data columns bitwise the reference run's."""
    mine, theirs = (checkpoints.load(p / "checkpoint.pt", "checkpoint") for p in (out, reference))
    assert mine["update"] == theirs["update"] == UPDATES
    assert list(mine["policy"]) == list(theirs["policy"])
    for key, value in theirs["policy"].items():
        assert torch.equal(mine["policy"][key], value), key
    rows, want = complete_rows(out / "log.csv"), complete_rows(reference / "log.csv")
    assert [r["update"] for r in rows] == [str(k) for k in range(1, UPDATES + 1)]
    assert [[r[k] for k in DATA_FIELDS] for r in rows] == [[r[k] for k in DATA_FIELDS] for r in want]
    assert (out / "plugin" / "weights.pt").read_bytes() == (reference / "plugin" / "weights.pt").read_bytes()


@pytest.fixture(scope="module")
def reference(tmp_path_factory, child_env):
    """The uninterrupted run (its folder, once it has ended): it runs in the
    background from the first test that asks for it, beside that test's runs."""
    folder = tmp_path_factory.mktemp("reference")
    child = Child(folder / "run", [], child_env, folder / "out.txt")

    def ended() -> Path:
        assert child.wait() == 0, child.text()[-3000:]
        return folder / "run"

    yield ended
    child.stop()


def test_killed_runs_resume_to_the_uninterrupted_result(reference, tmp_path, child_env):
    """The reference run goes on beside the first runs of this test."""
    rng = random.Random(20240611)
    out = tmp_path / "run"
    plans = []
    for k in range(KILLS - 1):
        sig = (signal.SIGKILL, signal.SIGTERM, signal.SIGINT)[k % 3]
        if k == 0:  # inside the very first checkpoint write: no checkpoint at all yet
            plans.append((sig, "write", 1))
        elif sig == signal.SIGINT or rng.random() < 0.7:  # inside its first or second checkpoint write
            plans.append((sig, "write", rng.randint(1, 2)))
        else:  # anywhere in the update after its first checkpoint write began
            plans.append((sig, "moment", rng.uniform(0.0, 0.5)))
    plans.append((signal.SIGKILL, "export", None))  # inside the plugin's weights write, after the last update
    children, landed_in_writes, started, history = [], 0, time.monotonic(), []
    try:
        for sig, mode, arg in plans + [(None, None, None)]:
            ran = out.exists() and any((out / name).exists() for name in ("log.csv", "tensorboard"))
            flags = ["--resume"] if (out / "checkpoint.pt").exists() else ["--overwrite"] if ran else []
            child = Child(out, flags, child_env, tmp_path / f"child{len(children)}.txt")
            children.append(child)
            if sig is None:  # the last one runs to the end
                assert child.wait() == 0, child.text()[-3000:]
                break
            if mode == "write":
                reached = child.nth_checkpoint_write(arg)
            elif mode == "moment":
                reached = child.nth_checkpoint_write(1)
                time.sleep(arg)
            else:
                weights = out / "plugin" / f".weights.pt.{child.process.pid}.tmp"
                reached = child.until(weights.exists)
            signalled = reached and child.process.poll() is None
            if signalled:
                logged_before = len(complete_rows(out / "log.csv"))
                child.process.send_signal(sig)
            rc = child.wait()
            text = child.text()
            assert "Traceback" not in text, text[-3000:]
            if not signalled:  # it ended before the signal: the run is complete
                assert rc == 0, text[-3000:]
                break
            assert rc == (130 if sig == signal.SIGINT else -sig), (sig, mode, arg, rc, text[-3000:])
            if sig == signal.SIGINT:
                said = re.search(r"interrupted at update (\d+); (?:--resume continues from the last checkpoint "
                                 r"\(update (\d+)\)|no checkpoint was written yet: start it again)", text)
                assert said, text[-3000:]
                landed_in_writes += said[1] != said[2]  # between an update's end and its checkpoint's
            elif child.tmp.exists():
                landed_in_writes += 1  # killed inside a checkpoint write: the next run clears its file
            # The checkpoint loads, and it is at most one interval behind the updates done.
            logged = len(complete_rows(out / "log.csv"))
            history.append(f"{sig.name} {mode} {arg}: rc {rc}, logged {logged}, checkpoint {checkpointed(out)}, "
                           f"in a write {child.tmp.exists()}, {time.monotonic() - child.started:.1f} s")
            assert logged >= logged_before
            assert logged - checkpointed(out) <= 1, (logged, checkpointed(out))
        took = time.monotonic() - started
    finally:
        for child in children:
            child.stop()
    print(f"{len(children)} runs, {landed_in_writes} killed inside a checkpoint write, {took:.0f} s", *history,
          sep="\n")
    assert len(children) == KILLS + 1, history  # every kill happened before the run completed
    assert landed_in_writes >= 3, history  # signals did land inside checkpoint writes
    for child in children[1:]:  # every later run resumed (or, before any checkpoint, restarted)
        assert "error:" not in child.text()
    assert_same_result(out, reference())
    assert temporary_files(out) == [], history


def test_a_full_disk_stops_the_run_and_its_last_checkpoint_resumes(reference, tmp_path, child_env):
    """The run's folder is a tmpfs with room for one checkpoint and not two
    (1.5 checkpoints), so that the first checkpoint is written and the
    second cannot be. Where tmpfs cannot be mounted (not root), the child's
    file size limit (RLIMIT_FSIZE, SIGXFSZ ignored) is half a checkpoint
    instead: the first checkpoint write fails."""
    reference = reference()
    size = (reference / "checkpoint.pt").stat().st_size
    small = tmp_path / "small"
    small.mkdir()
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size * 3 // 2}", "tmpfs", str(small)],
                             capture_output=True).returncode == 0

    def limit():
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (size // 2, size // 2))

    try:
        child = Child(small / "run", [], child_env, tmp_path / "full.txt", preexec_fn=None if mounted else limit)
        rc = child.wait()
        text = child.text()
        assert rc == 1 and "Traceback" not in text, text[-3000:]
        if mounted:
            assert "No space left on device" in text, text
            assert "the last checkpoint, " in text and "(update 1), is whole" in text, text
            assert checkpointed(small / "run") == 1
        else:
            assert "File too large" in text, text
            assert not (small / "run" / "checkpoint.pt").exists()
        assert temporary_files(small / "run") == []
        shutil.copytree(small / "run", tmp_path / "roomy")
    finally:
        if mounted:
            subprocess.run(["umount", str(small)], check=True)
    flags = ["--resume"] if (tmp_path / "roomy" / "checkpoint.pt").exists() else ["--overwrite"]
    child = Child(tmp_path / "roomy", flags, child_env, tmp_path / "roomy.txt")
    assert child.wait() == 0, child.text()[-3000:]
    assert "Traceback" not in child.text()
    assert temporary_files(tmp_path / "roomy") == []
    assert_same_result(tmp_path / "roomy", reference)


def test_an_interrupt_before_training_exits_130_without_a_traceback(tmp_path, child_env):
    """Ctrl-C, once, while train-ppo builds its env (its progress line says
    it started), long before the first update: one that lands inside a
    garbage collector callback, where Python would print and drop it, is
    raised again without a word of the drop (`racing_stack._cli.ctrl_c_not_lost`)."""
    child = Child(tmp_path / "run", [], child_env, tmp_path / "out.txt")
    try:
        # The line comes once train-ppo's imports are done (an interrupt
        # during the imports is Python's own: a traceback and exit -2).
        assert child.until(lambda: "train-ppo: building the envs" in child.log.read_text(errors="replace")), \
            child.text()[-3000:]
        assert not (tmp_path / "run" / "log.csv").exists()
        child.process.send_signal(signal.SIGINT)
        rc = child.wait()
    finally:
        child.stop()
    text = child.text()  # a drop raised again is not printed: no traceback at all
    assert rc == 130 and "Traceback" not in text and "Exception ignored" not in text, (rc, text[-3000:])
    assert "interrupted before training; no checkpoint was written yet: start it again" in text, text[-3000:]
