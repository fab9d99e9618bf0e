"""The validation vocabulary (``racing_env.checks``) and the rule it keeps at
the public entry points: a wrong type raises ``TypeError``, a wrong value of
the right type ``ValueError``, each naming the argument."""

from __future__ import annotations

import math

import jax.numpy as jnp
import numpy as np
import pytest

from racing_env import Level, ProjectConfig, checks
from racing_env.isolation import Isolation
from racing_env.render import EpisodeView, FramePainter

NOT_INTS = [True, np.bool_(False), np.array(True), 1.0, np.float32(2.0), np.array(2.0), "3", None, [1]]
NOT_REALS = [True, np.bool_(True), "1.0", None, 1j, [1.0]]
NOT_FINITE = [math.nan, math.inf, -math.inf, np.float32("nan")]


@pytest.mark.parametrize("value", [0, 7, np.int64(7), np.uint32(2**32 - 1), np.array(5), jnp.int32(6)])
def test_integer_in_returns_python_ints(value):
    got = checks.integer_in(value, "n", 0, 2**32, "2**32")
    assert type(got) is int and got == int(value)
    assert checks.integer_in(value, "n", 0) == int(value)


@pytest.mark.parametrize("value", NOT_INTS)
def test_integer_in_refuses_what_is_not_an_int_as_a_type_fault(value):
    with pytest.raises(TypeError, match="^n must be an int"):
        checks.integer_in(value, "n", 0, 10)


@pytest.mark.parametrize("value, end, match", [(-1, 10, r"n must be in \[0, 9\], got -1"),
                                               (10, 10, r"n must be in \[0, 9\], got 10"),
                                               (-5, None, "n must be >= 0, got -5"),
                                               (2**40, 2**32, r"n must be in \[0, 2\*\*32\), got")])
def test_integer_in_refuses_a_value_out_of_range(value, end, match):
    with pytest.raises(ValueError, match=match):
        checks.integer_in(value, "n", 0, end, "2**32" if end == 2**32 else None)


@pytest.mark.parametrize("value", [0, -2.5, np.float32(1.5), np.int8(-3), 10**300])
def test_real_returns_python_floats(value):
    got = checks.real(value, "x")
    assert type(got) is float and got == float(value)


@pytest.mark.parametrize("value", NOT_REALS)
def test_real_refuses_what_is_not_a_real_number(value):
    with pytest.raises(TypeError, match="^x must be a real number"):
        checks.real(value, "x")


@pytest.mark.parametrize("value", NOT_FINITE)
def test_real_refuses_nan_and_infinities(value):
    with pytest.raises(ValueError, match="^x must be finite"):
        checks.real(value, "x")
    with pytest.raises(ValueError, match=r"^x must be in \(0, 1\]"):
        checks.real_in(value, "x", 0.0, 1.0, low_open=True)
    with pytest.raises(ValueError, match="^x must be finite and > 0"):
        checks.positive(value, "x")


def test_an_int_too_large_for_a_float_is_refused_as_a_value_in_a_short_message():
    with pytest.raises(ValueError, match="^x must be finite") as error:
        checks.real(10**400, "x")
    assert len(str(error.value)) < 100
    with pytest.raises(ValueError, match=r"^n must be in \[0, 9\]") as error:
        checks.integer_in(-10**400, "n", 0, 10)
    assert len(str(error.value)) < 100


def test_isolation_keeps_python_numbers():
    """A NumPy int limit would overflow the child's shift to bytes (4096 << 20 in int32 is 0)."""
    isolation = Isolation(call_timeout_s=np.float32(2.0), memory_limit_mb=np.int32(4096))
    assert type(isolation.memory_limit_mb) is int and isolation.memory_limit_mb << 20 == 4096 << 20
    assert type(isolation.call_timeout_s) is float


@pytest.mark.parametrize("low_open, high_open, inside, outside", [
    (True, False, [1e-9, 60.0], [0.0, 60.0001]),
    (False, True, [0.0, 59.999], [-1e-9, 60.0]),
    (False, False, [0.0, 60.0], [-0.5, 61.0]),
])
def test_real_in_keeps_each_end_open_or_closed(low_open, high_open, inside, outside):
    for value in inside:
        assert checks.real_in(value, "x", 0.0, 60.0, low_open=low_open, high_open=high_open) == value
    for value in outside:
        with pytest.raises(ValueError, match=r"^x must be in [\[(]0, 60[\])]"):
            checks.real_in(value, "x", 0.0, 60.0, low_open=low_open, high_open=high_open)


@pytest.mark.parametrize("value, error", [(0.0, ValueError), (-1, ValueError), (math.nan, ValueError),
                                          (True, TypeError), ("1", TypeError)])
def test_positive_refuses_zero_negatives_and_non_numbers(value, error):
    with pytest.raises(error, match="^x must be"):
        checks.positive(value, "x")
    assert checks.positive(1e-30, "x") == 1e-30


# --------------------------------------------------------------------------- the rule at the entry points


def _entry_points():
    """(label, call taking the bad value, the bad value, the error)."""
    cases = []
    for name in ("substeps", "solver_iterations"):
        cases += [(f"ProjectConfig.{name}", lambda v, n=name: ProjectConfig(**{n: v}), bad, TypeError)
                  for bad in NOT_INTS]
        cases += [(f"ProjectConfig.{name}", lambda v, n=name: ProjectConfig(**{n: v}), bad, ValueError)
                  for bad in (0, -1, 1001)]
    for name in ("physics_dt_s", "wheelbase_m", "tyre_friction", "min_acceleration_mps2"):
        cases += [(f"ProjectConfig.{name}", lambda v, n=name: ProjectConfig(**{n: v}), bad, TypeError)
                  for bad in NOT_REALS]
        cases += [(f"ProjectConfig.{name}", lambda v, n=name: ProjectConfig(**{n: v}), bad, ValueError)
                  for bad in NOT_FINITE]
    cases += [("ProjectConfig.chassis_size_m", lambda v: ProjectConfig(chassis_size_m=(4.2, v, 0.5)), bad, error)
              for bad, error in (("1", TypeError), (True, TypeError), (0.0, ValueError), (math.nan, ValueError))]
    level = {"level_id": 1, "name": "x", "max_episode_steps": 10}
    for name in ("level_id", "max_episode_steps"):
        cases += [(f"Level.{name}", lambda v, n=name: Level(**(level | {n: v})), bad, TypeError) for bad in NOT_INTS]
        cases += [(f"Level.{name}", lambda v, n=name: Level(**(level | {n: v})), -1, ValueError)]
    for name in ("call_timeout_s", "start_timeout_s"):
        cases += [(f"Isolation.{name}", lambda v, n=name: Isolation(**{n: v}), bad, TypeError) for bad in NOT_REALS]
        cases += [(f"Isolation.{name}", lambda v, n=name: Isolation(**{n: v}), bad, ValueError)
                  for bad in (0.0, -1.0, *NOT_FINITE)]
    cases += [("Isolation.memory_limit_mb", lambda v: Isolation(memory_limit_mb=v), bad, TypeError)
              for bad in (True, 2048.0, "4096")]
    cases += [("Isolation.memory_limit_mb", lambda v: Isolation(memory_limit_mb=v), bad, ValueError)
              for bad in (1023, 2**40, 10**25)]  # 2**40 MiB in bytes no longer fits the child's C long
    cases += [("FramePainter.size", lambda v: FramePainter((v, 600)), bad, error)
              for bad, error in ((True, TypeError), (800.0, TypeError), (63, ValueError), (4097, ValueError))]
    cases += [("EpisodeView.control_dt_s", lambda v: EpisodeView(v, record="x.mp4"), bad, error)
              for bad, error in ((True, TypeError), ("0.1", TypeError), (0.0, ValueError), (math.inf, ValueError))]
    cases += [("EpisodeView.record_fps", lambda v: EpisodeView(0.1, record="x.mp4", record_fps=v), bad, error)
              for bad, error in ((True, TypeError), (None, TypeError), (0, ValueError), (61, ValueError))]
    return cases


@pytest.mark.parametrize("label, make, bad, error", _entry_points(),
                         ids=[f"{c[0]}={c[2]!r}" for c in _entry_points()])
def test_each_entry_point_refuses_a_wrong_type_as_a_type_error_and_a_wrong_value_as_a_value_error(
        label, make, bad, error):
    name = label.split(".")[1]
    with pytest.raises(error) as raised:
        make(bad)
    assert raised.type is error and name.split("[")[0] in str(raised.value), (label, str(raised.value))


def test_a_settings_table_is_built_from_a_mapping_of_its_names():
    """A mapping of some names gives the dataclass with the rest at their
    defaults; a value that is not a mapping is a TypeError, a name that is
    not one of its settings (or not a string) a ValueError, each naming
    the table; the dataclass's own refusals pass through."""
    made = checks.settings_table(ProjectConfig, {"wheelbase_m": 2.5}, "car")
    assert made == ProjectConfig(wheelbase_m=2.5)
    assert checks.settings_table(ProjectConfig, {}, "car") == ProjectConfig()
    for value in (None, [("wheelbase_m", 2.5)], "wheelbase_m=2.5", 3):
        with pytest.raises(TypeError, match=r"car must be a table \(a mapping of its settings by name\), got "):
            checks.settings_table(ProjectConfig, value, "car")
    for value, shown in (({"wheelbase_m": 2.5, "bogus": 2}, "'bogus'"), ({1: 2}, "1"), ({b"wheelbase_m": 2}, "b'")):
        with pytest.raises(ValueError, match=rf"car has no setting {shown}.*; its settings are \['"):
            checks.settings_table(ProjectConfig, value, "car")
    with pytest.raises(ValueError, match="wheelbase_m"):
        checks.settings_table(ProjectConfig, {"wheelbase_m": -1.0}, "car")
