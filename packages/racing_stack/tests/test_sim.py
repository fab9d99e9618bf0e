"""``sim``: one episode on track_gen seed 42, the JSON result, named errors."""

import json

import pytest

from racing_stack import sim


def test_sim_runs_the_template_on_seed_42_to_the_timeout(tmp_path, capsys):
    out = tmp_path / "result.json"
    assert sim.main(["--out", str(out), "--seed", "3"]) == 0
    printed = json.loads(capsys.readouterr().out)
    assert printed == json.loads(out.read_text())
    (episode,) = printed["episodes"]
    assert printed["track_gen_seed"] == 42 and episode["track_id"] == 42
    assert episode["termination_reason"] == "timeout"
    assert episode["steps"] == printed["challenge"]["level"]["max_episode_steps"]
    assert printed["backend"] == "cpu_reference" and printed["seed"] == 3


def test_a_rejected_track_seed_is_an_error_not_a_retry(monkeypatch):
    monkeypatch.setattr(sim, "TRACK_SEED", 151)  # invalid at the defaults (thickness)
    with pytest.raises(SystemExit, match="seed 151 was rejected"):
        sim.build_track("cpu_reference")


def test_a_bad_controller_directory_is_named(tmp_path, capsys):
    assert sim.main(["--controller", str(tmp_path / "nowhere")]) == 2
    assert "nowhere" in capsys.readouterr().err


def test_sim_with_the_pursuit_controller_completes_the_lap(capsys):
    from racing_env.plugins import PURSUIT

    assert sim.main(["--controller", str(PURSUIT)]) == 0
    (episode,) = json.loads(capsys.readouterr().out)["episodes"]
    assert episode["termination_reason"] == "success" and episode["lap_completed"]
    assert 20.0 < episode["lap_time_s"] < 60.0  # 376 m (measured 35.8 s)
