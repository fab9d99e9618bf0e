"""What a PPO run can trust, on the CPU: the guard stops a run whose data
went bad and its last checkpoint resumes to the uninterrupted result;
damaged, foreign or nonsensical checkpoints and weights are refused by
name and change nothing; a run is never overwritten silently; log.csv and
the TensorBoard events of a resumed run hold every update exactly once;
non-finite or huge settings are refused by name."""

from __future__ import annotations

import copy
import csv
import dataclasses
import math
import shutil
import struct
from pathlib import Path

import jax.numpy as jnp
import numpy as np
import pytest
import torch

from racing_stack import checkpoints
from racing_stack.checkpoints import CorruptFile
from racing_stack.ppo import LOG_FIELDS, PRESETS, GuardError, RunExists, Trainer, make_env

#: A tiny run (as test_ppo's TINY): 4 worlds on the first 4 Train tracks,
#: 8 steps, 24-step episodes; a checkpoint every update, no validation.
TINY = dataclasses.replace(PRESETS["cpu"], worlds=4, steps=8, updates=4, minibatches=2, tracks=4,
                           max_episode_steps=24, stagger_steps=3, checkpoint_every=1, validate_every=0,
                           validation_tracks=2)
#: The log columns that depend on the run's data only (not on its timing).
DATA_FIELDS = [k for k in LOG_FIELDS if k not in ("seconds", "transitions_per_s")]


def quiet(row):
    pass


@pytest.fixture(scope="module")
def env():
    return make_env(TINY)


@pytest.fixture(scope="module")
def straight(env, tmp_path_factory):
    """An uninterrupted TINY run: its rows, its policy after every update and
    its checkpoint of every update (copied aside as the run goes)."""
    out = tmp_path_factory.mktemp("straight")
    states, saved = {}, {}

    def record(row):  # called before the update's own checkpoint: checkpoint.pt is the previous update's
        k = row["update"]
        states[k] = {key: v.clone() for key, v in trainer.policy.state_dict().items()}
        if k > 1:
            saved[k - 1] = out.parent / f"{out.name}-update{k - 1}.pt"
            shutil.copyfile(out / "checkpoint.pt", saved[k - 1])

    trainer = Trainer(TINY, env, out, progress=record)
    rows = trainer.run()
    saved[TINY.updates] = out / "checkpoint.pt"
    return {"out": out, "rows": rows, "states": states, "checkpoints": saved, "trainer": trainer}


def assert_same_policy(a, b):
    assert list(a) == list(b)
    for key in a:
        assert torch.equal(a[key], b[key]), key


def assert_same_rows(rows, want):
    """Log rows (dicts from the trainer or strings from log.csv) equal in every data column."""
    assert len(rows) == len(want)
    for mine, theirs in zip(rows, want):
        for key in DATA_FIELDS:
            a, b = float(mine[key]), float(theirs[key])
            assert a == b or (math.isnan(a) and math.isnan(b)), (mine["update"], key, a, b)


def read_log(path):
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


# -- the guard ---------------------------------------------------------------------


class Corrupting:
    """The env, with the outputs of its ``call``-th step replaced by
    ``corrupt(obs, reward, info)`` -> (obs, reward). The actions it passes
    on are made finite, so that the shared env stays sound whatever the
    trainer sends."""

    def __init__(self, real, call, corrupt):
        self.real, self.call, self.corrupt, self.calls = real, call, corrupt, 0

    def __getattr__(self, name):
        return getattr(self.real, name)

    def step(self, action):
        self.calls += 1
        obs, reward, terminated, truncated, info = self.real.step(jnp.nan_to_num(action))
        if self.calls == self.call:
            obs, reward = self.corrupt(obs, reward, info)
        return obs, reward, terminated, truncated, info


def bad_reward(value, seen):
    def corrupt(obs, reward, info):
        reward = reward.at[1].set(value)  # an impossible lap fraction
        rollout = seen["trainer"].rollout  # the reward wrapper's memory before this step
        shaped, _, _ = TINY.reward(rollout.endings, reward, obs, info, jnp.zeros(4, bool),
                                   jnp.ones(4))
        seen["shaped"] = float(shaped[1])  # what the trainer learns from
        return obs, reward
    return corrupt


def bad_feature(seen):
    def corrupt(obs, reward, info):
        seen["shaped"] = math.nan
        return {**obs, "velocity_body": obs["velocity_body"].at[2, 0].set(jnp.nan)}, reward
    return corrupt


def bad_parameter(seen):
    def corrupt(obs, reward, info):  # the policy's parameters go bad in the middle of update 2's rollout
        with torch.no_grad():
            seen["trainer"].policy.log_std[0] = math.nan
        seen["shaped"] = math.nan
        return obs, reward
    return corrupt


@pytest.mark.parametrize("case", ["reward 224", "reward nan", "observation feature", "parameter"])
def test_the_guard_stops_a_corrupted_run_and_its_last_checkpoint_resumes(env, straight, tmp_path, case):
    seen = {}
    corrupt = {"reward 224": bad_reward(224.0, seen), "reward nan": bad_reward(math.nan, seen),
               "observation feature": bad_feature(seen), "parameter": bad_parameter(seen)}[case]
    call = TINY.steps + 4  # the 4th step of update 2
    trainer = Trainer(TINY, Corrupting(env, call, corrupt), tmp_path, progress=quiet)
    seen["trainer"] = trainer
    with pytest.raises(GuardError) as caught:
        trainer.run()
    message = str(caught.value)
    field = case.split(" ")[0] if case.startswith("reward") else case
    assert message.startswith("update 2: ") and f" {field} values are not" in message, message
    assert f"the worst is {seen['shaped']!r}" in message, message
    if case == "reward 224":
        assert seen["shaped"] > 224.0  # 224 laps in one step: hundreds of thousands of metres
    assert f"the last checkpoint, {tmp_path / 'checkpoint.pt'} (update 1), is whole" in message
    # Nothing of update 2 was logged or saved: the checkpoint is update 1's, sound.
    assert [int(r["update"]) for r in read_log(tmp_path / "log.csv")] == [1]
    state = checkpoints.load(tmp_path / "checkpoint.pt", "checkpoint")
    assert state["update"] == 1
    assert_same_policy(state["policy"], straight["states"][1])
    # Resumed with the sound env, it ends where the uninterrupted run ended.
    resumed = Trainer(TINY, env, tmp_path, progress=quiet)
    rows = resumed.run(resume=True)
    assert [r["update"] for r in rows] == [2, 3, 4]
    assert_same_rows(rows, straight["rows"][1:])
    assert_same_policy(resumed.policy.state_dict(), straight["states"][4])
    assert_same_rows(read_log(tmp_path / "log.csv"), straight["rows"])


# -- refused checkpoints -------------------------------------------------------------


def trainer_state(trainer):
    """Everything `Trainer.load` could change, copied."""
    return {"policy": {k: v.clone() for k, v in trainer.policy.state_dict().items()},
            "optimizer": copy.deepcopy(trainer.optimizer.state_dict()), "update": trainer.update,
            "saved_update": trainer.saved_update, "generator": trainer.generator.get_state(),
            "rollout": trainer.rollout.state(), "rate": trainer.rate, "crash_clock": trainer.crash_clock,
            "best": trainer.best,
            "obs": {k: np.array(v) for k, v in trainer.rollout.obs.items()}, "env": trainer.env.snapshot()}


def assert_unchanged(trainer, before):
    after = trainer_state(trainer)
    assert_same_policy(after["policy"], before["policy"])
    keys = ("update", "saved_update", "best", "rate", "crash_clock")
    assert [after[k] for k in keys] == [before[k] for k in keys]
    assert torch.equal(after["generator"], before["generator"])
    for key, value in before["rollout"].items():
        assert torch.equal(after["rollout"][key], value), key
    assert repr(after["optimizer"]) == repr(before["optimizer"])
    for part in ("obs", "env"):
        assert list(after[part]) == list(before[part])
        for key in before[part]:
            np.testing.assert_array_equal(after[part][key], before[part][key], err_msg=f"{part}[{key}]")


def nonsense(state, case):
    """``state`` (a checkpoint's payload) with one field that cannot be this run's."""
    policy = state["policy"]
    if case == "policy of another shape":
        policy["actor.0.weight"] = torch.zeros(3, 3)
    elif case == "policy missing a layer":
        del policy["critic.2.bias"]
    elif case == "policy not finite":
        policy["critic.0.weight"][0, 0] = math.inf
    elif case == "policy not tensors":
        state["policy"] = {k: v.tolist() for k, v in policy.items()}
    elif case == "update negative":
        state["update"] = -1
    elif case == "update beyond the run":
        state["update"] = TINY.updates + 1
    elif case == "update a string":
        state["update"] = "2"
    elif case == "optimizer moment of another shape":
        state["optimizer"]["state"][0]["exp_avg"] = torch.zeros(1, 2)
    elif case == "optimizer moment not finite":
        state["optimizer"]["state"][0]["exp_avg_sq"][0] = math.nan
    elif case == "optimizer of another network":
        state["optimizer"]["param_groups"][0]["params"] = [0]
    elif case == "generator state":
        state["generator"] = torch.zeros(3, dtype=torch.uint8)
    elif case == "pending of another shape":
        state["rollout"]["pending"] = torch.zeros(TINY.worlds + 1, dtype=torch.bool)
    elif case == "hold beyond the stagger":
        state["rollout"]["hold"][0] = TINY.stagger_steps + 1
    elif case == "previous action not finite":
        state["rollout"]["previous_action"][0, 0] = math.nan
    elif case == "rollout state missing a field":
        del state["rollout"]["still"]
    elif case == "learning rate negative":
        state["learning_rate"] = -1e-3
    elif case == "crash clock beyond the update":
        state["crash_clock"] = state["update"] + 1
    elif case == "crash clock a bool":
        state["crash_clock"] = True
    elif case == "feature statistics negative":
        policy["normalizer.var"][0] = -1.0
    elif case == "observation missing a field":
        del state["obs"]["yaw"]
    elif case == "observation of another type":
        state["obs"]["yaw"] = state["obs"]["yaw"].to(torch.float64)
    elif case == "observation of a type NumPy lacks":
        state["obs"]["yaw"] = state["obs"]["yaw"].to(torch.bfloat16)
    elif case == "env snapshot of a type NumPy lacks":
        key = sorted(state["env"])[-1]
        state["env"][key] = state["env"][key].to(torch.bfloat16)
    elif case == "env snapshot missing a field":
        del state["env"][sorted(state["env"])[0]]
    elif case == "env snapshot of another shape":
        key = sorted(state["env"])[-1]
        state["env"][key] = torch.zeros(tuple(state["env"][key].shape) + (2,), dtype=state["env"][key].dtype)
    elif case == "env snapshot with negative step counts":
        state["env"]["state.steps"] = torch.full_like(state["env"]["state.steps"], -5)
    elif case == "env snapshot with a segment beyond its track":
        state["env"]["state.race.local_segment"] = torch.full_like(state["env"]["state.race.local_segment"], 10**6)
    elif case == "env snapshot with a car far off its track":
        state["env"]["physics.qpos"][:, 0] = 1e9
    elif case == "fields missing":
        del state["optimizer"]
    elif case == "fields extra":
        state["extra"] = 1
    elif case == "best policy":
        state["best"] = {"update": 1, "policy": policy}
    elif case == "settings invalid":
        state["config"]["learning_rate"] = -1.0
    elif case == "not a dict":
        return [state]
    else:
        raise AssertionError(case)
    return state


NONSENSE = ["policy of another shape", "policy missing a layer", "policy not finite", "policy not tensors",
            "update negative", "update beyond the run", "update a string", "optimizer moment of another shape",
            "optimizer moment not finite", "optimizer of another network", "generator state",
            "pending of another shape", "hold beyond the stagger", "previous action not finite",
            "rollout state missing a field", "learning rate negative",
            "crash clock beyond the update", "crash clock a bool", "feature statistics negative",
            "observation missing a field", "observation of another type",
            "observation of a type NumPy lacks", "env snapshot missing a field", "env snapshot of another shape",
            "env snapshot of a type NumPy lacks", "env snapshot with negative step counts",
            "env snapshot with a segment beyond its track", "env snapshot with a car far off its track",
            "fields missing", "fields extra",
            "best policy", "settings invalid", "not a dict"]


#: The field each out-of-range env value is refused by (the env's `restore` names it).
ENV_FIELDS = {"env snapshot with negative step counts": "'state.steps'",
              "env snapshot with a segment beyond its track": "'state.race.local_segment'",
              "env snapshot with a car far off its track": "'physics.qpos'] must be a car within 50 m"}


@pytest.fixture(scope="module")
def untrained(env, tmp_path_factory):
    return Trainer(TINY, env, tmp_path_factory.mktemp("fresh"), progress=quiet)


@pytest.fixture
def fresh(untrained):
    """A trainer that has not trained, and its state now (other tests step the shared env)."""
    return untrained, trainer_state(untrained)


def refuse(trainer, before, path, match):
    with pytest.raises(CorruptFile, match=match) as caught:
        trainer.load(path)
    assert str(path) in str(caught.value)
    assert_unchanged(trainer, before)


def test_damaged_and_foreign_checkpoints_are_refused_and_change_nothing(fresh, straight, tmp_path):
    trainer, before = fresh
    good = straight["checkpoints"][2]
    data = good.read_bytes()
    rng = np.random.default_rng(0)
    path = tmp_path / "checkpoint.pt"
    for _ in range(3):
        flipped = bytearray(data)
        flipped[int(rng.integers(len(data) // 2, len(data)))] ^= 0x10
        path.write_bytes(bytes(flipped))
        refuse(trainer, before, path, "checksum does not match")
    for cut in (0, 40, len(data) // 2, len(data) - 1):
        path.write_bytes(data[:cut])
        refuse(trainer, before, path, "not a racing_stack file|truncated")
    torch.save(checkpoints.load(good, "checkpoint"), path)  # what a plain torch.save checkpoint would be
    refuse(trainer, before, path, "not a racing_stack file")
    checkpoints.save(path, "weights", straight["states"][2])
    refuse(trainer, before, path, "expected a 'checkpoint' file")
    # The sound file loads: the refusals above were the file's fault.
    trainer_copy = Trainer(TINY, trainer.env, tmp_path / "sound", progress=quiet)
    trainer_copy.load(good)
    assert trainer_copy.update == 2 and trainer_copy.saved_update == 2
    assert_same_policy(trainer_copy.policy.state_dict(), straight["states"][2])


@pytest.mark.parametrize("case", NONSENSE)
def test_a_checkpoint_of_nonsense_fields_is_refused_by_name_and_changes_nothing(fresh, straight, tmp_path, case):
    trainer, before = fresh
    path = tmp_path / "checkpoint.pt"
    checkpoints.save(path, "checkpoint", nonsense(checkpoints.load(straight["checkpoints"][2], "checkpoint"), case))
    with pytest.raises(CorruptFile) as caught:
        trainer.load(path)
    assert str(path) in str(caught.value), caught.value
    assert ENV_FIELDS.get(case, "") in str(caught.value), caught.value
    assert_unchanged(trainer, before)


def test_a_resume_with_fewer_updates_is_refused_naming_updates(env, straight, tmp_path):
    shutil.copytree(straight["out"], tmp_path / "run")
    shutil.copyfile(straight["checkpoints"][2], tmp_path / "run" / "checkpoint.pt")
    trainer = Trainer(dataclasses.replace(TINY, updates=3), env, tmp_path / "run", progress=quiet)
    before = trainer_state(trainer)
    log = (tmp_path / "run" / "log.csv").read_bytes()
    with pytest.raises(ValueError, match="updates is 3, fewer than the 4 of the run in"):
        trainer.run(resume=True)
    assert_unchanged(trainer, before)
    assert (tmp_path / "run" / "log.csv").read_bytes() == log
    # A checkpoint without a setting it should have was written by another version: refused by name too.
    state = checkpoints.load(straight["checkpoints"][2], "checkpoint")
    del state["config"]["gamma"]
    checkpoints.save(tmp_path / "old.pt", "checkpoint", state)
    with pytest.raises(ValueError, match=r"lacks the settings \['gamma'\]"):
        trainer.load(tmp_path / "old.pt")
    assert_unchanged(trainer, before)


# -- exported weights ---------------------------------------------------------------


def test_a_damaged_weights_file_of_an_exported_plugin_is_refused(env, straight, tmp_path):
    from racing_env.plugins import load_plugin
    from racing_env.runner import challenge_values

    from racing_stack.ppo.export import export_plugin

    plugin = export_plugin(straight["trainer"].policy, TINY, tmp_path / "plugin")
    obs, _ = env.reset(seed=3)
    one = {k: np.asarray(v)[0] for k, v in obs.items()}

    def controller():
        loaded = load_plugin(plugin)
        return loaded.load_class()(one, {}, loaded.config(challenge_values(env)))

    weights = plugin / "weights.pt"
    data = weights.read_bytes()
    action = controller().compute_control(one)  # the sound plugin acts
    assert action.shape == (2,) and np.isfinite(action).all()
    policy = straight["states"][4]
    wrong = dict(policy, **{"actor.0.weight": torch.zeros(2, 2)})
    damages = {
        "flipped": lambda: weights.write_bytes(data[:-100] + bytes([data[-100] ^ 1]) + data[-99:]),
        "truncated": lambda: weights.write_bytes(data[:len(data) // 3]),
        "foreign": lambda: torch.save(policy, weights),
        "checkpoint": lambda: shutil.copyfile(straight["checkpoints"][1], weights),
        "wrong shape": lambda: checkpoints.save(weights, "weights", wrong),
        "not finite": lambda: checkpoints.save(weights, "weights", dict(policy, log_std=torch.tensor([0.0, math.nan]))),
    }
    for name, damage in damages.items():
        damage()
        with pytest.raises(CorruptFile) as caught:
            controller()
        assert str(weights) in str(caught.value), name
    weights.write_bytes(data)
    np.testing.assert_array_equal(controller().compute_control(one), action)


# -- no silent overwrite -------------------------------------------------------------


def test_a_folder_holding_a_run_is_not_overwritten_silently(env, straight, tmp_path):
    out = tmp_path / "run"
    trainer = Trainer(TINY, env, out, progress=quiet)
    for name in ("checkpoint.pt", "log.csv", "tensorboard", "plugin", "learning_curve.png", "policy.gif"):
        path = out / name
        path.mkdir() if "." not in name else path.write_bytes(b"an earlier run's")
        with pytest.raises(RunExists, match=name):
            trainer.run()
        assert path.exists() and (path.is_dir() or path.read_bytes() == b"an earlier run's")
        shutil.rmtree(path) if path.is_dir() else path.unlink()
    assert issubclass(RunExists, FileExistsError)
    # A whole earlier run: refused, untouched; then replaced on request.
    shutil.rmtree(out)
    shutil.copytree(straight["out"], out)
    (out / "policy.gif").write_bytes(b"old")
    (out / "plugin").mkdir()
    (out / "notes.txt").write_text("mine")
    files = {p: p.read_bytes() for p in out.rglob("*") if p.is_file()}
    with pytest.raises(RunExists):
        trainer.run()
    assert {p: p.read_bytes() for p in out.rglob("*") if p.is_file()} == files
    rows = trainer.run(overwrite=True)
    assert_same_rows(rows, straight["rows"])  # the refusals changed nothing: the same run from scratch
    assert not (out / "policy.gif").exists() and not (out / "plugin").exists()
    assert (out / "notes.txt").read_text() == "mine"
    assert_same_rows(read_log(out / "log.csv"), straight["rows"])
    assert_same_policy(checkpoints.load(out / "checkpoint.pt", "checkpoint")["policy"], straight["states"][4])


# -- log.csv and TensorBoard of a resumed run ---------------------------------------


def events(folder: Path):
    """Every scalar (tag, step, value) of the TensorBoard event files in ``folder``,
    read over the TFRecord framing (length, its CRC, data, its CRC)."""
    from tensorboardX.proto.event_pb2 import Event

    found = []
    for path in sorted(folder.iterdir()):
        data = path.read_bytes()
        at = 0
        while at < len(data):
            assert at + 12 <= len(data), f"{path} ends inside a record header"
            (length,) = struct.unpack("<Q", data[at:at + 8])
            assert at + 12 + length + 4 <= len(data), f"{path} ends inside a record"
            event = Event.FromString(data[at + 12:at + 12 + length])
            at += 12 + length + 4
            for value in event.summary.value:
                found.append((value.tag, event.step, value.simple_value))
    return found


def assert_events_match_the_log(folder, rows):
    got = events(folder)
    pairs = [(tag, step) for tag, step, _ in got]
    assert len(pairs) == len(set(pairs)), sorted(p for p in pairs if pairs.count(p) > 1)
    want = {(key, int(float(row["transitions"]))): float(row[key]) for row in rows for key in LOG_FIELDS[3:]
            if math.isfinite(float(row[key]))}
    assert set(pairs) == set(want)
    for tag, step, value in got:
        assert value == np.float32(want[tag, step]), (tag, step)


def test_a_resume_rewrites_the_log_up_to_its_checkpoint_and_the_events_hold_each_update_once(env, straight,
                                                                                                   tmp_path):
    assert_events_match_the_log(straight["out"] / "tensorboard", read_log(straight["out"] / "log.csv"))
    out = tmp_path / "run"
    shutil.copytree(straight["out"], out)
    shutil.copyfile(straight["checkpoints"][2], out / "checkpoint.pt")  # killed after logging update 4
    lines = (out / "log.csv").read_bytes().splitlines(keepends=True)
    assert len(lines) == 5
    with open(out / "log.csv", "ab") as f:  # a row cut by a kill, then garbage
        f.write(lines[3][:37] + b"\n" + b"\x00" * 300 + b"garbage,,\n2,64\n" + lines[4][:-5])
    seen = []

    def look(row):
        seen.append((out / "log.csv").read_bytes())

    trainer = Trainer(TINY, env, out, progress=look)
    rows = trainer.run(resume=True)
    assert [r["update"] for r in rows] == [3, 4]
    # At the first resumed update the log held rows 1 and 2, as written, and that update's row.
    assert seen[0].splitlines(keepends=True)[:3] == lines[:3]
    assert [int(r["update"]) for r in read_log(out / "log.csv")] == [1, 2, 3, 4]
    assert (out / "log.csv").read_bytes().splitlines(keepends=True)[:3] == lines[:3]
    assert_same_rows(read_log(out / "log.csv"), straight["rows"])
    assert_same_policy(trainer.policy.state_dict(), straight["states"][4])
    assert_events_match_the_log(out / "tensorboard", read_log(out / "log.csv"))
    # Resumed again from its end: nothing to do, nothing repeated.
    assert Trainer(TINY, env, out, progress=quiet).run(resume=True) == []
    assert [int(r["update"]) for r in read_log(out / "log.csv")] == [1, 2, 3, 4]
    assert_events_match_the_log(out / "tensorboard", read_log(out / "log.csv"))


def test_a_resume_names_the_updates_its_log_lacks(env, straight, tmp_path, capsys):
    """A log that lacks rows before the checkpoint (here updates 1 and 2,
    cut out by hand) is said once, naming them; the run goes on from its
    checkpoint and the log keeps the gap."""
    out = tmp_path / "run"
    shutil.copytree(straight["out"], out)
    shutil.copyfile(straight["checkpoints"][3], out / "checkpoint.pt")
    lines = (out / "log.csv").read_bytes().splitlines(keepends=True)
    (out / "log.csv").write_bytes(b"".join([lines[0], lines[3]]))  # the header and update 3
    rows = Trainer(TINY, env, out, progress=quiet).run(resume=True)
    assert [r["update"] for r in rows] == [4]
    said = [line for line in capsys.readouterr().err.splitlines() if "lacks the rows" in line]
    assert said == [f"train-ppo: {out / 'log.csv'} lacks the rows of 2 of the 3 updates before the checkpoint "
                    "(updates 1-2): a damaged or edited log; the resumed log and its TensorBoard events keep "
                    "that gap"]
    assert [int(r["update"]) for r in read_log(out / "log.csv")] == [3, 4]


def test_a_resume_keeps_one_row_of_each_update_its_log_repeats(env, straight, tmp_path, capsys):
    out = tmp_path / "run"
    shutil.copytree(straight["out"], out)
    shutil.copyfile(straight["checkpoints"][3], out / "checkpoint.pt")
    lines = (out / "log.csv").read_bytes().splitlines(keepends=True)
    (out / "log.csv").write_bytes(b"".join([lines[0], lines[1], lines[2], lines[1], lines[3]]))  # update 1 twice
    rows = Trainer(TINY, env, out, progress=quiet).run(resume=True)
    assert [r["update"] for r in rows] == [4]
    err = capsys.readouterr().err
    assert "repeats the rows of some updates (1 row more than updates): an edited log; the first row of each " \
           "update is kept" in err and "lacks the rows" not in err, err
    assert [int(r["update"]) for r in read_log(out / "log.csv")] == [1, 2, 3, 4]
    assert_same_rows(read_log(out / "log.csv"), straight["rows"])


@pytest.mark.parametrize("garbage", [
    ",".join(["nan"] * len(LOG_FIELDS)).encode(), ",".join(["1.5"] * len(LOG_FIELDS)).encode(),
    ",".join(["1e0"] * len(LOG_FIELDS)).encode(), b"\xff\xfe\x80 not UTF-8",
], ids=["nan", "1.5", "1e0", "not UTF-8"])
def test_a_garbage_log_row_is_dropped_on_resume(env, straight, tmp_path, garbage):
    out = tmp_path / "run"
    shutil.copytree(straight["out"], out)
    shutil.copyfile(straight["checkpoints"][3], out / "checkpoint.pt")
    with open(out / "log.csv", "ab") as f:
        f.write(garbage + b"\n")
    rows = Trainer(TINY, env, out, progress=quiet).run(resume=True)
    assert [r["update"] for r in rows] == [4]
    assert_same_rows(read_log(out / "log.csv"), straight["rows"])


# -- settings ------------------------------------------------------------------------


@pytest.mark.parametrize("setting, name", [
    ("reward.step_cost=1e400", "step_cost"), ("reward.step_cost=-1e400", "step_cost"),
    ("reward.metres_scale=1e7", "metres_scale"), ("reward.metres_scale=-0.1", "metres_scale"),
    ("reward.off_track_penalty=1000001", "off_track_penalty"), ("reward.off_track_penalty=True", "off_track_penalty"),
    ("reward.off_track_penalty='2'", "off_track_penalty"), ("reward.step_cost=nan", "reward.step_cost"),
    ("reward.step_cost=float('inf')", "reward.step_cost"), ("reward.slip_cost=1e7", "slip_cost"),
    ("reward.slip_free_mps=101", "slip_free_mps"), ("reward.slip_free_mps=nan", "slip_free_mps"),
    ("features.spacing_m=1e400", "spacing_m"), ("features.spacing_m=0", "spacing_m"),
    ("features.spacing_m=nan", "features.spacing_m"), ("features.scale_m=1e5", "scale_m"),
    ("features.scale_m=-1e-9", "scale_m"), ("features.points=641", "points"),
    ("features.points=1000000000", "points"), ("features.points=12.0", "points"),
    ("learning_rate=1e400", "learning_rate"), ("init_log_std=-1e400", "init_log_std"),
    ("max_grad_norm=1e400", "max_grad_norm"), ("gamma=1e400", "gamma"),
])
def test_non_finite_and_huge_settings_are_refused_by_name(setting, name):
    with pytest.raises(ValueError, match=name.replace(".", r"\.")):
        TINY.override([setting])


def test_the_largest_settings_allowed_are_accepted():
    config = TINY.override(["reward.step_cost=1e6", "reward.metres_scale=1000000", "reward.off_track_penalty=0",
                            "features.spacing_m=1e4", "features.scale_m=10000", "features.points=640"])
    assert (config.reward.step_cost, config.features.points, config.features.spacing_m) == (1e6, 640, 1e4)


@pytest.mark.parametrize("name", ["learning_rate", "clip", "max_grad_norm", "value_coef", "entropy_coef",
                                  "init_log_std", "reward.step_cost", "features.scale_m"])
def test_an_int_too_large_for_a_float_is_refused_by_name(name):
    with pytest.raises(ValueError, match=name.split(".")[-1]):
        TINY.override([f"{name}=1{'0' * 400}"])
