"""The car-envelope benchmark runs end to end on the CPU (its short schedule,
seconds), and the committed report is one `Envelope.from_json` reads, of the
car `ProjectConfig()` builds today, with the numbers its docs page states."""

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from racing_env.config import ProjectConfig
from racing_env.envelope import FULL_SCHEDULE, SHORT_SCHEDULE, Envelope, config_hash

ROOT = Path(__file__).parents[1]
REPORT = ROOT / "benchmarks/results/car_envelope.json"


def test_the_short_run_writes_its_report_and_picture(tmp_path):
    out = tmp_path / "envelope.json"
    run = subprocess.run([sys.executable, str(ROOT / "benchmarks/racing_env/car_envelope.py"), "--short",
                          "--out", str(out)], capture_output=True, text=True, timeout=600, cwd=tmp_path)
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-2000:]
    report = json.loads(out.read_text())
    assert report["schedule_name"] == "short" and report["schedule"] == SHORT_SCHEDULE.to_dict()
    envelope = Envelope.from_json(json.dumps(report["envelope"]))
    assert envelope.config_sha256 == report["config_sha256"] == config_hash(ProjectConfig())
    np.testing.assert_array_equal(envelope.speeds_mps, SHORT_SCHEDULE.speeds_mps)
    assert all(len(h) == 64 for h in report["source_sha256"].values())
    assert report["measure_wall_s"] > 0 and out.with_suffix(".png").stat().st_size > 10_000


@pytest.mark.parametrize("flags, message", [
    (["--publish", "--short"], "argument --publish: the committed report is the full schedule"),
    (["--publish", "--out", "x.json"], "argument --out: not allowed with argument --publish"),
])
def test_only_a_full_run_publishes(tmp_path, flags, message):
    run = subprocess.run([sys.executable, str(ROOT / "benchmarks/racing_env/car_envelope.py"), *flags],
                         capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert run.returncode == 2 and message in run.stderr, run.stderr[-2000:]


def test_the_committed_report_is_the_full_schedule_of_todays_car():
    report = json.loads(REPORT.read_text())
    assert report["schedule_name"] == "full" and report["schedule"] == FULL_SCHEDULE.to_dict()
    envelope = Envelope.from_json(json.dumps(report["envelope"]))
    assert envelope.config_sha256 == config_hash(ProjectConfig())
    page = (ROOT / "docs/racing_env/envelope.md").read_text()
    for speed in (10.0, 20.0, 30.0):
        assert f"| {speed:g} | {envelope.lateral_at(speed):.2f} |" in page, speed
    picture = (ROOT / "benchmarks/results/car_envelope.png").read_bytes()
    assert (ROOT / "docs/assets/car_envelope.png").read_bytes() == picture
