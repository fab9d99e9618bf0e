"""The backend table: one class per name, each with exactly the `Backend`
interface (method names, signatures and kinds, attributes), names that a
command line reads without importing JAX or MuJoCo, and unknown names
refused by name."""

from __future__ import annotations

import inspect
import subprocess
import sys

import pytest

from racing_env.backend_names import BACKEND_NAMES
from racing_env.backends import BACKENDS, Backend, backend_type
from racing_env.config import ProjectConfig
from racing_env.physics import CpuReferencePhysics

#: The attributes `Backend` declares with their class-level kind, and its methods (``__init__`` included).
CLASS_ATTRIBUTES = {"name": str, "one_world": bool, "uses_gpu": bool}
METHODS = sorted(["__init__", *(name for name, member in vars(Backend).items() if not name.startswith("_")
                                and (inspect.isfunction(member) or isinstance(member, staticmethod)))])


def test_the_table_is_the_names_in_their_order():
    assert tuple(BACKENDS) == BACKEND_NAMES == ("cpu_reference", "mjx_warp")
    assert [backend.name for backend in BACKENDS.values()] == list(BACKENDS)


def test_the_protocol_declares_what_the_env_calls():
    assert METHODS == ["__init__", "by_world", "continue_core", "core_data", "device_bytes_per_world", "fields",
                       "positions", "preload", "reset", "restore", "step", "velocities"]
    assert set(Backend.__annotations__) == {*CLASS_ATTRIBUTES, "physics", "home"}


@pytest.mark.parametrize("name", BACKEND_NAMES)
def test_each_backend_has_the_protocols_signatures(name):
    backend = BACKENDS[name]
    for method in METHODS:
        assert inspect.signature(getattr(backend, method)) == inspect.signature(getattr(Backend, method)), method
        static = isinstance(inspect.getattr_static(backend, method), staticmethod)
        assert static == isinstance(inspect.getattr_static(Backend, method), staticmethod), method
    assert not [m for m in vars(backend) if not m.startswith("_") and callable(getattr(backend, m))
                and m not in METHODS], "a public method the protocol does not declare"
    for attribute, kind in CLASS_ATTRIBUTES.items():
        assert isinstance(getattr(backend, attribute), kind), attribute


@pytest.mark.parametrize("fixture", ["cpu_env", "mjx_pool_env"])
def test_a_built_backend_has_its_physics_and_home(request, fixture):
    env = request.getfixturevalue(fixture)
    backend = env._backend
    assert isinstance(backend, BACKENDS[env.backend])
    assert env.physics is backend.physics and backend.physics.name == env.backend
    assert backend.home is not None


def test_the_class_attributes_say_what_command_lines_asked_by_name():
    """`one_world` and `uses_gpu`: what ``sim`` and ``evaluate`` compared
    backend names for."""
    assert [(b.one_world, b.uses_gpu) for b in BACKENDS.values()] == [(True, False), (False, True)]
    with pytest.raises(ValueError, match="num_envs must be 1 for the cpu_reference backend"):
        CpuReferencePhysics(ProjectConfig(), 2)


@pytest.mark.parametrize("name", ["mjx", None, ["mjx_warp"], 1])
def test_an_unknown_backend_is_refused_by_name(name):
    with pytest.raises(ValueError, match=r"backend must be one of \('cpu_reference', 'mjx_warp'\), got "):
        backend_type(name)


def test_the_names_import_without_jax_or_mujoco():
    code = ("import sys\nfrom racing_env.backend_names import BACKEND_NAMES\n"
            "print(sorted(m for m in ('jax', 'mujoco', 'warp') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    assert out.stdout.strip() == "[]"


def test_preloading_a_backend_imports_its_engine_quietly_and_builds_nothing():
    """``preload``: in a fresh process, ``mjx_warp``'s imports MuJoCo Warp
    through the env's quiet Warp (its log level lowered, so that the banner
    stays off stdout when Warp initialises later) without initialising
    Warp's runtime or touching a device; ``cpu_reference``'s is nothing
    more than the module's own imports."""
    code = (
        "import sys\n"
        "from racing_env.backends import backend_type\n"
        "backend_type('cpu_reference').preload()\n"
        "engine = 'mujoco.mjx.third_party.mujoco_warp'\n"
        "before = engine in sys.modules\n"
        "backend_type('mjx_warp').preload()\n"
        "import warp\n"
        "print('engine', before, engine in sys.modules, 'runtime', warp._src.context.runtime is None,\n"
        "      'quiet', warp.config.log_level == warp.LOG_WARNING)\n")
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr[-2000:]
    assert run.stdout == "engine False True runtime True quiet True\n", run.stdout
