"""The fused MLP kernels (`racing_stack.ppo.fused`) against a float64
reference of the same arithmetic: the same bfloat16 roundings of the
inputs, the weights and the hidden activations, on random networks of odd
shapes; which networks they take; and the PPO loss through them. They run
on CUDA, or on the CPU in a process started with ``TRITON_INTERPRET=1``
(``make test-racing-stack`` runs them so)."""

from __future__ import annotations

import dataclasses
import os

import pytest
import torch
from test_algorithm import CONFIG, HIGH, LOW, rollout_buffers
from torch import nn

from racing_stack.ppo import fused
from racing_stack.ppo.algorithm import matmul_precision
from racing_stack.ppo.losses import normalised_advantages, outputs, ppo_losses
from racing_stack.ppo.networks import ActorCritic

pytestmark = pytest.mark.kernels

SHAPES = [(130, 7, 32, 64, 2), (64, 134, 256, 256, 1), (1, 16, 16, 16, 2), (200, 30, 64, 128, 2),
          (0, 5, 16, 32, 1), (257, 134, 256, 256, 2)]


@pytest.fixture
def device() -> torch.device:
    """Where the kernels run: CUDA, or the CPU through Triton's interpreter."""
    if os.environ.get("TRITON_INTERPRET", "0") == "1":
        return torch.device("cpu")
    if torch.cuda.is_available():
        return torch.device("cuda")
    pytest.skip("runs the Triton kernels: needs CUDA, or TRITON_INTERPRET=1 in its own process")


def network(features: int, first: int, second: int, outputs_: int, seed: int) -> nn.Sequential:
    torch.manual_seed(seed)
    net = nn.Sequential(nn.Linear(features, first), nn.Tanh(), nn.Linear(first, second), nn.Tanh(),
                        nn.Linear(second, outputs_))
    for p in net.parameters():
        p.data.normal_(0.0, 0.4)
    return net


def bf16(t: torch.Tensor) -> torch.Tensor:
    """``t`` rounded to bfloat16 (to nearest, ties to even), in float64."""
    return t.detach().to(torch.bfloat16).double()


def reference(net: nn.Sequential, z: torch.Tensor, grad: torch.Tensor) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """The output and the parameters' gradients of ``(output * grad).sum()``
    in float64, with the kernels' roundings: bfloat16 inputs, weights,
    biases, hidden activations and pre-activation gradients, the hidden
    weight gradients rounded to bfloat16."""
    w1, b1, w2, b2, w3, b3 = (bf16(p) for p in net.parameters())
    x = bf16(z)
    h1 = bf16(torch.tanh(x @ w1.T + b1))
    h2 = bf16(torch.tanh(h1 @ w2.T + b2))
    out = h2 @ w3.T + b3
    g = grad.double()
    dz2 = bf16((g @ w3) * (1 - h2 * h2))
    dz1 = bf16((dz2 @ w2) * (1 - h1 * h1))
    return out, [bf16(dz1.T @ x), dz1.sum(0), bf16(dz2.T @ h1), dz2.sum(0), g.T @ h2, g.sum(0)]


@pytest.mark.parametrize("shape", SHAPES, ids=[f"B{s[0]}-F{s[1]}-H{s[2]}x{s[3]}-O{s[4]}" for s in SHAPES])
def test_the_kernels_compute_the_network_and_its_gradients(device, shape):
    rows, features, first, second, outs = shape
    net = network(features, first, second, outs, seed=rows + features).to(device)
    assert fused.fusable(net, features)
    z = (torch.randn(rows, features) * 2).clamp(-10, 10)
    grad = torch.randn(rows, outs)
    out = fused.mlp(net, z.to(device))
    (out * grad.to(device)).sum().backward()
    expected, grads = reference(net.cpu(), z, grad)
    assert out.dtype == torch.float32 and out.shape == (rows, outs)
    # A hidden activation may round to the bfloat16 beside the reference's (float32 arithmetic and
    # tanh against float64): at most one bfloat16 step (2^-8 below 1 in magnitude) an activation.
    step = 2.0**-8 * net[4].weight.detach().cpu().double().abs().sum(1)
    assert ((out.cpu().double() - expected).abs() <= step + 1e-5).all()
    for (name, p), want in zip(net.named_parameters(), grads):
        got = p.grad.cpu().double()
        assert got.shape == want.shape, name
        scale = want.norm().clamp(min=1e-6)
        assert (got - want).norm() / scale < 5e-3, name  # a few activations a bfloat16 step apart, no more


def test_a_nan_stays_nan(device):
    """A NaN feature (here the GPU's own NaN, all mantissa bits set, which
    a rounding on the bits must not carry into the sign) gives its row NaN
    outputs and NaN gradients; the other rows stay finite."""
    net = network(20, 32, 32, 2, 1).to(device)
    z = torch.randn(70, 20)
    z.view(torch.int32)[3, 5] = 0x7FFFFFFF
    assert z[3, 5].isnan()
    out = fused.mlp(net, z.to(device))
    assert out[3].isnan().all() and out[torch.arange(70) != 3].isfinite().all()
    grad = torch.zeros(70, 2, device=device)
    grad[3] = 1.0
    out.backward(grad)
    assert net[0].weight.grad.isnan().any() and net[4].weight.grad.isnan().all()


def test_an_input_that_wants_a_gradient_is_refused():
    net = network(7, 16, 16, 2, 0)
    with pytest.raises(ValueError, match="z must not require a gradient"):
        fused.mlp(net, torch.randn(3, 7, requires_grad=True))


@pytest.mark.parametrize("z", [torch.randn(7), torch.randn(3, 6), torch.randn(2, 3, 7),
                               torch.ones(3, 7, dtype=torch.int64)], ids=["1-D", "other features", "3-D", "integers"])
def test_an_input_of_another_shape_or_type_is_refused(z):
    with pytest.raises(ValueError, match="^(z must be floating point|net must be Linear)"):
        fused.mlp(network(7, 16, 16, 2, 0), z)


def test_a_network_the_kernels_do_not_compute_is_refused():
    with pytest.raises(ValueError, match="net must be Linear, Tanh"):
        fused.mlp(nn.Sequential(nn.Linear(7, 16), nn.ReLU()), torch.randn(3, 7))


def test_which_networks_the_kernels_take():
    assert fused.fusable(network(134, 256, 256, 2, 0), 134)
    assert fused.fusable(network(1, 16, 256, 1, 0), 1)
    assert not fused.fusable(network(134, 256, 256, 2, 0), 133)  # other features
    assert not fused.fusable(network(134, 100, 256, 2, 0), 134)  # not a power of two
    assert not fused.fusable(network(134, 512, 256, 2, 0), 134)  # too wide
    assert not fused.fusable(network(134, 8, 256, 2, 0), 134)  # too narrow
    assert not fused.fusable(network(134, 256, 256, 3, 0), 134)  # three outputs
    assert not fused.fusable(network(300, 256, 256, 2, 0), 300)  # too many features
    relu = network(134, 256, 256, 2, 0)
    relu[1] = nn.ReLU()
    assert not fused.fusable(relu, 134)
    assert not fused.fusable(nn.Sequential(nn.Linear(134, 256), nn.Tanh(), nn.Linear(256, 2)), 134)
    no_bias = network(134, 256, 256, 2, 0)
    no_bias[2] = nn.Linear(256, 256, bias=False)
    assert not fused.fusable(no_bias, 134)


def test_the_loss_through_the_kernels_is_autocasts_within_bfloat16s_rounding(device):
    """The PPO loss and its gradients on the preset's network, fused
    against autocast's bfloat16 path: other roundings, the same values
    within them."""
    config = dataclasses.replace(CONFIG, hidden=(256, 256), matmul_precision="bf16")
    buf, advantage, returns = rollout_buffers(config, 3)
    n = config.steps * config.worlds
    flat = {k: buf[k].reshape(n, *buf[k].shape[2:]).to(device) for k in ("x", "u", "logp", "valid")}
    adv = normalised_advantages(advantage.reshape(n).to(device), flat["valid"])
    results = {}
    for fuse in (False, True):
        torch.manual_seed(0)
        policy = ActorCritic(config.features.size, config.hidden, config.init_log_std, LOW, HIGH).to(device)
        cfg = dataclasses.replace(config, fused_mlp=fuse)
        with matmul_precision("bf16", device):
            mean, value = outputs(policy, flat["x"], cfg)
            assert ("_FusedMLP" in type(mean.grad_fn).__name__) == fuse  # the path asked for ran
            loss, stats = ppo_losses(policy, cfg, flat["x"], flat["u"], flat["logp"], adv,
                                     returns.reshape(n).to(device), flat["valid"])
        loss.backward()
        results[fuse] = (mean, value, stats, [p.grad.clone() for p in policy.parameters()])
    (m0, v0, s0, g0), (m1, v1, s1, g1) = results[False], results[True]
    assert m0.dtype == v0.dtype == torch.bfloat16 and m1.dtype == v1.dtype == torch.float32  # not rounded
    torch.testing.assert_close(m1, m0.float(), rtol=2e-2, atol=2e-3)
    torch.testing.assert_close(v1, v0.float(), rtol=2e-2, atol=2e-3)
    torch.testing.assert_close(s1, s0, rtol=2e-2, atol=1e-3)
    for a, b in zip(g1, g0):
        assert (a - b).norm() <= 3e-2 * b.norm() + 1e-6
