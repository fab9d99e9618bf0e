"""`racing_stack.ppo.algorithm` and the checkpoint's settings rule: the
update's paths (the captured one falls back to the eager one where it
cannot run), the matmul precision set and restored, and which settings a
resume may change."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import pytest
import torch

from racing_stack.ppo import PRESETS
from racing_stack.ppo.algorithm import PPOUpdate, matmul_precision
from racing_stack.checkpoints import CorruptFile
from racing_stack.ppo.checkpoint import HOW, RETIRED, WRITTEN_BEFORE, resume_problem
from racing_stack.ppo.distributed import Group
from racing_stack.ppo.graphs import captured

CONFIG = dataclasses.replace(PRESETS["cpu"], worlds=4, steps=6, minibatches=3, epochs=2, hidden=(16, 16))
LOW, HIGH = np.array([-0.6, -8.0], np.float32), np.array([0.6, 4.0], np.float32)


def rollout_buffers(config, seed: int) -> tuple[dict[str, torch.Tensor], torch.Tensor, torch.Tensor]:
    """Random rollout buffers [T, E, ...] (a quarter of the slots not valid), advantages and returns [T, E]."""
    g = torch.Generator().manual_seed(seed)
    t, e, d = config.steps, config.worlds, config.features.size
    buf = {"x": torch.randn((t, e, d), generator=g), "u": torch.randn((t, e, 2), generator=g),
           "logp": torch.randn((t, e), generator=g) - 2.0, "value": torch.randn((t, e), generator=g),
           "valid": (torch.rand((t, e), generator=g) > 0.25).float()}
    return buf, torch.randn((t, e), generator=g), torch.randn((t, e), generator=g)


def updated(config) -> tuple[PPOUpdate, dict[str, float]]:
    """A fresh update of ``config`` after two optimisations on random buffers."""
    update = PPOUpdate(config, LOW, HIGH, torch.device("cpu"))
    for seed in (1, 2):
        buf, advantage, returns = rollout_buffers(config, seed)
        stats = update.optimise(buf, advantage, returns)
    return update, stats


def test_the_graph_path_falls_back_to_the_eager_update_on_the_cpu():
    eager, eager_stats = updated(CONFIG)
    graph, graph_stats = updated(dataclasses.replace(CONFIG, update_path="graph"))
    assert not graph.graphed and not eager.graphed
    assert graph._captured is None  # nothing was captured
    assert graph_stats == eager_stats
    for (name, a), (_, b) in zip(eager.policy.state_dict().items(), graph.policy.state_dict().items()):
        torch.testing.assert_close(a, b, rtol=0, atol=0, msg=name)
    for a, b in zip(eager.optimizer.state.values(), graph.optimizer.state.values()):
        for key in a:
            torch.testing.assert_close(a[key], b[key], rtol=0, atol=0)


def test_the_graph_path_is_for_one_cuda_process_only():
    graph, cuda = dataclasses.replace(CONFIG, update_path="graph"), torch.device("cuda", 0)
    assert captured(graph, cuda, Group()) and not captured(CONFIG, cuda, Group())
    assert not captured(graph, torch.device("cpu"), Group()) and not captured(graph, cuda, Group(1, 2))
    cpu = PPOUpdate(dataclasses.replace(CONFIG, update_path="graph"), LOW, HIGH, torch.device("cpu"))
    assert not cpu.graphed
    shared = PPOUpdate(dataclasses.replace(CONFIG, update_path="graph"), LOW, HIGH, torch.device("cpu"))
    shared.device, shared.group = torch.device("cuda", 0), Group(0, 2)
    assert not shared.graphed  # under torchrun: eager
    shared.group = Group()
    assert shared.graphed


def test_a_minibatch_step_adds_its_gradients_and_returns_its_statistics():
    """`PPOUpdate.gradients`, the step both paths run: the loss's own
    gradients (clipped) land in the parameters, its statistics come back."""
    update = PPOUpdate(CONFIG, LOW, HIGH, torch.device("cpu"))
    buf, advantage, returns = rollout_buffers(CONFIG, 3)
    rows = torch.arange(8)
    flat = {k: v.reshape(-1, *v.shape[2:])[rows] for k, v in buf.items()}
    stats = update.gradients(flat["x"], flat["u"], flat["logp"], advantage.reshape(-1)[rows],
                             returns.reshape(-1)[rows], flat["valid"], flat["valid"].sum())
    assert stats.shape == (7,) and torch.isfinite(stats).all()
    norms = [torch.linalg.vector_norm(torch.stack([p.grad.norm() for p in part]))
             for part in (update.policy.actor_parameters(), list(update.policy.critic.parameters()))]
    for before, after in zip(stats[5:], norms):  # clipped to max_grad_norm, or left as they were
        assert float(after) == pytest.approx(min(float(before), CONFIG.max_grad_norm), rel=1e-4)


@pytest.mark.parametrize("precision", ["high", "highest", "bf16"])
def test_the_matmul_precision_is_set_inside_and_restored_after(precision):
    before = torch.get_float32_matmul_precision()
    with matmul_precision(precision):
        assert torch.get_float32_matmul_precision() == ("high" if precision == "bf16" else precision)
        assert torch.is_autocast_enabled("cpu") == (precision == "bf16")
        if precision == "bf16":
            assert torch.get_autocast_dtype("cpu") == torch.bfloat16
            assert torch.nn.Linear(3, 2)(torch.ones(4, 3)).dtype == torch.bfloat16
    assert torch.get_float32_matmul_precision() == before and not torch.is_autocast_enabled("cpu")
    with pytest.raises(RuntimeError), matmul_precision(precision):
        raise RuntimeError("an error inside")
    assert torch.get_float32_matmul_precision() == before


def test_a_bf16_update_rounds_the_matmuls_but_keeps_the_float32_state():
    """``matmul_precision="bf16"``: the same update within bfloat16's
    rounding (losses and weights near the float32 ones, not equal), the
    weights, the optimizer's moments and the feature statistics float32
    and float64 as before."""
    exact, exact_stats = updated(CONFIG)
    rounded, stats = updated(dataclasses.replace(CONFIG, matmul_precision="bf16"))
    assert stats != exact_stats
    for key in ("policy_loss", "value_loss", "entropy"):
        assert stats[key] == pytest.approx(exact_stats[key], rel=0.05, abs=1e-3), key
    for (name, a), (_, b) in zip(exact.policy.state_dict().items(), rounded.policy.state_dict().items()):
        assert a.dtype == b.dtype, name
        torch.testing.assert_close(b, a, rtol=0.05, atol=2e-3, msg=name)
    assert all(v.dtype == torch.float32 for state in rounded.optimizer.state.values() for k, v in state.items()
               if k != "step")


@pytest.mark.parametrize("precision", ["highest", "bf16"])
def test_a_compiled_update_computes_the_eager_update_within_its_roundings(precision):
    """``compiled``: the minibatch losses go through ``torch.compile`` (its
    frames counted by Torch), and two updates later the parameters, the
    optimizer's moments and the statistics are the eager update's within
    the roundings of fused kernels (float32: summation orders; bf16: the
    fused passes keep float32 where autocast rounds to bfloat16)."""
    from torch._dynamo.utils import counters

    config = dataclasses.replace(CONFIG, matmul_precision=precision)
    eager, eager_stats = updated(config)
    before = counters["stats"]["unique_graphs"]
    compiled, stats = updated(dataclasses.replace(config, compiled=True))
    assert counters["stats"]["unique_graphs"] > before
    tolerance = {"rtol": 1e-4, "atol": 1e-5} if precision == "highest" else {"rtol": 0.05, "atol": 2e-3}
    for key, value in eager_stats.items():
        assert stats[key] == pytest.approx(value, rel=tolerance["rtol"] * 10, abs=tolerance["atol"] * 10), key
    for (name, a), (_, b) in zip(eager.policy.state_dict().items(), compiled.policy.state_dict().items()):
        assert a.dtype == b.dtype, name
        torch.testing.assert_close(b, a, **tolerance, msg=name)
    for p, q in zip(eager.policy.parameters(), compiled.policy.parameters()):
        for key in ("exp_avg", "exp_avg_sq"):  # within 2 % of each moment's largest
            value = eager.optimizer.state[p][key]
            assert (compiled.optimizer.state[q][key] - value).abs().max() <= 0.02 * value.abs().max(), key


def test_a_resume_may_change_how_an_update_runs_but_not_what_it_computes(tmp_path: Path):
    path = tmp_path / "checkpoint.pt"
    written = CONFIG.to_json()
    assert HOW == ("update_path",)
    resume_problem(dataclasses.replace(CONFIG, update_path="graph"), written, path)
    with pytest.raises(ValueError, match=r"trained with other settings: \['matmul_precision'\]"):
        resume_problem(dataclasses.replace(CONFIG, matmul_precision="high"), written, path)


def test_a_checkpoint_written_before_the_newer_settings_resumes_as_its_run_ran(tmp_path: Path):
    path = tmp_path / "checkpoint.pt"
    older = {k: v for k, v in CONFIG.to_json().items() if k not in WRITTEN_BEFORE}
    resume_problem(CONFIG, older, path)
    resume_problem(dataclasses.replace(CONFIG, update_path="graph"), older, path)
    with pytest.raises(ValueError, match=r"other settings: \['matmul_precision'\]"):
        resume_problem(dataclasses.replace(CONFIG, matmul_precision="high"), older, path)
    with pytest.raises(ValueError, match=r"lacks the settings \['gamma'\]"):
        resume_problem(CONFIG, {k: v for k, v in older.items() if k != "gamma"}, path)


@pytest.mark.parametrize("retired", ["fused_mlp", "critic_beside_rollout"])
@pytest.mark.parametrize("value", [False, True])
def test_a_checkpoint_of_a_retired_setting_resumes_without_it(tmp_path: Path, retired, value):
    """A checkpoint written with a removed setting (`RETIRED`: the fused
    MLP, the critic's steps apart) resumes, on or off, as any other
    setting of how its run ran; an unknown setting is still refused as
    damage."""
    path = tmp_path / "checkpoint.pt"
    assert RETIRED == ("fused_mlp", "critic_beside_rollout") and not hasattr(CONFIG, retired)
    resume_problem(CONFIG, {**CONFIG.to_json(), retired: value}, path)
    with pytest.raises(CorruptFile, match="not a valid configuration"):
        resume_problem(CONFIG, {**CONFIG.to_json(), "fused_kernels": value}, path)


def test_the_optimizer_state_keeps_its_step_size_a_number():
    """What a checkpoint keeps of the optimizer: its step size a number, the one set last."""
    update, _ = updated(CONFIG)
    update.set_learning_rate(3e-4)
    state = update.optimizer_state()
    assert [g["lr"] for g in state["param_groups"]] == [3e-4] and state["state"]
    assert update.optimizer.param_groups[0]["lr"] == 3e-4 and not update.optimizer.param_groups[0]["capturable"]


def _own_buffers(update: PPOUpdate, seed: int) -> tuple[dict[str, torch.Tensor], torch.Tensor, torch.Tensor]:
    """Random buffers whose log-probabilities are ``update``'s policy's own (as if it had acted)."""
    buf, advantage, returns = rollout_buffers(update.config, seed)
    with torch.no_grad():
        buf["logp"] = update.policy.distribution(buf["x"]).log_prob(buf["u"]).sum(-1)
    return buf, advantage, returns


def test_a_lagged_update_on_its_own_policys_data_is_ppos_bit_for_bit():
    """The decoupled loss of a lagged update weighs each row by pi_prox /
    pi_old and clips against pi_prox, the policy as the update starts: on
    data that policy collected itself both are PPO's own, so the update is
    the unlagged one bit for bit; on data an older policy collected it is
    another update."""
    lagged = PPOUpdate(dataclasses.replace(CONFIG, policy_lag=1), LOW, HIGH, torch.device("cpu"))
    plain = PPOUpdate(CONFIG, LOW, HIGH, torch.device("cpu"))
    buf, advantage, returns = _own_buffers(plain, 11)
    assert torch.equal(lagged.proximal_log_probs({k: v.reshape(-1, *v.shape[2:]) for k, v in buf.items()}),
                       buf["logp"].reshape(-1))
    assert lagged.optimise(buf, advantage, returns) == plain.optimise(buf, advantage, returns)
    for (name, a), (_, b) in zip(lagged.policy.state_dict().items(), plain.policy.state_dict().items()):
        assert torch.equal(a, b), name
    older, advantage, returns = _own_buffers(plain, 12)
    older["logp"] = older["logp"] - 0.3 * torch.rand(older["logp"].shape)  # another policy acted
    assert lagged.optimise(older, advantage, returns) != plain.optimise(older, advantage, returns)
