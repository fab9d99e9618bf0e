"""JAX rollout arrays cross to Torch over DLPack and get rl_triton advantages."""

import jax
import jax.numpy as jnp
import numpy as np
import torch

import rl_triton
from rl_triton import reference


def test_jax_rollout_to_torch_gae_without_copies():
    key = jax.random.PRNGKey(0)
    k1, k2, k3, k4 = jax.random.split(key, 4)
    num_envs, seq_len = 8, 64
    rewards = jax.random.normal(k1, (num_envs, seq_len), jnp.float32)
    values = jax.random.normal(k2, (num_envs, seq_len), jnp.float32)
    terminated = (jax.random.uniform(k3, (num_envs, seq_len)) < 0.05).astype(jnp.float32)
    last_value = jax.random.normal(k4, (num_envs,), jnp.float32)

    r, v, term, lv = (torch.from_dlpack(x) for x in (rewards, values, terminated, last_value))
    assert r.data_ptr() == rewards.unsafe_buffer_pointer()  # shared, not copied

    adv = rl_triton.compute_gae(r, v, term, gamma=0.99, lambda_=0.95, last_value=lv)
    want = reference.gae(np.asarray(rewards), np.asarray(values), np.asarray(terminated),
                         gamma=0.99, lambda_=0.95, last_value=np.asarray(last_value))
    np.testing.assert_allclose(adv.numpy(), want, rtol=1e-5, atol=1e-5)
    back = jax.dlpack.from_dlpack(adv)
    np.testing.assert_array_equal(np.asarray(back), adv.numpy())
