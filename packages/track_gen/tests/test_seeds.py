"""Seeds and epochs: the rules of the RL auto-reset page."""

import numpy as np
import pytest
import warp as wp
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from track_gen.course import Course
from track_gen.pipeline import presets
from track_gen.seeds import (PerEnvSeededRNG, effective_seed, effective_seed_wp, per_env_seeds)

SEEDS = st.integers(0, 2**32 - 1)
EPOCHS = st.integers(0, 2**31 - 1)


@given(SEEDS)
def test_epoch_zero_uses_the_seed_itself(seed):
    assert effective_seed(seed, 0) == seed


@given(SEEDS, st.integers(1, 2**31 - 1))
def test_other_epochs_use_a_hash_of_the_pair(seed, epoch):
    h = effective_seed(seed, epoch)
    assert 0 <= h < 2**32
    assert h == effective_seed(seed, epoch)  # a function of the pair


def test_hash_separates_seeds_and_epochs():
    pairs = [(s, e) for s in range(64) for e in range(1, 65)]
    hashes = {effective_seed(s, e) for s, e in pairs}
    assert len(hashes) == len(pairs)
    # Neighbouring envs at the next epoch do not land on each other's seeds.
    assert all(effective_seed(s, 1) not in range(64) for s in range(64))


@wp.kernel
def _effective(seeds: wp.array(dtype=wp.uint32), epochs: wp.array(dtype=wp.int32),
               out: wp.array(dtype=wp.uint32)):
    i = wp.tid()
    out[i] = effective_seed_wp(seeds[i], epochs[i])


@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(st.tuples(SEEDS, EPOCHS), min_size=1, max_size=50))
def test_warp_function_gives_the_same_bits(device, pairs):
    seeds = wp.array([s for s, _ in pairs], dtype=wp.uint32, device=device)
    epochs = wp.array([e for _, e in pairs], dtype=wp.int32, device=device)
    out = wp.zeros(len(pairs), dtype=wp.uint32, device=device)
    wp.launch(_effective, len(pairs), [seeds, epochs, out], device=device)
    assert out.numpy().tolist() == [effective_seed(s, e) for s, e in pairs]


def test_int_seeds_count_up_per_env_modulo_2_32():
    assert per_env_seeds(7, 3).tolist() == [7, 8, 9]
    assert per_env_seeds(2**32 - 2, 4).tolist() == [2**32 - 2, 2**32 - 1, 0, 1]


def test_array_seeds_are_per_env():
    assert per_env_seeds(np.array([5, 1, 9]), 3).tolist() == [5, 1, 9]


@pytest.mark.parametrize("seeds,error,match", [
    (True, TypeError, "got bool"),
    (-1, ValueError, r"in \[0, 2\*\*32\)"),
    (np.array([1.5, 2.0]), TypeError, "array of ints"),
    (np.array([1, 2]), ValueError, r"shape \[3\]"),
    (np.array([1, 2, 2**32]), ValueError, r"in \[0, 2\*\*32\)"),
])
def test_bad_seeds_are_refused(seeds, error, match):
    with pytest.raises(error, match=match):
        per_env_seeds(seeds, 3)


@pytest.mark.parametrize("seed,epoch,error", [(1.0, 0, TypeError), (1, -1, ValueError),
                                              (2**32, 0, ValueError), (1, True, TypeError)])
def test_effective_seed_refuses_bad_input(seed, epoch, error):
    with pytest.raises(error):
        effective_seed(seed, epoch)


def test_rng_owns_seeds_and_epochs_on_the_device(device):
    rng = PerEnvSeededRNG(100, 4, device=device)
    assert rng.seeds_warp.dtype == wp.uint32 and rng.seeds_warp.shape == (4,)
    assert rng.effective_seeds().tolist() == [100, 101, 102, 103]
    rng.epochs.assign(np.array([0, 1, 2, 3], dtype=np.int32))
    assert rng.effective_seeds().tolist() == [effective_seed(100 + e, e) for e in range(4)]
    rng.reset_epoch()
    assert rng.epochs.numpy().tolist() == [0, 0, 0, 0]
    with pytest.raises(ValueError, match="num_envs"):
        PerEnvSeededRNG(0, 0)


def test_a_warp_seed_array_is_used_by_reference(device):
    """The page: seeds written into the array passed as seeds= take effect at
    the next regeneration that selects the env (a Warp array on the course
    device is that array; other arrays are copied)."""
    seeds = wp.array(np.arange(100, 104, dtype=np.uint32), dtype=wp.uint32, device=device)
    course = Course.track(presets.track(num_envs=4, device=device, sdf_resolution=8), seeds=seeds)
    assert course.rng.seeds_warp is seeds
    fresh = Course.track(presets.track(num_envs=4, device=device, sdf_resolution=8), seeds=[100, 101, 777, 103])
    center = course.result.center.numpy().copy()
    seeds.assign(np.array([100, 101, 777, 103], dtype=np.uint32))
    course.regenerate(mask=wp.array([0, 0, 1, 0], dtype=wp.int32, device=device), advance=False)
    np.testing.assert_array_equal(course.result.center.numpy()[2], fresh.result.center.numpy()[2])
    np.testing.assert_array_equal(course.result.center.numpy()[[0, 1, 3]], center[[0, 1, 3]])


def test_other_seed_arrays_are_copied(device):
    host = np.arange(100, 104, dtype=np.uint32)
    course = Course.track(presets.track(num_envs=4, device=device, sdf_resolution=8), seeds=host)
    before = course.result.center.numpy().copy()
    host[2] = 777
    course.regenerate(mask=wp.array([0, 0, 1, 0], dtype=wp.int32, device=device), advance=False)
    np.testing.assert_array_equal(course.result.center.numpy(), before)


@pytest.mark.parametrize("seeds,error", [
    (lambda d: wp.zeros(4, dtype=wp.int32, device=d), TypeError),
    (lambda d: wp.zeros(3, dtype=wp.uint32, device=d), ValueError),
])
def test_unusable_warp_seed_arrays_are_refused(device, seeds, error):
    with pytest.raises(error, match="seeds"):
        Course.track(presets.track(num_envs=4, device=device), seeds=seeds(device))
