"""The cost of the isolated mode: the pure-pursuit reference's controller
calls per control step, in a child process against in this process (the
baseline, measured in the same run), and a whole Runner episode in each mode;
and a step's calls of several isolated worlds, called at once as the Runner
does against one after another.

    python benchmarks/racing_env/isolation.py [--steps N] [--rounds R] [--worlds W] [--out FILE]

One ``cpu_reference`` world on Level 0's track. The per-step cost is a
step's ``compute_control`` and ``step_callback`` (what the Runner calls
every step), replayed on the same recorded observations in both modes; the
episode rows time `racing_env.runner.run` end to end (env included). Also
timed: an episode's start in a cold child (process start-up, imports, the
plugin's import, its constructor) and in a warm one (the spare the Runner
keeps started). The worlds' row replays the trace in ``W`` children at
once, a step's calls of all of them on the Runner's thread pool, against
the same children called one after another, and the worlds' cold starts
(a child each: process, imports, constructor) both ways. Gates: both modes give
identical episodes; the isolated overhead per step stays under 1 ms; ``W``
worlds called at once take less time per step than one after another.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

from protocol import environment, gate, source_hashes  # noqa: E402

from racing_env import Level, ProjectConfig, VecCarRacingEnv, level0_track  # noqa: E402
from racing_env.isolation import ChildControllers, Isolation  # noqa: E402
from racing_env.plugins import PURSUIT, load_plugin  # noqa: E402
from racing_env.runner import MAX_CALLERS, _each, challenge_values, run  # noqa: E402

#: The most the isolated mode may add to a control step (s).
GATE_OVERHEAD_S = 1e-3


def one(tree, w=0):
    return {k: v if isinstance(v, str) else np.asarray(v)[w] for k, v in tree.items()}


def record(env: VecCarRacingEnv, plugin, steps: int) -> list[tuple]:
    """``steps`` of the reference driving: (obs, info, next obs, reward, terminated, truncated, next info)."""
    obs, info = env.reset(seed=0)
    obs, info = one(obs), one(info)
    controller = plugin.load_class()(obs, info, plugin.config(challenge_values(env)))
    trace = []
    for _ in range(steps):
        action = controller.compute_control(obs, info)
        nxt, reward, terminated, truncated, nxt_info = env.step(np.asarray(action, np.float64)[None])
        nxt, nxt_info = one(nxt), one(nxt_info)
        trace.append((obs, info, nxt, float(reward[0]), bool(terminated[0]), bool(truncated[0]), nxt_info))
        obs, info = nxt, nxt_info
    return trace


def replay(controller, trace) -> np.ndarray:
    """Seconds per step of ``compute_control`` + ``step_callback`` over ``trace``."""
    times = np.empty(len(trace))
    for k, (obs, info, nxt, reward, terminated, truncated, nxt_info) in enumerate(trace):
        start = time.perf_counter()
        action = controller.compute_control(obs, info)
        controller.step_callback(action, nxt, reward, terminated, truncated, nxt_info)
        times[k] = time.perf_counter() - start
    return times


def replay_worlds(controllers, trace, pool) -> np.ndarray:
    """Seconds per step of every controller's ``compute_control`` +
    ``step_callback`` over ``trace``, the worlds' calls of a phase one
    after another (``pool`` None) or at once on ``pool``, as the Runner
    calls them (`racing_env.runner._each`)."""
    times = np.empty(len(trace))
    worlds = range(len(controllers))
    for k, (obs, info, nxt, reward, terminated, truncated, nxt_info) in enumerate(trace):
        start = time.perf_counter()
        actions = _each(pool, lambda w: controllers[w].compute_control(obs, info), worlds)
        _each(pool, lambda w: controllers[w].step_callback(actions[w], nxt, reward, terminated, truncated, nxt_info),
              worlds)
        times[k] = time.perf_counter() - start
    return times


def stats(seconds: np.ndarray) -> dict[str, float]:
    return {"median_us": float(np.median(seconds) * 1e6), "p90_us": float(np.percentile(seconds, 90) * 1e6),
            "mean_us": float(seconds.mean() * 1e6)}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=500, help="control steps per round (default 500)")
    parser.add_argument("--rounds", type=int, default=5, help="rounds per mode (default 5)")
    parser.add_argument("--worlds", type=int, default=8, help="isolated worlds called at once (default 8)")
    parser.add_argument("--out", type=Path, default=Path("isolation.json"))
    args = parser.parse_args()
    if not 2 <= args.worlds <= MAX_CALLERS:
        parser.error(f"--worlds must be in [2, {MAX_CALLERS}], got {args.worlds}")
    config = ProjectConfig()
    level = Level(level_id=0, name="isolation benchmark", max_episode_steps=args.steps)
    env = VecCarRacingEnv(1, config=config, level=level, backend="cpu_reference", track=level0_track())
    plugin = load_plugin(PURSUIT)
    challenge = challenge_values(env)
    trace = record(env, plugin, args.steps)
    isolation = Isolation()

    in_process, isolated, cold, warm = [], [], [], []
    for _ in range(args.rounds):
        obs, info = trace[0][0], trace[0][1]
        in_process.append(replay(plugin.load_class()(obs, info, plugin.config(challenge)), trace))
        with ChildControllers(plugin.directory, challenge, isolation, spares=0) as children:
            start = time.perf_counter()
            controller = children.start(0, obs, info)
            cold.append(time.perf_counter() - start)
            isolated.append(replay(controller, trace))
        with ChildControllers(plugin.directory, challenge, isolation, spares=1) as children:
            children.start(0, obs, info)
            time.sleep(5.0)  # the spare is ready
            start = time.perf_counter()
            children.start(0, obs, info)
            warm.append(time.perf_counter() - start)

    in_turn, at_once = [], []
    obs, info = trace[0][0], trace[0][1]
    with (ChildControllers(plugin.directory, challenge, isolation, spares=0) as children,
          ThreadPoolExecutor(args.worlds) as pool):
        controllers = [children.start(w, obs, info) for w in range(args.worlds)]
        for _ in range(args.rounds):
            in_turn.append(replay_worlds(controllers, trace, None))
            at_once.append(replay_worlds(controllers, trace, pool))
    in_turn_s, at_once_s = (float(np.median(np.concatenate(t))) for t in (in_turn, at_once))
    starts = {"in_turn": [], "at_once": []}
    for _ in range(2):
        for name in starts:
            with (ChildControllers(plugin.directory, challenge, isolation, spares=0) as children,
                  ThreadPoolExecutor(args.worlds) as pool):
                start = time.perf_counter()
                _each(None if name == "in_turn" else pool, lambda w: children.start(w, obs, info), range(args.worlds))
                starts[name].append(time.perf_counter() - start)

    episodes = {}
    for name, mode in (("in_process", None), ("isolated", isolation)):
        run(plugin, env, episodes=1, seed=0, isolation=mode)  # warm-up (compiles, caches)
        start = time.perf_counter()
        result = run(plugin, env, episodes=2, seed=1, isolation=mode)
        seconds = time.perf_counter() - start
        steps = sum(e.steps for e in result.episodes)
        episodes[name] = {"seconds": seconds, "steps": steps, "us_per_step": seconds / steps * 1e6,
                          "episodes": [e.__dict__ for e in result.episodes]}
    base, iso = np.concatenate(in_process), np.concatenate(isolated)
    overhead_s = float(np.median(iso) - np.median(base))
    identical = episodes["in_process"]["episodes"] == episodes["isolated"]["episodes"]
    report = {
        "protocol": "isolation",
        "environment": environment(),
        "source_sha256": source_hashes(__file__),
        "device": "cpu",
        "cpus": os.cpu_count(),
        "shapes": {"worlds": 1, "backend": "cpu_reference", "track": "Level 0", "steps_per_round": args.steps,
                   "rounds": args.rounds, "controller": "pursuit"},
        "limits": isolation.__dict__,
        "controller_calls_per_step": {"in_process": stats(base), "isolated": stats(iso),
                                      "isolated_overhead_median_us": overhead_s * 1e6},
        "episode_start_s": {"cold_median": float(np.median(cold)), "warm_spare_median": float(np.median(warm))},
        "worlds_calls_per_step": {"worlds": args.worlds, "in_turn": stats(np.concatenate(in_turn)),
                                  "at_once": stats(np.concatenate(at_once)),
                                  "median_ratio_at_once_to_in_turn": at_once_s / in_turn_s,
                                  "cold_starts_s": {name: float(np.median(t)) for name, t in starts.items()}},
        "runner_episodes": episodes,
        "gates": [gate("identical_episodes_in_both_modes", identical, True, identical),
                  gate("isolated_overhead_per_step_s", overhead_s, GATE_OVERHEAD_S, overhead_s < GATE_OVERHEAD_S),
                  gate("worlds_at_once_to_in_turn_per_step", at_once_s / in_turn_s, 1.0, at_once_s < in_turn_s)],
    }
    report["passed"] = all(g["passed"] for g in report["gates"])
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=1) + "\n")
    print(json.dumps({k: report[k] for k in ("controller_calls_per_step", "episode_start_s", "worlds_calls_per_step",
                                             "passed")}, indent=1))
    for name, entry in episodes.items():
        print(name, f"{entry['us_per_step']:.0f} us/step over {entry['steps']} steps")
    return 0 if report["passed"] else 1


if __name__ == "__main__":
    sys.exit(main())
