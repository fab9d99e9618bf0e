"""``evaluate``, the Runner's command line: a plugin on the first tracks of a
verified split, the JSON result on the pool's own rows, the picture, clear
errors for a bad level, split or count."""

import json

import pytest
from PIL import Image

from racing_stack import evaluate, pools


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
    return tmp_path_factory.mktemp("cache")


@pytest.fixture(scope="module")
def recording(tmp_path_factory):
    return tmp_path_factory.mktemp("recording") / "laps.gif"


@pytest.fixture(scope="module")
def first_two(cache, recording):
    """The pure-pursuit reference on Validation's first two tracks, recorded."""
    from racing_env import ProjectConfig
    from racing_env.render import EpisodeView

    with pytest.MonkeyPatch.context() as patch, \
            EpisodeView(ProjectConfig().control_dt_s, record=recording, size=(320, 240)) as view:
        patch.setenv("RACING_STACK_CACHE", str(cache))
        return evaluate.evaluate(backend="cpu_reference", tracks=2, view=view)


def test_it_drives_the_splits_first_tracks_once_each(first_two):
    committed = json.loads((pools.MANIFESTS / f"{pools.pool_name('validation')}.json").read_text())
    ids = [t["track_id"] for t in committed["tracks"][:2]]
    assert [e["track_id"] for e in first_two["episodes"]] == ids
    assert first_two["level"] == 1 and first_two["split"] == "validation"
    assert first_two["summary"]["success_rate"] == 1.0  # the reference laps them
    lengths = first_two["track_length_m"]
    assert sorted(lengths) == sorted(str(i) for i in ids)  # the driven tracks, no others
    assert all(300.0 < lengths[str(i)] < 1500.0 for i in ids)


def test_world_0s_episodes_are_recorded(first_two, recording):
    offered = sum(e["steps"] + 1 for e in first_two["episodes"])  # each episode's reset and steps
    with Image.open(recording) as gif:
        assert gif.n_frames == -(-offered // 5) and gif.size == (320, 240)


def test_the_command_line_writes_the_result_and_draws_it(first_two, tmp_path, capsys):
    result = tmp_path / "result.json"
    result.write_text(json.dumps(first_two))
    picture = tmp_path / "result.png"
    assert evaluate.main(["--from-result", str(result), "--plot", str(picture), "--reference", str(result)]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["summary"] == first_two["summary"]
    assert picture.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and picture.stat().st_size > 10_000


@pytest.mark.parametrize("argv,message", [
    (["--level", "1", "--split", "nope"], "split must be one of"),
    (["--tracks", "0"], "tracks must be in [1, 1000]"),
    (["--tracks", "1001"], "tracks must be in [1, 1000]"),
    (["--controller", "/nonexistent/plugin"], "nonexistent"),
    (["--split", "train", "--tracks", "10001"], "tracks must be in [1, 10000]"),
    (["--record", "/nonexistent/laps.gif"], "record's folder"),
])
def test_bad_arguments_are_clear_errors(argv, message, cache, monkeypatch, capsys):
    monkeypatch.setenv("RACING_STACK_CACHE", str(cache))
    assert evaluate.main(["--backend", "cpu_reference", *argv]) == 2
    assert message in capsys.readouterr().err
    assert not (cache / f"{pools.pool_name('train')}.npz").exists()  # refused before any pool is built
