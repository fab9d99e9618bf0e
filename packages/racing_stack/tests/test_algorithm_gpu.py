"""The captured update on a CUDA device: the ``"graph"`` path's updates
(the first eager, which makes the optimizer's moments, the later ones one
replay each) are bitwise the eager ones (the same kernels on the same
data, the step size changed between them; compiled too), it is captured again for a new
policy and optimizer, and TF32 (``matmul_precision="high"``) changes the
numbers a little, not the update."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from test_algorithm import CONFIG, HIGH, LOW, rollout_buffers

from racing_stack.ppo.algorithm import PPOUpdate

pytestmark = pytest.mark.gpu

#: Minibatches of 2,048 rows of the preset's network, so that the matmuls use the tensor cores.
BIG = dataclasses.replace(CONFIG, worlds=1024, steps=8, minibatches=4, epochs=2, hidden=(256, 256))


@pytest.fixture(autouse=True)
def cuda():
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA device")


def optimised(config, seeds=(1, 2, 3)) -> tuple[PPOUpdate, list[dict[str, float]]]:
    """Updates on random buffers, each at its own step size."""
    update = PPOUpdate(config, LOW, HIGH, torch.device("cuda", 0))
    buf, advantage, returns = (None, None, None)
    stats = []
    for seed in seeds:
        cpu, a, r = rollout_buffers(config, seed)
        if buf is None:  # the rollout's buffers are written in place, as a Rollout's are
            buf = {k: v.cuda() for k, v in cpu.items()}
        else:
            for k, v in cpu.items():
                buf[k].copy_(v)
        advantage, returns = a.cuda(), r.cuda()
        update.set_learning_rate(config.learning_rate / seed)
        stats.append(update.optimise(buf, advantage, returns))
    return update, stats


def assert_same_update(a: PPOUpdate, b: PPOUpdate) -> None:
    for (name, x), (_, y) in zip(a.policy.state_dict().items(), b.policy.state_dict().items()):
        torch.testing.assert_close(x, y, rtol=0, atol=0, msg=name)
    for x, y in zip(a.optimizer.state.values(), b.optimizer.state.values()):
        for key in x:
            torch.testing.assert_close(x[key], y[key], rtol=0, atol=0)


@pytest.mark.parametrize("config", [CONFIG, BIG, dataclasses.replace(BIG, matmul_precision="bf16", compiled=True)],
                         ids=["small", "preset network", "compiled bf16"])
def test_the_graph_path_updates_bitwise_as_the_eager_path(config):
    eager, eager_stats = optimised(config)
    graph, graph_stats = optimised(dataclasses.replace(config, update_path="graph"))
    assert graph.graphed and graph._captured is not None and not eager.graphed and eager._captured is None
    assert all(g["capturable"] for g in graph.optimizer.param_groups)
    assert not any(g["capturable"] for g in eager.optimizer.param_groups)
    assert graph_stats == eager_stats
    assert_same_update(eager, graph)


def test_a_new_policy_is_captured_again():
    config = dataclasses.replace(CONFIG, update_path="graph")
    update, _ = optimised(config, seeds=(1, 2))
    first = update._captured
    assert first is not None and first.fits(update, first.flat)
    update.policy = update.new_policy()
    update.optimizer = update.new_optimizer(update.policy)
    buf, advantage, returns = rollout_buffers(config, 5)
    buf = {k: v.cuda() for k, v in buf.items()}
    update.optimise(buf, advantage.cuda(), returns.cuda())  # a new optimizer holds no moments yet: eager
    assert update._captured is first and not first.fits(update, first.flat)
    update.optimise(buf, advantage.cuda(), returns.cuda())
    assert update._captured is not first and update._captured.fits(update, update._captured.flat)


def test_tf32_changes_the_numbers_a_little():
    highest, a = optimised(BIG, seeds=(1,))
    high, b = optimised(dataclasses.replace(BIG, matmul_precision="high"), seeds=(1,))
    assert torch.get_float32_matmul_precision() == "highest"  # restored after each update
    assert a != b
    for key in ("policy_loss", "value_loss", "entropy"):
        assert b[0][key] == pytest.approx(a[0][key], rel=2e-2, abs=1e-3), key


def test_an_optimizer_saved_on_the_cpu_resumes_on_the_graph_path():
    """A checkpoint's optimizer written on the CPU (unfused, its step counts
    on the host) loaded on CUDA (`adopt`): the first update captures at
    once (the moments exist) and gives the eager path's numbers; replacing
    the moments afterwards is a new capture, not a replay into old ones."""
    cpu = PPOUpdate(CONFIG, LOW, HIGH, torch.device("cpu"))
    buf, advantage, returns = rollout_buffers(CONFIG, 7)
    cpu.optimise(buf, advantage, returns)
    saved, weights = cpu.optimizer_state(), cpu.policy.state_dict()
    updates = {}
    for path in ("eager", "graph"):
        update = PPOUpdate(dataclasses.replace(CONFIG, update_path=path), LOW, HIGH, torch.device("cuda", 0))
        update.policy.load_state_dict(weights)
        optimizer = update.new_optimizer(update.policy)
        optimizer.load_state_dict(saved)
        update.adopt(optimizer)
        update.optimizer = optimizer
        assert all(g["fused"] and isinstance(g["lr"], torch.Tensor) for g in optimizer.param_groups)
        assert all(s["step"].is_cuda for s in optimizer.state.values())
        cuda = {k: v.cuda() for k, v in buf.items()}
        update.optimise(cuda, advantage.cuda(), returns.cuda())
        updates[path] = update
    assert updates["graph"]._captured is not None
    assert_same_update(updates["eager"], updates["graph"])
    graph = updates["graph"]
    first = graph._captured
    assert first.fits(graph, first.flat)
    for state in graph.optimizer.state.values():  # new moment tensors, the same optimizer
        state.update({k: v.clone() for k, v in state.items()})
    assert not first.fits(graph, first.flat)
