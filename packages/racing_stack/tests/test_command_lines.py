"""What ``evaluate``, ``sim``, ``train-ppo`` and ``materialize-track-pool``
tell a user: each option's help and default in ``--help``, an option of the other Level refused by name, one line when a
GPU backend would run on the CPU, one line when a pool is built, and the
plugin's name (not its folder's) in the picture. Nothing here runs an
episode."""

from __future__ import annotations

import pytest

from racing_stack import _cli, evaluate, pools, sim
from racing_stack.ppo import cli as train_ppo

#: The options whose ``--help`` entry must give their default.
DEFAULTS = {
    evaluate.main: ["--controller", "--level", "--split", "--tracks", "--episodes", "--backend", "--worlds", "--seed",
                    "--isolate", "--call-timeout", "--start-timeout", "--memory-limit", "--record-fps"],
    sim.main: ["--backend", "--controller", "--seed", "--record-fps"],
    train_ppo.main: ["--preset", "--out", "--updates"],
    pools.main: ["--splits", "--cache"],
}


def _help_entries(main, capsys) -> dict[str, str]:
    """``main``'s ``--help``: each option's first flag -> its entry, on one line."""
    with pytest.raises(SystemExit) as stop:
        main(["--help"])
    assert stop.value.code == 0
    options = capsys.readouterr().out.split("\noptions:\n", 1)[1]
    entries: dict[str, str] = {}
    flag = None
    for line in options.splitlines():
        if line.startswith("  -"):
            flag = line.split()[0].rstrip(",")
            entries[flag] = line.strip()
        elif flag is not None and line.strip():
            entries[flag] += " " + line.strip()
    return entries


@pytest.mark.parametrize("main", DEFAULTS, ids=["evaluate", "sim", "train-ppo", "materialize-track-pool"])
def test_help_gives_every_options_default(main, capsys):
    entries = _help_entries(main, capsys)
    missing = [flag for flag in DEFAULTS[main] if "default" not in entries[flag]]
    assert not missing, {flag: entries[flag] for flag in missing}
    if main is evaluate.main:
        assert "(default validation)" in entries["--split"] and "mjx_warp (default;" in entries["--backend"]
    elif main is sim.main:
        assert "cpu_reference (default;" in entries["--backend"]
    bare = [entry for entry in entries.values() if len(entry.split()) < 4]  # a flag and its metavar, no help
    assert not bare, bare


@pytest.mark.parametrize("argv, said", [
    (["--level", "0", "--tracks", "3"], "argument --tracks: Level 1 only (a split's first N tracks): Level 0 has "
                                        "one fixed track; --episodes N drives it N times"),
    (["--episodes", "3"], "argument --episodes: Level 0 only (runs of its fixed track): Level 1 drives each track "
                          "of its split once; --tracks N drives the first N"),
    (["--level", "1", "--episodes", "1"], "argument --episodes: Level 0 only"),
])
def test_an_option_of_the_other_level_is_a_usage_error_naming_it(argv, said, monkeypatch, capsys):
    monkeypatch.setattr(evaluate, "evaluate", None)  # nothing may run
    with pytest.raises(SystemExit) as stop:
        evaluate.main(["--backend", "cpu_reference", *argv])
    assert stop.value.code == 2 and said in capsys.readouterr().err


@pytest.mark.parametrize("level, count, said", [(0, {"tracks": 3}, "tracks is Level 1's"),
                                                (1, {"episodes": 2}, "episodes is Level 0's")])
def test_evaluate_refuses_a_count_of_the_other_level_before_the_plugin(level, count, said):
    with pytest.raises(ValueError, match=said):
        evaluate.evaluate("/nonexistent/plugin", level=level, backend="cpu_reference", **count)


@pytest.mark.parametrize("backend, jax_backend, said", [("mjx_warp", "cpu", True), ("mjx_warp", "gpu", False),
                                                         ("cpu_reference", "cpu", False)])
def test_a_gpu_backend_without_a_gpu_is_one_line(backend, jax_backend, said, monkeypatch, capsys):
    import jax

    monkeypatch.setattr(jax, "default_backend", lambda: jax_backend)
    _cli.say_gpu_backend_on_cpu("evaluate", backend)
    err = capsys.readouterr().err
    if not said:
        assert err == ""
        return
    assert err.count("\n") == 1 and err.startswith("evaluate: no GPU here, so mjx_warp steps on the CPU: 10-30 ms")
    assert "~5x slower than cpu_reference with one world; --backend cpu_reference runs MuJoCo C" in err


def test_evaluate_says_the_cpu_fallback_once_and_each_pool_build(monkeypatch, capsys):
    """The run's start on a machine without a GPU: the fallback line once,
    then the line `level_env` gives before it builds a pool, each prefixed
    ``evaluate:``."""
    import jax

    def stopped(*args, on_build, **kwargs):
        on_build("validation: building its pool of 1,000 tracks into ...")
        raise ValueError("stopped before the run")

    monkeypatch.setattr(jax, "default_backend", lambda: "cpu")
    monkeypatch.setattr(evaluate, "evaluate", stopped)
    assert evaluate.main(["--backend", "mjx_warp"]) == 2
    lines = capsys.readouterr().err.splitlines()
    assert lines[0].startswith("evaluate: no GPU here, so mjx_warp steps on the CPU")
    assert lines[1:] == ["evaluate: validation: building its pool of 1,000 tracks into ...",
                         "evaluate: stopped before the run"]


def test_sim_says_the_cpu_fallback_once(monkeypatch, capsys):
    import jax

    def stopped(backend):
        raise RuntimeError("stopped before the track")

    monkeypatch.setattr(jax, "default_backend", lambda: "cpu")
    monkeypatch.setattr(sim, "build_track", stopped)
    with pytest.raises(RuntimeError, match="stopped before the track"):
        sim.main(["--backend", "mjx_warp"])
    err = capsys.readouterr().err
    assert err.count("no GPU here") == 1 and "sim: no GPU here, so mjx_warp steps on the CPU" in err


@pytest.mark.parametrize("names, title", [({"plugin_name": "ppo7"}, "ppo7: 100.0 % laps"),
                                          ({}, "plugin: 100.0 % laps")])  # a result written before plugin_name
def test_the_picture_names_the_plugin_by_its_name(tmp_path, monkeypatch, names, title):
    import matplotlib.axes

    titles = []
    real = matplotlib.axes.Axes.set

    def set_(self, **settings):
        titles.append(settings.get("title"))
        return real(self, **settings)

    monkeypatch.setattr(matplotlib.axes.Axes, "set", set_)
    episode = {"track_id": 7, "termination_reason": "success", "lap_completed": True, "lap_time_s": 30.0}
    result = {"plugin": "/runs/ppo7/plugin", **names, "summary": {"success_rate": 1.0, "lap_time_s": {"median": 30.0}},
              "track_length_m": {"7": 500.0}, "episodes": [episode]}
    evaluate.draw(result, tmp_path / "result.png")
    assert titles[0] == f"{title}, median 30.0 s"
