"""Level 1's pools: disjoint namespaces, the first valid seeds in order,
committed manifests that a fresh CPU build reproduces, a cache verified
instead of rebuilt, mismatches named; a damaged cache entry rebuilt once,
a killed run's temporary files removed, concurrent runs taking turns."""

import json
import os
import re
import subprocess
import sys
import threading
import time

import numpy as np
import pytest
import warp as wp
from racing_env import BENCHMARK_VERSION, LEVEL_1
from track_gen.course import Course
from track_gen.pipeline import presets

from racing_stack import pools
from racing_stack._files import exclusive_lock


def test_the_namespaces_are_disjoint_and_sized_as_documented():
    ranges = sorted((s.first_seed, s.first_seed + pools.NAMESPACE) for s in pools.SPLITS.values())
    assert all(a[1] <= b[0] for a, b in zip(ranges, ranges[1:]))
    assert {k: s.size for k, s in pools.SPLITS.items()} == {"train": 10_000, "validation": 1_000, "test": 1_000}
    assert ranges[-1][1] <= 2**32


def test_a_pool_is_the_first_valid_seeds_of_its_namespace_in_order():
    pool = pools.build_pool("test", size=30)
    first = pools.SPLITS["test"].first_seed
    wp.config.quiet = True
    course = Course.track(presets.track(num_envs=40, device="cpu"), seeds=first)
    valid_seeds = first + np.flatnonzero(course.result.valid.numpy())
    np.testing.assert_array_equal(np.asarray(pool.track_id), valid_seeds[:30])
    assert pool.level_id == LEVEL_1.level_id and pool.split == "test" and pool.benchmark_version == BENCHMARK_VERSION


@pytest.mark.parametrize("split", sorted(pools.SPLITS))
def test_the_committed_manifests_are_reproduced_by_a_fresh_build(split):
    committed = json.loads((pools.MANIFESTS / f"{pools.pool_name(split)}.json").read_text())
    assert len(committed["tracks"]) == pools.SPLITS[split].size
    assert committed["level_id"] == LEVEL_1.level_id and committed["split"] == split
    pool = pools.build_pool(split, size=40)
    built = [{"track_id": int(t), "geometry_hash": h} for t, h in zip(np.asarray(pool.track_id), pool.geometry_hashes)]
    assert built == committed["tracks"][:40]


def test_the_cache_is_verified_not_rebuilt_and_a_mismatch_is_named(tmp_path, monkeypatch):
    monkeypatch.setattr(pools, "MANIFESTS", tmp_path / "manifests")
    monkeypatch.setitem(pools.SPLITS, "test", pools.Split(first_seed=pools.SPLITS["test"].first_seed, size=12))
    cache = tmp_path / "cache"
    lines = []
    built = pools.materialize("test", cache, write_manifest=True, progress=lines.append)
    assert len(built) == 12 and any("12/12 tracks" in line for line in lines)

    builds, real = [], pools.build_pool

    def counted(*args, **kwargs):
        builds.append(args)
        return real(*args, **kwargs)

    monkeypatch.setattr(pools, "build_pool", counted)
    again = pools.materialize("test", cache)
    assert again.geometry_hashes == built.geometry_hashes and builds == []  # the cache was used
    manifest = pools.MANIFESTS / f"{pools.pool_name('test')}.json"
    doc = json.loads(manifest.read_text())
    doc["tracks"][5]["geometry_hash"] = "0" * 64
    manifest.write_text(json.dumps(doc))
    # The cache differs from the committed manifest: rebuilt once; the fresh build differs too: an error.
    lines.clear()
    with pytest.raises(ValueError, match="row 5"):
        pools.materialize("test", cache, progress=lines.append)
    assert len(builds) == 1
    assert any("the cached pool is damaged (another pool's files: split 'test': row 5" in line
               for line in lines), lines
    manifest.unlink()
    with pytest.raises(ValueError, match="no committed manifest"):
        pools.materialize("test", cache)


@pytest.mark.parametrize("split,size,error", [("nope", None, ValueError), ("test", 0, ValueError),
                                              ("test", True, TypeError)])
def test_bad_arguments_are_named(split, size, error):
    with pytest.raises(error, match="split|size"):
        pools.build_pool(split, size=size)


@pytest.mark.parametrize("size, error", [(0, ValueError), (-1, ValueError), (1001, ValueError), (True, TypeError),
                                         (2.0, TypeError)])
def test_a_prefix_beyond_its_split_is_refused_before_building(size, error, monkeypatch):
    monkeypatch.setattr(pools, "build_pool", lambda *a, **k: pytest.fail("built before the size was checked"))
    with pytest.raises(error, match=r"size \(None or an int, for split 'validation'\) must be"):
        pools.materialize_prefix("validation", size)
    with pytest.raises(ValueError, match=r"must be in \[1, 1000\], got 1001"):
        pools.materialize_prefix("validation", 1001)


@pytest.mark.parametrize("verbose", [False, True])
def test_warp_s_info_messages_only_with_verbose(monkeypatch, verbose):
    monkeypatch.setattr(pools, "materialize", lambda *args, **kwargs: None)
    before = wp.config.log_level
    try:
        assert pools.main(["--splits", "test"] + ["--verbose"] * verbose) == 0
        assert wp.config.log_level == (wp.LOG_INFO if verbose else wp.LOG_WARNING)
    finally:
        wp.config.log_level = before


# --------------------------------------------------------------------------- the cache's faults

NAME = f"level1_test_v{BENCHMARK_VERSION}"


@pytest.fixture(scope="module")
def small_pool():
    return pools.build_pool("test", size=3)


@pytest.fixture
def small_split(tmp_path, monkeypatch, small_pool):
    """A three-track Test split with its committed manifest under tmp_path;
    returns the cache folder and the list of builds (one None per build)."""
    monkeypatch.setattr(pools, "MANIFESTS", tmp_path / "manifests")
    builds = []

    def build(split, size=None, progress=None):
        builds.append(None)
        return small_pool

    monkeypatch.setattr(pools, "build_pool", build)
    pools.materialize("test", tmp_path / "first", write_manifest=True)
    builds.clear()
    cache = tmp_path / "cache"
    pools.materialize("test", cache)
    assert builds == [None]
    builds.clear()
    return cache, builds


def _tamper_with_a_row(path):
    with np.load(path, allow_pickle=False) as data:
        arrays = {name: data[name].copy() for name in data.files}
    arrays["centerline"][1, 5, 0] += 1.0
    path.unlink()
    np.savez(path, **arrays)


@pytest.mark.parametrize(("damage", "named"), [
    pytest.param(lambda npz, manifest: npz.unlink(), "npz is missing", id="npz-missing"),
    pytest.param(lambda npz, manifest: manifest.unlink(), "json is missing", id="manifest-missing"),
    pytest.param(lambda npz, manifest: npz.write_bytes(npz.read_bytes()[:len(npz.read_bytes()) // 2]),
                 "npz is not a readable", id="npz-truncated"),
    pytest.param(lambda npz, manifest: npz.write_bytes(b"not a zip"), "npz is not a readable", id="npz-not-a-zip"),
    pytest.param(lambda npz, manifest: npz.write_bytes(b""), "npz is not a readable", id="npz-empty"),
    pytest.param(lambda npz, manifest: manifest.write_text('{"format": 1, "tra'), "json is not valid JSON",
                 id="manifest-truncated"),
    pytest.param(lambda npz, manifest: _tamper_with_a_row(npz), r"row 1 \(track_id [0-9]+\) of .*npz: geometry hash",
                 id="row-changed"),
    # Opening a named pipe would wait for a writer for good.
    pytest.param(lambda npz, manifest: (npz.unlink(), os.mkfifo(npz)), r"npz is not a regular file \(a named pipe\)",
                 id="npz-a-named-pipe"),
    pytest.param(lambda npz, manifest: (manifest.unlink(), os.mkfifo(manifest)),
                 r"json is not a regular file \(a named pipe\)", id="manifest-a-named-pipe"),
])
def test_a_damaged_cache_entry_is_removed_and_rebuilt_once(small_split, small_pool, damage, named):
    cache, builds = small_split
    npz, manifest = cache / f"{NAME}.npz", cache / f"{NAME}.json"
    damage(npz, manifest)
    lines = []
    pool = pools.materialize("test", cache, progress=lines.append)
    assert builds == [None] and pool.geometry_hashes == small_pool.geometry_hashes
    said = [line for line in lines if "the cached pool is damaged" in line]
    assert len(said) == 1 and re.search(named, said[0]) and "rebuilding" in said[0], lines
    assert pools.materialize("test", cache).geometry_hashes == small_pool.geometry_hashes
    assert builds == [None]


@pytest.fixture(scope="module")
def validation_pool():
    return pools.build_pool("validation", size=3)


def test_a_whole_pool_of_another_split_under_this_name_is_rebuilt(validation_pool, small_split, small_pool):
    """Three Validation tracks saved under the Test pool's name: whole by
    their own manifest, not the committed Test pool; removed and rebuilt
    once, saying why."""
    cache, builds = small_split
    for part in (cache / f"{NAME}.npz", cache / f"{NAME}.json"):
        part.unlink()
    validation_pool.save(cache / f"{NAME}.npz")
    lines = []
    pool = pools.materialize("test", cache, progress=lines.append)
    assert builds == [None] and pool.geometry_hashes == small_pool.geometry_hashes
    said = [line for line in lines if "the cached pool is damaged" in line]
    assert len(said) == 1 and "(another pool's files: split 'test':" in said[0], lines
    assert pools.materialize("test", cache).geometry_hashes == small_pool.geometry_hashes and builds == [None]


def test_a_build_is_said_in_one_line_naming_why(small_split):
    """``on_build`` (evaluate's line on stderr) hears one line before each
    build: into the cache where it lacks the pool, naming the damage where
    its entry is damaged, and of a prefix (built for each run); none where
    the cache holds the pool."""
    cache, builds = small_split
    lines = []
    pools.materialize("test", cache, on_build=lines.append)
    assert lines == [] and builds == []
    (cache / f"{NAME}.json").unlink()
    pools.materialize("test", cache, on_build=lines.append)
    assert builds == [None] and len(lines) == 1, lines
    assert re.fullmatch(rf"test: rebuilding its pool in {re.escape(str(cache / NAME))}\.npz: the cached one is "
                        r"damaged \(.*json is missing\)", lines[0]), lines
    fresh = cache.parent / "fresh"
    assert pools.materialize_prefix("test", cache=fresh, on_build=lines.append) is not None
    assert lines[1:] == [f"test: building its pool of 1,000 tracks into {fresh / NAME}.npz (not in the cache yet; "
                         "built once, then verified at each use)"]
    assert pools.materialize_prefix("test", 3, on_build=lines.append) is not None
    assert lines[2:] == ["test: building its first 3 tracks (a part of a split is built for each run, not cached)"]


def test_stale_temporary_files_are_removed_and_others_kept(small_split):
    cache, _ = small_split
    stale = [f".{NAME}.npz.k3j9x_1q.tmp", f".{NAME}.json.0ab7c2de.tmp"]
    kept = [f".level1_train_v{BENCHMARK_VERSION}.npz.k3j9x_1q.tmp", f"{NAME}.npz.tmp", "notes.txt"]
    for name in stale + kept:
        (cache / name).write_bytes(b"half")
    lines = []
    pools.materialize("test", cache, progress=lines.append)
    assert sum("left by a killed run" in line for line in lines) == 2
    assert not any((cache / name).exists() for name in stale)
    assert all((cache / name).exists() for name in kept)


def test_a_run_waits_for_the_run_holding_the_lock_and_leaves_its_files_alone(small_split):
    cache, builds = small_split
    (cache / f"{NAME}.npz").unlink()
    live = cache / f".{NAME}.npz.live1234.tmp"  # the other run's file, being written
    live.write_bytes(b"half")
    lines, done = [], []
    with exclusive_lock(cache / f".{NAME}.lock"):
        runner = threading.Thread(target=lambda: done.append(pools.materialize("test", cache, progress=lines.append)))
        runner.start()
        deadline = time.monotonic() + 30
        while not any("waiting for another run" in line for line in lines) and time.monotonic() < deadline:
            time.sleep(0.01)
        time.sleep(0.2)
        assert live.exists() and builds == [] and not done, lines
    runner.join(timeout=60)
    assert len(done) == 1 and builds == [None] and not live.exists()


# A materialize-track-pool run of its own, whose build loads root/source.npz:
# "race" waits for its twin, then builds slowly; "hang-at-N" hangs at its
# N-th os.replace (1: before the npz is published, 2: before the manifest is).
RUN = """
import os, sys, time
from pathlib import Path
from racing_env import TrackPool
from racing_stack import pools

root, cache, me, mode = Path(sys.argv[1]), sys.argv[2], sys.argv[3], sys.argv[4]
pools.MANIFESTS = root / "manifests"

def build(split, size=None, progress=None):
    (root / f"built.{me}").touch()
    time.sleep(1.0 if mode == "race" else 0.0)  # both would be building at once, were they not taking turns
    return TrackPool.load(root / "source.npz")

pools.build_pool = build
if mode == "race":
    (root / f"ready.{me}").touch()
    deadline = time.monotonic() + 60
    while len(list(root.glob("ready.*"))) < 2 and time.monotonic() < deadline:
        time.sleep(0.005)
else:
    replace, replaced = os.replace, []

    def hang(src, dst):
        replaced.append(dst)
        if len(replaced) == int(mode.removeprefix("hang-at-")):
            print("hanging", flush=True)
            time.sleep(600)
        replace(src, dst)

    os.replace = hang
sys.exit(pools.main(["--splits", "test", "--cache", cache]))
"""


def _start(root, cache, me, mode):
    return subprocess.Popen([sys.executable, "-c", RUN, str(root), str(cache), me, mode],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def test_two_concurrent_runs_both_succeed_and_build_once(tmp_path, monkeypatch, small_pool):
    monkeypatch.setattr(pools, "MANIFESTS", tmp_path / "manifests")
    monkeypatch.setattr(pools, "build_pool", lambda *args, **kwargs: small_pool)
    pools.materialize("test", tmp_path / "first", write_manifest=True)
    small_pool.save(tmp_path / "source.npz")
    runs = [_start(tmp_path, tmp_path / "cache", str(i), "race") for i in range(2)]
    outputs = [run.communicate(timeout=240) for run in runs]
    assert [run.returncode for run in runs] == [0, 0], outputs
    assert len(list(tmp_path.glob("built.*"))) == 1
    assert all("3 tracks match the committed manifest" in err for _, err in outputs), outputs
    assert sorted(p.name for p in (tmp_path / "cache").iterdir()) == sorted([f".{NAME}.lock", f"{NAME}.json",
                                                                             f"{NAME}.npz"])


@pytest.mark.parametrize(("hang_at", "published"), [(1, []), (2, [f"{NAME}.npz"])])
def test_the_run_after_a_killed_one_cleans_up_and_rebuilds(small_split, small_pool, tmp_path, hang_at, published):
    _, builds = small_split
    small_pool.save(tmp_path / "source.npz")
    cache = tmp_path / "killed"
    run = _start(tmp_path, cache, "killed", f"hang-at-{hang_at}")
    try:
        assert run.stdout.readline() == "hanging\n", run.communicate(timeout=60)
    finally:
        run.kill()
        run.wait(timeout=60)
    left = sorted(p.name for p in cache.iterdir() if p.name.endswith(".tmp"))
    assert sorted(p.name for p in cache.iterdir() if not p.name.endswith(".tmp")) == [f".{NAME}.lock", *published]
    assert len(left) == 3 - hang_at  # the manifest's temporary file, and the npz's if it was not published
    lines = []
    pool = pools.materialize("test", cache, progress=lines.append)
    assert pool.geometry_hashes == small_pool.geometry_hashes and builds == [None]
    assert not any("waiting" in line for line in lines), lines  # the kill released the lock
    assert sum("left by a killed run" in line for line in lines) == len(left)
    assert any("the cached pool is damaged" in line for line in lines) == bool(published)
    assert sorted(p.name for p in cache.iterdir()) == sorted([f".{NAME}.lock", f"{NAME}.json", f"{NAME}.npz"])


@pytest.mark.parametrize("cache, variable, said", [
    ("{tmp}/cache/sub", None, "argument --cache: '{tmp}/cache' is a file, not a folder"),
    ("{tmp}/cache", None, "argument --cache: '{tmp}/cache' is a file, not a folder"),
    ("", None, "argument --cache: must name a folder, got ''"),
    ("{tmp}/" + "a" * 300, None, "argument --cache: cannot write in '{tmp}/aaaa"),
    (None, "{tmp}/cache", "argument $RACING_STACK_CACHE: '{tmp}/cache' is a file, not a folder"),
    (None, "", "$RACING_STACK_CACHE is set but empty: it must name a folder (or be unset)"),
])
def test_a_cache_that_cannot_be_made_is_a_usage_error_naming_it(tmp_path, monkeypatch, capsys, cache, variable, said):
    """A cache folder that is empty, a file, under a file or a name the
    system refuses is refused (exit 2) before anything is built."""
    monkeypatch.setattr(pools, "build_pool", lambda *args, **kwargs: pytest.fail("built without a cache"))
    (tmp_path / "cache").write_text("a file in the way")
    if variable is not None:
        monkeypatch.setenv("RACING_STACK_CACHE", variable.format(tmp=tmp_path))
    with pytest.raises(SystemExit) as stop:
        pools.main(["--splits", "test"] + ([] if cache is None else ["--cache", cache.format(tmp=tmp_path)]))
    err = capsys.readouterr().err
    assert stop.value.code == 2 and said.format(tmp=tmp_path) in err and "Traceback" not in err, err
    assert (tmp_path / "cache").read_text() == "a file in the way"
