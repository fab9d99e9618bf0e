"""Every pixi task has a pip-path twin: a Makefile target of the same name."""

import re
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).parents[1]


def pixi_tasks() -> set[str]:
    manifest = tomllib.loads((ROOT / "pixi.toml").read_text())
    tasks = set(manifest.get("tasks", {}))
    for feature in manifest.get("feature", {}).values():
        tasks |= set(feature.get("tasks", {}))
    return tasks


def make_targets() -> set[str]:
    text = (ROOT / "Makefile").read_text()
    return set(re.findall(r"^([A-Za-z0-9_-]+):", text, flags=re.M))


def test_every_pixi_task_has_a_make_twin():
    tasks = pixi_tasks()
    assert {"tests", "gpu-tests", "docs", "benchmark-rl-triton"} <= tasks
    missing = tasks - make_targets()
    assert not missing, f"pixi tasks without a Makefile twin: {sorted(missing)}"


def test_each_package_has_its_own_test_task():
    packages = {p.name for p in (ROOT / "packages").iterdir() if (p / "pyproject.toml").exists()}
    assert packages == {"rl_triton", "track_gen", "racing_env", "racing_stack"}
    for name in packages:
        assert f"test-{name.replace('_', '-')}" in pixi_tasks()


def test_readme_names_the_two_commands():
    readme = (ROOT / "README.md").read_text()
    for command in ("pixi run sim", "make sim", "pixi run tests", "make tests", "pixi run benchmark-rl-triton",
                    "make benchmark-rl-triton"):
        assert command in readme


def test_make_help_lists_every_target():
    text = (ROOT / "Makefile").read_text()
    targets = set(re.findall(r"^([a-z0-9-]+):", text, flags=re.M)) - {"help"}
    described = set(re.findall(r"^([a-z0-9-]+):.*## ", text, flags=re.M))
    assert targets == described, f"targets without a ## line: {sorted(targets - described)}"
    assert re.search(r"^\.DEFAULT_GOAL := help$", text, flags=re.M)


def test_pytest_from_the_root_collects_every_package():
    import subprocess
    import sys

    out = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q"], cwd=ROOT, capture_output=True,
                         text=True, timeout=600)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-2000:]
    collected = out.stdout.strip().splitlines()
    for package in ("rl_triton", "track_gen", "racing_env", "racing_stack"):
        assert any(line.startswith(f"packages/{package}/tests/") for line in collected), package
    assert any(line.startswith("tests-integration/") for line in collected)


def test_the_manifest_uses_current_pixi_syntax():
    manifest = tomllib.loads((ROOT / "pixi.toml").read_text())
    assert "project" not in manifest and "system-requirements" not in manifest  # both deprecated
    platforms = {p["name"]: p for p in manifest["workspace"]["platforms"]}
    assert platforms["linux-64-cuda"]["cuda"] == "13.0" and "cuda" not in platforms["linux-64-cpu"]
    cpu, gpu = manifest["feature"]["cpu"], manifest["feature"]["gpu"]
    assert cpu["platforms"] == ["linux-64-cpu"] and gpu["platforms"] == ["linux-64-cuda"]
    for feature in (cpu, gpu):
        assert "system-requirements" not in feature and "pypi-options" not in feature  # no index for every package
    assert cpu["pypi-dependencies"]["torch"]["index"] == "https://download.pytorch.org/whl/cpu"
    assert gpu["pypi-dependencies"]["torch"]["index"] == "https://download.pytorch.org/whl/cu130"
    assert gpu["pypi-dependencies"]["jax"]["extras"] == ["cuda13"]


def test_one_python_floor_everywhere():
    """Python 3.10 cannot install the JAX racing_env needs: every package,
    the pixi manifest, the lint and the docs say 3.11."""
    for pyproject in sorted((ROOT / "packages").glob("*/pyproject.toml")):
        project = tomllib.loads(pyproject.read_text())["project"]
        assert project["requires-python"] == ">=3.11", pyproject
        assert not any("python_version" in d for d in project["dependencies"]), pyproject
    assert tomllib.loads((ROOT / "pixi.toml").read_text())["dependencies"]["python"].startswith(">=3.11,")
    assert tomllib.loads((ROOT / "ruff.toml").read_text())["target-version"] == "py311"
    assert 'needs Python 3.11 or newer (`requires-python = ">=3.11"`)' in (ROOT / "docs/development.md").read_text()


BOOM = """
from racing_env.controller import Controller


class Boom(Controller):
    def compute_control(self, obs, info=None):
        raise RuntimeError("boom")
"""


def test_make_sim_prints_only_json(tmp_path):
    """`make sim > run.json` is valid JSON: make echoes no command on stdout
    (a controller that raises at once keeps the episode short; sim then
    exits 1, after the result, and make says its recipe failed)."""
    import json
    import subprocess
    import sys

    plugin = tmp_path / "boom"
    plugin.mkdir()
    (plugin / "controller.py").write_text(BOOM)
    (plugin / "config.toml").write_text("")
    # This interpreter instead of .venv's, and no venv to build first.
    out = subprocess.run(["make", "--no-print-directory", "sim", f"PY={sys.executable}", "STAMP=",
                          f"ARGS=--controller {plugin}"], cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert out.returncode == 2 and "sim] Error 1" in out.stderr, out.stderr[-3000:]
    (episode,) = json.loads(out.stdout)["episodes"]
    assert episode["termination_reason"] == "invalid_action"


def test_json_targets_and_the_venv_echo_nothing_on_stdout():
    text = (ROOT / "Makefile").read_text()
    for target in ("sim", "evaluate", "$(STAMP)"):
        recipe = re.search(rf"^{re.escape(target)}:.*\n((?:\t.*\n)+)", text, flags=re.M).group(1)
        commands = re.findall(r"^\t(?!\t)(.*)", recipe, flags=re.M)
        assert commands and all(c.startswith("@") for c in commands), (target, commands)
    stamp = re.search(r"^\$\(STAMP\):.*\n((?:\t.*\n)+)", text, flags=re.M).group(1)
    assert "install" in stamp and all(">&2" in c for c in re.split(r"\n\t(?=@)", stamp) if "touch" not in c)


def test_make_tests_runs_every_target_and_names_the_failed_ones():
    """A failing package does not stop `make tests`: every target runs, the
    failed ones are named, and the exit status is not zero."""
    import subprocess

    targets = ["test-rl-triton", "test-track-gen", "test-racing-env", "test-racing-stack", "test-integration"]
    # /bin/false as the interpreter: every target fails at once, no venv to build first.
    out = subprocess.run(["make", "--no-print-directory", "tests", "PY=false", "STAMP="], cwd=ROOT,
                         capture_output=True, text=True, timeout=120)
    assert out.returncode != 0
    assert f"make tests: FAILED: {' '.join(targets)}" in out.stderr, out.stderr[-2000:]
    out = subprocess.run(["make", "--no-print-directory", "tests", "PY=true", "STAMP="], cwd=ROOT,
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and "every target passed" in out.stdout, out.stderr[-2000:]
    pixi = tomllib.loads((ROOT / "pixi.toml").read_text())["tasks"]["tests"]["cmd"]
    assert f"for target in {' '.join(targets)}; do pixi run $target || failed=" in pixi


WINDOW_TEST = ("packages/racing_env/tests/test_render.py::"
               "test_the_window_shows_the_track_and_the_car_on_a_virtual_display")


def test_the_window_tests_skip_naming_xvfb_without_it_unless_ci_requires_them(tmp_path):
    import os
    import subprocess
    import sys

    env = dict(os.environ, PATH=str(tmp_path))  # no Xvfb on it
    env.pop("RACING_STACK_WINDOW_TESTS", None)
    command = [sys.executable, "-m", "pytest", "-q", "-rs", "-p", "no:cacheprovider", WINDOW_TEST]
    out = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0 and "1 skipped" in out.stdout, out.stdout[-3000:]
    assert "needs Xvfb's Xvfb (Debian: apt-get install xvfb" in out.stdout
    env["RACING_STACK_WINDOW_TESTS"] = "required"  # as .ci/run sets it
    out = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert out.returncode == 1 and "1 failed" in out.stdout, out.stdout[-3000:]
    assert "export RACING_STACK_WINDOW_TESTS=required" in (ROOT / ".ci/run").read_text()


def test_the_readme_names_xvfb_as_a_prerequisite():
    readme = (ROOT / "README.md").read_text()
    assert "Xvfb" in readme and "apt-get install xvfb" in readme


def test_make_examples_runs_every_example():
    """`make examples` (and `pixi run examples`) runs each file of examples/,
    and the README names the command."""
    text = (ROOT / "Makefile").read_text()
    recipe = re.search(r"^examples:.*\n((?:\t.*\n)+)", text, flags=re.M).group(1)
    pixi = tomllib.loads((ROOT / "pixi.toml").read_text())["tasks"]["examples"]["cmd"]
    examples = sorted(p.relative_to(ROOT).as_posix() for p in (ROOT / "examples").glob("*.py"))
    assert len(examples) == 3
    for example in examples:
        assert f"$(PY) {example} " in recipe, example
        assert f"python {example} " in pixi, example
    assert [line.split()[1] for line in recipe.splitlines()] == [c.split()[1] for c in pixi.split(" && ")]
    readme = (ROOT / "README.md").read_text()
    assert "`pixi run examples`" in readme and "`make examples`" in readme


@pytest.mark.parametrize("example", sorted(p.name for p in (ROOT / "examples").glob("*.py")))
def test_each_example_refuses_an_out_it_cannot_write_by_name_before_any_work(example, tmp_path):
    """``--out`` under a file (or naming one, for a folder) is a usage error
    naming it, at once; ``--help`` gives the whole first paragraph and each
    number's default."""
    (tmp_path / "file").write_text("")
    run = subprocess.run([sys.executable, str(ROOT / "examples" / example), "--out", str(tmp_path / "file" / "x.png")],
                         capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert run.returncode == 2 and "error: argument --out: cannot make the folder" in run.stderr, run.stderr[-2000:]
    assert run.stdout == "" and sorted(p.name for p in tmp_path.iterdir()) == ["file"]
    helped = subprocess.run([sys.executable, str(ROOT / "examples" / example), "--help"], capture_output=True,
                            text=True, timeout=120, cwd=tmp_path).stdout
    first = (ROOT / "examples" / example).read_text().split('"""')[1].split("\n\n")[0]
    assert " ".join(first.split()) in " ".join(helped.split())
    bounds = re.findall(r"\((?:>|>=|in) [^)]*\)", " ".join(helped.split()))  # a number's help: its range...
    assert bounds and all(", default " in bound for bound in bounds), bounds  # ...and its default


@pytest.mark.parametrize("example, flag, value, said", [
    ("racing_env_trajectories.py", "--seconds", "0", "must be in (0, 3600], got 0.0"),
    ("racing_env_trajectories.py", "--seconds", "inf", "must be in (0, 3600], got inf"),
    ("racing_env_trajectories.py", "--seconds", "nan", "must be in (0, 3600], got nan"),
    ("racing_env_trajectories.py", "--seconds", "3601", "must be in (0, 3600], got 3601.0"),
    ("track_gen_drive.py", "--steps", "-3", "must be >= 1, got -3"),
    ("track_gen_drive.py", "--envs", "0", "must be >= 1, got 0"),
    ("track_gen_pictures.py", "--num-envs", "0", "must be >= 1, got 0"),
])
def test_each_example_refuses_a_number_out_of_range_by_its_flag(example, flag, value, said, tmp_path):
    run = subprocess.run([sys.executable, str(ROOT / "examples" / example), flag, value, "--out", str(tmp_path / "x")],
                         capture_output=True, text=True, timeout=120)
    assert run.returncode == 2 and f"error: argument {flag}: {said}" in run.stderr, run.stderr
    assert list(tmp_path.iterdir()) == []
