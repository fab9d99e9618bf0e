"""PPO's data path on a CUDA device: the env's outputs reach Torch as views
of the same GPU buffers, and a whole rollout runs with JAX's transfer guard
on (both directions) and Torch's synchronisation check set to error: no
host transfer and no host wait during collection."""

from __future__ import annotations

import dataclasses

import jax
import pytest
import torch

from racing_stack.interop import to_torch
from racing_stack.ppo import PRESETS, Trainer, make_env

pytestmark = pytest.mark.gpu

CONFIG = dataclasses.replace(PRESETS["gpu"], worlds=256, steps=16, updates=1, minibatches=4, tracks=64,
                             max_episode_steps=20)


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
