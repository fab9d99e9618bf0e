"""PPO on the vector env, on one device or one process per GPU, in the shape of Brax's
``agents/ppo``:

- `racing_stack.ppo.config`: `PPOConfig` and the presets;
- `racing_stack.ppo.networks`: the actor-critic and its feature
  normaliser (Torch alone: the exported plugin imports only this);
- `racing_stack.ppo.losses`: the clipped loss and the step size's schedules;
- `racing_stack.ppo.rollout`: the rollouts, their endings and bootstraps;
- `racing_stack.ppo.validation`: on-device validation, accounted for as the Runner does;
- `racing_stack.ppo.algorithm`: the update (advantages, minibatch steps, the guard's reads);
- `racing_stack.ppo.checkpoint`: a run's checkpoint, its fields and their checks;
- `racing_stack.ppo.envs`: a run's training and validation envs;
- `racing_stack.ppo.train`: the train loop;
- `racing_stack.ppo.export`: a policy as a controller plugin (imports the networks alone);
- `racing_stack.ppo.logs`: the log, TensorBoard and the learning curve;
- `racing_stack.ppo.distributed`: the processes training one policy together (``torchrun``);
- `racing_stack.ppo.cli`: ``train-ppo`` and what a run leaves at its end.

Importing this package imports none of them: each name below is loaded
on first use, so ``racing_stack.ppo.networks`` comes without JAX or the
trainer (the trainer's module stops JAX from preallocating the GPU).
"""

from __future__ import annotations

import importlib
from typing import Any

#: Each public name and the module that holds it.
_HOMES = {
    "PPOConfig": "config", "PRESETS": "config",
    "ActorCritic": "networks",
    "LOG_FIELDS": "logs", "draw_curve": "logs",
    "RUN_FILES": "train", "GuardError": "train", "RunExists": "train", "Trainer": "train", "finish": "cli",
    "make_env": "envs", "make_validation_env": "envs", "resume_problem": "checkpoint", "whole_config": "checkpoint",
    "PPOUpdate": "algorithm",
    "Group": "distributed",
    "export_plugin": "export",
    "main": "cli",
}

__all__ = sorted(_HOMES)


def __getattr__(name: str) -> Any:
    if name not in _HOMES:
        raise AttributeError(f"module 'racing_stack.ppo' has no attribute {name!r}")
    return getattr(importlib.import_module(f"racing_stack.ppo.{_HOMES[name]}"), name)
