"""The minimum-time-lap benchmark: its committed report covers every Level
1 Validation and Test track of the committed pool manifests (ids and
geometry hashes), under the committed envelope of today's car and today's
default settings; its numbers are the docs page's; and a recomputation of
the first tracks of each split (built from their seeds, as the pools are)
agrees with it."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from racing_env.config import ProjectConfig
from racing_env.envelope import config_hash
from racing_env.raceline import LineSettings
from racing_stack import pools

ROOT = Path(__file__).parents[1]
REPORT = ROOT / "benchmarks/results/min_time_laps.json"


def test_the_committed_report_covers_every_validation_and_test_track():
    report = json.loads(REPORT.read_text())
    envelope = json.loads((ROOT / "benchmarks/results/car_envelope.json").read_text())
    assert report["envelope"]["config_sha256"] == envelope["config_sha256"] == config_hash(ProjectConfig())
    assert report["settings"] == LineSettings().to_dict() and report["tracks_per_split"] is None
    for split in ("validation", "test"):
        manifest = json.loads((pools.MANIFESTS / f"{pools.pool_name(split)}.json").read_text())
        tracks = report["splits"][split]["tracks"]
        assert [(t["track_id"], t["geometry_hash"]) for t in tracks] == [
            (t["track_id"], t["geometry_hash"]) for t in manifest["tracks"]]
        for t in tracks:
            assert 0 < t["t_lim_s"] < t["t_lim_standing_s"]
            assert t["line_length_m"] < 1.1 * t["centerline_length_m"]
            assert t["max_speed_mps"] <= report["envelope"]["speeds_mps"][1]


def test_the_docs_page_states_the_reports_numbers():
    report = json.loads(REPORT.read_text())
    page = (ROOT / "docs/racing_env/limits.md").read_text()
    for split in ("validation", "test"):
        summary = report["splits"][split]["summary"]
        assert f"{summary['t_lim_s']['median']:.2f} s" in page, split
        assert f"{summary['t_lim_standing_s']['median']:.2f} s" in page, split
    picture = (ROOT / "benchmarks/results/min_time_laps.png").read_bytes()
    assert (ROOT / "docs/assets/min_time_laps.png").read_bytes() == picture


def test_a_recomputation_of_the_first_tracks_agrees(tmp_path):
    run = subprocess.run([sys.executable, str(ROOT / "benchmarks/racing_env/min_time_laps.py"), "--check",
                          "--tracks", "2", "--workers", "1"], capture_output=True, text=True, timeout=600,
                         cwd=tmp_path)
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-3000:]
    assert "the committed report holds" in run.stderr


@pytest.mark.parametrize("flags, message", [
    (["--publish", "--tracks", "2"], "argument --publish: the committed report is every track"),
    (["--publish", "--out", "x.json"], "argument --out: not allowed with argument --publish"),
])
def test_only_a_whole_run_publishes(tmp_path, flags, message):
    run = subprocess.run([sys.executable, str(ROOT / "benchmarks/racing_env/min_time_laps.py"), *flags],
                         capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert run.returncode == 2 and message in run.stderr, run.stderr[-2000:]
