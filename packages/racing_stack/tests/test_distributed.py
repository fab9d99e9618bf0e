"""`racing_stack.ppo.distributed` and the trainer's pieces that join
processes: a process alone is the identity, the checkpoint's union of
every process's worlds and each process's share of it, the guard's rows
of several processes, and the trainer's refusals (the two-process runs
themselves: tests-integration/test_ppo_distributed.py)."""

from __future__ import annotations

import types

import pytest
import torch

from racing_stack.ppo import PRESETS, Trainer
from racing_stack.ppo.distributed import Group, start
from racing_stack.ppo.algorithm import first_worst as _first_worst
from racing_stack.ppo.checkpoint import _share, _union, whole_config


def test_a_process_alone_changes_nothing():
    alone = Group()
    x = torch.arange(6.0)
    assert alone.lead and alone.first_world(8) == 0
    assert alone.share(x) is x or torch.equal(alone.share(x), x)
    assert torch.equal(alone.sum(x.clone()), x)
    assert alone.any(True) and not alone.any(False)
    assert torch.equal(alone.gather(x), x[None])
    assert alone.objects({"a": 1}) == [{"a": 1}]


def test_a_process_takes_its_rows_of_the_whole_batch():
    whole = torch.arange(12).reshape(6, 2)
    assert torch.equal(Group(1, 3).share(whole), whole[2:4])
    assert Group(2, 3).first_world(5) == 10 and not Group(2, 3).lead


@pytest.mark.parametrize(("rank", "size", "error"), [(1, 1, ValueError), (-1, 2, ValueError), (0, 0, ValueError),
                                                     (True, 2, TypeError), (0, 2.0, TypeError)])
def test_a_bad_group_is_refused_by_name(rank, size, error):
    with pytest.raises(error, match="rank|size"):
        Group(rank, size)


def test_start_without_torchrun_is_a_process_alone(monkeypatch):
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    assert start() == Group()


def test_the_checkpoint_joins_every_process_worlds_and_each_takes_its_share_back():
    parts = [{"env": {"state.world": torch.tensor([2 * r, 2 * r + 1]), "state.root_seed": torch.tensor(7),
                      "physics.qpos": torch.full((2, 3), float(r))},
              "rollout": {"hold": torch.tensor([r, r])}} for r in range(3)]
    union = _union(parts)
    assert union["env"]["state.world"].tolist() == [0, 1, 2, 3, 4, 5]
    assert union["env"]["state.root_seed"].item() == 7
    assert union["env"]["physics.qpos"].shape == (6, 3)
    for r in range(3):
        back = _share(union["env"], Group(r, 3))
        for key, value in parts[r]["env"].items():
            assert torch.equal(back[key], value), key
    assert _share("not fields", Group(1, 3)) == "not fields"  # left for the checks to refuse
    parts[1]["env"]["state.root_seed"] = torch.tensor(8)
    with pytest.raises(ValueError, match="root_seed"):
        _union(parts)


def test_the_guard_counts_every_process_values_and_names_the_first_worst():
    reads = torch.tensor([[[0.0, 0.0], [2.0, 5.0], [0.0, 0.0]],
                          [[1.0, -3.0], [1.0, 9.0], [0.0, 0.0]]])  # [processes, fields, (count, worst)]
    assert _first_worst(reads).tolist() == [[1.0, -3.0], [3.0, 5.0], [0.0, 0.0]]
    assert torch.equal(_first_worst(reads[:1]), reads[0])


def test_a_checkpoint_states_all_the_worlds_together():
    config = PRESETS["cpu"]
    assert whole_config(config, Group(1, 4)).worlds == 4 * config.worlds
    assert whole_config(config, Group()) == config


def test_the_trainer_refuses_an_env_of_another_share_or_a_validation_off_the_lead(tmp_path):
    config = PRESETS["cpu"]
    env = types.SimpleNamespace(num_envs=config.worlds, first_world=0)
    with pytest.raises(ValueError, match="first_world is 0; process 1 of 2 drives the worlds from 16"):
        Trainer(config, env, tmp_path, group=Group(1, 2))
    env.first_world = config.worlds
    with pytest.raises(ValueError, match="validation: only the lead process validates"):
        Trainer(config, env, tmp_path, validation=object(), group=Group(1, 2))
