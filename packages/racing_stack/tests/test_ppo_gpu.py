"""PPO's data path on a CUDA device: the env's outputs reach Torch as views
of the same GPU buffers, and a whole rollout runs with JAX's transfer guard
on (both directions) and Torch's synchronisation check set to error: no
host transfer and no host wait during collection. A validation on the
device drives the same episodes as the Runner with the exported plugin.
Every crossing of a rollout delivers, bit for bit, what its producer
wrote (`racing_stack.integrity.tapped`): from a cold start (empty Warp,
Triton, JAX, CUDA and pool caches) at the GPU preset's shapes, and under
delays injected on both sides of every crossing."""

from __future__ import annotations

import copy
import dataclasses
import gc
import json
import os
import subprocess
import sys
import textwrap

import jax
import pytest
import torch

from racing_stack.integrity import jax_busy, stressed, tapped, torch_sleep_cycles_per_us
from racing_stack.interop import Handover, to_torch
from racing_stack.ppo import PRESETS, Trainer, make_env, make_validation_env

pytestmark = pytest.mark.gpu

#: The GPU preset at a tiny size on the reference path (eager, float32 matmuls): the graph path is held against it.
CONFIG = dataclasses.replace(PRESETS["gpu"], update_path="eager", matmul_precision="highest", worlds=256, steps=16,
                             updates=1, minibatches=4, tracks=64, max_episode_steps=20, stagger_steps=4,
                             validation_tracks=8)
#: Crossings of a rollout step: the action to JAX, one pack of the step's outputs and the next features back.
CROSSINGS_PER_STEP = 2


@pytest.fixture(scope="module")
def trainer(tmp_path_factory):
    if jax.default_backend() != "gpu" or not torch.cuda.is_available():
        pytest.skip("needs a CUDA device for JAX and Torch")
    return Trainer(CONFIG, make_env(CONFIG), tmp_path_factory.mktemp("ppo"))


def test_env_outputs_are_views_of_the_gpu_buffers(trainer):
    obs = trainer.rollout.obs
    view = to_torch(obs["centerline"])
    assert view.is_cuda and view.data_ptr() == obs["centerline"].unsafe_buffer_pointer()


def test_a_rollout_moves_nothing_through_the_host(trainer):
    trainer.collect()  # warm: every function compiled
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        with jax.transfer_guard("disallow"):
            trainer.collect()
    finally:
        torch.cuda.set_sync_debug_mode("default")
    ended = (trainer.buf["terminated"] | trainer.buf["truncated"]).sum()
    assert int(ended) > 0  # episodes ended (and reset) inside the guarded rollout


def test_an_update_trains_on_the_gpu(trainer):
    rows = trainer.run()
    assert rows and rows[-1]["update"] == 1 and trainer.policy.log_std.is_cuda


def test_the_graph_path_collects_and_updates_bitwise_as_the_eager_path(trainer, tmp_path):
    """``update_path="graph"``: the rollout's policy steps and the minibatch
    steps replay captured graphs, on one env's worlds from the same reset,
    with the eager path's numbers (buffers, losses, weights)."""
    rows, trainers, env = {}, {}, make_env(CONFIG)
    for path in ("eager", "graph"):
        config = dataclasses.replace(CONFIG, update_path=path, updates=3)
        trainers[path] = Trainer(config, env, tmp_path / path)  # the env is reset with the config's seed
        rows[path] = [{k: v for k, v in trainers[path]._one_update().items()
                       if k not in ("seconds", "transitions_per_s")} for _ in range(2)]
    eager, graph = trainers["eager"], trainers["graph"]
    assert graph.rollout._act is not None and graph.learner._captured is not None and eager.rollout._act is None
    assert json.dumps(rows["eager"]) == json.dumps(rows["graph"])  # NaN (no lap, no validation) included
    for key in ("x", "u", "logp", "value", "valid", "reward", "terminated"):
        assert torch.equal(eager.buf[key], graph.buf[key]), key
    for (name, a), (_, b) in zip(eager.policy.state_dict().items(), graph.policy.state_dict().items()):
        assert torch.equal(a, b), name


def test_a_pipelined_run_on_the_graph_path_has_the_numbers_of_one_that_reads_first(tmp_path):
    """On the GPU the next rollout launched right after the captured
    optimisation (`Trainer.pipelined`) runs after it on the device: the
    same rows, buffers and weights as a run that reads first, bf16 too.
    The two runs share one env (each reset with the config's seed), so the
    run that reads first goes last: its fifth rollout steps on from its
    own fourth."""
    rows, trainers, env = {}, {}, make_env(CONFIG)
    config = dataclasses.replace(CONFIG, update_path="graph", matmul_precision="bf16", updates=5)
    for pipelined in (True, False):
        trainers[pipelined] = Trainer(config, env, tmp_path / str(pipelined))
        trainers[pipelined].pipelined = pipelined
        rows[pipelined] = [{k: v for k, v in trainers[pipelined]._one_update().items()
                            if k not in ("seconds", "transitions_per_s")} for _ in range(4)]
        assert trainers[pipelined].ahead == pipelined
    trainers[False].collect()  # the rollout the pipelined run collected ahead, collected after reading
    assert json.dumps(rows[False]) == json.dumps(rows[True])
    for key in ("x", "u", "logp", "value", "valid", "reward", "terminated"):
        assert torch.equal(trainers[False].buf[key], trainers[True].buf[key]), key
    for (name, a), (_, b) in zip(trainers[False].policy.state_dict().items(),
                                 trainers[True].policy.state_dict().items()):
        assert torch.equal(a, b), name


@pytest.mark.parametrize("precision", ["high", "bf16"])
def test_a_lagged_run_collects_beside_its_update_with_the_numbers_of_one_after_it(tmp_path, precision):
    """``policy_lag=1``: on the graph path the next rollout runs on its own
    stream while the captured update runs; on the eager path the update's
    kernels are all launched before the rollout's. Streams ordered wrong
    (a rollout writing what the update reads, or reading the acting copy
    before it is made) would show as other numbers. Under bfloat16
    autocast too: its captures replay the eager kernels."""
    rows, trainers, env = {}, {}, make_env(CONFIG)
    for path in ("eager", "graph"):
        config = dataclasses.replace(CONFIG, update_path=path, updates=5, policy_lag=1, matmul_precision=precision)
        trainers[path] = Trainer(config, env, tmp_path / path)
        rows[path] = []
        for _ in range(4):
            rows[path].append({k: v for k, v in trainers[path]._one_update().items()
                               if k not in ("seconds", "transitions_per_s")})
            assert trainers[path].ahead  # the next rollout was collected during this update
    eager, graph = trainers["eager"], trainers["graph"]
    assert json.dumps(rows["eager"]) == json.dumps(rows["graph"])
    for key in ("x", "u", "logp", "value", "valid", "reward", "terminated"):
        assert torch.equal(eager.buf[key], graph.buf[key]), key
    for policy in ("policy", "acting"):
        for (name, a), (_, b) in zip(getattr(eager.learner, policy).state_dict().items(),
                                     getattr(graph.learner, policy).state_dict().items()):
            assert torch.equal(a, b), (policy, name)


def test_a_validation_on_the_gpu_drives_what_the_runner_drives(trainer, tmp_path):
    from racing_env.plugins import load_plugin
    from racing_env.runner import run

    from racing_stack.ppo.export import export_plugin
    from racing_stack.ppo.validation import validate

    validation = make_validation_env(CONFIG)
    rows = list(range(CONFIG.validation_tracks))
    mine = validate(trainer.policy, validation, CONFIG, trainer.crossing, rows, early_exit=False)
    plugin = export_plugin(trainer.policy, CONFIG, tmp_path / "plugin")
    episodes = sorted(run(load_plugin(plugin), validation, seed=CONFIG.seed, track_indices=rows).episodes,
                      key=lambda e: e.world)
    assert [e.world for e in episodes] == rows
    for a, b in zip(mine, episodes):  # the Runner's accounting of the same episodes
        assert (a.track_id, a.episode_seed, a.termination_reason) == (b.track_id, b.episode_seed, b.termination_reason)
        assert a.progress == pytest.approx(b.progress, abs=1e-3)


def test_the_learned_plugin_on_the_gpu_drives_batched_what_it_drives_a_world_a_call(trainer, tmp_path):
    """The exported plugin with ``device = "cuda"``: its BatchController
    (every world's row in one call) drives the episodes its per-episode
    controllers drive (one row a call), record for record: its network
    computes in float64, so the float32 action does not depend on the
    call's row count."""
    from racing_env.plugins import load_plugin
    from racing_env.runner import run

    from racing_stack.ppo.export import export_plugin

    validation = make_validation_env(CONFIG)
    plugin = load_plugin(export_plugin(trainer.policy, CONFIG, tmp_path / "plugin", device="cuda"))
    rows = list(range(CONFIG.validation_tracks))
    one = run(plugin, validation, seed=CONFIG.seed, track_indices=rows)
    many = run(plugin, validation, seed=CONFIG.seed, track_indices=rows, batched=True)
    assert [dataclasses.asdict(e) for e in many.episodes] == [dataclasses.asdict(e) for e in one.episodes]
    assert len(one.episodes) == len(rows) and max(e.progress for e in one.episodes) > 0


def test_a_validation_on_the_graph_path_replays_the_eager_calls(trainer):
    """``update_path="graph"``: validation's mean action replays a captured
    graph (`CapturedMean`, kept for the policy), with the eager episodes;
    the policy's tensors moved, it captures anew."""
    from racing_stack.ppo.validation import _CAPTURED, CapturedMean, validate

    validation = make_validation_env(CONFIG)
    rows = list(range(CONFIG.validation_tracks))
    graph = dataclasses.replace(CONFIG, update_path="graph")
    eager = validate(trainer.policy, validation, CONFIG, trainer.crossing, rows, early_exit=False)
    assert trainer.policy not in _CAPTURED
    for _ in range(2):  # captured at the first call, replayed at the second
        replayed = validate(trainer.policy, validation, graph, trainer.crossing, rows, early_exit=False)
        assert [dataclasses.asdict(e) for e in replayed] == [dataclasses.asdict(e) for e in eager]
    captured = _CAPTURED[trainer.policy][len(rows)]
    assert isinstance(captured, CapturedMean) and captured.fits(trainer.policy)
    moved = copy.deepcopy(trainer.policy)
    assert validate(moved, validation, graph, trainer.crossing, rows, early_exit=False) == eager
    assert _CAPTURED[moved][len(rows)] is not captured
    kept = len(_CAPTURED)
    del moved
    gc.collect()
    assert len(_CAPTURED) == kept - 1  # a policy gone takes its capture with it


def test_rollouts_under_injected_delays_deliver_what_was_written(trainer):
    """Torch's stream sleeps after every view and JAX's stream is busy
    before every step: reads come late and writes come late, so a buffer
    given back early or a read not ordered after its write would show."""
    busy, _ = jax_busy(1.0)
    own = trainer.crossing
    trainer.crossing = tapped(stressed(Handover, int(200 * torch_sleep_cycles_per_us()), busy))(trainer.device)
    try:
        found = []
        for _ in range(10):
            trainer.collect()
            found.append(trainer.crossing.compare())
        trainer.crossing.drain()
        assert trainer.crossing.held == 0  # every crossing released once the device passed its fence
    finally:
        trainer.crossing = own
    assert all(f["crossings"] == CROSSINGS_PER_STEP * CONFIG.steps + 1 for f in found)
    assert [f["mismatched_bytes"] for f in found] == [0] * 10


COLD_ROLLOUTS = textwrap.dedent("""
    import dataclasses, json
    from racing_stack.integrity import tapped
    from racing_stack.interop import Handover
    from racing_stack.ppo import PRESETS, Trainer, make_env

    config = dataclasses.replace(PRESETS["gpu"], tracks=256, validate_every=0)
    trainer = Trainer(config, make_env(config), "{out}")
    trainer.crossing = tapped(Handover)(trainer.device)
    found = []
    for _ in range(5):
        trainer.collect()
        found.append(trainer.crossing.compare())
        advantage, returns = trainer.advantages()
        trainer.guard(advantage, returns, trainer.optimise(advantage, returns))
        trainer.update += 1
    print(json.dumps({{"found": found, "worlds": config.worlds, "steps": config.steps}}))
""")


def test_a_cold_start_at_the_gpu_preset_shapes_delivers_what_was_written(tmp_path):
    """The condition that corrupted updates 2-3 before crossings were held:
    a fresh process, every compile and pool cache empty, 8,192 worlds x 32
    steps; each of its first 5 rollouts' crossings compared, and guarded."""
    if jax.default_backend() != "gpu" or not torch.cuda.is_available():
        pytest.skip("needs a CUDA device for JAX and Torch")
    caches = {name: str(tmp_path / name) for name in ("WARP_CACHE_PATH", "TRITON_CACHE_DIR",
                                                      "JAX_COMPILATION_CACHE_DIR", "CUDA_CACHE_PATH",
                                                      "RACING_STACK_CACHE")}
    done = subprocess.run([sys.executable, "-c", COLD_ROLLOUTS.format(out=tmp_path / "run")],
                          env={**os.environ, **caches}, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert (result["worlds"], result["steps"]) == (8192, 32)
    assert [f["crossings"] for f in result["found"]] == [CROSSINGS_PER_STEP * 32 + 1] * 5
    assert [f["mismatched_bytes"] for f in result["found"]] == [0] * 5
