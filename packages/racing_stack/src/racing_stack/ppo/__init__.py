"""PPO on the vector env, on one device or one process per GPU, in the shape of Brax's
``agents/ppo``:

- `racing_stack.ppo.config`: `PPOConfig` and the presets;
- `racing_stack.ppo.networks`: the actor-critic and its feature
  normaliser (Torch alone: the exported plugin imports only this);
- `racing_stack.ppo.losses`: the clipped loss and the step size's schedules;
- `racing_stack.ppo.rollout`: the rollouts, their endings and bootstraps;
- `racing_stack.ppo.validation`: on-device validation, accounted for as the Runner does;
- `racing_stack.ppo.train`: the train loop, checkpoints and what a run leaves at its end;
- `racing_stack.ppo.export`: a policy as a controller plugin (imports the networks alone);
- `racing_stack.ppo.logs`: the log, TensorBoard and the learning curve;
- `racing_stack.ppo.distributed`: the processes training one policy together (``torchrun``);
- `racing_stack.ppo.cli`: ``train-ppo``.

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
    "RUN_FILES": "train", "GuardError": "train", "RunExists": "train", "Trainer": "train", "finish": "train",
    "make_env": "train", "make_validation_env": "train", "resume_problem": "train", "whole_config": "train",
    "Group": "distributed",
    "export_plugin": "export",
    "main": "cli",
}

__all__ = sorted(_HOMES)


def __getattr__(name: str) -> Any:
    if name not in _HOMES:
        raise AttributeError(f"module 'racing_stack.ppo' has no attribute {name!r}")
    return getattr(importlib.import_module(f"racing_stack.ppo.{_HOMES[name]}"), name)
