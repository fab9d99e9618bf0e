"""PPOConfig: its settings checked by name, and ``override`` (what
``--set`` takes) in any order, each refusal naming the setting."""

from __future__ import annotations

import dataclasses
import itertools
import json
import math

import numpy as np
import pytest

from racing_stack.ppo import PRESETS, PPOConfig
from racing_stack.prior import PursuitPrior
from racing_stack.features import LocalTrack
from racing_stack.reward import ShapedReward

BASE = PRESETS["cpu"]


def test_a_residual_on_the_prior_is_set_by_name():
    config = BASE.override(["features.prior={}", "residual=0.5"])
    assert config.features.prior == PursuitPrior() and config.residual == 0.5
    assert config.override(["features.prior.preview_m=60.0"]).features.prior == PursuitPrior(preview_m=60.0)
    # A table at once, then one of its names; replaced whole; cleared (with the residual that needs it).
    assert BASE.override(["features.prior={'preview_m': 80.0}", "features.prior={}"]).features.prior == PursuitPrior()
    assert BASE.override(["residual=1.0", "features.prior={}", "features.prior.preview_m=80.0"]).features.prior \
        == PursuitPrior(preview_m=80.0)
    assert config.override(["residual=0.0", "features.prior=None"]) == BASE
    with pytest.raises(ValueError, match="residual needs a prior"):
        config.override(["features.prior=None"])
    assert PPOConfig.from_json(json.loads(json.dumps(config.to_json()))) == config


def test_settings_are_overridden_by_name_and_checked():
    config = BASE.override(["learning_rate=1e-4", "reward.off_track_penalty=5", "hidden=(32, 16)",
                            "tracks=None", "schedule='constant'", "init_log_std=(-1.0, -2.0)"])
    assert (config.learning_rate, config.reward.off_track_penalty, config.hidden, config.tracks,
            config.schedule, config.init_log_std) == (1e-4, 5, (32, 16), None, "constant", (-1.0, -2.0))
    assert dataclasses.replace(config, learning_rate=BASE.learning_rate, reward=BASE.reward, hidden=BASE.hidden,
                               tracks=BASE.tracks, schedule=BASE.schedule,
                               init_log_std=BASE.init_log_std) == BASE  # nothing else moved
    for settings, match in ((["learning_rate"], "must be name=value"), (["lr=1"], "unknown setting 'lr'"),
                            (["reward.bonus=1"], "unknown setting 'reward.bonus'"),
                            (["reward=1"], "setting 'reward': reward must be a table"),
                            (["learning_rate=fast"], "'fast' is not a Python literal"),
                            (["learning_rate=-1.0"], "learning_rate must be in"),
                            (["hidden=3"], "hidden must be a list or tuple, got 3"),
                            (["features.points=0"], "points must be in"),
                            (["residual=0.5"], "residual needs a prior"),
                            (["features.prior={'speed': 1}"], "features.prior has no setting 'speed'; its settings")):
        with pytest.raises(ValueError, match=match):
            BASE.override(settings)


@pytest.mark.parametrize("kwargs, error, match", [
    ({"worlds": 0}, ValueError, "worlds must be in \\[1, 2\\*\\*31\\)"),
    ({"worlds": 8.0}, TypeError, "worlds must be an int"),
    ({"max_episode_steps": 2**31}, ValueError, "max_episode_steps must be in \\[1, 2\\*\\*31\\)"),
    ({"stagger_steps": -1}, ValueError, "stagger_steps must be in \\[0, 2\\*\\*31\\)"),
    ({"minibatches": 3}, ValueError, "minibatches \\(3\\) must divide"),
    ({"gamma": 1.5}, ValueError, "gamma must be in"),
    ({"tracks": 0}, ValueError, "tracks must be in \\[1, 10000\\]"),
    ({"tracks": 10001}, ValueError, "tracks must be in \\[1, 10000\\]"),
    ({"validation_tracks": 1001}, ValueError, "validation_tracks must be at most the Validation split's 1000"),
    ({"tracks": True}, TypeError, "tracks must be an int"),
    ({"learning_rate": float("nan")}, ValueError, "learning_rate must be in \\(0, 1\\]"),
    ({"learning_rate": 1e30}, ValueError, "learning_rate must be in \\(0, 1\\]"),
    ({"learning_rate": 10**400}, ValueError, "learning_rate must be in \\(0, 1\\]"),
    ({"init_log_std": (1e6, 0.0)}, ValueError, "init_log_std must be in \\[-10, 2\\]"),
    ({"init_log_std": (0.0, -200.0)}, ValueError, "init_log_std must be in \\[-10, 2\\]"),
    ({"init_log_std": -1.0}, ValueError, "init_log_std must be a pair"),
    ({"init_log_std": (0.0, 0.0, 0.0)}, ValueError, "init_log_std must be a pair"),
    ({"desired_kl": 0.0}, ValueError, "desired_kl must be in \\(0, 10\\]"),
    ({"select_success_rate": 0.0}, ValueError, "select_success_rate must be in \\(0, 1\\]"),
    ({"select_success_rate": 1.01}, ValueError, "select_success_rate must be in \\(0, 1\\]"),
    ({"min_learning_rate": 1e-2, "max_learning_rate": 1e-3}, ValueError, "min_learning_rate \\(0.01\\) exceeds"),
    ({"value_coef": 1e300}, ValueError, "value_coef must be in \\[0, 1000\\]"),
    ({"hidden": (1_000_000, 1_000_000)}, ValueError, "hidden's widths must be in \\[1, 16384\\], got 1000000"),
    ({"hidden": (64, 64.0)}, TypeError, "hidden's widths must be an int, got float 64.0"),
    ({"hidden": (64, True)}, TypeError, "hidden's widths must be an int, got a bool"),
    ({"hidden": [64, 64]}, TypeError, "hidden must be a tuple of ints"),
    ({"clip": 0.0}, ValueError, "clip must be in \\(0, 10\\]"),
    ({"gamma": "0.9"}, TypeError, "gamma must be a real number"),
    ({"entropy_coef": float("inf")}, ValueError, "entropy_coef must be in \\[0, 1000\\]"),
    ({"hidden": ()}, ValueError, "hidden must be a non-empty tuple"),
    ({"hidden": (64, 0)}, ValueError, "hidden's widths must be in \\[1, 16384\\], got 0"),
    ({"seed": -1}, ValueError, "seed must be in \\[0, 2\\*\\*32\\)"),
    ({"seed": 1.0}, TypeError, "seed must be an int"),
    ({"features": None}, TypeError, "features must be a LocalTrack"),
    ({"validate_every": -1}, ValueError, "validate_every must be in \\[0, 2\\*\\*31\\)"),
    ({"validation_tracks": 0}, ValueError, "validation_tracks must be in \\[1, 2\\*\\*31\\)"),
    ({"schedule": "cosine"}, ValueError, "schedule must be one of"),
    ({"crash_warmup_success": 1.5}, ValueError, "crash_warmup_success must be in \\[0, 1\\]"),
    ({"crash_warmup_success": math.nan}, ValueError, "crash_warmup_success must be in \\[0, 1\\]"),
    ({"crash_warmup_success": "0.5"}, TypeError, "crash_warmup_success must be a real number"),
    ({"residual": 0.5}, ValueError, "residual needs a prior to correct: set features.prior"),
    ({"residual": 2.5, "features": LocalTrack(prior={})}, ValueError, "residual must be in \\[0, 2\\]"),
    ({"residual": 1e-9, "features": LocalTrack(prior={})}, ValueError, "residual must be 0 or in \\[1e-6, 2\\]"),
    ({"residual": math.nan, "features": LocalTrack(prior={})}, ValueError, "residual must be in \\[0, 2\\]"),
])
def test_bad_settings_are_refused_by_name(kwargs, error, match):
    with pytest.raises(error, match=match):
        dataclasses.replace(PPOConfig(), **kwargs)


def test_settings_take_the_same_effect_in_any_order():
    """A table given as a dict is checked and filled in at once, whatever
    the rest of the config holds yet: every order of these settings that
    gives the table before naming one of its gains gives one config (a
    minibatch count that divides the worlds only once they are set too)."""
    settings = ["minibatches=3", "features.prior={}", "features.prior.max_speed_mps=30", "worlds=48"]
    made = set()
    for order in itertools.permutations(settings):
        if order.index("features.prior={}") < order.index("features.prior.max_speed_mps=30"):
            made.add(BASE.override(list(order)))
    assert len(made) == 1
    (config,) = made
    assert (config.minibatches, config.worlds, config.features.prior) == (3, 48, PursuitPrior(max_speed_mps=30))
    with pytest.raises(ValueError, match="unknown setting 'features.prior.max_speed_mps'"):
        BASE.override(["features.prior.max_speed_mps=30", "features.prior={}"])  # no prior yet to name a gain of


@pytest.mark.parametrize("setting, match", [
    ("hidden=b'@@'", "hidden must be a list or tuple, got b'@@'"),
    ("hidden={64: 1}", "hidden must be a list or tuple"),
    ("hidden={128, 64}", "hidden must be a list or tuple"),
    ("init_log_std={-1.0: 0, -2.0: 0}", "init_log_std must be a list or tuple"),
    ("init_log_std={1, 2}", "init_log_std must be a list or tuple"),
    ("init_log_std=None", "init_log_std must be a list or tuple"),
    ("reward=None", "setting 'reward' is a table: give a dict of its settings"),
    ("features=None", "setting 'features' is a table: give a dict of its settings"),
    ("features.prior={1: 2}", "features.prior has no setting 1; its settings are"),
    ("reward={1: 2}", "reward has no setting 1"),
    ("features.prior=(1, 2)", "setting 'features.prior': features.prior must be a table"),
    ("worlds=" + "[" * 100_000, "setting 'worlds': '\\[\\[\\[.*' is not a Python literal"),
])
def test_a_sequence_or_table_of_the_wrong_kind_is_refused_by_name(setting, match):
    """Only a list or tuple is a sequence setting (bytes, dicts and sets
    are not: their items are not the values written), only a dict is a
    table; the message names the setting and stays short."""
    with pytest.raises(ValueError, match=match) as refused:
        BASE.override([setting])
    assert len(str(refused.value)) < 2000


@pytest.mark.parametrize("settings, error, match", [
    ([1], TypeError, "a setting must be a str, name=value, got 1"),
    ([None], TypeError, "a setting must be a str"),
    ([("learning_rate", 1)], TypeError, "a setting must be a str"),
    ([b"learning_rate=1"], TypeError, "a setting must be a str"),
    (None, TypeError, "settings must be a list of name=value strings, got None"),
    ("seed=1", TypeError, "settings must be a list"),
    ({"seed=1"}, TypeError, "settings must be a list"),
])
def test_settings_that_are_not_strings_in_a_list_are_refused(settings, error, match):
    with pytest.raises(error, match=match):
        BASE.override(settings)


def test_tables_and_sequences_read_from_json_are_checked_by_name():
    data = BASE.to_json()
    for name, value, error, match in (("hidden", b"@@", TypeError, "hidden must be a list or tuple"),
                                      ("init_log_std", {1.0, 2.0}, TypeError, "init_log_std must be a list or tuple"),
                                      ("features", None, TypeError, "features must be a table"),
                                      ("reward", {"bonus": 1}, ValueError, "reward has no setting 'bonus'")):
        with pytest.raises(error, match=match):
            PPOConfig.from_json({**data, name: value})
    assert PPOConfig.from_json(json.loads(json.dumps(data))) == BASE


@pytest.mark.parametrize("prior, error, match", [
    ({1: 2}, ValueError, "prior has no setting 1; its settings are \\['max_speed_mps'"),
    ({"bogus": 1}, ValueError, "prior has no setting 'bogus'"),
    ({"max_speed_mps": True}, TypeError, "max_speed_mps must be a real number"),
    ((64,) * 100_000, TypeError, "prior must be a PursuitPrior, a mapping of its gains or None, got \\(64, 64"),
])
def test_a_local_track_prior_of_the_wrong_kind_is_refused_by_name(prior, error, match):
    with pytest.raises(error, match=match) as refused:
        LocalTrack(prior=prior)
    assert len(str(refused.value)) < 2000
    assert LocalTrack(prior={"preview_m": 60.0}).prior == PursuitPrior(preview_m=60.0)
    assert ShapedReward() == ShapedReward(**dataclasses.asdict(ShapedReward()))


@pytest.mark.parametrize("name, good", [("schedule", "linear"), ("update_path", "graph"),
                                        ("matmul_precision", "high")])
@pytest.mark.parametrize("value, error", [(np.array(["linear"]), TypeError), (np.array([-1.0, -1.0]), TypeError),
                                          (b"linear", TypeError), (None, TypeError), ("cosine", ValueError),
                                          ("", ValueError)])
def test_a_named_choice_must_be_one_of_its_strings(name, good, value, error):
    with pytest.raises(error, match=f"{name} must be"):
        dataclasses.replace(BASE, **{name: value})
    made = dataclasses.replace(BASE, **{name: type("Named", (str,), {})(good)})
    assert type(getattr(made, name)) is str and getattr(made, name) == good and hash(made) is not None
    assert BASE.override([f"{name}={good!r}"]) == made


@pytest.mark.parametrize("value, error", [(2, ValueError), (-1, ValueError), (True, TypeError), ("1", TypeError),
                                          (1.0, TypeError), (None, TypeError)])
def test_a_policy_lag_must_be_0_or_1(value, error):
    with pytest.raises(error, match="policy_lag"):
        dataclasses.replace(BASE, policy_lag=value)
    assert dataclasses.replace(BASE, policy_lag=np.int64(1)).policy_lag == 1 and BASE.policy_lag == 0
    assert BASE.override(["policy_lag=1"]).policy_lag == 1


def test_the_update_path_and_matmul_precision_default_to_the_reference_and_the_gpu_preset_to_the_fastest():
    """The config's defaults (and the CPU preset's) are the reference path;
    the GPU preset takes the captured bf16 path (the CPU falls back to eager)."""
    assert (BASE.update_path, BASE.matmul_precision) == ("eager", "highest")
    assert (PRESETS["cpu"].update_path, PRESETS["cpu"].matmul_precision) == ("eager", "highest")
    assert (PRESETS["gpu"].update_path, PRESETS["gpu"].matmul_precision) == ("graph", "bf16")


def test_a_network_of_more_than_max_weights_is_refused():
    """hidden is bounded by the weights it makes on the features, not only
    by each layer's width: two layers of the widest width fit, five do not,
    and nor do 41 (about 11e9 weights)."""
    from racing_stack.ppo.config import MAX_WEIGHTS

    assert MAX_WEIGHTS == 2**30
    assert dataclasses.replace(BASE, hidden=(16384, 16384)).hidden == (16384, 16384)
    for hidden in ((16384,) * 5, (16384,) * 41):
        with pytest.raises(ValueError, match=r"hidden makes a network of [\d,]+ weights on \d+ features; at most "
                                             r"1,073,741,824 \(2\*\*30\)"):
            dataclasses.replace(BASE, hidden=hidden)
    with pytest.raises(ValueError, match="hidden makes a network of"):
        BASE.override(["hidden=(16384, 16384, 16384, 16384, 16384)"])


@pytest.mark.parametrize("name", ["compiled", "act_in_jax"])
@pytest.mark.parametrize("value", [1, 0, "True", None, np.bool_(True)])
def test_compiled_and_act_in_jax_must_be_bools(name, value):
    with pytest.raises(TypeError, match=f"{name} must be a bool"):
        dataclasses.replace(BASE, **{name: value})
    assert getattr(BASE.override([f"{name}=True"]), name) is True
    for removed in ("fused_mlp", "critic_beside_rollout"):  # an unknown setting, refused by name
        with pytest.raises(ValueError, match=removed):
            BASE.override([f"{removed}=True"])
