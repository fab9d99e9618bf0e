"""The policy's networks against NumPy: the running feature statistics
(`Normalizer`), the statistics travelling with the weights, `load_checked`
refusing what does not fit, and the plugin's imports staying Torch-only."""

import subprocess
import sys

import numpy as np
import pytest
import torch

from racing_stack.checkpoints import CorruptFile
from racing_stack.ppo.networks import ActorCritic, Linear, Normalizer, clipped_mean

LOW = np.array([-0.6, -8.0], np.float32)
HIGH = np.array([0.6, 4.0], np.float32)
FEATURES = 11


def batches(rng, sizes, features=FEATURES):
    """Rows with means and scales far from 0 and 1 (float32, as the features
    are), and random 0/1 weights."""
    centre, scale = rng.normal(0.0, 50.0, features), rng.uniform(0.01, 30.0, features)
    for n in sizes:
        x = (centre + scale * rng.standard_normal((n, features))).astype(np.float32)
        yield x, (rng.random(n) < 0.6).astype(np.float32)


def normalise(x, mean, var):
    return np.clip((x - mean) / np.sqrt(var + 1e-8), -10.0, 10.0)


def test_normalizer_statistics_are_those_of_every_weighted_row():
    """Several updates of odd sizes equal NumPy's mean and population
    variance of all the rows of weight 1, concatenated."""
    rng = np.random.default_rng(0)
    norm = Normalizer(FEATURES)
    kept = []
    for x, w in batches(rng, [1, 7, 33, 2, 200, 5]):
        if not w.any():
            w[0] = 1.0  # zero weights are tested apart
        norm.update(torch.from_numpy(x), torch.from_numpy(w))
        kept.append(x[w == 1].astype(np.float64))
        every = np.concatenate(kept)
        assert norm.count.item() == len(every)
        np.testing.assert_allclose(norm.mean.numpy(), every.mean(0), rtol=1e-12, atol=1e-12)
        np.testing.assert_allclose(norm.var.numpy(), every.var(0), rtol=1e-10, atol=1e-12)
    assert norm.mean.dtype == norm.var.dtype == norm.count.dtype == torch.float64


def test_a_normalizer_weight_is_a_mask():
    """Any positive weight counts its row once, as documented: weights
    0.5 and 3 give the statistics of weights 1."""
    rng = np.random.default_rng(2)
    x = torch.from_numpy(rng.normal(size=(9, FEATURES)))
    mask = torch.tensor([1.0, 0.0, 1.0, 1.0, 0.0, 1.0, 1.0, 1.0, 0.0])
    shares = mask * torch.tensor([0.5, 7.0, 3.0, 1.0, 0.0, 0.25, 1e-9, 2.0, 0.0])
    norms = [Normalizer(FEATURES), Normalizer(FEATURES)]
    norms[0].update(x, mask)
    norms[1].update(x, shares)
    for k, v in norms[0].state_dict().items():
        assert torch.equal(v, norms[1].state_dict()[k]), k
    assert norms[1].count.item() == 6


def test_normalizer_one_row_then_equal_rows():
    """A single row has variance 0; equal rows keep it 0; the output of a
    zero-variance feature is clamped, not infinite."""
    norm = Normalizer(3)
    row = torch.tensor([[1.5, -2.0, 1e4]])
    norm.update(row, torch.ones(1))
    np.testing.assert_array_equal(norm.var.numpy(), [0.0, 0.0, 0.0])
    norm.update(row.repeat(4, 1), torch.ones(4))
    np.testing.assert_array_equal(norm.mean.numpy(), row[0].double().numpy())
    np.testing.assert_array_equal(norm.var.numpy(), [0.0, 0.0, 0.0])
    assert norm.count.item() == 5
    out = norm(torch.tensor([[1.5, -1.0, 0.0]]))
    np.testing.assert_allclose(out.numpy(), [[0.0, 10.0, -10.0]], atol=1e-3)


def test_all_zero_weights_change_nothing():
    rng = np.random.default_rng(1)
    norm = Normalizer(FEATURES)
    (x, w), (y, _) = batches(rng, [40, 17])
    for state in ("fresh", "fed"):
        before = {k: v.clone() for k, v in norm.state_dict().items()}
        norm.update(torch.from_numpy(y), torch.zeros(17))
        norm.update(torch.from_numpy(y[:0]), torch.zeros(0))  # an empty batch too
        for k, v in norm.state_dict().items():
            assert torch.equal(v, before[k]), (state, k)
        norm.update(torch.from_numpy(x), torch.from_numpy(w))


def test_left_out_rows_are_left_out_whatever_they_hold():
    norm = Normalizer(3)
    x = torch.tensor([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0], [float("inf"), 0.0, float("nan")]])
    norm.update(x, torch.tensor([1.0, 1.0, 0.0]))
    np.testing.assert_allclose(norm.mean.numpy(), [2.5, 3.5, 4.5])
    np.testing.assert_allclose(norm.var.numpy(), [2.25, 2.25, 2.25])


def test_normalizer_output_is_the_clipped_standard_score():
    rng = np.random.default_rng(2)
    norm = Normalizer(FEATURES)
    for x, w in batches(rng, [64, 9]):
        norm.update(torch.from_numpy(x), torch.from_numpy(w))
    x, _ = next(batches(rng, [300]))
    x[:5] *= 1e3  # far outside: clamped at both ends
    x = x.reshape(3, 100, FEATURES)  # any leading shape
    got = norm(torch.from_numpy(x))
    assert got.dtype == torch.float32 and got.shape == x.shape
    want = normalise(x.astype(np.float64), norm.mean.numpy(), norm.var.numpy())
    assert (want == 10.0).any() and (want == -10.0).any()
    np.testing.assert_allclose(got.numpy(), want, rtol=1e-5, atol=1e-5)


def network(init_log_std=(-0.5, -1.5), seed=0, hidden=(16, 8)):
    torch.manual_seed(seed)
    return ActorCritic(FEATURES, hidden, init_log_std, LOW, HIGH)


def test_initial_noise_per_dimension_and_broadcast():
    np.testing.assert_array_equal(network((-0.5, -1.5)).log_std.detach().numpy(), np.float32([-0.5, -1.5]))
    np.testing.assert_array_equal(network(np.array([0.25, -2.0])).log_std.detach().numpy(), np.float32([0.25, -2.0]))
    net = network(-0.7)
    np.testing.assert_array_equal(net.log_std.detach().numpy(), np.float32([-0.7, -0.7]))
    assert net.log_std.dtype == torch.float32 and net.log_std.requires_grad
    x = torch.randn(5, FEATURES)
    np.testing.assert_allclose(net.distribution(x).stddev.detach().numpy(), np.exp(np.full((5, 2), -0.7)), rtol=1e-6)


def test_a_rollout_step_is_the_distribution_sampled_with_the_given_noise():
    """`act`: u = mean + std x noise, its log probability (NumPy's Gaussian
    density as the reference) and the value, on trained-like statistics and
    a log std away from its start."""
    net = network((0.3, -1.2), hidden=(9, 7))
    rng = np.random.default_rng(8)
    x = torch.from_numpy(next(batches(rng, [33], FEATURES))[0])
    net.normalizer.update(x, torch.ones(33))
    noise = torch.from_numpy(rng.standard_normal((33, 2)).astype(np.float32))
    with torch.no_grad():
        u, logp, value = net.act(x, noise)
        mean = net.distribution(x).mean.numpy().astype(np.float64)
        std = np.exp(np.float64([0.3, -1.2]))
        want_u = mean + std * noise.numpy()
        np.testing.assert_allclose(u.numpy(), want_u, rtol=1e-6, atol=1e-6)
        density = np.exp(-0.5 * ((want_u - mean) / std) ** 2) / (std * np.sqrt(2 * np.pi))
        np.testing.assert_allclose(logp.numpy(), np.log(density).sum(-1), rtol=1e-5, atol=1e-5)
        np.testing.assert_array_equal(value.numpy(), net.value(x).numpy())
    assert u.shape == (33, 2) and logp.shape == value.shape == (33,)


def test_the_initial_mean_action_is_neutral():
    """No steering, no acceleration, to within the small last layer: the
    distribution's mean, and the mean action (its clipped draws' mean)
    near it."""
    net = network()
    x = torch.from_numpy(next(batches(np.random.default_rng(3), [50], FEATURES))[0])
    net.normalizer.update(x, torch.ones(50))
    with torch.no_grad():
        centre = net.env_action(net.distribution(x).mean, x).numpy()
        action = net.mean_action(x).numpy()
    assert action.shape == (50, 2) and action.dtype == np.float32
    assert np.all(np.abs(centre) < 0.05 * (HIGH - LOW)) and np.all(np.abs(action) < 0.05 * (HIGH - LOW))


def reference_clipped_mean(mean: np.ndarray, std: np.ndarray) -> np.ndarray:
    """E[clip(mean + std e, -1, 1)], e standard normal, by the trapezoid rule over e in [-12, 12] (float64)."""
    e = np.linspace(-12.0, 12.0, 24001)
    density = np.exp(-0.5 * e * e) / np.sqrt(2.0 * np.pi)
    values = np.clip(mean[..., None] + std[..., None] * e, -1.0, 1.0) * density
    return np.trapezoid(values, e, axis=-1)


def test_the_mean_action_is_the_mean_of_the_clipped_draws():
    """`clipped_mean` against a quadrature of the clipped Gaussian, on
    random means and deviations and at the edges (a mean far past a bound,
    a deviation near 0 or many times the range); it is the clipped mean
    as the deviation vanishes; `mean_action` is it in the env's units."""
    rng = np.random.default_rng(8)
    mean = np.concatenate([rng.uniform(-4, 4, 300), [0.0, 1.0, -1.0, 50.0, -50.0, 1.2, 0.999]])
    std = np.concatenate([np.exp(rng.uniform(-10, 2, 300)), [1e-4, 0.35, 0.35, 0.5, 7.0, 4.5e-5, 7.3]])
    got = clipped_mean(torch.from_numpy(mean).float(), torch.from_numpy(std).float()).numpy()
    np.testing.assert_allclose(got, reference_clipped_mean(mean, std), rtol=0, atol=2e-6)
    tiny = clipped_mean(torch.from_numpy(mean).float(), torch.full((mean.size,), 1e-7)).numpy()
    np.testing.assert_allclose(tiny, np.clip(mean, -1, 1), rtol=0, atol=1e-6)
    # A deviation that underflowed to 0 (exp of a very negative log std): still the clipped mean, no 0 / 0.
    edges = torch.tensor([1.0, -1.0, 0.25, 3.0])
    assert clipped_mean(edges, torch.zeros(4)).tolist() == [1.0, -1.0, 0.25, 1.0]
    # Full throttle in the mean (1.17, as a trained policy holds on a straight) is less in the draws.
    assert clipped_mean(torch.tensor(1.17), torch.tensor(0.35)) < 0.95
    net = network(seed=6)
    x = torch.from_numpy(next(batches(rng, [40]))[0])
    with torch.no_grad():
        net.log_std.copy_(torch.tensor([-3.0, -1.0]))
        net.actor[-1].bias.add_(torch.tensor([0.4, 1.5]))  # acceleration past its upper bound
        m = net.distribution(x).mean.double().numpy()
        std = np.broadcast_to(np.exp([-3.0, -1.0]), m.shape)
        want = (LOW + HIGH) / 2 + (HIGH - LOW) / 2 * reference_clipped_mean(m, std)
        np.testing.assert_allclose(net.mean_action(x).numpy(), want, rtol=0, atol=1e-5)


def test_the_clipped_mean_within_other_bounds():
    """`clipped_mean` with per-element bounds (a residual's narrowed range,
    one of them possibly 0) against a quadrature, random and at the edges."""
    rng = np.random.default_rng(9)
    low = np.concatenate([-rng.uniform(0, 1, 200), [0.0, -1.0, 0.0, -0.3]])
    high = np.concatenate([rng.uniform(0, 1, 200), [1.0, 0.0, 0.0, 0.7]])
    mean = np.concatenate([rng.uniform(-3, 3, 200), [0.0, 0.0, 0.2, 5.0]])
    std = np.concatenate([np.exp(rng.uniform(-8, 1, 200)), [0.5, 0.5, 0.3, 1e-6]])
    e = np.linspace(-12.0, 12.0, 24001)
    density = np.exp(-0.5 * e * e) / np.sqrt(2.0 * np.pi)
    want = np.trapezoid(np.clip(mean[:, None] + std[:, None] * e, low[:, None], high[:, None]) * density, e, axis=-1)
    t = {k: torch.from_numpy(v).float() for k, v in dict(mean=mean, std=std, low=low, high=high).items()}
    got = clipped_mean(t["mean"], t["std"], t["low"], t["high"]).numpy()
    np.testing.assert_allclose(got, want, rtol=0, atol=2e-6)
    assert (got >= low.astype(np.float32)).all() and (got <= high.astype(np.float32)).all()
    assert got[-2] == 0.0 and abs(got[-1] - 0.7) < 1e-6
    # A number for one bound and a tensor for the other.
    mixed = clipped_mean(t["mean"], t["std"], -1.0, t["high"]).numpy()
    np.testing.assert_array_equal(mixed, clipped_mean(t["mean"], t["std"], torch.full_like(t["mean"], -1.0),
                                                      t["high"]).numpy())


def test_normalizer_buffers_travel_with_the_weights():
    """The statistics are in the state dict, and a network loaded from it
    answers as the one that saved them."""
    rng = np.random.default_rng(4)
    trained = network(seed=1)
    for x, w in batches(rng, [70, 30]):
        trained.normalizer.update(torch.from_numpy(x), torch.from_numpy(w))
    state = trained.state_dict()
    for key in ("normalizer.mean", "normalizer.var", "normalizer.count"):
        assert key in state and state[key].dtype == torch.float64
        assert key not in dict(trained.named_parameters())
    fresh = network(seed=2)
    x = torch.from_numpy(next(batches(rng, [20]))[0])
    fresh.load_checked({k: v.clone() for k, v in state.items()}, "test")
    torch.testing.assert_close(fresh.value(x), trained.value(x), rtol=0, atol=0)
    torch.testing.assert_close(fresh.mean_action(x), trained.mean_action(x), rtol=0, atol=0)


def test_outputs_depend_on_the_statistics():
    """value, the distribution's mean and mean_action are the heads applied
    to the clipped standard score of x under the running statistics (not to
    x): moving the statistics moves every output."""
    rng = np.random.default_rng(5)
    net = network()
    x = torch.from_numpy(next(batches(rng, [30]))[0])
    outputs = []
    for update in range(3):
        z = torch.from_numpy(normalise(x.double().numpy(), net.normalizer.mean.numpy(),
                                       net.normalizer.var.numpy()).astype(np.float32))
        with torch.no_grad():
            value, mean, action = net.value(x), net.distribution(x).mean, net.mean_action(x)
            torch.testing.assert_close(value, net.critic(z).squeeze(-1), rtol=1e-5, atol=1e-5)
            torch.testing.assert_close(mean, net.actor(z), rtol=1e-5, atol=1e-5)
            half, middle = (HIGH - LOW) / 2, (HIGH + LOW) / 2
            std = np.broadcast_to(net.log_std.exp().double().numpy(), (30, 2))
            want = middle + half * reference_clipped_mean(net.actor(z).double().numpy(), std)
            torch.testing.assert_close(action, torch.from_numpy(want.astype(np.float32)), rtol=1e-5, atol=1e-5)
        outputs.append((value, mean, action))
        y, w = next(batches(rng, [40]))
        net.normalizer.update(torch.from_numpy(y + 3.0 * update), torch.from_numpy(w))
    for (v0, m0, a0), (v1, m1, a1) in zip(outputs, outputs[1:]):
        assert (v0 - v1).abs().min() > 1e-6 and (m0 - m1).abs().min() > 1e-7 and (a0 - a1).abs().max() > 1e-6


def damaged(state, how):
    """A copy of ``state`` damaged one way."""
    state = {k: v.clone() for k, v in state.items()}
    if how.startswith("missing "):
        del state[how.removeprefix("missing ")]
    elif how == "float32 variance":
        state["normalizer.var"] = state["normalizer.var"].float()
    elif how == "float64 weights":
        state["actor.0.weight"] = state["actor.0.weight"].double()
    elif how == "NaN mean":
        state["normalizer.mean"][3] = float("nan")
    elif how == "infinite variance":
        state["normalizer.var"][0] = float("inf")
    elif how == "infinite count":
        state["normalizer.count"] = torch.tensor(float("inf"), dtype=torch.float64)
    elif how == "negative variance":
        state["normalizer.var"][FEATURES - 1] = -1e-3
    elif how == "negative count":
        state["normalizer.count"] = torch.tensor(-1.0, dtype=torch.float64)
    elif how == "NaN log_std":
        state["log_std"] = torch.tensor([0.0, float("nan")])
    elif how == "wrong shape":
        state["normalizer.mean"] = torch.zeros(FEATURES + 1, dtype=torch.float64)
    elif how == "extra key":
        state["normalizer.extra"] = torch.zeros(1)
    elif how == "not a tensor":
        state["normalizer.count"] = 3.0
    else:
        raise AssertionError(how)
    return state


DAMAGES = ["missing normalizer.mean", "missing normalizer.var", "missing normalizer.count", "missing log_std",
           "float32 variance", "float64 weights", "NaN mean", "infinite variance", "infinite count",
           "negative variance", "negative count", "NaN log_std", "wrong shape", "extra key", "not a tensor"]


@pytest.mark.parametrize("how", DAMAGES)
def test_load_checked_refuses_and_changes_nothing(how):
    rng = np.random.default_rng(6)
    source = network(seed=1)
    for x, w in batches(rng, [50]):
        source.normalizer.update(torch.from_numpy(x), torch.from_numpy(w))
    target = network(seed=2)
    target.normalizer.update(torch.randn(9, FEATURES), torch.ones(9))
    before = {k: v.clone() for k, v in target.state_dict().items()}
    with pytest.raises(CorruptFile, match="^the test file"):
        target.load_checked(damaged(source.state_dict(), how), "the test file")
    after = target.state_dict()
    assert set(after) == set(before)
    for k, v in before.items():
        assert torch.equal(after[k], v), k
    target.load_checked({k: v.clone() for k, v in source.state_dict().items()}, "the test file")  # undamaged: loads
    for k, v in source.state_dict().items():
        assert torch.equal(target.state_dict()[k], v), k


@pytest.mark.parametrize("weights", [[1, 2], None, {"log_std": [0.0, 0.0]}])
def test_load_checked_refuses_what_is_not_a_dict_of_tensors(weights):
    with pytest.raises(CorruptFile, match="is not a dict of tensors"):
        network().load_checked(weights, "x.pt")


def test_the_networks_and_the_export_import_neither_jax_nor_the_trainer():
    code = ("import sys\n"
            "import racing_stack.ppo.networks, racing_stack.ppo.export\n"
            "bad = sorted(m for m in sys.modules if m == 'jax' or m.startswith(('jax.', 'jaxlib'))"
            " or m == 'racing_stack.ppo.train')\n"
            "assert 'torch' in sys.modules and 'racing_stack.ppo.export' in sys.modules\n"
            "print(','.join(bad))\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "", f"imported: {done.stdout.strip()}"


@pytest.mark.parametrize("interpolate", [False, True])
def test_the_exported_plugin_keeps_every_feature_setting(tmp_path, interpolate):
    """The plugin's controller builds its features from config.toml's
    ``[features]`` table: it must give back the trained ones, whatever they are."""
    import dataclasses
    import tomllib

    from racing_stack.ppo import PRESETS
    from racing_stack.ppo.export import export_plugin
    from racing_stack.features import LocalTrack

    features = LocalTrack(points=5, spacing_m=4.5, scale_m=30.0, interpolate=interpolate)
    config = dataclasses.replace(PRESETS["cpu"], features=features)
    policy = ActorCritic(features.size, config.hidden, config.init_log_std, LOW, HIGH)
    plugin = export_plugin(policy, config, tmp_path / "plugin")
    settings = tomllib.loads((plugin / "config.toml").read_text())
    assert LocalTrack(**settings["features"]) == features
    assert tuple(settings["hidden"]) == config.hidden


def residual_network(residual=0.5, seed=0):
    torch.manual_seed(seed)
    return ActorCritic(FEATURES, (16, 8), (-0.5, -1.5), LOW, HIGH, residual)


def reference_residual_mean(prior: np.ndarray, scale: np.ndarray, mean: np.ndarray, std: np.ndarray) -> np.ndarray:
    """E[clip(prior + scale clip(mean + std e, -1, 1), LOW, HIGH)], e standard normal, by the trapezoid rule."""
    e = np.linspace(-12.0, 12.0, 24001)
    density = np.exp(-0.5 * e * e) / np.sqrt(2.0 * np.pi)
    draws = np.clip(mean[..., None] + std[..., None] * e, -1.0, 1.0)
    values = np.clip(prior[..., None] + scale[:, None] * draws, LOW[:, None], HIGH[:, None]) * density
    return np.trapezoid(values, e, axis=-1)


def test_a_residual_policy_corrects_the_prior_in_its_last_features():
    """The env's action is clip(prior + residual x half range x clip(u)),
    the prior the features' last two columns (at and inside the bounds);
    untrained, the mean action is the prior's within the last layer's
    small initial weights."""
    rng = np.random.default_rng(12)
    half = (HIGH - LOW) / 2
    net = residual_network(0.5)
    x = torch.from_numpy(next(batches(rng, [64]))[0])
    prior = rng.uniform(LOW, HIGH, (64, 2)).astype(np.float32)
    prior[:8] = LOW
    prior[8:16] = HIGH
    x[:, -2:] = torch.from_numpy(prior)
    net.normalizer.update(x, torch.ones(64))
    u = torch.from_numpy(rng.normal(0.0, 1.5, (64, 2)).astype(np.float32))
    want = np.clip(prior + 0.5 * half * np.clip(u.numpy(), -1, 1), LOW, HIGH)
    assert (want == LOW).any() and (want == HIGH).any() and (np.abs(u.numpy()) > 1).any()
    with torch.no_grad():
        np.testing.assert_allclose(net.env_action(u, x).numpy(), want, rtol=0, atol=1e-6)
        np.testing.assert_allclose(net.env_action(u[None], x[None]).numpy(), want[None], rtol=0, atol=1e-6)
        mean, std = net.distribution(x).mean.double().numpy(), net.log_std.exp().double().numpy()
        action = net.mean_action(x).numpy()
    want = reference_residual_mean(prior, 0.5 * half, mean, np.broadcast_to(std, mean.shape))
    np.testing.assert_allclose(action, want, rtol=0, atol=1e-5)
    # Where no correction reaches a bound; at a bound the draws clipped there pull the mean inside.
    inside = (prior - 0.5 * half >= LOW) & (prior + 0.5 * half <= HIGH)
    assert inside.sum() >= 10 and action.dtype == np.float32
    assert (np.abs(action - prior)[inside] < 0.5 * half[None].repeat(64, 0)[inside] * 0.05).all()


@pytest.mark.parametrize("residual", [0.3, 1.0, 2.0])
def test_a_residual_policys_mean_action_is_the_mean_of_its_twice_clipped_draws(residual):
    """Where prior and correction add up past a bound (full throttle out of
    the start), the env gets the bound from many draws: the mean action
    is the mean of what the env gets, not the prior plus the clipped
    draws' mean clipped once more (which drives harder); random means,
    deviations and priors, on and inside the bounds, odd batch shapes."""
    rng = np.random.default_rng(int(residual * 10))
    half = (HIGH - LOW) / 2
    net = residual_network(residual)
    x = torch.from_numpy(next(batches(rng, [3 * 37]))[0]).reshape(3, 37, FEATURES)
    prior = rng.uniform(LOW, HIGH, (3, 37, 2)).astype(np.float32)
    prior[0, :9], prior[1, :9] = LOW, HIGH
    prior[2, :9] = HIGH - rng.uniform(0, 0.2, (9, 2)) * half
    x[..., -2:] = torch.from_numpy(prior)
    with torch.no_grad():
        net.actor[-1].bias.copy_(torch.tensor([0.3, 0.8]))
        net.actor[-1].weight.mul_(20.0)  # means spread over and past [-1, 1]
        net.log_std.copy_(torch.from_numpy(rng.uniform(-1.5, -0.5, 2).astype(np.float32)))
        mean = net.distribution(x).mean.double().numpy()
        std = np.broadcast_to(net.log_std.exp().double().numpy(), mean.shape)
        action = net.mean_action(x).numpy()
    want = reference_residual_mean(prior.reshape(-1, 2), residual * half, mean.reshape(-1, 2), std.reshape(-1, 2))
    np.testing.assert_allclose(action.reshape(-1, 2) / half, want / half, rtol=0, atol=1e-5)
    once = np.clip(prior.reshape(-1, 2) + residual * half * reference_clipped_mean(mean, std).reshape(-1, 2),
                   LOW, HIGH)
    assert (np.abs(once - want).max(0) / half > 0.01 * residual).all()  # the cases reach where the clips differ
    # Monte Carlo through env_action, the training rollouts' own map.
    u = torch.from_numpy(mean[None] + std[None] * rng.standard_normal((4000, *mean.shape))).float()
    with torch.no_grad():
        drawn = net.env_action(u, x.expand(4000, *x.shape)).double().mean(0).numpy()
    np.testing.assert_allclose(action / half, drawn / half, rtol=0, atol=0.02 * residual)


@pytest.mark.parametrize("low, high", [(HIGH, LOW), (LOW, LOW), (LOW[:1], HIGH[:1]),
                                       ([-0.6, float("nan")], HIGH), ([-0.6, -np.inf], HIGH)])
def test_bad_action_bounds_are_refused(low, high):
    with pytest.raises(ValueError, match="low and high must be finite action bounds"):
        ActorCritic(FEATURES, (4,), 0.0, np.asarray(low), np.asarray(high))


def test_weights_for_other_action_bounds_are_refused():
    """The bounds come from the env; a file's that differ (the map of the
    normalised action onto the env's) are refused, and nothing changes."""
    state = network().state_dict()
    other = ActorCritic(FEATURES, (16, 8), 0.0, LOW, HIGH * 2).state_dict()
    target = network()
    before = {k: v.clone() for k, v in target.state_dict().items()}
    for name in ("action_middle", "action_half"):
        with pytest.raises(CorruptFile, match="w.pt was trained for other action bounds than the env's"):
            target.load_checked({**state, name: other[name]}, "w.pt")
    assert all(torch.equal(v, before[k]) for k, v in target.state_dict().items())


def test_a_residual_travels_with_the_weights_and_must_match():
    state = residual_network(0.5).state_dict()
    assert float(state["residual"]) == 0.5
    assert "action_low" not in state and "action_high" not in state  # the bounds come from the env, not the file
    with pytest.raises(CorruptFile, match="trained as a residual of 0.5, not of 0.25"):
        residual_network(0.25).load_checked(state, "w.pt")
    with pytest.raises(CorruptFile, match="does not fit the network"):
        network().load_checked(state, "w.pt")  # a policy that acts alone
    with pytest.raises(CorruptFile, match="does not fit the network"):
        residual_network(0.5).load_checked(network().state_dict(), "w.pt")
    other = residual_network(0.5, seed=3)
    other.load_checked(state, "w.pt")
    x = torch.randn(4, FEATURES)
    torch.testing.assert_close(other.mean_action(x), residual_network(0.5).mean_action(x), rtol=0, atol=0)


@pytest.mark.parametrize("residual, features, error, match", [
    (-0.1, FEATURES, ValueError, r"residual must be 0 or a number in \[1e-6, 2\]"),
    (2.5, FEATURES, ValueError, "residual must be 0 or"), (1e-50, FEATURES, ValueError, "residual must be 0 or"),
    (float("nan"), FEATURES, ValueError, "residual must be 0 or"),
    (True, FEATURES, TypeError, "residual must be a real number, got bool"),
    ("0.5", FEATURES, TypeError, "residual must be a real number, got str"),
    (0.5, 2, ValueError, "needs the prior's action among its features"),
])
def test_bad_residuals_are_refused(residual, features, error, match):
    with pytest.raises(error, match=match):
        ActorCritic(features, (4,), 0.0, LOW, HIGH, residual)


def test_the_exported_plugin_keeps_its_residual_and_prior(tmp_path):
    """A residual policy's plugin gives back the network, its residual and
    the prior's gains, and acts as the trained policy does."""
    import dataclasses
    import tomllib

    from racing_stack.ppo import PRESETS
    from racing_stack.ppo.export import export_plugin, load_policy
    from racing_stack.prior import PursuitPrior
    from racing_stack.features import LocalTrack

    features = LocalTrack(points=3, prior=PursuitPrior(max_speed_mps=26.0, lookahead_gain_s=0.0))
    config = dataclasses.replace(PRESETS["cpu"], features=features, residual=0.75)
    policy = ActorCritic(features.size, config.hidden, config.init_log_std, LOW, HIGH, 0.75)
    policy.normalizer.update(torch.randn(9, features.size) * 3, torch.ones(9))
    plugin = export_plugin(policy, config, tmp_path / "plugin")
    settings = tomllib.loads((plugin / "config.toml").read_text())
    assert settings["residual"] == 0.75 and LocalTrack(**settings["features"]) == features
    loaded, got = load_policy(settings, plugin / "weights.pt", LOW, HIGH, torch.device("cpu"))
    assert got == features
    x = torch.randn(5, features.size)
    torch.testing.assert_close(loaded.mean_action(x), policy.mean_action(x), rtol=0, atol=0)
    with pytest.raises(CorruptFile, match="was trained with other settings than its config.toml's"):
        load_policy({**settings, "residual": 0.5}, plugin / "weights.pt", LOW, HIGH, torch.device("cpu"))
    with pytest.raises(ValueError, match="the policy is a residual of 0.75, config.residual is 0.5"):
        export_plugin(policy, dataclasses.replace(config, residual=0.5), tmp_path / "other")
    with pytest.raises(ValueError, match="the policy is a residual of 0, config.residual is 0.75"):
        export_plugin(ActorCritic(features.size, config.hidden, 0.0, LOW, HIGH), config, tmp_path / "other")
    assert not (tmp_path / "other").exists()
    tenth = dataclasses.replace(config, residual=0.1)  # not a float32: the policy's is the nearest one
    export_plugin(ActorCritic(features.size, config.hidden, 0.0, LOW, HIGH, 0.1), tenth, tmp_path / "tenth")


def _exported(tmp_path, name, **features):
    import dataclasses

    from racing_stack.ppo import PRESETS
    from racing_stack.ppo.export import export_plugin
    from racing_stack.features import LocalTrack

    local = LocalTrack(points=4, **features)
    config = dataclasses.replace(PRESETS["cpu"], features=local)
    torch.manual_seed(len(name))
    return export_plugin(ActorCritic(local.size, config.hidden, config.init_log_std, LOW, HIGH), config,
                         tmp_path / name)


def test_an_exported_plugin_is_called_by_its_name(tmp_path):
    """The exported config.toml names the plugin (what the video's caption
    and evaluate's picture show): the name given (train-ppo gives the run's
    folder name), else the directory's; a name that is not a non-empty
    string is refused before anything is written."""
    import dataclasses

    from racing_env.plugins import load_plugin

    from racing_stack.features import LocalTrack
    from racing_stack.ppo import PRESETS
    from racing_stack.ppo.export import export_plugin

    local = LocalTrack(points=4)
    config = dataclasses.replace(PRESETS["cpu"], features=local)
    policy = ActorCritic(local.size, config.hidden, config.init_log_std, LOW, HIGH)
    odd = 'run "7" \\ \t\x7f é'  # quotes, a backslash, control characters, DEL, non-ASCII: TOML escapes
    assert load_plugin(export_plugin(policy, config, tmp_path / "plugin", name=odd), import_code=False).name == odd
    assert load_plugin(export_plugin(policy, config, tmp_path / "mine"), import_code=False).name == "mine"
    with pytest.raises(TypeError, match="name must be a string or None, got int"):
        export_plugin(policy, config, tmp_path / "other", name=7)
    with pytest.raises(ValueError, match="name must not be empty, got ' '"):
        export_plugin(policy, config, tmp_path / "other", name=" ")
    assert not (tmp_path / "other").exists()


def _load(plugin, settings=None):
    import tomllib

    from racing_stack.ppo.export import load_policy

    settings = tomllib.loads((plugin / "config.toml").read_text()) if settings is None else settings
    return load_policy(settings, plugin / "weights.pt", LOW, HIGH, torch.device("cpu"))


def test_weights_beside_other_settings_are_refused_by_name(tmp_path):
    """An export killed between weights.pt and config.toml leaves the new
    weights beside the old settings (here: the same network, other feature
    spacing and interpolation, which would load and drive with other
    features than trained); a hand edit of a feature setting too. Equal
    values in another spelling (4 for 4.0) and the device are not settings
    the weights depend on."""
    import shutil
    import tomllib

    old = _exported(tmp_path, "old", spacing_m=6.0, interpolate=False)
    new = _exported(tmp_path, "new", spacing_m=4.0, interpolate=True)
    shutil.copy(new / "weights.pt", old / "weights.pt")  # the new export, cut before its config.toml
    with pytest.raises(CorruptFile, match=r"weights.pt was trained with other settings than its config.toml's "
                                          r"\(an interrupted export, or an edit\): trained with .*spacing_m.: 4\.0"):
        _load(old)
    settings = tomllib.loads((new / "config.toml").read_text())
    _load(new)
    for key, value in [("scale_m", 30.5), ("points", 5), ("interpolate", False)]:
        with pytest.raises(CorruptFile, match="trained with other settings"):
            _load(new, {**settings, "features": {**settings["features"], key: value}})
    with pytest.raises(CorruptFile, match="trained with other settings"):
        _load(new, {**settings, "hidden": [*settings["hidden"][:-1], settings["hidden"][-1] + 1]})
    respelled = {**settings, "device": "cuda", "features": {**settings["features"], "spacing_m": 4}}
    _, features = _load(new, respelled)
    assert features.spacing_m == 4.0


def test_weights_exported_before_the_settings_were_kept_still_load(tmp_path):
    """A weights.pt without the settings (the committed plugins of earlier
    rounds) loads as before; one whose settings entry cannot be read is
    refused by name."""
    from racing_stack import checkpoints

    plugin = _exported(tmp_path, "plugin", spacing_m=5.0)
    state = checkpoints.load(plugin / "weights.pt", "weights")
    checkpoints.save(plugin / "weights.pt", "weights", {k: v for k, v in state.items() if k != "trained_with"})
    policy, _ = _load(plugin)
    assert all(torch.equal(v, state[k]) for k, v in policy.state_dict().items())
    for broken in ["not json", "[1, 2]", '{"features": {}}']:
        checkpoints.save(plugin / "weights.pt", "weights", {**state, "trained_with": broken})
        with pytest.raises(CorruptFile, match="holds no readable training settings"):
            _load(plugin)


def test_the_prior_alone_drives_the_prior_exactly():
    from racing_stack.ppo.networks import prior_alone

    rng = np.random.default_rng(2)
    x = torch.from_numpy(next(batches(rng, [40]))[0])
    prior = rng.uniform(LOW, HIGH, (40, 2)).astype(np.float32)
    prior[:5], prior[5:10] = LOW, HIGH  # where the correction's draws are clipped on one side
    x[:, -2:] = torch.from_numpy(prior)
    policy = prior_alone(FEATURES, LOW, HIGH)
    policy.normalizer.update(x, torch.ones(40))  # whatever the statistics
    assert float(policy.residual) == 1.0
    with torch.no_grad():
        np.testing.assert_array_equal(policy.mean_action(x).numpy(), prior)


def test_the_exported_plugin_drives_in_a_child_that_never_starts_a_jax_backend(tmp_path, monkeypatch):
    """An isolated learned plugin (its features, the pursuit prior, the
    network) makes no JAX array: on a GPU host each world's child would
    otherwise claim the device. Its children inherit a ``JAX_PLATFORMS``
    that no backend can start on."""
    import dataclasses

    import jax

    from racing_env import Level, ProjectConfig, VecCarRacingEnv, level0_track
    from racing_env.isolation import Isolation
    from racing_env.plugins import load_plugin
    from racing_env.runner import run
    from racing_stack.ppo import PRESETS
    from racing_stack.ppo.export import export_plugin
    from racing_stack.prior import PursuitPrior
    from racing_stack.features import LocalTrack

    features = LocalTrack(points=3, prior=PursuitPrior(max_speed_mps=26.0, lookahead_gain_s=0.0))
    config = dataclasses.replace(PRESETS["cpu"], features=features, residual=0.75)
    env = VecCarRacingEnv(1, config=ProjectConfig(), level=Level(level_id=0, name="short", max_episode_steps=4),
                          backend="cpu_reference", track=level0_track())
    plugin = export_plugin(ActorCritic(features.size, config.hidden, config.init_log_std, env.single_action_space.low,
                                       env.single_action_space.high, 0.75), config, tmp_path / "plugin")
    jax.devices()  # this process's backend starts before the children's environment is changed
    monkeypatch.setenv("JAX_PLATFORMS", "no_such_platform")
    (episode,) = run(load_plugin(plugin), env, episodes=1, isolation=Isolation(start_timeout_s=120.0)).episodes
    assert episode.error is None and episode.termination_reason == "timeout" and episode.steps == 4


def _twins(inputs: int, outputs: int, seed: int) -> tuple[Linear, torch.nn.Linear]:
    torch.manual_seed(seed)
    ours = Linear(inputs, outputs)
    theirs = torch.nn.Linear(inputs, outputs)
    theirs.load_state_dict(ours.state_dict())
    return ours, theirs


def _run(layer: torch.nn.Linear, x: torch.Tensor, grad: torch.Tensor, bf16: bool) -> list[torch.Tensor]:
    """The output, and the gradients of x, the weight and the bias for an output gradient ``grad``."""
    for p in layer.parameters():
        p.grad = None
    x = x.clone().requires_grad_(True)
    with torch.autocast("cpu", torch.bfloat16, enabled=bf16):
        y = layer(x)
    y.backward(grad.to(y.dtype))
    return [y.detach(), x.grad, layer.weight.grad, layer.bias.grad]


@pytest.mark.parametrize("rows, inputs, outputs", [(1, 3, 2), (7, 134, 256), (257, 256, 1), (64, 5, 256)])
def test_linear_is_torch_linear_in_float32(rows, inputs, outputs):
    ours, theirs = _twins(inputs, outputs, rows)
    x, grad = torch.randn(rows, inputs), torch.randn(rows, outputs)
    for a, b in zip(_run(ours, x, grad, False), _run(theirs, x, grad, False)):
        assert a.dtype == b.dtype and torch.equal(a, b)
    assert list(ours.state_dict()) == ["weight", "bias"]  # checkpoints and plugins load as before


@pytest.mark.parametrize("rows, inputs, outputs", [(1, 3, 2), (7, 134, 256), (257, 256, 1), (1000, 5, 256)])
def test_linear_under_bf16_autocast_sums_the_bias_gradient_by_a_product(rows, inputs, outputs):
    """Under bfloat16 autocast: autocast's output bit for bit, float32
    parameter gradients, the input's and the weight's gradients those of
    Torch's own backward, the bias's the rows' sum of the output gradient
    (as bfloat16 holds it) to bfloat16's rounding."""
    ours, theirs = _twins(inputs, outputs, rows + 1)
    x, grad = torch.randn(rows, inputs) * 3, torch.randn(rows, outputs) * 5
    got, want = _run(ours, x, grad, True), _run(theirs, x, grad, True)
    assert got[0].dtype == torch.bfloat16 and torch.equal(got[0], want[0])
    assert got[2].dtype == got[3].dtype == torch.float32
    for a, b in zip(got[1:3], want[1:3]):
        torch.testing.assert_close(a.float(), b.float(), rtol=1.6e-2, atol=1e-2)
    exact = grad.to(torch.bfloat16).double().sum(0)
    assert torch.allclose(got[3].double(), exact, rtol=2**-7, atol=1e-6 * float(exact.abs().max()) + 1e-12)
    with torch.no_grad(), torch.autocast("cpu", torch.bfloat16):
        assert torch.equal(ours(x), theirs(x))  # without a gradient: Torch's Linear itself


def test_a_bf16_update_steps_every_bias():
    """The bias gradients reach the optimizer under bfloat16 (an update moves every bias)."""
    policy = ActorCritic(6, (16, 16), -1.0, np.array([-1.0, -1.0]), np.array([1.0, 1.0]))
    x = torch.randn(33, 6)
    with torch.autocast("cpu", torch.bfloat16):
        loss = policy.distribution(x).mean.square().sum() + policy.value(x).square().sum()
    loss.float().backward()
    for name, p in policy.named_parameters():
        if name.endswith("bias"):
            assert p.grad is not None and p.grad.dtype == torch.float32 and bool(p.grad.abs().sum() > 0), name


def test_linear_under_bf16_autocast_refuses_a_second_derivative_and_skips_unwanted_gradients():
    ours, _ = _twins(5, 7, 0)
    x = torch.randn(9, 5, requires_grad=True)
    with torch.autocast("cpu", torch.bfloat16):
        y = ours(x)
    (gx,) = torch.autograd.grad(y.float().square().sum(), x, create_graph=True)
    with pytest.raises(RuntimeError, match="once_differentiable|differentiate twice|not have been used"):
        torch.autograd.grad(gx.sum(), ours.weight)  # not a silently wrong second derivative
    ours.weight.requires_grad_(False)
    with torch.autocast("cpu", torch.bfloat16):
        ours(torch.randn(9, 5)).float().sum().backward()
    assert ours.weight.grad is None and ours.bias.grad is not None
    plain = Linear(5, 7, bias=False)
    with torch.autocast("cpu", torch.bfloat16):
        assert plain(torch.randn(3, 5, requires_grad=True)).dtype == torch.bfloat16  # Torch's Linear: no bias
