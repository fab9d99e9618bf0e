"""Bad input: a clear TypeError/ValueError naming the argument, raised before any work."""

import warnings

import pytest
import torch

import rl_triton
from rl_triton._launch import CHUNK_MAX_REGISTERS, CHUNK_TILE, plan
from rollouts import OPS, rollout

E, T = 3, 8


def f(*shape, dtype=torch.float32, device="cpu"):
    return torch.zeros(*shape, dtype=dtype, device=device)


def gae(**over):
    args = dict(rewards=f(E, T), values=f(E, T), terminateds=f(E, T))
    args.update(over)
    return rl_triton.compute_gae(**args)


@pytest.mark.parametrize("over,error,match", [
    (dict(rewards=[[0.0]]), TypeError, "rewards must be a torch.Tensor"),
    (dict(rewards=f(E, T, dtype=torch.int32)), TypeError, "rewards must have a floating-point dtype"),
    (dict(rewards=f(E)), ValueError, r"rewards must have shape \[num_envs, seq_len\]"),
    (dict(rewards=f(E, 0)), ValueError, "seq_len >= 1"),
    (dict(values=f(E, T + 1)), ValueError, r"values must have shape \[3, 8\]"),
    (dict(terminateds=f(E, T, dtype=torch.complex64)), TypeError, "terminateds must have"),
    (dict(values=f(E, T, device="meta")), ValueError, "values must be on rewards's device"),
    (dict(last_value=f(E), bootstrap_values=f(E, T)), ValueError, "mutually exclusive"),
    (dict(last_value=f(E), truncateds=f(E, T)), ValueError, "last_value and truncateds"),
    (dict(last_value=f(E + 1)), ValueError, r"last_value must have shape \[3\]"),
    (dict(gamma=1.5), ValueError, r"gamma must be in \[0, 1\]"),
    (dict(lambda_=float("nan")), ValueError, "lambda_ must not be NaN"),
    (dict(gamma="0.9"), TypeError, "gamma must be a Python float"),
    (dict(gamma=10**400), ValueError, "gamma must be a real number a float can hold"),
    (dict(lambda_=-(10**400)), ValueError, "lambda_ must be a real number a float can hold"),
])
def test_gae_rejects(over, error, match):
    with pytest.raises(error, match=match):
        gae(**over)


def test_a_rejected_call_changes_nothing():
    rl_triton.compute_gae(f(E, T), f(E, T), f(E, T))
    before = rl_triton.last_path()
    r = torch.randn(E, T)
    snapshot = r.clone()
    with pytest.raises(ValueError):
        rl_triton.compute_gae(r, f(E, T + 1), f(E, T))
    assert rl_triton.last_path() == before
    assert torch.equal(r, snapshot)


def test_vtrace_rejects_bad_clip():
    x = f(E, T)
    with pytest.raises(ValueError, match="rho_bar must be > 0"):
        rl_triton.compute_vtrace(x, x, x, x, x, rho_bar=0.0)
    with pytest.raises(ValueError, match="c_bar must be a real number a float can hold"):
        rl_triton.compute_vtrace(x, x, x, x, x, c_bar=2**1100)
    with pytest.raises(ValueError, match="log_pi_behavior must have shape"):
        rl_triton.compute_vtrace(x, f(E, 2), x, x, x)


def test_retrace_rejects_bad_shapes_and_actions():
    x, p = f(E, T), f(E, T, 4)
    a = torch.zeros(E, T, dtype=torch.int64)
    with pytest.raises(ValueError, match="action_probs_target must have shape"):
        rl_triton.compute_retrace(x, x, x, p, a, x, x, None, 0.9)
    with pytest.raises(ValueError, match=r"next_q_values_all must have shape \[3, 8, 4\]"):
        rl_triton.compute_retrace(p, x, x, f(E, T, 5), a, x, x, None, 0.9)
    with pytest.raises(TypeError, match="actions must have an integer dtype"):
        rl_triton.compute_retrace(p, x, x, p, x, x, x, None, 0.9)


def test_returns_and_scans_reject():
    x = f(E, T)
    with pytest.raises(ValueError, match="next_values must have shape"):
        rl_triton.compute_lambda_returns(x, f(E, 1), x)
    with pytest.raises(ValueError, match="bootstrap_values must have shape"):
        rl_triton.compute_discounted_returns(x, x, bootstrap_values=f(E))
    with pytest.raises(ValueError, match=r"seed_values must have shape \[3\]"):
        rl_triton.compute_eligibility_traces(x, x, 0.9, 0.9, seed_values=f(E, 1))
    with pytest.raises(ValueError, match="boundary must be 'ends_at' or 'starts_at'"):
        rl_triton.compute_episodic_prefix_sum(x, x, boundary="start")
    with pytest.raises(ValueError, match="dones must have shape"):
        rl_triton.compute_episodic_prefix_sum(x, f(T))


def test_launch_config_is_validated():
    with pytest.raises(ValueError, match="block_t must be a power of two"):
        rl_triton.LaunchConfig(block_t=12)
    for field, huge in (("block_e", 2**64), ("block_t", 2**40), ("num_warps", 2**70), ("num_warps", 64)):
        with pytest.raises(ValueError, match=rf"{field} must be a power of two in \[\d+, \d+\]"):
            rl_triton.LaunchConfig(**{field: huge})
    assert rl_triton.LaunchConfig(block_e=2**20, block_t=2**20, num_warps=32).num_warps == 32
    with pytest.raises(ValueError, match="chunked must be a bool"):
        rl_triton.LaunchConfig(chunked=1)
    for bad in (8, 256, True, 64.0):
        with pytest.raises(ValueError, match="max_registers must be 0 or an int"):
            rl_triton.LaunchConfig(max_registers=bad)


def test_chunked_plans_cap_registers():
    default = rl_triton.LaunchConfig()
    long_rows = plan(16, 262144, 1, 1056, default)
    assert long_rows.chunked and long_rows.max_registers == CHUNK_MAX_REGISTERS
    assert long_rows.chunk_t == CHUNK_TILE
    assert plan(4096, 2048, 1, 1056, default).max_registers is None  # fused: the compiler's choice
    own = plan(16, 262144, 1, 1056, default, chunk_tile=1024, chunk_registers=80)
    assert (own.chunk_t, own.max_registers) == (1024, 80)
    assert plan(16, 262144, 1, 1056, rl_triton.LaunchConfig(max_registers=0)).max_registers is None
    assert plan(4096, 2048, 1, 1056, rl_triton.LaunchConfig(max_registers=96)).max_registers == 96


def test_chunks_that_cover_the_rows_run_unmasked_unless_the_op_says():
    default = rl_triton.LaunchConfig()
    assert plan(16, 262144, 1, 1056, default).even
    assert not plan(16, 262144, 1, 1056, default, chunk_unmasked=False).even
    assert not plan(16, 262143, 1, 1056, default).even  # the last chunk is partial


def test_correctness_warnings_only_with_the_flag(monkeypatch):
    term = torch.zeros(E, T)
    trunc = torch.zeros(E, T)
    term[0, 2] = trunc[0, 2] = 1  # both at one step
    boot = torch.zeros(E, T)
    boot[1, 3] = 5.0  # interior, not truncated
    args = (f(E, T), f(E, T), term, trunc)
    monkeypatch.delenv("RL_TRITON_CORRECTNESS_WARNINGS", raising=False)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        rl_triton.compute_gae(*args, bootstrap_values=boot)
    monkeypatch.setenv("RL_TRITON_CORRECTNESS_WARNINGS", "1")
    with pytest.warns(RuntimeWarning) as record:
        rl_triton.compute_gae(*args, bootstrap_values=boot)
    messages = " ".join(str(w.message) for w in record)
    assert "terminateds and truncateds are both set" in messages
    assert "bootstrap_values is nonzero at interior" in messages
    nv = torch.ones(E, T)
    with pytest.warns(RuntimeWarning, match="next_values is nonzero at truncated steps"):
        rl_triton.compute_lambda_returns(f(E, T), nv, f(E, T), trunc)
    batch = rollout(2, 5)
    batch.actions[0, 0] = 7
    with pytest.warns(RuntimeWarning, match="actions has entries outside"):
        OPS["retrace"](batch, "cpu")


def test_correctness_warnings_point_at_the_callers_line(monkeypatch):
    monkeypatch.setenv("RL_TRITON_CORRECTNESS_WARNINGS", "1")
    term = torch.zeros(E, T)
    trunc = torch.zeros(E, T)
    term[0, 2] = trunc[0, 2] = 1
    nv = torch.ones(E, T)
    calls = [
        lambda: rl_triton.compute_gae(f(E, T), f(E, T), term, trunc, bootstrap_values=torch.zeros(E, T)),
        lambda: rl_triton.compute_vtrace(f(E, T), f(E, T), f(E, T), f(E, T), term, trunc,
                                         bootstrap_values=torch.zeros(E, T)),
        lambda: rl_triton.compute_lambda_returns(f(E, T), nv, f(E, T), trunc),
    ]
    for call in calls:
        with pytest.warns(RuntimeWarning) as record:
            call()
        assert {w.filename for w in record} == {__file__}, [w.filename for w in record]
