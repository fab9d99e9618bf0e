"""The RL auto-reset page's recipes as printed, with a trivial sim of our own
(``sim_step``: every agent moves 3 course-line points ahead; ``respawn``:
masked agents back to point 0), for the tests on cpu and cuda."""

from __future__ import annotations

from typing import Any

import numpy as np
import warp as wp


@wp.kernel
def sim_step_kernel(center: wp.array2d(dtype=wp.vec3), count: wp.array(dtype=wp.int32),
                    idx: wp.array(dtype=wp.int32), pos: wp.array(dtype=wp.vec3)):
    e = wp.tid()
    n = wp.max(count[e], 1)
    i = (idx[e] + 3) % n
    idx[e] = i
    pos[e] = wp.where(count[e] > 0, center[e, i], wp.vec3(0.0))


@wp.kernel
def respawn_kernel(mask: wp.array(dtype=wp.int32), center: wp.array2d(dtype=wp.vec3),
                   idx: wp.array(dtype=wp.int32), pos: wp.array(dtype=wp.vec3)):
    e = wp.tid()
    if mask[e] != 0:
        idx[e] = 0
        pos[e] = center[e, 0]


@wp.kernel
def reward_and_done(valid: wp.array(dtype=wp.int32), oob: wp.array(dtype=wp.int32),
                    passed: wp.array(dtype=wp.int32), dist: wp.array(dtype=wp.float32),
                    laps: wp.array(dtype=wp.int32), max_laps: int,
                    reward: wp.array(dtype=wp.float32), obs_dist: wp.array(dtype=wp.float32),
                    done: wp.array(dtype=wp.int32)):
    e = wp.tid()
    ok = valid[e] != 0
    r = 10.0 * float(passed[e]) - 5.0 * float(oob[e])
    reward[e] = wp.where(ok, r, 0.0)        # a select: never r * float(valid[e])
    obs_dist[e] = wp.where(ok, dist[e], 0.0)
    d = 0
    if oob[e] != 0 or laps[e] >= max_laps:
        d = 1
    if not ok:
        d = 1                               # done |= 1 - valid
    done[e] = d                             # EVERY entry, every step


class TrivialSim:
    """The user's physics of the recipes, on ``course``'s device."""

    def __init__(self, course: Any):
        self.course, self.device = course, course.generator.device
        self.idx = wp.zeros(course.num_envs, dtype=wp.int32, device=self.device)

    def sim_step(self, pos: wp.array, quat: wp.array, stream: wp.Stream | None = None) -> None:
        r = self.course.result
        wp.launch(sim_step_kernel, self.course.num_envs, [r.center, r.count, self.idx, pos],
                  device=self.device, stream=stream)

    def respawn(self, mask: Any, pos: wp.array, quat: wp.array | None = None,
                stream: wp.Stream | None = None) -> None:
        if isinstance(mask, np.ndarray):
            mask = wp.array(mask.astype(np.int32), dtype=wp.int32, device=self.device)
        wp.launch(respawn_kernel, self.course.num_envs, [mask, self.course.result.center, self.idx, pos],
                  device=self.device, stream=stream)


def bound_agents(course: Any) -> tuple[wp.array, wp.array, wp.array, TrivialSim]:
    E, device = course.num_envs, course.generator.device
    pos = wp.zeros(E, dtype=wp.vec3f, device=device)          # your sim's stable buffers
    quat = wp.full(E, wp.quat_identity(), dtype=wp.quatf, device=device)
    he = wp.full(E, wp.vec2f(0.02, 0.01), dtype=wp.vec2f, device=device)
    course.bind(position=pos, orientation=quat, half_extents=he)
    sim = TrivialSim(course)
    sim.respawn(np.ones(E, bool), pos)                        # every agent at its start
    return pos, quat, he, sim


def host_recipe(course: Any, steps: int, max_laps: int = 3) -> dict[str, Any]:
    """The host recipe; returns every step's reward and observation and how
    many envs were regenerated."""
    regen, respawn_mask = course.inputs["regen_mask"], course.inputs["reset_mask"]
    pos, quat, _, sim = bound_agents(course)
    rewards, observations, regenerated = [], [], 0
    for _ in range(steps):
        sim.sim_step(pos, quat)                 # your physics: writes the bound buffers
        res = course.step()
        valid = res.valid.numpy() != 0          # read it first: a regeneration rewrites it
        oob = res.contacts.oob.numpy() != 0
        passed = res.events.passed.numpy()
        dist = res.events.dist_to_next.numpy()
        reward = np.where(valid, 10.0 * passed - 5.0 * oob, 0.0)   # a select, never "* valid"
        obs_dist = np.where(valid, dist, 0.0)                       # no NaN reaches the policy
        crashed = oob & valid                                       # same course
        finished = (res.events.laps.numpy() >= max_laps) | ~valid   # done |= 1 - valid
        if crashed.any():
            respawn_mask.assign(crashed.astype(np.int32))
            course.reset(respawn_mask)          # respawn on the SAME course
        if finished.any():                      # a host check: see the cost below
            regen.assign(finished.astype(np.int32))
            course.regenerate(mask=regen, advance=True)   # NEW courses, reset included
            regenerated += int(finished.sum())
        sim.respawn(crashed | finished, pos)    # your code: back to the start line
        rewards.append(reward)
        observations.append(obs_dist)
    return {"rewards": np.array(rewards), "observations": np.array(observations), "regenerated": regenerated}


def graph_recipe(course: Any, device: str, steps: int, max_laps: int = 3) -> tuple[np.ndarray, ...]:
    """The graph recipe; returns ``(rewards, observations, generations)`` per replay."""
    E = course.num_envs
    pos, quat, _, sim = bound_agents(course)
    done = course.inputs["regen_mask"]
    reward = wp.zeros(E, dtype=wp.float32, device=device)
    obs_dist = wp.zeros(E, dtype=wp.float32, device=device)

    with wp.ScopedCapture(device=device) as cap:
        sim.sim_step(pos, quat)                 # your physics: writes the bound buffers
        res = course.step()                     # progress events + contacts + valid
        wp.launch(reward_and_done, E,
                  [res.valid, res.contacts.oob, res.events.passed, res.events.dist_to_next,
                   res.events.laps, max_laps, reward, obs_dist, done], device=device)
        course.regenerate(mask=done, advance=True)  # new courses where done[e] != 0
        sim.respawn(done, pos, quat)            # your kernel: restart the masked agents
    step = cap.graph

    rewards, observations, generations = [], [], [course.result.generation.numpy().copy()]
    for _ in range(steps):
        wp.capture_launch(step)                 # one RL step, auto-reset included
        rewards.append(reward.numpy().copy())
        observations.append(obs_dist.numpy().copy())
        generations.append(course.result.generation.numpy().copy())
    return np.array(rewards), np.array(observations), np.array(generations)


def torch_recipe(course: Any, device: str, max_laps: int = 3) -> tuple[Any, dict[str, Any]]:
    """The torch recipe (``torch.cuda.graph`` with ``registered(conditional=True)``);
    returns the graph and the torch views of its reward and observation."""
    import torch

    from track_gen.interop.torch import registered, retain

    E = course.num_envs
    pos, quat, _, sim = bound_agents(course)
    done = course.inputs["regen_mask"]
    reward = wp.zeros(E, dtype=wp.float32, device=device)
    obs_dist = wp.zeros(E, dtype=wp.float32, device=device)
    wp.synchronize_device(device)

    g = torch.cuda.CUDAGraph(keep_graph=True)
    with torch.cuda.graph(g):
        with registered(conditional=True) as s:  # torch's capture stream, known to Warp
            sim.sim_step(pos, quat, stream=s)   # your own Warp launches go to s
            res = course.step()                 # library calls adopt it on their own
            wp.launch(reward_and_done, E,
                      [res.valid, res.contacts.oob, res.events.passed,
                       res.events.dist_to_next, res.events.laps, max_laps, reward, obs_dist, done],
                      stream=s)
            course.regenerate(mask=done, advance=True)
            sim.respawn(done, pos, quat, stream=s)  # Warp only: no torch allocation after it
    retain(g, course)                           # the course now lives as long as g
    return g, {"reward": wp.to_torch(reward), "obs_dist": wp.to_torch(obs_dist)}
