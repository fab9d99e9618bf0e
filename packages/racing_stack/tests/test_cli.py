"""What the command lines share: a Ctrl-C that is not lost
(`ctrl_c_not_lost`), checked in a child process whose SIGINT lands inside
a garbage collector callback, where Python prints and drops it."""

import signal
import subprocess
import sys
import time

import pytest
from plugin_dirs import DROP_A_CTRL_C, DROPPED_LINE

CHILD = """
import contextlib, signal, sys, time
signal.signal(signal.SIGINT, signal.default_int_handler)
from racing_stack._cli import ctrl_c_not_lost
""" + DROP_A_CTRL_C + """
guarded = sys.argv[1] == "guarded"
with ctrl_c_not_lost() if guarded else contextlib.nullcontext():
    pass
assert signal.getsignal(signal.SIGINT) is signal.default_int_handler  # a quiet block leaves Python's own
try:
    with ctrl_c_not_lost() if guarded else contextlib.nullcontext():
        drop_a_ctrl_c()
        deadline = time.monotonic() + 8.0
        while time.monotonic() < deadline:
            sum(range(1000))
    print("ran on", flush=True)
except KeyboardInterrupt:
    os.kill(os.getpid(), signal.SIGINT)  # pressed again on the way out: ignored
    time.sleep(0.3)
    print("interrupted", flush=True)
    sys.exit(130)
"""


HANDLED = """
import os, signal, time
signal.signal(signal.SIGINT, signal.default_int_handler)
from racing_stack._cli import ctrl_c_not_lost

with ctrl_c_not_lost():
    try:
        os.kill(os.getpid(), signal.SIGINT)
        time.sleep(5.0)
        print("slept on", flush=True)
    except KeyboardInterrupt:
        started = time.monotonic()
        while time.monotonic() - started < 1.5:  # handling it (a partial result written, say)
            sum(range(1000))
        print("handled", flush=True)
print("default" if signal.getsignal(signal.SIGINT) is signal.default_int_handler else "not default", flush=True)
"""


WAKE = """
import os, signal, sys, threading, time, types
signal.signal(signal.SIGINT, signal.default_int_handler)
from racing_stack._cli import ctrl_c_not_lost

def report_a_drop():  # as Python reports a KeyboardInterrupt it dropped, from another thread
    time.sleep(0.3)
    error = KeyboardInterrupt()
    sys.unraisablehook(types.SimpleNamespace(exc_type=KeyboardInterrupt, exc_value=error, exc_traceback=None,
                                             err_msg="Exception ignored in", object=None))

try:
    with ctrl_c_not_lost():
        try:
            os.kill(os.getpid(), signal.SIGINT)  # pressed
            time.sleep(1.0)
        except KeyboardInterrupt:
            pass
        threading.Thread(target=report_a_drop).start()
        started = time.monotonic()
        time.sleep(8.0)  # a blocking wait
    print("slept on", flush=True)
except KeyboardInterrupt:
    print(f"woken after {time.monotonic() - started:.1f} s", flush=True)
"""


EARLY = """
import signal, sys, time
signal.signal(signal.SIGINT, signal.default_int_handler)
if sys.argv[1] == "command":
    sys.argv[0] = "-m"  # as Python sets it while it imports the packages of `python -m racing_stack.<command>`
import racing_stack
from racing_stack._cli import ctrl_c_not_lost
""" + DROP_A_CTRL_C + """
drop_a_ctrl_c()  # while the command imports, before its block
started = time.monotonic()
try:
    with ctrl_c_not_lost():
        while time.monotonic() - started < 8.0:
            sum(range(1000))
    print("ran on", flush=True)
except KeyboardInterrupt:
    print(f"interrupted after {time.monotonic() - started:.1f} s", flush=True)
print("hook", "python's" if sys.unraisablehook is sys.__unraisablehook__ else "another", flush=True)
"""


def child(mode: str, script: str = CHILD) -> tuple[subprocess.CompletedProcess, float]:
    started = time.monotonic()
    done = subprocess.run([sys.executable, "-c", script, mode], capture_output=True, text=True, timeout=120)
    return done, time.monotonic() - started


def test_a_ctrl_c_dropped_in_a_gc_callback_is_lost_without_the_guard():
    """The failure the guard is for: the run goes on to its end."""
    done, _ = child("plain")
    assert DROPPED_LINE in done.stderr and "Exception ignored" in done.stderr and "KeyboardInterrupt" in done.stderr
    assert done.returncode == 0 and done.stdout.strip() == "ran on"


def test_the_guard_raises_a_dropped_ctrl_c_again_and_ignores_one_on_the_way_out():
    """The drop is not printed: the Ctrl-C is not lost, so it is no news."""
    done, seconds = child("guarded")
    assert DROPPED_LINE in done.stderr  # the first one was dropped
    assert done.returncode == 130 and done.stdout.strip() == "interrupted", done.stderr
    assert seconds < 8.0  # stopped long before the block's 8 s
    assert "Exception ignored" not in done.stderr and "Traceback" not in done.stderr, done.stderr


def test_a_ctrl_c_that_is_not_dropped_is_raised_once():
    """Its handling, inside the block, is not cut short by a repeat; a block
    that did not end by it gives Python's own handler back."""
    done, _ = child("guarded", HANDLED)
    assert done.returncode == 0 and done.stdout.split() == ["handled", "default"], done.stderr
    assert "Traceback" not in done.stderr


def test_a_dropped_ctrl_c_is_raised_again_in_a_blocking_wait():
    """The guard sends a real SIGINT: a blocking wait (a child's answer, a
    sleep) is cut short, not waited out."""
    done, _ = child("guarded", WAKE)
    assert done.returncode == 0 and done.stdout.startswith("woken after"), done.stdout + done.stderr
    assert float(done.stdout.split()[2]) < 4.0


def test_a_ctrl_c_dropped_while_a_command_starts_is_raised_in_its_block():
    """Run as ``python -m racing_stack.<command>``, a Ctrl-C dropped before
    the command's block (while it imports) is raised in the block at once;
    imported as a library, racing_stack leaves a drop alone."""
    done, _ = child("command", EARLY)
    assert DROPPED_LINE in done.stderr and "Exception ignored" in done.stderr  # before the block: Python's report
    words = done.stdout.split()
    assert words[:2] == ["interrupted", "after"] and float(words[2]) < 4.0, done.stdout + done.stderr
    assert words[-2:] == ["hook", "python's"]  # the recorder is gone with the block
    done, _ = child("library", EARLY)
    assert done.stdout.split() == ["ran", "on", "hook", "python's"], done.stdout + done.stderr


@pytest.mark.parametrize("handler", ["ignored", "the caller's"])
def test_the_guard_leaves_a_sigint_it_does_not_own_alone(handler):
    from racing_stack._cli import ctrl_c_not_lost

    mine = signal.SIG_IGN if handler == "ignored" else (lambda signum, frame: None)
    previous = signal.signal(signal.SIGINT, mine)
    try:
        with ctrl_c_not_lost():
            assert signal.getsignal(signal.SIGINT) is mine
        assert signal.getsignal(signal.SIGINT) is mine
    finally:
        signal.signal(signal.SIGINT, previous)
