"""The lock that makes concurrent runs take turns: exclusive, released by
its holder's exit, and skipped where the folder cannot be written."""

from __future__ import annotations

import errno
import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from racing_stack import _files
from racing_stack._files import exclusive_lock


def test_a_second_holder_waits_for_the_first(tmp_path):
    lock, order, waited = tmp_path / ".x.lock", [], threading.Event()

    def second():
        with exclusive_lock(lock, waiting=waited.set):
            order.append("second")

    with exclusive_lock(lock):
        thread = threading.Thread(target=second)
        thread.start()
        assert waited.wait(timeout=30)
        order.append("first")
    thread.join(timeout=30)
    assert order == ["first", "second"] and lock.exists()


def test_a_killed_holder_releases_the_lock(tmp_path):
    lock = tmp_path / ".x.lock"
    holder = subprocess.Popen([sys.executable, "-c", "import sys, time\nfrom racing_stack._files import "
                               "exclusive_lock\nwith exclusive_lock(sys.argv[1]):\n    print('held', flush=True)\n"
                               "    time.sleep(600)", str(lock)], stdout=subprocess.PIPE, text=True)
    assert holder.stdout.readline() == "held\n"
    holder.kill()
    holder.wait(timeout=30)
    with exclusive_lock(lock, waiting=lambda: pytest.fail("waited for a killed holder")):
        pass


@pytest.mark.parametrize("code", [errno.EACCES, errno.EROFS])
def test_a_folder_that_cannot_be_written_runs_the_block_unlocked(tmp_path, monkeypatch, code):
    real_open = os.open

    def read_only(path, flags, *args):
        if flags & os.O_CREAT:
            raise OSError(code, os.strerror(code), str(path))
        return real_open(path, flags, *args)

    monkeypatch.setattr(_files.os, "open", read_only)
    ran = []
    with exclusive_lock(tmp_path / ".missing.lock"):
        ran.append("missing")
    (tmp_path / ".present.lock").write_bytes(b"")
    with exclusive_lock(tmp_path / ".present.lock"):
        ran.append("present")
    assert ran == ["missing", "present"]


def test_other_open_errors_are_raised(tmp_path):
    with pytest.raises(FileNotFoundError):
        with exclusive_lock(tmp_path / "no-such-folder" / ".x.lock"):
            pytest.fail("ran without the lock")


def test_a_learning_curve_replaces_its_picture_whole_or_not_at_all(tmp_path, monkeypatch):
    """`draw_curve` (the learning curve of train-ppo and the PPO benchmark)
    writes through `save_figure`: an interrupt while Matplotlib writes
    leaves the earlier picture and nothing beside it."""
    import matplotlib.figure

    from racing_stack.ppo import draw_curve

    log = tmp_path / "log.csv"
    log.write_text("transitions,success_rate,mean_progress,median_lap_time_s,mean_reward,validation_success_rate,"
                   "validation_median_lap_time_s\n1,0.5,0.5,30,0.01,nan,nan\n2,0.75,0.9,29,0.02,1.0,28\n")
    picture = tmp_path / "learning_curve.png"
    picture.write_bytes(b"an earlier curve")
    real = matplotlib.figure.Figure.savefig

    def half_written(figure, fname, *args, **kwargs):
        real(figure, fname, *args, **kwargs)
        fname.truncate(100) if hasattr(fname, "truncate") else Path(fname).write_bytes(b"\x89PNG half")
        raise KeyboardInterrupt

    monkeypatch.setattr(matplotlib.figure.Figure, "savefig", half_written)
    with pytest.raises(KeyboardInterrupt):
        draw_curve(log, picture)
    assert picture.read_bytes() == b"an earlier curve"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["learning_curve.png", "log.csv"]
    monkeypatch.undo()
    draw_curve(log, picture)
    assert picture.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
