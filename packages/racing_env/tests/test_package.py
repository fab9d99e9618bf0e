import importlib
import re
import subprocess
import sys

import pytest

import racing_env


def test_version():
    assert racing_env.__version__ == "0.3.0"


def test_declared_dependencies_import():
    import gymnasium
    import jax
    import mujoco
    import scipy.optimize
    import threadpoolctl
    from mujoco import mjx

    assert jax.numpy.add(1, 2) == 3
    assert hasattr(scipy.optimize, "lsq_linear") and hasattr(threadpoolctl, "threadpool_limits")
    assert mujoco.mj_versionString().startswith("3.17")
    assert hasattr(mjx, "put_model")
    assert gymnasium.__version__.startswith("1.4")


def test_every_public_name_imports_from_the_package():
    namespace: dict = {}
    exec("from racing_env import *", namespace)
    assert set(racing_env.__all__) <= set(namespace) and set(racing_env.__all__) <= set(dir(racing_env))
    with pytest.raises(AttributeError, match="has no attribute 'nothing'"):
        racing_env.nothing  # noqa: B018


@pytest.mark.parametrize(("old", "name", "new"), [
    ("racing_env.plugins", "challenge_values", "racing_env.runner.challenge_values"),
    ("racing_env.physics", "BACKENDS", "racing_env.backend_names.BACKEND_NAMES"),
    ("racing_env.vector", "reset_option", "racing_env.io.reset_option"),
    ("racing_env.vector", "SNAPSHOT_MARGIN_M", "racing_env.io.SNAPSHOT_MARGIN_M"),
    ("racing_env.vector", "SNAPSHOT_SPEED_FACTOR", "racing_env.io.SNAPSHOT_SPEED_FACTOR"),
])
def test_a_moved_name_still_comes_from_its_old_place_with_a_warning(old, name, new):
    module = importlib.import_module(old)
    with pytest.warns(DeprecationWarning, match=re.escape(f"{old}.{name} moved to {new}; the old name goes")):
        moved = getattr(module, name)
    home, _, attribute = new.rpartition(".")
    assert moved is getattr(importlib.import_module(home), attribute)
    with pytest.raises(AttributeError, match="has no attribute 'nothing'"):
        module.nothing  # noqa: B018


def test_the_old_backend_tuple_is_the_names():
    with pytest.warns(DeprecationWarning):
        from racing_env.physics import BACKENDS
    assert BACKENDS == ("cpu_reference", "mjx_warp")


@pytest.mark.parametrize("before, level", [("", "30"), ("warp.config.log_level = warp.LOG_ERROR", "40"),
                                           ("warp.config.log_level = warp.LOG_DEBUG", "10")])
def test_the_mjx_warp_backend_takes_warp_without_its_banner(before, level):
    """Warp's default level (info: its banner and a line per module on
    stdout) is lowered to warnings when the MJX-Warp backend takes Warp;
    a level the user set stays."""
    code = f"import warp\n{before}\nfrom racing_env._warp import warp as quiet\nprint(quiet().config.log_level)\n"
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-2000:]
    assert run.stdout.split() == [level]


@pytest.mark.parametrize("after", ["", "warp.config.log_level = warp.LOG_INFO"])
def test_the_mjx_warp_backend_takes_warp_without_its_no_driver_line(after):
    """Warp's first array initialises it (through Warp's own init, not
    ``warp.init``): at the lowered level its native line that no NVIDIA
    driver loads is left out of stderr; at a level the user set after,
    it is theirs, where the machine has no driver."""
    from racing_env._warp import NO_DRIVER

    code = (f"from racing_env._warp import warp as quiet\nwarp = quiet()\n{after}\n"
            "print(warp.zeros(3, device='cpu').numpy().sum())\n"
            "print('driver', warp.get_cuda_driver_version() is not None)\n")
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-2000:]
    lines = run.stdout.splitlines()
    assert lines[-2] == "0.0", run.stdout
    assert (NO_DRIVER in run.stderr) == (bool(after) and lines[-1] == "driver False"), run.stderr


def test_a_warp_initialised_before_keeps_its_level():
    code = ("import warp\nwarp.init()\nfrom racing_env._warp import warp as quiet\n"
            "print('level', quiet().config.log_level)\n")
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-2000:]
    assert run.stdout.splitlines()[-1] == "level 20" and "initialized" in run.stdout  # the user's banner, shown
