import tomllib
from pathlib import Path

import racing_stack


def test_installed_versions_are_the_pinned_ones():
    assert racing_stack.installed_versions() == racing_stack.PINS


def test_pins_match_the_package_metadata():
    pyproject = Path(__file__).parents[1] / "pyproject.toml"
    deps = tomllib.loads(pyproject.read_text())["project"]["dependencies"]
    assert {d.split("==")[0].split("[")[0]: d.split("==")[1] for d in deps} == racing_stack.PINS


def test_pinned_packages_report_their_versions():
    import racing_env
    import rl_triton
    import track_gen

    assert {"track-gen": track_gen.__version__, "racing-env": racing_env.__version__,
            "rl-triton": rl_triton.__version__} == racing_stack.PINS
