"""What the racing_env benchmark protocols (M4 environment throughput, M5
TrackPool) measure alike: the run's environment and source hashes, process
VRAM, Warp graph captures, the cycled random actions and the env stepper
that replays them, the health run, the transfer guards and the gates.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import platform
import subprocess
import threading
import time
from collections.abc import Callable
from importlib.metadata import version
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import warp as wp

import racing_env
from racing_env import TerminationReason, VecCarRacingEnv, core

ROOT = Path(__file__).resolve().parents[2]
#: Random action batches an env stepper cycles through.
ACTION_BATCHES = 64


def logger(protocol: str) -> Callable[[str], None]:
    """A timestamped progress printer for `protocol`."""

    def log(msg: str) -> None:
        print(f"[{protocol} {time.strftime('%H:%M:%S')}] {msg}", flush=True)

    return log


def source_hashes(script: str) -> dict[str, str]:
    """sha256 of every source file that decides what was measured: the
    packages' sources, this module and the benchmark `script`."""
    files = sorted((ROOT / "packages/racing_env/src").rglob("*.py"))
    files += sorted((ROOT / "packages/racing_stack/src").rglob("*.py"))
    files += [Path(__file__).resolve(), Path(script).resolve()]
    return {str(f.relative_to(ROOT)): hashlib.sha256(f.read_bytes()).hexdigest() for f in files}


def environment() -> dict[str, Any]:
    env = {
        "python": platform.python_version(),
        "platform": platform.platform(),
        "numpy": np.__version__,
        "jax": jax.__version__,
        "jaxlib": version("jaxlib"),
        "warp": wp.__version__,
        "mujoco": version("mujoco"),
        "mujoco_mjx": version("mujoco-mjx"),
        "gymnasium": version("gymnasium"),
        "racing_env": racing_env.__version__,
        "jax_devices": [str(d) for d in jax.devices()],
    }
    if jax.default_backend() == "gpu":
        query = ["nvidia-smi", "--query-gpu=name,driver_version,memory.total", "--format=csv,noheader"]
        env["gpu"] = subprocess.run(query, capture_output=True, text=True).stdout.strip()
    return env


class VramSampler:
    """This process's GPU memory (MiB, from nvidia-smi) every `period` s."""

    def __init__(self, period: float = 0.5) -> None:
        self.period = period
        self.samples: list[tuple[float, int]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def read(self) -> int | None:
        query = ["nvidia-smi", "--query-compute-apps=pid,used_memory", "--format=csv,noheader,nounits"]
        try:
            out = subprocess.run(query, capture_output=True, text=True, timeout=10).stdout
        except (OSError, subprocess.TimeoutExpired):
            return None
        used = [int(m) for p, m in (line.split(",") for line in out.strip().splitlines() if "," in line)
                if int(p) == os.getpid()]
        return sum(used) if used else None

    def _run(self) -> None:
        while not self._stop.is_set():
            value = self.read()
            if value is not None:
                self.samples.append((time.perf_counter(), value))
            self._stop.wait(self.period)

    def __enter__(self) -> VramSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()


class CaptureCounter:
    """Counts Warp graph captures (`wp.ScopedCapture` entries) while active."""

    def __init__(self) -> None:
        self.count = 0
        self._enter = wp.ScopedCapture.__enter__

    def __enter__(self) -> CaptureCounter:
        enter = self._enter

        def counting(capture):
            self.count += 1
            return enter(capture)

        wp.ScopedCapture.__enter__ = counting
        return self

    def __exit__(self, *exc: object) -> None:
        wp.ScopedCapture.__enter__ = self._enter


def random_actions(env: VecCarRacingEnv, seed: int) -> list[jax.Array]:
    low = jnp.asarray(env.single_action_space.low)
    high = jnp.asarray(env.single_action_space.high)
    key = jax.random.PRNGKey(seed)
    batches = jax.random.uniform(key, (ACTION_BATCHES, env.num_envs, 2), minval=low, maxval=high)
    return [batches[k] for k in range(ACTION_BATCHES)]


class EnvStepper:
    """The env under the cycled random actions, `run(n)` steps at a time."""

    name = "env"

    def __init__(self, env: VecCarRacingEnv) -> None:
        self.env = env
        self.worlds = env.num_envs
        self.actions = random_actions(env, 0)
        self.calls = 0
        self.out: tuple | None = None

    def run(self, steps: int) -> float:
        """Seconds for `steps` calls, dispatched back to back, one sync at the end."""
        start = time.perf_counter()
        for _ in range(steps):
            self.out = self.env.step(self.actions[self.calls % ACTION_BATCHES])
            self.calls += 1
        jax.block_until_ready(self.out)
        return time.perf_counter() - start

    def final_nonfinite(self) -> int:
        obs, reward, _, _, info = self.out
        return int(count_nonfinite(obs, reward, info["lap_time_s"]))


class CoreScanStepper:
    """The env's pure core (`racing_env.core.step`) looped on the device,
    `run(n)` calls in one jitted call (a ``fori_loop``, the cycled random
    actions picked on the device): what a pure-JAX trainer would run. It
    steps a copy of the env's state (the env is left as it was), and the
    loop carries every call's outputs, so none of them can be left out."""

    name = "core_scan"

    def __init__(self, env: VecCarRacingEnv) -> None:
        self.worlds = env.num_envs
        self.params, physics = env.params, env.physics
        actions = jnp.stack(random_actions(env, 0))
        state, data = jax.tree.map(jnp.copy, env.core_state())
        self.calls = 0

        def loop(params, carry, first, steps):
            def body(k, carry):
                state, data, _ = carry
                state, data, *out = core.step(params, physics, state, data, actions[k % ACTION_BATCHES])
                return state, data, out

            return jax.lax.fori_loop(first, first + steps, body, carry)

        self._loop = jax.jit(loop, donate_argnums=(1,))
        # The carried outputs start as zeros of one call's shapes.
        shapes = list(jax.eval_shape(lambda: core.step(self.params, physics, state, data, actions[0])[2:]))
        self.carry = (state, data, jax.tree.map(lambda x: jnp.zeros(x.shape, x.dtype), shapes))

    def run(self, steps: int) -> float:
        """Seconds for `steps` calls in one jitted loop, one sync at the end."""
        start = time.perf_counter()
        self.carry = self._loop(self.params, self.carry, jnp.int32(self.calls), jnp.int32(steps))
        self.calls += steps
        jax.block_until_ready(self.carry)
        return time.perf_counter() - start

    def final_nonfinite(self) -> int:
        obs, reward, _, _, info = self.carry[2]
        return int(count_nonfinite(obs, reward, info["lap_time_s"]))


@jax.jit
def count_nonfinite(obs, reward, lap_time_s) -> jax.Array:
    """Non-finite entries among the public numeric values of one call."""
    leaves = [*obs.values(), reward, lap_time_s]
    return sum(jnp.sum(~jnp.isfinite(x.astype(jnp.float32))) for x in leaves)


def vram_summary(samples: list[tuple[float, int]], start: float, end: float) -> dict[str, Any]:
    inside = [(t, m) for t, m in samples if start <= t <= end]
    if len(inside) < 3:
        return {"samples": len(inside), "peak_mib": None, "steady_growth_mib": None}
    settle = start + 0.1 * (end - start)
    steady = [m for t, m in inside if t >= settle]
    return {
        "samples": len(inside),
        "peak_mib": max(m for _, m in samples),
        "after_first_tenth_mib": steady[0],
        "steady_max_mib": max(steady),
        "steady_growth_mib": max(steady) - steady[0],
    }


def health_run(env: VecCarRacingEnv) -> dict[str, Any]:
    """Zero actions from a fresh reset until every world has timed out and
    autoreset once."""
    timeout = env.level.max_episode_steps
    obs, info = env.reset(seed=4)
    zero = jnp.zeros((env.num_envs, 2), jnp.float32)
    counts = {name: jnp.zeros(env.num_envs, jnp.int32) for name in ("timeout", "success", "off_track", "invalid")}
    resets = jnp.zeros(env.num_envs, jnp.int32)
    nonfinite = jnp.zeros((), jnp.int32)
    timeout_call = jnp.zeros(env.num_envs, jnp.int32)
    reset_call = jnp.zeros(env.num_envs, jnp.int32)
    first_episode = info["episode_seed"]
    pending = jnp.zeros(env.num_envs, bool)

    @jax.jit
    def tally(call, counts, resets, nonfinite, timeout_call, reset_call, pending, obs, reward, terminated, truncated,
              info):
        call = call + 1
        reason = info["termination_reason"]
        counts = {
            "timeout": counts["timeout"] + (reason == TerminationReason.TIMEOUT),
            "success": counts["success"] + (reason == TerminationReason.SUCCESS),
            "off_track": counts["off_track"] + (reason == TerminationReason.OFF_TRACK),
            "invalid": counts["invalid"] + (reason == TerminationReason.INVALID_ACTION),
        }
        timeout_call = jnp.where(truncated, call, timeout_call)
        is_reset = pending & (reward == 0) & ~terminated & ~truncated & (info["episode_seed"] != first_episode)
        resets = resets + is_reset
        reset_call = jnp.where(is_reset, call, reset_call)
        nonfinite = nonfinite + count_nonfinite(obs, reward, info["lap_time_s"])
        return call, counts, resets, nonfinite, timeout_call, reset_call, terminated | truncated

    steps = timeout + 2
    t0 = time.perf_counter()
    nonfinite = nonfinite + count_nonfinite(obs, jnp.zeros(env.num_envs), info["lap_time_s"])
    call = jnp.zeros((), jnp.int32)  # on the device: no transfer per step
    for _ in range(steps):
        obs, reward, terminated, truncated, info = env.step(zero)
        call, counts, resets, nonfinite, timeout_call, reset_call, pending = tally(
            call, counts, resets, nonfinite, timeout_call, reset_call, pending, obs, reward, terminated,
            truncated, {k: v for k, v in info.items() if k != "benchmark_version"},
        )
    jax.block_until_ready(resets)
    counts = {k: np.asarray(v) for k, v in counts.items()}
    timeout_call, reset_call = np.asarray(timeout_call), np.asarray(reset_call)
    return {
        "steps": steps,
        "seconds": time.perf_counter() - t0,
        "worlds": env.num_envs,
        "timeouts": int(counts["timeout"].sum()),
        "worlds_timed_out_once": int((counts["timeout"] == 1).sum()),
        "timeout_at_call": sorted(set(timeout_call.tolist())),
        "autoresets": int(np.asarray(resets).sum()),
        "worlds_reset_once": int((np.asarray(resets) == 1).sum()),
        "reset_at_call": sorted(set(reset_call.tolist())),
        "success": int(counts["success"].sum()),
        "off_track": int(counts["off_track"].sum()),
        "invalid_action": int(counts["invalid"].sum()),
        "nonfinite_public_values": int(nonfinite),
    }


def transfer_guards(env: VecCarRacingEnv) -> dict[str, Any]:
    """An active step and a mixed-world autoreset step under
    ``jax.transfer_guard("disallow")`` after warm-up."""
    env.reset(seed=5)
    action = jnp.full((env.num_envs, 2), 0.05, jnp.float32)
    spoiled = action.at[::2].set(jnp.nan)
    for a in (action, spoiled, action):
        jax.block_until_ready(env.step(a))
    env.reset(seed=5)
    result = {}
    for name, steps in (("active_step", [action]), ("mixed_autoreset_step", [spoiled, action])):
        try:
            with jax.transfer_guard("disallow"):
                outs = [env.step(a) for a in steps]
                jax.block_until_ready(outs)
            result[name] = {"passed": True, "terminated": [int(np.asarray(o[2]).sum()) for o in outs]}
        except Exception as error:  # the guard raises a backend-specific error type
            result[name] = {"passed": False, "error": str(error)[:500]}
    result["mixed_autoreset_step"]["note"] = (
        "even worlds invalid (terminated) on the first step, so reset by NEXT_STEP on the second")
    return result


def process_seconds() -> float | None:
    """Seconds since this process started, its imports included (the
    command's wall time, as a user's clock would show it), from Linux's
    /proc at the clock-tick resolution (10 ms); None where there is none."""
    try:
        fields = Path("/proc/self/stat").read_text().rsplit(")", 1)[1].split()
        uptime_s = float(Path("/proc/uptime").read_text().split()[0])
        return uptime_s - int(fields[19]) / os.sysconf("SC_CLK_TCK")  # field 22, the start time in ticks
    except (OSError, IndexError, ValueError):
        return None


def shown(path: Path) -> str:
    """How a report or a log line names ``path``: relative to the repository
    when inside it (the same on every machine), else whole."""
    path = Path(path).resolve()
    return str(path.relative_to(ROOT)) if path.is_relative_to(ROOT) else str(path)


def add_report_arguments(parser: argparse.ArgumentParser, name: str) -> None:
    """``--out FILE`` or ``--publish``: a run writes ``benchmarks/out/NAME.json``
    (ignored) unless told otherwise; only ``--publish`` writes the committed
    ``benchmarks/results/NAME.json`` (`report_path`)."""
    group = parser.add_mutually_exclusive_group()
    group.add_argument("--out", type=Path, default=None, help=f"the report (default benchmarks/out/{name}.json)")
    group.add_argument("--publish", action="store_true",
                       help=f"write the committed report, benchmarks/results/{name}.json, and its picture")


def report_path(args: argparse.Namespace, name: str) -> Path:
    """The report file of `add_report_arguments`' flags."""
    return args.out or ROOT / ("benchmarks/results" if args.publish else "benchmarks/out") / f"{name}.json"


def gate(name: str, value: Any, threshold: Any, passed: bool) -> dict[str, Any]:
    return {"name": name, "value": value, "threshold": threshold, "passed": bool(passed)}
