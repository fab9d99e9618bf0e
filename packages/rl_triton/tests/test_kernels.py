"""The Triton kernels against the NumPy references (CUDA, or CPU under TRITON_INTERPRET=1)."""

import zlib

import numpy as np
import pytest
import torch

import rl_triton
from rl_triton._launch import plan
from rollouts import OPS, REFERENCES, assert_matches, rollout, run

pytestmark = pytest.mark.kernels

ALL_OPS = sorted(OPS)
# Small tiles and chunks, so short inputs run many tiles and the chunked path.
CONFIGS = {
    "planned": {},
    "tiles": {"block_t": 8},
    "chunked": {"block_t": 8, "chunked": True},
    "chunked_rows": {"block_e": 2, "block_t": 4, "chunked": True},
    "flipped": {"block_t": 8, "flip": True},
    "flipped_chunked": {"block_e": 2, "block_t": 4, "chunked": True, "flip": True},
}


def check(op: str, batch, device: str) -> None:
    got = run(op, batch, device)
    assert rl_triton.last_path() in ("triton", "triton-interpreter")
    assert_matches(got, REFERENCES[op](batch))


@pytest.mark.parametrize("op", ALL_OPS)
@pytest.mark.parametrize("config", sorted(CONFIGS))
@pytest.mark.parametrize("shape", [(1, 1), (3, 1), (1, 7), (3, 37), (5, 64), (2, 131)])
def test_random_rollouts(op, config, shape, kernel_device):
    batch = rollout(*shape, seed=zlib.crc32(repr((op, config, shape)).encode()))
    with rl_triton.launch_config(**CONFIGS[config]):
        check(op, batch, kernel_device)


@pytest.mark.parametrize("op", ALL_OPS)
@pytest.mark.parametrize("flip", [False, True])
@pytest.mark.parametrize("chunked", [False, True])
def test_tiles_that_cover_the_inputs_run_unmasked(op, flip, chunked, kernel_device):
    shape, config = (8, 64), {"block_t": 8, "chunked": chunked, "flip": flip}
    assert plan(*shape, 1, 1, rl_triton.LaunchConfig(**config)).even
    batch = rollout(*shape, seed=zlib.crc32(repr((op, flip, chunked, "even")).encode()))
    with rl_triton.launch_config(**config):
        check(op, batch, kernel_device)


@pytest.mark.parametrize("op", ALL_OPS)
@pytest.mark.parametrize("case", ["all_terminated", "none_done", "all_truncated",
                                  "truncated_at_last_step", "dense_boundaries"])
def test_edge_cases(op, case, kernel_device):
    kw = {
        "all_terminated": dict(p_term=1.0, p_trunc=0.0),
        "none_done": dict(p_term=0.0, p_trunc=0.0),
        "all_truncated": dict(p_term=0.0, p_trunc=1.0),
        "truncated_at_last_step": dict(p_term=0.05, p_trunc=0.0, last_truncated=True),
        "dense_boundaries": dict(p_term=0.4, p_trunc=0.4),
    }[case]
    batch = rollout(4, 45, seed=7, **kw)
    with rl_triton.launch_config(block_t=8, chunked=True):
        check(op, batch, kernel_device)


@pytest.mark.parametrize("gamma,lam", [(0.0, 0.0), (1.0, 1.0), (0.5, 0.0), (0.99, 1.0)])
@pytest.mark.parametrize("op", ALL_OPS)
def test_extreme_discounts(op, gamma, lam, kernel_device):
    batch = rollout(3, 29, seed=3, gamma=gamma, lam=lam)
    check(op, batch, kernel_device)


@pytest.mark.parametrize("op", ALL_OPS)
def test_chunked_path_matches_fused_path(op, kernel_device):
    """A long row cut into many chunks gives the fused path's result."""
    batch = rollout(2, 1500, seed=11, p_term=0.01, p_trunc=0.01)
    with rl_triton.launch_config(block_t=64, chunked=True):
        chunked = run(op, batch, kernel_device)
    with rl_triton.launch_config(block_t=64, chunked=False):
        fused = run(op, batch, kernel_device)
    for c, f in zip(chunked, fused):
        np.testing.assert_allclose(c, f, rtol=2e-5, atol=2e-5 * max(1.0, float(np.abs(f).max())))
    assert_matches(chunked, REFERENCES[op](batch))


def test_low_precision_inputs_and_flag_dtypes(kernel_device):
    """float16/bfloat16 values and bool/uint8 flags are read as float32 and nonzero."""
    import torch

    batch = rollout(3, 40, seed=5)
    d = kernel_device
    want = REFERENCES["gae"](batch)
    for float_dtype, flag_dtype in [(torch.float16, torch.bool), (torch.bfloat16, torch.uint8)]:
        r = batch.t("rewards", d).to(float_dtype)
        v = batch.t("values", d).to(float_dtype)
        boot = batch.t("bootstrap_values", d).to(float_dtype)
        term = batch.t("terminateds", d).to(flag_dtype)
        trunc = batch.t("truncateds", d).to(flag_dtype)
        got = rl_triton.compute_gae(r, v, term, trunc, batch.gamma, batch.lam, bootstrap_values=boot)
        lowp = rollout(3, 40, seed=5)
        lowp.rewards, lowp.values, lowp.bootstrap_values = (
            x.float().cpu().numpy() for x in (r, v, boot))
        assert_matches((got.cpu().numpy(),), REFERENCES["gae"](lowp))
        assert not np.allclose(got.cpu().numpy(), want[0], atol=0)  # inputs really were rounded


@pytest.mark.parametrize("config", ["planned", "chunked", "unmasked", "unmasked_chunked"])
@pytest.mark.parametrize("num_actions", [5, 8])
def test_out_of_range_actions_have_probability_zero(config, num_actions, kernel_device):
    """Also where the tiles cover the inputs: with a power-of-two action count
    nothing is masked, and an out-of-range action must still read as 0."""
    shape = (2, 20) if config in ("planned", "chunked") else (4, 64)
    batch = rollout(*shape, seed=9, num_actions=num_actions)
    batch.actions[0, 3] = -1
    batch.actions[1, 10] = 99
    batch.actions[1, -1] = 99  # also what the clamped read of the step after the last sees
    chunked = config.endswith("chunked")
    settings = {"block_t": 8, "chunked": chunked} if config != "planned" else {}
    if config.startswith("unmasked"):
        assert plan(*shape, 1, 1, rl_triton.LaunchConfig(**settings)).even
    with rl_triton.launch_config(**settings):
        assert_matches(run("retrace", batch, kernel_device), REFERENCES["retrace"](batch))


@pytest.mark.parametrize("num_actions", [1, 2, 8])
@pytest.mark.parametrize("chunked", [False, True])
def test_retrace_unmasked_with_power_of_two_actions(num_actions, chunked, kernel_device):
    """A power-of-two action count drops the last mask on tiles that cover the inputs."""
    shape, config = (8, 64), {"block_t": 8, "chunked": chunked}
    assert plan(*shape, 1, 1, rl_triton.LaunchConfig(**config)).even
    batch = rollout(*shape, seed=zlib.crc32(repr((num_actions, chunked)).encode()),
                    num_actions=num_actions)
    with rl_triton.launch_config(**config):
        check("retrace", batch, kernel_device)


@pytest.mark.parametrize("op", ["gae", "vtrace"])
@pytest.mark.parametrize("config", ["planned", "chunked"])
def test_infinite_last_value_of_a_terminated_env_is_never_used(op, config, kernel_device):
    """``V(s_T)`` after a termination at ``T-1`` enters nothing: an infinite one
    leaves the outputs finite (a carry started as ``0 * last_value`` would be NaN)."""
    d = kernel_device
    b = rollout(3, 24, seed=11)
    term = b.t("terminateds", d).clone()
    term[:, -1] = 1
    r, v = b.t("rewards", d), b.t("values", d)

    def outputs(last_value):
        with rl_triton.launch_config(**CONFIGS[config]):
            if op == "gae":
                return (rl_triton.compute_gae(r, v, term, gamma=b.gamma, lambda_=b.lam,
                                              last_value=last_value),)
            return rl_triton.compute_vtrace(b.t("log_pi_target", d), b.t("log_pi_behavior", d),
                                            v, r, term, gamma=b.gamma, last_value=last_value)

    got = outputs(torch.tensor([float("inf"), -float("inf"), 1.0], device=d))
    want = outputs(torch.tensor([0.0, 0.0, 1.0], device=d))
    for g, w in zip(got, want):
        assert torch.isfinite(g).all()
        torch.testing.assert_close(g, w)
