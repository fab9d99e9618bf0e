"""PPO's data path on a CUDA device: the env's outputs reach Torch as views
of the same GPU buffers, and a whole rollout runs with JAX's transfer guard
on (both directions) and Torch's synchronisation check set to error: no
host transfer and no host wait during collection. A validation on the
device drives the same episodes as the Runner with the exported plugin."""

from __future__ import annotations

import dataclasses

import jax
import pytest
import torch

from racing_stack.interop import to_torch
from racing_stack.ppo import PRESETS, Trainer, make_env, make_validation_env

pytestmark = pytest.mark.gpu

CONFIG = dataclasses.replace(PRESETS["gpu"], worlds=256, steps=16, updates=1, minibatches=4, tracks=64,
                             max_episode_steps=20, validation_tracks=8)


@pytest.fixture(scope="module")
def trainer(tmp_path_factory):
    if jax.default_backend() != "gpu" or not torch.cuda.is_available():
        pytest.skip("needs a CUDA device for JAX and Torch")
    return Trainer(CONFIG, make_env(CONFIG), tmp_path_factory.mktemp("ppo"))


def test_env_outputs_are_views_of_the_gpu_buffers(trainer):
    obs = trainer.obs
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


def test_a_validation_on_the_gpu_drives_what_the_runner_drives(trainer, tmp_path):
    import numpy as np
    from racing_env.plugins import load_plugin
    from racing_env.runner import run

    from racing_stack.export import export_plugin

    validation = make_validation_env(CONFIG)
    trainer.validation = validation
    try:
        result = trainer.validate()
    finally:
        trainer.validation = None
    plugin = export_plugin(trainer.policy, CONFIG, tmp_path / "plugin")
    episodes = sorted(run(load_plugin(plugin), validation, seed=CONFIG.seed,
                          track_indices=list(range(CONFIG.validation_tracks))).episodes, key=lambda e: e.world)
    assert [e.world for e in episodes] == list(range(CONFIG.validation_tracks))
    assert result["validation_success_rate"] == np.mean([e.termination_reason == "success" for e in episodes])
    np.testing.assert_allclose(result["validation_mean_progress"], np.mean([e.progress for e in episodes]),
                               atol=1e-3)
