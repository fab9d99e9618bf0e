"""PPO across processes on the CPU (gloo), through the real command under
``torchrun``: two processes of 2 worlds each train the policy one process
of 4 worlds trains (same log, same weights within float tolerance); the
two-process checkpoint resumes in one process; a checkpoint one process
refuses its share of stops both; a process that dies stops the other with
an error, not a hang."""

from __future__ import annotations

import csv
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from racing_stack import checkpoints

#: A tiny run of the CPU preset: 4 worlds in all on the first 4 Train tracks.
SETTINGS = ["steps=8", "minibatches=2", "epochs=2", "tracks=4", "max_episode_steps=24", "stagger_steps=12",
            "validate_every=0", "checkpoint_every=2"]


def train(out: Path, worlds: int, updates: int, processes: int = 1, *extra: str, wait: bool = True):
    """``train-ppo`` (under torchrun with ``processes`` > 1) into ``out``."""
    launcher = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={processes}"] \
        if processes > 1 else [sys.executable]
    sets = [arg for s in [*SETTINGS, f"worlds={worlds}"] for arg in ("--set", s)]
    command = [*launcher, "-m", "racing_stack.ppo", "--out", str(out), "--updates", str(updates), *sets, *extra]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    if not wait:
        return subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stdout + done.stderr
    return done


def rows(out: Path) -> list[dict[str, str]]:
    with open(out / "log.csv") as f:
        return list(csv.DictReader(f))


def weights(out: Path) -> dict[str, torch.Tensor]:
    return checkpoints.load(out / "checkpoint.pt", "checkpoint")["policy"]


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """One process of 4 worlds and two of 2, 4 updates each."""
    base = tmp_path_factory.mktemp("distributed")
    train(base / "one", 4, 4)
    train(base / "two", 2, 4, 2)
    return base


def test_two_processes_train_what_one_process_of_all_their_worlds_trains(runs):
    one, two = rows(runs / "one"), rows(runs / "two")
    assert [r["update"] for r in two] == ["1", "2", "3", "4"]
    for a, b in zip(one, two):
        assert a["transitions"] == b["transitions"]  # all 4 worlds counted
        for key in ("episodes", "margin_endings", "stall_endings"):
            assert a[key] == b[key], key  # the same worlds, seeds, noise and holds
        for key in ("mean_reward", "mean_speed_mps", "policy_loss", "value_loss", "approx_kl", "clip_fraction",
                    "explained_variance", "actor_grad_norm", "critic_grad_norm", "std_steering"):
            assert float(a[key]) == pytest.approx(float(b[key]), rel=1e-3, abs=1e-5), key
    mine, theirs = weights(runs / "two"), weights(runs / "one")
    assert set(mine) == set(theirs)
    for key, value in theirs.items():
        torch.testing.assert_close(mine[key], value, rtol=1e-4, atol=1e-5, msg=key)
    assert float(theirs["normalizer.count"]) > 0  # the feature statistics took in every process's rows


def test_the_checkpoint_holds_all_worlds_and_resumes_in_one_process(runs):
    state = checkpoints.load(runs / "two" / "checkpoint.pt", "checkpoint")
    alone = checkpoints.load(runs / "one" / "checkpoint.pt", "checkpoint")
    assert state["config"]["worlds"] == 4  # the run as one process of all the worlds
    assert state["env"]["state.world"].tolist() == [0, 1, 2, 3]
    assert alone["env"]["state.world"].tolist() == [0, 1, 2, 3]
    assert state["rollout"]["hold"].tolist() == alone["rollout"]["hold"].tolist()
    train(runs / "two", 4, 6, 1, "--resume")  # one process of 4 worlds takes the two processes' run on
    train(runs / "one", 4, 6, 1, "--resume")
    for a, b in zip(rows(runs / "one")[4:], rows(runs / "two")[4:]):
        assert a["episodes"] == b["episodes"]
        assert float(a["mean_reward"]) == pytest.approx(float(b["mean_reward"]), rel=1e-3, abs=1e-5)


def test_a_one_process_checkpoint_resumes_in_two_processes(runs, tmp_path):
    """Each of two processes takes its worlds of a one-process checkpoint
    and they continue as one process does."""
    import shutil

    two, now = tmp_path / "two", len(rows(runs / "one"))
    shutil.copytree(runs / "one", two)
    train(two, 2, now + 2, 2, "--resume")
    train(runs / "one", 4, now + 2, 1, "--resume")
    mine, theirs = rows(two), rows(runs / "one")
    assert [r["update"] for r in mine] == [str(u) for u in range(1, now + 3)]
    for a, b in zip(theirs[now:], mine[now:]):
        assert a["episodes"] == b["episodes"]
        assert float(a["mean_reward"]) == pytest.approx(float(b["mean_reward"]), rel=1e-3, abs=1e-5)
    for key, value in weights(runs / "one").items():
        torch.testing.assert_close(weights(two)[key], value, rtol=1e-4, atol=1e-5, msg=key)


def test_a_resume_with_other_worlds_in_all_is_refused_by_name(runs, tmp_path):
    done = subprocess.run([sys.executable, "-m", "racing_stack.ppo", "--out", str(runs / "two"), "--resume",
                           "--updates", "8", *[a for s in [*SETTINGS, "worlds=2"] for a in ("--set", s)]],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 2
    assert "other settings: ['worlds']" in done.stderr


def test_a_checkpoint_one_process_refuses_its_share_of_is_refused_by_both(runs, tmp_path):
    """Steps no run reaches in process 1's worlds alone: process 1 names
    the field, process 0 says another process refused, and both stop with
    the usage error before training (neither goes on alone)."""
    out = tmp_path / "two"
    out.mkdir()
    state = checkpoints.load(runs / "two" / "checkpoint.pt", "checkpoint")
    state["env"]["state.steps"][2:] = -5  # worlds 2 and 3: process 1's share
    checkpoints.save(out / "checkpoint.pt", "checkpoint", state)
    (out / "log.csv").write_bytes((runs / "two" / "log.csv").read_bytes())
    logged = rows(out)
    done = train(out, 2, state["update"] + 2, 2, "--resume", wait=False)
    text, _ = done.communicate(timeout=600)
    assert done.returncode != 0, text
    assert "'state.steps'] must be in [0, 24]" in text and "world 2 (entry 0" in text
    assert "another process refused its share of the run" in text
    assert rows(out) == logged  # nothing trained


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_a_process_that_dies_stops_the_other_with_an_error(tmp_path):
    port, out = free_port(), tmp_path / "killed"
    sets = [a for s in [*SETTINGS, "worlds=2"] for a in ("--set", s)]
    procs = []
    for rank in (0, 1):
        env = {**os.environ, "OMP_NUM_THREADS": "1", "WORLD_SIZE": "2", "RANK": str(rank), "LOCAL_RANK": str(rank),
               "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)}
        procs.append(subprocess.Popen([sys.executable, "-m", "racing_stack.ppo", "--out", str(out), "--updates",
                                       "10000", "--timeout", "120", *sets], env=env, stdout=subprocess.PIPE,
                                      stderr=subprocess.PIPE, text=True))
    try:
        deadline = time.monotonic() + 600
        while not (out / "log.csv").exists() or len(rows(out)) < 2:  # both are training
            assert time.monotonic() < deadline, "the run did not start"
            assert all(p.poll() is None for p in procs), procs[0].communicate()
            time.sleep(0.5)
        procs[1].send_signal(signal.SIGKILL)
        killed = time.monotonic()
        _, err = procs[0].communicate(timeout=150)
        assert procs[0].returncode == 1, err
        assert time.monotonic() - killed < 130
        assert "process 0 of 2 stopped at update" in err and "stopped answering" in err
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
