"""PPO's rollouts: the policy drives every world for ``steps`` calls on the
device, and the buffers keep what the update needs.

NEXT_STEP autoreset: the call after a terminal one only resets its world
(the env ignores its action, returns the new episode's first observation,
reward 0, no flags). That slot is masked out of GAE's result and of every
loss; the terminal transition before it is kept. So is every call of a
world still held at the start (`PPOConfig.stagger_steps`).

What ends a return (`returns_cut`): the env's off-track and invalid-action
endings, and the reward wrapper's training-only endings (the margin band
entered, a stall), after which the env drives on. What bootstraps
(`returns_bootstrapped`): the Level's timeout and a completed lap, from the
value of the terminal call's own observation (the reset slot's input): the
car would race on, so the finish line is not the end of the value.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import torch

from racing_env import TerminationReason
from racing_stack.interop import Handover
from racing_stack.ppo.config import PPOConfig
from racing_stack.ppo.distributed import Group
from racing_stack.ppo.env_step import PACK, Clock, after_step
from racing_stack.ppo.graphs import capture_stream, captured, capturing, warm_up
from racing_stack.ppo.jax_rollout import Carry, acting_vector, scan_rollout, spec_of
from racing_stack.ppo.networks import ActorCritic
from racing_stack.reward import MARGIN, STALL, Endings

__all__ = ["CapturedAct", "Rollout", "episodes", "returns_bootstrapped", "returns_cut"]


class Rollout:
    """The rollout buffers and the state that carries from one rollout to
    the next (the observation, the pending resets, the start-up holds, the
    reward wrapper's memory and the previous action).

    Args:
        config: the run's settings.
        env: its `racing_env.VecCarRacingEnv` (``config.worlds`` worlds, reset here with ``config.seed``).
        device: Torch's device (JAX's too).
        crossing: every JAX-Torch crossing goes through it.
        generator: draws the start-up holds.
        group: the processes training together (`Group`; this one drives
            its share of every draw made for the whole batch).
    """

    def __init__(self, config: PPOConfig, env, device: torch.device, crossing: Handover,
                 generator: torch.Generator, group: Group = Group()) -> None:
        self.config, self.env, self.device, self.crossing, self.group = config, env, device, crossing, group
        t, e, d = config.steps, config.worlds, config.features.size
        z = dict(device=device)
        # A step's outputs arrive in one pack (`after_step`), whose columns
        # `keep` copies into these; the buffers below are views of them.
        self.floats = torch.zeros((t, 4, e), **z)
        self.ints = torch.zeros((t, 2, e), dtype=torch.int32, **z)
        self.done = torch.zeros((t, 2, e), dtype=torch.bool, **z)
        self.buf = {
            "x": torch.zeros((t, e, d), **z), "u": torch.zeros((t, e, 2), **z),
            "logp": torch.zeros((t, e), **z), "value": torch.zeros((t, e), **z), "valid": torch.zeros((t, e), **z),
            "reward": self.floats[:, 0], "progress": self.floats[:, 1], "lap_time": self.floats[:, 2],
            "speed": self.floats[:, 3], "ending": self.ints[:, 0], "reason": self.ints[:, 1],
            "terminated": self.done[:, 0], "truncated": self.done[:, 1],
        }
        obs, _ = env.reset(seed=config.seed)
        self.obs = obs
        self.last_value = torch.zeros(e, **z)
        self._act: CapturedAct | None = None
        self._kept: dict[str, torch.Tensor] | None = None
        hold = group.share(torch.randint(0, config.stagger_steps + 1, (e * group.size,), generator=generator,
                                         dtype=torch.int32, **z))
        #: The holds and pending resets (JAX's, `Clock`), and Torch's copy of whether the next call holds each
        #: world braked (the pack's last column).
        self.clock = Clock(jnp.asarray(hold.cpu().numpy()), jnp.zeros(e, bool))
        self.held = hold > 0
        self.endings = config.reward.start(e)
        self.previous_action = jnp.zeros((e, 2), jnp.float32)
        space = env.single_action_space
        self.brake = torch.as_tensor(np.array([0.0, space.low[1]], np.float32), device=device)
        #: float32 [T, E, 2]: the env's actions of the last rollout collected as one JAX program
        #: (`PPOConfig.act_in_jax`; None on the Torch rollout, whose actions cross to the env one by one).
        self.sent: torch.Tensor | None = None
        #: The CUDA stream the rollouts' Torch work runs on (None on the CPU).
        self.stream = torch.cuda.Stream(device) if device.type == "cuda" else None

    def collect(self, policy: ActorCritic, generator: torch.Generator, crash_weight: float = 1.0,
                after: torch.cuda.Event | None = None) -> None:
        """One rollout into the buffers, on the device: each step crosses the
        action to JAX and the step's outputs back to Torch in one pack with
        the next call's features (one jitted function makes it), then
        fences (`racing_stack.interop.Handover`). ``crash_weight``: the share of
        the crash and slide costs paid (`ShapedReward`).

        On a CUDA device Torch's work runs on `stream`, after the current
        stream's work (or only after the event ``after``: an update
        launched since then runs beside the rollout), and the current
        stream waits for the rollout."""
        if self.stream is None:
            self._collect(policy, generator, crash_weight)
            return
        current = torch.cuda.current_stream(self.device)
        if after is None:
            self.stream.wait_stream(current)
        else:
            self.stream.wait_event(after)
        with torch.cuda.stream(self.stream):
            self._collect(policy, generator, crash_weight)
        current.wait_stream(self.stream)

    def _collect(self, policy: ActorCritic, generator: torch.Generator, crash_weight: float) -> None:
        env, buf, cfg, cross = self.env, self.buf, self.config, self.crossing
        weight = jax.device_put(np.float32(crash_weight))  # once a rollout: no transfer inside the loop
        if cfg.act_in_jax:
            self._scan(policy, generator, weight)
            return
        features = cfg.features(self.obs, self.previous_action)
        act = self._captured_act(policy, features) if captured(cfg, self.device, self.group) else None
        with torch.no_grad():
            buf["x"][0] = cross.to_torch(features)
            for t in range(cfg.steps):
                if act is None:
                    noise = self.group.share(torch.randn((cfg.worlds * self.group.size, 2), generator=generator,
                                                         device=self.device))
                    action = self.act(policy, t, noise)
                else:
                    torch.randn(act.noise.shape, generator=generator, device=self.device, out=act.noise)
                    action = act.replay(t)
                sent = cross.to_jax(action)
                obs, reward, terminated, truncated, info = env.step(sent)
                pack, self.endings, self.clock, self.previous_action = after_step(
                    cfg.reward, cfg.features, self.endings, self.clock, reward, obs,
                    info["termination_reason"], info["lap_time_s"], terminated, truncated, sent, weight)
                if act is None:
                    self.keep(policy, t, cross.to_torch(pack))
                else:
                    act.pack.copy_(cross.to_torch(pack))
                cross.fence()
                self.obs = obs
            if act is not None:
                act.replay_tail()

    def _scan(self, policy: ActorCritic, generator: torch.Generator, weight: jax.Array) -> None:
        """One rollout as one JAX program (`racing_stack.ppo.jax_rollout`):
        the acting policy's vector and the noise [T, E, 2] cross to JAX, the
        rows [T, E, ...] back to Torch, which keeps them and computes the
        values over all of them at once; the env continues from where the
        scan ended."""
        cfg, cross, buf, d = self.config, self.crossing, self.buf, self.config.features.size
        group, (t, e) = self.group, (cfg.steps, cfg.worlds)
        with torch.no_grad():
            whole = torch.randn((e * group.size, t, 2), generator=generator, device=self.device)
            noise = group.share(whole).transpose(0, 1).contiguous()
            vector = acting_vector(policy)
            spec = spec_of(policy, cfg.features, cfg.reward, cfg.matmul_precision, cfg.residual, t)
            carry = Carry(None, None, self.endings, self.clock, self.previous_action, self.obs,
                          cfg.features(self.obs, self.previous_action))
            # The env's own state, donated: it continues from the scan's.
            carry, rows = scan_rollout(spec, self.env.params, self.env.physics, self.env.core_state(), carry,
                                       cross.to_jax(vector), cross.to_jax(noise), cross.to_jax(self.brake), weight)
            self.env.continue_from(carry.state, carry.data)
            self.endings, self.clock, self.previous_action, self.obs = (carry.endings, carry.clock, carry.previous,
                                                                         carry.obs)
            rows, last = cross.to_torch(rows), cross.to_torch(carry.x)
            buf["x"].copy_(rows[..., :d])
            acted = d + len(PACK)
            self._keep_columns(slice(None), rows[..., d:acted])
            buf["u"].copy_(rows[..., acted:acted + 2])
            buf["logp"].copy_(rows[..., acted + 2])
            if self.sent is None:
                self.sent = torch.empty((t, e, 2), device=self.device)
            self.sent.copy_(rows[..., acted + 3:])
            buf["value"].copy_(policy.value(buf["x"].reshape(t * e, d)).reshape(t, e))
            self.last_value.copy_(policy.value(last))
            cross.fence()

    def keep(self, policy: ActorCritic, t: int, pack: torch.Tensor) -> None:
        """What rollout step ``t`` keeps of its ``pack`` (`after_step`'s,
        float32 [E, features + len(`PACK`)]): its columns into the
        buffers' slot ``t`` (whether the call was driven: ``valid``),
        whether the next call holds each world, and the next call's
        features into slot ``t + 1`` (after the last step, V of them into
        `last_value`). No host read."""
        d, last = self.config.features.size, t + 1 == self.config.steps
        self._keep_columns(slice(t, t + 1), pack[None, :, d:])
        if last:
            self.last_value.copy_(policy.value(pack[:, :d]))  # in place: an update may read the kept copy
        else:
            self.buf["x"][t + 1] = pack[:, :d]

    def _keep_columns(self, steps: slice, columns: torch.Tensor) -> None:
        """The pack columns after the features (`PACK`) of the rollout's
        ``steps``, float32 [n, E, len(PACK)], into the buffers' slots (whether
        each call was driven: ``valid``), and whether the call after the
        last of them holds each world. No host read."""
        self.floats[steps] = columns[..., 0:4].transpose(1, 2)
        self.ints[steps] = columns[..., 4:6].transpose(1, 2)  # small integers, exact in float32
        torch.ne(columns[..., 6:8].transpose(1, 2), 0, out=self.done[steps])
        self.buf["valid"][steps] = columns[..., 8]
        torch.ne(columns[-1, :, 9], 0, out=self.held)  # in place: a captured step reads it

    def act(self, policy: ActorCritic, t: int, noise: torch.Tensor) -> torch.Tensor:
        """The policy's work of rollout step ``t`` on the features in the
        buffers' slot ``t`` [E, D] and standard normal ``noise`` [E, 2]:
        the normalised action, its log probability and the value into the
        buffers' slot ``t``; returns the env's action [E, 2] (full braking
        where the world is held). No host read."""
        buf = self.buf
        x = buf["x"][t]
        u, buf["logp"][t], buf["value"][t] = policy.act(x, noise)
        buf["u"][t] = u
        return torch.where(self.held[:, None], self.brake, policy.env_action(u, x))

    def _captured_act(self, policy: ActorCritic, features: jax.Array) -> CapturedAct:
        """This rollout's `CapturedAct` of ``policy``, captured anew for
        another policy or other buffers (once JAX has made ``features``:
        nothing of JAX's is in flight while Torch captures)."""
        if self._act is None or not self._act.fits(self, policy):
            self._act = None  # its memory pool goes before the next capture takes one
            jax.block_until_ready(features)
            self._act = CapturedAct(self, policy)
        return self._act

    def batch(self, keep: bool = False) -> dict[str, torch.Tensor]:
        """The last rollout as the update reads it: the buffers [T, E, ...]
        and "last_value" [E]. The live ones, or (``keep``) a copy that the
        next rollout does not write (made on the current stream: a
        rollout collected while an update reads it writes the live ones)."""
        live = {**self.buf, "last_value": self.last_value}
        if not keep:
            return live
        if self._kept is None:
            self._kept = {k: torch.empty_like(v) for k, v in live.items()}
        torch._foreach_copy_(list(self._kept.values()), list(live.values()))
        return self._kept

    def state(self) -> dict[str, torch.Tensor]:
        """The state a checkpoint keeps beside the env's snapshot and
        observation (pending resets, holds, the reward's memory, the
        previous action), as CPU tensors."""
        memory = {k: torch.from_numpy(np.array(v)) for k, v in self.endings._asdict().items()}
        clock = {k: torch.from_numpy(np.array(v)) for k, v in self.clock._asdict().items()}
        return {**clock, **memory,
                "previous_action": torch.from_numpy(np.array(self.previous_action))}

    def check_state(self, state: Any) -> str | None:
        """What is wrong with a checkpoint's rollout ``state`` for this
        rollout (None: it fits)."""
        mine = self.state()
        if not isinstance(state, dict) or set(state) != set(mine):
            return f"is not a dict of {sorted(mine)}"
        for k, v in mine.items():
            theirs = state[k]
            if not isinstance(theirs, torch.Tensor) or theirs.dtype != v.dtype or theirs.shape != v.shape:
                return f"field {k!r} is not a {v.dtype} tensor of shape {tuple(v.shape)}"
            if theirs.is_floating_point() and not bool(theirs.isfinite().all()):
                return f"field {k!r} is not finite"
        if bool((state["hold"] < 0).any() or (state["hold"] > self.config.stagger_steps).any()):
            return f"field 'hold' is outside [0, {self.config.stagger_steps}]"
        if bool((state["still"] < 0).any()):
            return "field 'still' is negative"
        if bool((state["progress"] < 0).any()):
            return "field 'progress' is negative"
        return None

    def restore(self, state: dict[str, torch.Tensor], obs: dict[str, Any]) -> None:
        """Continue from a checked ``state`` and observation."""
        self.held.copy_(state["hold"] > 0)  # in place: a captured step reads it
        self.clock = Clock(jnp.asarray(state["hold"].numpy()), jnp.asarray(state["pending"].numpy()))
        self.endings = Endings(*(jnp.asarray(state[k].numpy()) for k in Endings._fields))
        self.previous_action = jnp.asarray(state["previous_action"].numpy())
        self.obs = {k: jnp.asarray(v) for k, v in obs.items()}


def returns_cut(batch: dict[str, torch.Tensor]) -> torch.Tensor:
    """bool [T, E]: where a return of ``batch`` (`Rollout.batch`) ends (no bootstrap)."""
    lap = batch["reason"] == TerminationReason.SUCCESS
    return (batch["terminated"] & ~lap) | (batch["ending"] != 0)


def returns_bootstrapped(batch: dict[str, torch.Tensor]) -> torch.Tensor:
    """bool [T, E]: where a return of ``batch`` ends by bootstrapping from the next slot's value."""
    lap = batch["reason"] == TerminationReason.SUCCESS
    return (batch["truncated"] | (batch["terminated"] & lap)) & ~returns_cut(batch)


def episodes(batch: dict[str, torch.Tensor], group: Group = Group()) -> dict[str, float]:
    """The ended episodes and training endings of ``batch`` (`Rollout.batch`),
    in every process's worlds (read once, after the rollout)."""
    valid = batch["valid"] > 0
    ended = (batch["terminated"] | batch["truncated"]) & valid
    sums = torch.stack([part.sum().double() for part in (
        (batch["ending"] == MARGIN) & valid, (batch["ending"] == STALL) & valid, valid,
        batch["speed"] * batch["valid"], batch["reward"] * batch["valid"])])
    mine = (batch["reason"][ended].cpu().numpy(), batch["progress"][ended].cpu().numpy(),
            batch["lap_time"][ended & (batch["reason"] == TerminationReason.SUCCESS)].cpu().numpy(),
            sums.cpu().numpy())
    parts = group.objects(mine)  # every process's, in rank order
    reason, progress, laps = (np.concatenate([p[k] for p in parts]) for k in range(3))
    sums = np.sum([p[3] for p in parts], axis=0)
    n = int(reason.size)
    count = max(sums[2], 1.0)

    def rate(code: int) -> float:
        return float(np.mean(reason == code)) if n else float("nan")

    return {
        "episodes": n,
        "success_rate": rate(TerminationReason.SUCCESS),
        "off_track_rate": rate(TerminationReason.OFF_TRACK),
        "timeout_rate": rate(TerminationReason.TIMEOUT),
        "mean_progress": float(progress.mean()) if n else float("nan"),
        "median_lap_time_s": float(np.median(laps)) if laps.size else float("nan"),
        "margin_endings": int(sums[0]),
        "stall_endings": int(sums[1]),
        "mean_speed_mps": float(sums[3] / count),
        "mean_reward": float(sums[4] / count),
    }


class CapturedAct:
    """Rollout step ``t``'s Torch work captured as CUDA graph ``t`` (one
    memory pool for all, replayed in order): from the second step on,
    `Rollout.keep` of the previous step's pack (copied into `pack` before
    the replay), then `Rollout.act`; the tail graph keeps the last step's
    pack.
    They read the noise (drawn into `noise` before each replay),
    whether each world is held and the buffers (updated in place), and the
    policy's parameters and feature statistics (updated in place by the
    optimizer and the normaliser); they write the buffers and the env's
    action into `action`. A replay launches the eager steps' kernels on
    the same data: the same numbers.

    Args:
        rollout: the rollout whose buffers and state it reads (on a CUDA device).
        policy: the policy it runs.
    """

    def __init__(self, rollout: Rollout, policy: ActorCritic) -> None:
        cfg, device = rollout.config, rollout.device
        self.policy = policy
        self._pointers = self._buffers(rollout)
        #: Standard normal draws [E, 2] of the next replay; the last step's pack [E, features + len(PACK)];
        #: the env's action [E, 2] the last replay wrote.
        self.noise = torch.zeros((cfg.worlds, 2), device=device)
        self.pack = torch.zeros((cfg.worlds, cfg.features.size + len(PACK)), device=device)
        self.action = torch.zeros((cfg.worlds, 2), device=device)
        self.graphs, pool, stream = [], None, capture_stream(self, device)
        with torch.no_grad():
            warm_up(device, lambda: rollout.act(policy, 0, self.noise))
            for t in range(cfg.steps + 1):
                graph = torch.cuda.CUDAGraph()
                with capturing(graph, device, stream, pool):
                    if t > 0:
                        rollout.keep(policy, t - 1, self.pack)
                    if t < cfg.steps:
                        self.action.copy_(rollout.act(policy, t, self.noise))
                pool = graph.pool()
                self.graphs.append(graph)

    @staticmethod
    def _buffers(rollout: Rollout) -> tuple[int, ...]:
        state = [rollout.held, rollout.brake, rollout.floats, rollout.ints, rollout.done,
                 rollout.last_value, *rollout.buf.values()]
        return tuple(t.data_ptr() for t in state)

    def fits(self, rollout: Rollout, policy: ActorCritic) -> bool:
        """Whether these graphs run ``policy`` on ``rollout``'s buffers and state as they are."""
        return policy is self.policy and self._buffers(rollout) == self._pointers

    def replay(self, t: int) -> torch.Tensor:
        """Step ``t``'s Torch work; returns `action` (static: read it before the next replay)."""
        self.graphs[t].replay()
        return self.action

    def replay_tail(self) -> None:
        """`Rollout.keep` of the last step's pack."""
        self.graphs[-1].replay()
