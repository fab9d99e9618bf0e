"""A training run's checkpoint (``DIR/checkpoint.pt``; the role of Brax's
``checkpoint.py``): what it holds, the processes' worlds gathered into
one and shared out again, and every field checked against the run that
continues from it before anything of that run changes.

The file itself is a checked `racing_stack.checkpoints` file of kind
``"checkpoint"``; its fields are `CHECKPOINT_FIELDS`.
"""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np
import torch

from racing_stack import checkpoints
from racing_stack.ppo.algorithm import PPOUpdate
from racing_stack.ppo.config import PPOConfig
from racing_stack.ppo.distributed import Group
from racing_stack.ppo.networks import ActorCritic
from racing_stack.ppo.rollout import Rollout
from racing_stack.ppo.validation import VALIDATION_FIELDS

__all__ = ["CHECKPOINT_FIELDS", "HOW", "RETIRED", "WRITTEN_BEFORE", "Resumed", "checked", "read", "restore",
           "resume_problem", "resumed", "trainer_state", "whole_config", "worlds_state", "write"]

#: The fields of a checkpoint.
CHECKPOINT_FIELDS = {"config", "update", "policy", "acting", "best", "optimizer", "learning_rate", "crash_clock",
                     "generator", "rollout", "env", "obs"}

#: Settings of how an update runs, not of what it computes: a resume may change them.
HOW = ("update_path",)
#: Settings added after checkpoints were first written, each with the value that runs as those runs did.
WRITTEN_BEFORE = {"update_path": "eager", "matmul_precision": "highest", "policy_lag": 0,
                  "compiled": False, "act_in_jax": False}
#: Settings of how an update ran that this version no longer has: a checkpoint's are dropped
#: (``fused_mlp``: the update's MLPs as fused kernels, other roundings of autocast's bf16 maths,
#: removed in racing-stack 0.4.0; a run that had them resumes on autocast's.
#: ``critic_beside_rollout``: the critic's steps apart from the actor's, the same numbers, removed
#: after racing-stack 0.4.0).
RETIRED = ("fused_mlp", "critic_beside_rollout")


class Resumed(NamedTuple):
    """A checkpoint's state, checked and built apart from the run's own."""

    update: int
    learning_rate: float
    crash_clock: int
    policy: ActorCritic
    optimizer: torch.optim.Optimizer
    generator: torch.Generator
    #: The best validated policy ({"update", its validation, "policy": a state dict}) or None.
    best: dict[str, Any] | None
    #: With ``policy_lag``, the acting policy and the crash clock it was copied with; else None.
    acting: tuple[ActorCritic, int] | None
    #: The rollout's state (`Rollout.state`), its observation and the env's snapshot (NumPy).
    rollout: dict[str, torch.Tensor]
    obs: dict[str, np.ndarray]
    env: dict[str, np.ndarray]


def whole_config(config: PPOConfig, group: Group) -> PPOConfig:
    """The run as one process of all the worlds would see it (a
    checkpoint's settings): ``worlds`` is every process's together."""
    return dataclasses.replace(config, worlds=config.worlds * group.size)


def resume_problem(config: PPOConfig, theirs: dict[str, Any], path: Path) -> None:
    """Refuse to continue the run of checkpoint ``path`` (its config as
    JSON) with ``config``: only ``updates`` may differ, and only grow, and
    the settings of how the update runs (`HOW`). A setting the checkpoint
    was written before takes the value its run had (`WRITTEN_BEFORE`); one
    this version no longer has is dropped (`RETIRED`).

    Raises:
        ValueError: naming the settings that are missing or differ, or the updates.
    """
    theirs = {**WRITTEN_BEFORE, **{k: v for k, v in theirs.items() if k not in RETIRED}}
    missing = sorted({f.name for f in dataclasses.fields(PPOConfig)} - set(theirs))
    if missing:
        raise ValueError(f"the checkpoint {path} was written by an older racing_stack: it lacks the settings "
                         f"{missing}; start a new run")
    try:
        their_config = PPOConfig.from_json(theirs)
    except (ValueError, TypeError, KeyError) as error:
        raise checkpoints.CorruptFile(f"{path}: its settings are not a valid configuration: {error}") from None
    differ = [f.name for f in dataclasses.fields(PPOConfig)
              if f.name not in ("updates", *HOW) and getattr(their_config, f.name) != getattr(config, f.name)]
    if differ:
        raise ValueError(f"the checkpoint {path} was trained with other settings: {differ}")
    if config.updates < their_config.updates:
        raise ValueError(f"updates is {config.updates}, fewer than the {their_config.updates} of the run in {path}: "
                         f"a resumed run's updates may only grow (--updates {their_config.updates} continues it "
                         "to its end)")


def worlds_state(rollout: Rollout, env, group: Group) -> dict[str, dict[str, torch.Tensor]]:
    """The world-state fields of a checkpoint ("rollout", "env", "obs"),
    as CPU tensors: in a `Group`, every process's worlds joined as one
    process of all of them holds them (each process calls this)."""
    worlds = {"rollout": rollout.state(),
              "env": {k: torch.from_numpy(v) for k, v in env.snapshot().items()},
              "obs": {k: torch.from_numpy(np.array(v)) for k, v in rollout.obs.items()}}
    if group.size == 1:
        return worlds
    # Exchanged as NumPy arrays (pickled tensors do not cross every backend).
    parts = group.objects({kind: {k: v.numpy() for k, v in fields.items()} for kind, fields in worlds.items()})
    return _union([{kind: {k: torch.from_numpy(v) for k, v in fields.items()} for kind, fields in part.items()}
                   for part in parts])


def trainer_state(trainer: Any) -> dict[str, Any]:
    """Everything the next update of a `racing_stack.ppo.train.Trainer`
    depends on (tensors and plain data; `CHECKPOINT_FIELDS`): config,
    update, policy, optimizer, step size, the crash cost's warm-up clock,
    generator, the rollout's state, the env's snapshot and observation
    (every process's worlds), the best validated policy; with
    ``policy_lag``, the acting policy and its clock.

    Raises:
        RuntimeError: the next update's rollout was collected ahead (a
            checkpoint holds none: `Trainer.run` writes one only after an
            update that collected none).
    """
    if trainer.ahead:
        raise RuntimeError("the next update's rollout was collected ahead: a checkpoint cannot hold it")
    lagged = trainer.config.policy_lag
    return {
        "config": whole_config(trainer.config, trainer.group).to_json(), "update": trainer.update,
        "policy": trainer.policy.state_dict(), "best": trainer.best, "optimizer": trainer.learner.optimizer_state(),
        "acting": {"policy": trainer.learner.acting.state_dict(), "crash_clock": trainer.acting_clock} if lagged
        else None,
        "learning_rate": trainer.rate, "crash_clock": trainer.crash_clock, "generator": trainer.generator.get_state(),
        **worlds_state(trainer.rollout, trainer.env, trainer.group),
    }


def restore(trainer: Any, path: Path) -> None:
    """Continue a `racing_stack.ppo.train.Trainer` from the checkpoint at
    ``path`` of a run with the same settings (only ``updates`` may grow; a
    linear step size then follows the new count: the next update's is
    ``learning_rate x (1 - done / updates)``). Everything is checked, in
    every process, before anything changes (`resumed`, which says what it
    raises)."""
    state = resumed(path, trainer.learner, trainer.rollout, trainer.env)
    trainer.env.restore(state.env)
    learner = trainer.learner
    learner.policy, learner.optimizer, learner.generator = state.policy, state.optimizer, state.generator
    trainer.selection.best = state.best
    if state.acting is not None:
        trainer.learner.acting.load_state_dict(state.acting[0].state_dict())  # in place: a captured rollout reads it
        trainer.acting_clock = state.acting[1]
    trainer.ahead = False
    trainer.rollout.restore(state.rollout, state.obs)
    trainer.update = trainer.saved_update = state.update
    trainer.crash_clock = state.crash_clock
    trainer.rate = state.learning_rate
    if trainer.config.schedule == "linear":
        trainer.rate = trainer.config.learning_rate * (1.0 - trainer.update / trainer.config.updates)


def write(path: Path, state: dict[str, Any], group: Group) -> None:
    """Write a checkpoint's ``state`` to ``path`` (the lead process; each
    process calls this) atomically as a checked `racing_stack.checkpoints`
    file: a kill or a full disk leaves the previous checkpoint whole.

    Raises:
        OSError: in every process, when the lead process's write failed.
    """
    failed = None
    if group.lead:
        try:
            checkpoints.save(path, "checkpoint", state)
        except OSError as error:
            failed = error
    if group.any(failed is not None):  # every process stops on a failed write
        raise failed or OSError(f"the lead process could not write {path}")


def read(path: Path, config: PPOConfig, group: Group) -> dict[str, Any]:
    """The fields of the checkpoint at ``path``, its world-state fields cut
    to this process's worlds, after checking its settings against
    ``config`` (`resume_problem`); nothing else is checked yet
    (`checked`).

    Raises:
        FileNotFoundError: no file at ``path``.
        racing_stack.checkpoints.CorruptFile: the file is damaged, of another kind, or holds no settings.
        ValueError: the settings differ, lack some or had more updates.
    """
    # On the CPU: Adam's step counts stay there (on a GPU each would cost a host wait per step).
    state = checkpoints.load(path, "checkpoint", map_location="cpu")
    if not isinstance(state, dict) or not isinstance(state.get("config"), dict):
        raise checkpoints.CorruptFile(f"{path} holds no run configuration")
    resume_problem(whole_config(config, group), state["config"], path)
    if "acting" not in state:  # written before the setting: a run without a lag
        state = {**state, "acting": None}
    if group.size > 1:
        state = {**state, **{k: _share(state[k], group) for k in ("rollout", "env", "obs")}}
    return state


def checked(state: dict[str, Any], path: Path, learner: PPOUpdate, rollout: Rollout, env) -> Resumed:
    """A checkpoint's ``state`` (`read`) checked field by field against
    the run of ``learner``, ``rollout`` and ``env``, and built apart from
    theirs (nothing of the run changes).

    Raises:
        racing_stack.checkpoints.CorruptFile: naming ``path`` and the first field that does not fit.
    """
    def bad(field: str, what: str) -> checkpoints.CorruptFile:
        return checkpoints.CorruptFile(f"{path}: its {field} {what}")

    if set(state) != CHECKPOINT_FIELDS:
        raise bad("fields", f"are {sorted(state)}, expected {sorted(CHECKPOINT_FIELDS)}")
    updates = learner.config.updates
    update = state["update"]
    if isinstance(update, bool) or not isinstance(update, int) or not 0 <= update <= updates:
        raise bad("update", f"is {update!r}, not an int in [0, {updates}]")
    rate = state["learning_rate"]
    if not isinstance(rate, float) or not 0.0 <= rate <= 1.0:  # a linear schedule ends at 0
        raise bad("learning rate", f"is {rate!r}, not a float in [0, 1]")
    clock = state["crash_clock"]
    if isinstance(clock, bool) or not isinstance(clock, int) or not 0 <= clock <= update:
        raise bad("crash clock", f"is {clock!r}, not an int in [0, {update}]")
    policy = _loaded_policy(learner, state["policy"], f"{path}: its policy")
    acting = state["acting"]
    if learner.config.policy_lag:
        if not isinstance(acting, dict) or set(acting) != {"policy", "crash_clock"}:
            raise bad("acting policy", "is not a dict of ['crash_clock', 'policy'] (the run has a policy_lag)")
        lagged = acting["crash_clock"]
        if isinstance(lagged, bool) or not isinstance(lagged, int) or not 0 <= lagged <= clock:
            raise bad("acting policy", f"has the crash clock {lagged!r}, not an int in [0, {clock}]")
        acting = (_loaded_policy(learner, acting["policy"], f"{path}: its acting policy"), lagged)
    elif acting is not None:
        raise bad("acting policy", "is there, but the run has no policy_lag")
    optimizer = _loaded_optimizer(learner, policy, state["optimizer"], bad)
    generator = torch.Generator(learner.device)
    try:
        generator.set_state(state["generator"].cpu())
    except (RuntimeError, TypeError, AttributeError) as error:
        raise bad("generator state", f"is not one: {error}") from None
    problem = rollout.check_state(state["rollout"])
    if problem:
        raise bad("rollout state", problem)
    obs, snapshot = _numpy_fields(state["obs"]), _numpy_fields(state["env"])
    if obs is None or set(obs) != set(rollout.obs) or any(
            obs[k].shape != tuple(v.shape) or obs[k].dtype != v.dtype for k, v in rollout.obs.items()):
        raise bad("observation", "does not match the env's fields, shapes and types")
    if snapshot is None:
        raise bad("env snapshot", "is not a dict of tensors of NumPy types")
    best = state["best"]
    if best is not None:
        keys = {"update", "policy", *VALIDATION_FIELDS}
        if not isinstance(best, dict) or set(best) != keys:
            raise bad("best policy", f"is not a dict of {sorted(keys)}")
        if not all(isinstance(best[k], float) for k in VALIDATION_FIELDS):
            raise bad("best policy", "has a validation result that is not a number")
        if isinstance(best["update"], bool) or not isinstance(best["update"], int) or \
                not 0 <= best["update"] <= update:
            raise bad("best policy", f"has the update {best['update']!r}, not an int in [0, {update}]")
        _loaded_policy(learner, best["policy"], f"{path}: its best policy")
    try:
        env.check_snapshot(snapshot)
    except (ValueError, TypeError) as error:
        raise checkpoints.CorruptFile(f"{path}: its env snapshot cannot be restored here: {error}") from None
    return Resumed(update, rate, clock, policy, optimizer, generator, best, acting, state["rollout"], obs, snapshot)


def resumed(path: Path, learner: PPOUpdate, rollout: Rollout, env) -> Resumed:
    """The checkpoint at ``path`` (`read`) checked against the run of
    ``learner``, ``rollout`` and ``env`` (`checked`) in every process of
    the learner's group, each its own share: all refuse, or none.

    Raises:
        FileNotFoundError: no file at ``path``.
        racing_stack.checkpoints.CorruptFile: the file is damaged, of
            another kind, or holds fields that do not fit this run (or
            another process's share does not), naming the file and the field.
        ValueError: the checkpoint's settings differ, lack some (written
            before they existed) or had more updates, naming them.
    """
    state = read(path, learner.config, learner.group)
    refused: checkpoints.CorruptFile | None = None
    try:
        result = checked(state, path, learner, rollout, env)
    except checkpoints.CorruptFile as error:
        refused = error
    if learner.group.any(refused is not None):
        raise refused or checkpoints.CorruptFile(f"{path}: another process refused its share of the run")
    return result


def _loaded_policy(learner: PPOUpdate, weights: Any, source: str) -> ActorCritic:
    """A new policy holding ``weights`` (checked by `ActorCritic.load_checked`)."""
    policy = learner.new_policy()
    policy.load_checked(weights, source)
    return policy


def _loaded_optimizer(learner: PPOUpdate, policy: ActorCritic, state: Any, bad) -> torch.optim.Optimizer:
    """A new optimizer of ``policy`` holding ``state``, its settings finite and its moments shaped like the policy."""
    optimizer = learner.new_optimizer(policy)
    try:
        optimizer.load_state_dict(state)
    except (ValueError, KeyError, TypeError, RuntimeError) as error:
        raise bad("optimizer state", f"does not fit the policy: {error}") from None
    for group in optimizer.param_groups:
        numbers = [group.get("lr"), group.get("eps"), *group.get("betas", ())]
        if not all(isinstance(v, float) and math.isfinite(v) for v in numbers):
            raise bad("optimizer settings", f"are not finite numbers: {numbers}")
    learner.adopt(optimizer)
    for p in policy.parameters():
        moments = optimizer.state.get(p, {})
        if any(not isinstance(v, torch.Tensor) or (v.dim() and v.shape != p.shape) or not v.isfinite().all()
               for v in moments.values()):
            raise bad("optimizer state", "has a moment of the wrong shape or a non-finite one")
    return optimizer


def _numpy_fields(tree: Any) -> dict[str, np.ndarray] | None:
    """A checkpoint's dict of tensors as NumPy arrays; None when it is
    not one (or holds a type NumPy lacks, such as bfloat16)."""
    if not isinstance(tree, dict) or not all(isinstance(v, torch.Tensor) for v in tree.values()):
        return None
    try:
        return {k: v.cpu().numpy() for k, v in tree.items()}
    except TypeError:
        return None


def _union(parts: list[dict[str, dict[str, torch.Tensor]]]) -> dict[str, dict[str, torch.Tensor]]:
    """The processes' world states (rank order) as one process's of all
    their worlds: every field with an axis has a world axis first and is
    joined along it; a scalar (the env's root seed) is one value for all."""
    out: dict[str, dict[str, torch.Tensor]] = {}
    for kind, fields in parts[0].items():
        out[kind] = {}
        for name, value in fields.items():
            values = [part[kind][name] for part in parts]
            if value.dim():
                out[kind][name] = torch.cat(values)
            elif all(torch.equal(v, value) for v in values):
                out[kind][name] = value
            else:
                raise ValueError(f"the processes' {kind} field {name!r} differs: {[v.item() for v in values]}")
    return out


def _share(fields: Any, group: Group) -> Any:
    """This process's worlds of a checkpoint's world-state fields (as one
    process of all the worlds saved them); what is not a dict of
    tensors is left for the checks to refuse."""
    if not isinstance(fields, dict) or not all(isinstance(v, torch.Tensor) for v in fields.values()):
        return fields
    return {k: group.share(v) if v.dim() else v for k, v in fields.items()}
