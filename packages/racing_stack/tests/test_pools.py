"""Level 1's pools: disjoint namespaces, the first valid seeds in order,
committed manifests that a fresh CPU build reproduces, a cache verified
instead of rebuilt, mismatches named."""

import json

import numpy as np
import pytest
import warp as wp
from racing_env import BENCHMARK_VERSION, LEVEL_1
from track_gen.course import Course
from track_gen.pipeline import presets

from racing_stack import pools


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

    def no_rebuild(*args, **kwargs):
        raise AssertionError("the cache should have been used")

    monkeypatch.setattr(pools, "build_pool", no_rebuild)
    again = pools.materialize("test", cache)
    assert again.geometry_hashes == built.geometry_hashes
    manifest = pools.MANIFESTS / f"{pools.pool_name('test')}.json"
    doc = json.loads(manifest.read_text())
    doc["tracks"][5]["geometry_hash"] = "0" * 64
    manifest.write_text(json.dumps(doc))
    with pytest.raises(ValueError, match="row 5"):
        pools.materialize("test", cache)
    manifest.unlink()
    with pytest.raises(ValueError, match="no committed manifest"):
        pools.materialize("test", cache)


@pytest.mark.parametrize("split,size", [("nope", None), ("test", 0), ("test", True)])
def test_bad_arguments_are_named(split, size):
    with pytest.raises(ValueError, match="split|size"):
        pools.build_pool(split, size=size)


@pytest.mark.parametrize("size", [0, -1, 1001, True, 2.0])
def test_a_prefix_beyond_its_split_is_refused_before_building(size, monkeypatch):
    monkeypatch.setattr(pools, "build_pool", lambda *a, **k: pytest.fail("built before the size was checked"))
    with pytest.raises(ValueError, match=r"size must be None or an int in \[1, 1000\] for split 'validation'"):
        pools.materialize_prefix("validation", size)


@pytest.mark.parametrize("verbose", [False, True])
def test_warp_s_info_messages_only_with_verbose(monkeypatch, verbose):
    monkeypatch.setattr(pools, "materialize", lambda *args, **kwargs: None)
    before = wp.config.log_level
    try:
        assert pools.main(["--splits", "test"] + ["--verbose"] * verbose) == 0
        assert wp.config.log_level == (wp.LOG_INFO if verbose else wp.LOG_WARNING)
    finally:
        wp.config.log_level = before
