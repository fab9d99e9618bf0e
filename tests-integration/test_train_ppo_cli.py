"""train-ppo's user errors, in-process: each exits 2 through argparse with
a message naming the flag, changes nothing on disk, and those that can be
found before the env is built are found before it is built."""

from __future__ import annotations

import os
import shutil

import pytest
import torch

from racing_stack import checkpoints, ppo
from racing_stack.ppo import cli

#: A tiny CPU run, as train-ppo's flags.
FLAGS = ["--preset", "cpu", "--updates", "2", "--set", "worlds=4", "--set", "steps=8", "--set", "tracks=4",
         "--set", "max_episode_steps=24", "--set", "validate_every=0"]
CONFIG = ppo.PRESETS["cpu"].override(["updates=2", "worlds=4", "steps=8", "tracks=4", "max_episode_steps=24",
                                      "validate_every=0"])


@pytest.fixture(scope="module")
def built():
    """The env of CONFIG, built once."""
    return ppo.make_env(CONFIG)


@pytest.fixture(scope="module")
def run_folder(built, tmp_path_factory):
    """A finished run of CONFIG (its checkpoint at update 2)."""
    out = tmp_path_factory.mktemp("run")
    ppo.Trainer(CONFIG, built, out, progress=lambda row: None).run()
    return out


@pytest.fixture
def envs(built, monkeypatch):
    """train-ppo's env builders, counting their calls; CONFIG's env is the
    one built once (any other config is built as usual)."""
    calls = []
    real = ppo.make_env

    def make_env(config, group=None):
        calls.append(config)
        if config.worlds == CONFIG.worlds and config.tracks == CONFIG.tracks and \
                config.max_episode_steps == CONFIG.max_episode_steps:
            return built
        return real(config, group)

    monkeypatch.setattr(cli, "make_env", make_env)
    return calls


def usage_error(capsys, argv):
    """The message of the usage error that ``train-ppo argv`` exits with."""
    with pytest.raises(SystemExit) as caught:
        ppo.main(argv)
    err = capsys.readouterr().err
    assert caught.value.code == 2, err
    assert "Traceback" not in err
    lines = [line for line in err.splitlines() if line.startswith("train-ppo: error: ")]
    assert len(lines) == 1, err
    return lines[0].removeprefix("train-ppo: error: ")


def snapshot(folder):
    return {p.relative_to(folder): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


@pytest.fixture
def run(run_folder, tmp_path):
    """A copy of the finished run (checkpoint at update 2)."""
    out = tmp_path / "run"
    shutil.copytree(run_folder, out)
    return out


# Errors in the flags themselves: nothing is read, nothing built.
@pytest.mark.parametrize("extra, flag, said", [
    (["--updates", "0"], "--updates", "updates must be in [1, 2**31), got 0"),
    (["--updates", "-3"], "--updates", "got -3"),
    (["--updates", "abc"], "--updates", "invalid int value: 'abc'"),
    (["--updates", "1.5"], "--updates", "invalid int value: '1.5'"),
    (["--preset", "nope"], "--preset", "invalid choice: 'nope'"),
    (["--set", "nonsense"], "--set", "must be name=value"),
    (["--set", "lr=1"], "--set", "unknown setting 'lr'"),
    (["--set", "reward.bonus=1"], "--set", "unknown setting 'reward.bonus'"),
    (["--set", "reward.step_cost=1e400"], "--set", "step_cost"),
    (["--set", "reward.off_track_penalty=-2"], "--set", "off_track_penalty"),
    (["--set", "features.spacing_m=nan"], "--set", "features.spacing_m"),
    (["--set", "features.scale_m=1e9"], "--set", "scale_m"),
    (["--set", "features.points=100000"], "--set", "points"),
    (["--set", "learning_rate=fast"], "--set", "learning_rate"),
    (["--set", "hidden=3"], "--set", "hidden"),
    (["--set", "seed=-1"], "--set", "seed"),
    (["--set", "learning_rate=1" + "0" * 400], "--set", "learning_rate"),
    (["--timeout", "nan"], "--timeout", "got nan"),
    (["--timeout", "inf"], "--timeout", "got inf"),
    (["--timeout", "0"], "--timeout", "in (0, 86400] seconds"),
    (["--timeout", "soon"], "--timeout", "invalid float value: 'soon'"),
], ids=lambda v: " ".join(v)[:40] if isinstance(v, list) else None)
def test_a_bad_flag_is_a_usage_error_naming_it(capsys, envs, tmp_path, extra, flag, said):
    message = usage_error(capsys, FLAGS + ["--out", str(tmp_path / "out")] + extra)
    assert message.startswith(f"argument {flag}: ") and said in message, message
    assert envs == []
    assert not (tmp_path / "out").exists() or not list((tmp_path / "out").iterdir())


def test_resume_and_overwrite_together_are_refused(capsys, envs, run):
    files = snapshot(run)
    message = usage_error(capsys, FLAGS + ["--out", str(run), "--resume", "--overwrite"])
    assert "--resume" in message and "--overwrite" in message
    assert snapshot(run) == files and envs == []


def test_an_out_that_is_a_file_or_under_a_file_is_refused(capsys, envs, tmp_path):
    path = tmp_path / "somefile"
    path.write_text("mine")
    message = usage_error(capsys, FLAGS + ["--out", str(path)])
    assert message == f"argument --out: {str(path)!r} is a file, not a folder"
    message = usage_error(capsys, FLAGS + ["--out", str(path / "sub")])
    assert message == f"argument --out: {str(path)!r} is a file, not a folder"
    message = usage_error(capsys, FLAGS + ["--out", str(tmp_path / ("a" * 300) / "b")])  # the system's refusal
    assert message.startswith("argument --out: cannot write in ") and message.endswith("(File name too long)")
    assert path.read_text() == "mine" and envs == []


def test_overwrite_removes_a_link_in_the_run_not_what_it_points_to(capsys, envs, tmp_path):
    """A run file that is a link (to a folder or a file) is removed as a
    link: what it points to stays."""
    from racing_stack.ppo.train import claim

    out, other = tmp_path / "run", tmp_path / "other"
    out.mkdir()
    other.mkdir()
    (other / "mine.txt").write_text("keep")
    (out / "log.csv").write_text("x")
    (out / "plugin").symlink_to(other, target_is_directory=True)
    (out / "policy.gif").symlink_to(other / "mine.txt")
    claim(out, overwrite=True)
    assert sorted(p.name for p in out.iterdir()) == [] and (other / "mine.txt").read_text() == "keep"


@pytest.mark.parametrize("out", ["", "  "])
def test_an_empty_out_is_refused(capsys, envs, out):
    """An empty path would train into the working folder."""
    assert usage_error(capsys, FLAGS + ["--out", out]) == f"argument --out: must name a folder, got {out!r}"
    assert envs == []


def test_an_out_holding_a_run_is_refused_without_resume_or_overwrite(capsys, envs, run):
    files = snapshot(run)
    message = usage_error(capsys, FLAGS + ["--out", str(run)])
    assert message.startswith(f"argument --out: {run}") and "already holds a run" in message
    assert "--resume" in message and "--overwrite" in message
    assert snapshot(run) == files and envs == []


def test_an_empty_cache_variable_is_refused(capsys, envs, tmp_path, monkeypatch):
    """It would build the pools into the working folder."""
    monkeypatch.setenv("RACING_STACK_CACHE", "")
    monkeypatch.chdir(tmp_path)
    message = usage_error(capsys, FLAGS + ["--out", str(tmp_path / "out")])
    assert message == "$RACING_STACK_CACHE is set but empty: it must name a folder (or be unset)"
    assert envs == [] and list(tmp_path.iterdir()) == []


def test_resume_without_a_checkpoint_is_refused(capsys, envs, tmp_path):
    message = usage_error(capsys, FLAGS + ["--out", str(tmp_path / "empty"), "--resume"])
    assert message.startswith("argument --resume: ") and "no checkpoint.pt" in message
    assert envs == []


def damage(path, how):
    data = path.read_bytes()
    if how == "flipped":
        path.write_bytes(data[:-1000] + bytes([data[-1000] ^ 0x40]) + data[-999:])
    elif how == "truncated":
        path.write_bytes(data[:len(data) // 2])
    elif how == "empty":
        path.write_bytes(b"")
    elif how == "foreign":
        torch.save(checkpoints.load(path, "checkpoint"), path)
    elif how == "weights":
        checkpoints.save(path, "weights", checkpoints.load(path, "checkpoint")["policy"])
    elif how == "older":
        state = checkpoints.load(path, "checkpoint")
        del state["config"]["gamma"]
        checkpoints.save(path, "checkpoint", state)
    elif how == "no settings":
        checkpoints.save(path, "checkpoint", {"update": 2})
    else:
        raise AssertionError(how)


@pytest.mark.parametrize("how, said", [
    ("flipped", "checksum does not match"), ("truncated", "truncated"), ("empty", "not a racing_stack file"),
    ("foreign", "not a racing_stack file"), ("weights", "expected a 'checkpoint' file"),
    ("older", "lacks the settings ['gamma']"), ("no settings", "holds no run configuration"),
])
def test_resume_from_a_damaged_or_foreign_checkpoint_is_refused(capsys, envs, run, how, said):
    damage(run / "checkpoint.pt", how)
    files = snapshot(run)
    message = usage_error(capsys, FLAGS + ["--out", str(run), "--resume"])
    assert message.startswith("argument --resume: ") and said in message, message
    assert str(run / "checkpoint.pt") in message, message
    assert snapshot(run) == files and envs == []


@pytest.mark.parametrize("extra, said", [
    (["--set", "learning_rate=0.002"], "other settings: ['learning_rate']"),
    (["--set", "reward.off_track_penalty=5.0"], "other settings: ['reward']"),
    (["--updates", "1"], "updates is 1, fewer than the 2"),
    (["--updates", "1"], "may only grow (--updates 2 continues it to its end)"),
])
def test_resume_with_other_settings_or_fewer_updates_is_refused(capsys, envs, run, extra, said):
    files = snapshot(run)
    message = usage_error(capsys, FLAGS + ["--out", str(run), "--resume"] + extra)
    assert message.startswith("argument --resume: ") and said in message, message
    assert snapshot(run) == files and envs == []


@pytest.mark.parametrize("case, said", [
    ("policy of another shape", "does not fit the network"),
    ("observation of a type NumPy lacks", "observation"),
])
def test_resume_from_a_checkpoint_of_nonsense_fields_is_refused_once_the_env_is_built(capsys, envs, run, case,
                                                                                       said):
    path = run / "checkpoint.pt"
    state = checkpoints.load(path, "checkpoint")
    if case == "policy of another shape":
        state["policy"]["critic.0.weight"] = torch.zeros(3, 3)
    else:
        state["obs"]["yaw"] = state["obs"]["yaw"].to(torch.bfloat16)
    checkpoints.save(path, "checkpoint", state)
    files = snapshot(run)
    message = usage_error(capsys, FLAGS + ["--out", str(run), "--resume"])
    assert message.startswith("argument --resume: ") and said in message and str(path) in message, message
    assert snapshot(run) == files and len(envs) == 1


@pytest.mark.parametrize("setting, said", [("tracks=100000", "tracks must be in [1, 10000], got 100000"),
                                           ("validation_tracks=100000", "validation_tracks must be at most the "
                                                                        "Validation split's 1000 tracks, got 100000")])
def test_more_tracks_than_a_split_holds_are_refused_before_any_work(capsys, envs, tmp_path, setting, said):
    flags = FLAGS + (["--set", "validate_every=1"] if setting.startswith("validation") else [])
    message = usage_error(capsys, flags + ["--out", str(tmp_path / "out"), "--set", setting])
    assert message.startswith("argument --set: ") and said in message, message
    assert envs == [] and not (tmp_path / "out").exists()


def test_envs_too_large_for_this_machine_are_a_usage_error(capsys, envs, tmp_path):
    """The env refuses a batch whose buffers cannot fit before it allocates
    them; train-ppo reports that as a usage error, not a traceback."""
    worlds = 2**31 - 8  # a multiple of the preset's 2 minibatches x 8 steps' divisor
    message = usage_error(capsys, FLAGS + ["--out", str(tmp_path / "big"), "--set", f"worlds={worlds}"])
    assert message.startswith(f"the envs cannot be built: num_envs={worlds} needs at least "), message
    assert "GiB of host memory" in message and [c.worlds for c in envs] == [worlds]


def test_without_the_train_extra_a_run_exports_says_what_it_skipped_and_exits_0(capsys, envs, tmp_path,
                                                                                 monkeypatch):
    """matplotlib, pygame and Pillow missing (the ``train`` extra not
    installed): the plugin is exported, the curve and the video are named
    as skipped with the extra that brings them, no traceback, exit 0."""
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *args: None if name in ("matplotlib", "pygame", "PIL") else real(name, *args))
    out = tmp_path / "bare"
    assert ppo.main([*FLAGS, "--out", str(out)]) == 0
    err = capsys.readouterr().err
    assert "Traceback" not in err
    assert "no curve: matplotlib not installed (pip install 'racing-stack[train]' brings it)" in err
    assert "no video: pygame, PIL not installed (pip install 'racing-stack[train]' brings it)" in err
    assert (out / "plugin" / "weights.pt").is_file() and f"plugin {out / 'plugin'}" in err
    assert not (out / "learning_curve.png").exists() and not (out / "policy.gif").exists()


def test_resuming_a_finished_run_says_so_and_only_exports_it_named_after_the_run(capsys, envs, run, monkeypatch):
    """``--resume`` of a run at its last update trains nothing: one line
    says the run was complete (all its updates) and is only exported again;
    the plugin is named after the run's folder, not "plugin"."""
    import importlib.util

    from racing_env.plugins import load_plugin

    real = importlib.util.find_spec  # no curve, no video: the export alone
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *args: None if name in ("matplotlib", "pygame", "PIL") else real(name, *args))
    log = (run / "log.csv").read_text()
    assert ppo.main([*FLAGS, "--out", str(run), "--resume"]) == 0
    err = capsys.readouterr().err
    said = [line for line in err.splitlines() if "already complete" in line]
    assert said == [f"train-ppo: the run in {run} was already complete (all 2 updates): --resume trains nothing and "
                    "only exports it again (the plugin, the curve, the video)"], err
    assert (run / "log.csv").read_text() == log  # no update added
    assert load_plugin(run / "plugin", import_code=False).name == "run"
    capsys.readouterr()
    assert ppo.main([*FLAGS, "--out", str(run), "--resume", "--updates", "3"]) == 0  # one more update: not said
    assert "already complete" not in capsys.readouterr().err


def test_a_full_disk_at_the_export_is_said_not_a_traceback(capsys, envs, run, monkeypatch):
    """The run is trained and checkpointed; its export then meets a full
    disk: one line names the failure and what --resume will do, exit 1,
    and the checkpoint, the log and the plugin are as they were (the
    resume rewrites its TensorBoard events)."""

    def kept(folder):
        return {path: body for path, body in snapshot(folder).items() if path.parts[0] != "tensorboard"}

    before = kept(run)

    real = os.fsync

    def full(fd):  # the disk fills up once the export writes the plugin's files
        if "/plugin/" in os.readlink(f"/proc/self/fd/{fd}"):
            raise OSError(28, "No space left on device")
        real(fd)

    monkeypatch.setattr(os, "fsync", full)  # every atomic write fsyncs its file before the rename
    assert ppo.main([*FLAGS, "--out", str(run), "--resume"]) == 1
    err = capsys.readouterr().err
    assert "Traceback" not in err
    assert "train-ppo: the export failed: [Errno 28] No space left on device; the run's last checkpoint (update 2) " \
           "is whole, the plugin, the curve or the video may not be: --resume, once there is room, exports them " \
           "again" in err, err
    assert kept(run) == before
    monkeypatch.undo()
    assert ppo.main([*FLAGS, "--out", str(run), "--resume"]) == 0

