"""Masks, seeds and epochs: every rule of the RL auto-reset page about generation."""

import numpy as np
import pytest
import warp as wp

from track_gen.course import Course
from track_gen.errors import CaptureError
from track_gen.pipeline import presets
from track_gen.seeds import PerEnvSeededRNG, effective_seed

E = 12
FIELDS = ["center", "count", "arc", "tangent", "normal", "left", "right", "length", "width",
          "checkpoints", "num_checkpoints", "sdf", "sdf_origin", "sdf_cell", "height", "valid",
          "fail_mask", "generation"]


def build(device, seeds=42, num_envs=E):
    return Course.track(presets.track(num_envs=num_envs, device=device, sdf_resolution=16), seeds=seeds)


def snapshot(course):
    return {f: getattr(course.result, f).numpy().copy() for f in FIELDS}


def same_bits(a, b):
    return a.tobytes() == b.tobytes()


def mask_of(device, envs, num_envs=E):
    return wp.array(np.isin(np.arange(num_envs), envs).astype(np.int32), dtype=wp.int32, device=device)


def test_masks_are_stable_zero_initialised_and_never_cleared(device):
    course = build(device)
    regen, reset = course.inputs["regen_mask"], course.inputs["reset_mask"]
    assert regen.dtype == wp.int32 and regen.shape == (E,) and not regen.numpy().any()
    assert reset.dtype == wp.int32 and reset.shape == (E,) and not reset.numpy().any()
    regen.assign(mask_of(device, [1]).numpy())
    course.regenerate(mask=regen)
    assert course.inputs["regen_mask"] is regen
    assert regen.numpy().tolist() == mask_of(device, [1]).numpy().tolist()


def test_all_zero_mask_is_an_exact_no_op(device):
    course = build(device)
    before = snapshot(course)
    epochs = course.rng.epochs.numpy().copy()
    course.regenerate(mask=course.inputs["regen_mask"], advance=True)
    after = snapshot(course)
    assert all(same_bits(before[f], after[f]) for f in FIELDS)
    assert same_bits(epochs, course.rng.epochs.numpy())


def test_masked_envs_get_new_courses_and_unmasked_envs_stay_bitwise(device):
    course = build(device)
    before = snapshot(course)
    course.regenerate(mask=mask_of(device, [0, 5]), advance=True)
    after = snapshot(course)
    for f in FIELDS:
        keep = [e for e in range(E) if e not in (0, 5)]
        assert same_bits(before[f][keep], after[f][keep]), f
    for e in (0, 5):
        assert not same_bits(before["center"][e], after["center"][e])
    assert after["generation"].tolist() == [1 if e in (0, 5) else 0 for e in range(E)]


def test_generation_changes_exactly_when_a_course_is_new(device):
    course = build(device)
    gens = []
    for envs in ([2], [], [2, 3], [3]):
        course.regenerate(mask=mask_of(device, envs), advance=True)
        gens.append(course.result.generation.numpy().copy())
    assert gens[-1][2] == 2 and gens[-1][3] == 2 and gens[-1][0] == 0
    assert same_bits(gens[0], gens[1])  # an empty mask builds nothing new


def test_advance_false_rebuilds_the_same_course_unless_seeds_were_written(device):
    course = build(device)
    course.regenerate(mask=mask_of(device, [4]), advance=True)
    before = snapshot(course)
    course.regenerate(mask=mask_of(device, [4]), advance=False)
    after = snapshot(course)
    assert all(same_bits(before[f], after[f]) for f in FIELDS)
    seeds = course.rng.seeds_warp.numpy().copy()
    seeds[4] = 999
    course.rng.seeds_warp.assign(seeds)
    course.regenerate(mask=mask_of(device, [4]), advance=False)
    assert not same_bits(before["center"][4], course.result.center.numpy()[4])
    assert course.result.generation.numpy()[4] == 1  # the epoch, not a counter


def test_written_seeds_never_change_unmasked_envs(device):
    course = build(device)
    before = snapshot(course)
    course.rng.seeds_warp.assign(np.arange(E, dtype=np.uint32) + 7000)
    course.regenerate(mask=mask_of(device, [1]), advance=False)
    keep = [e for e in range(E) if e != 1]
    assert same_bits(before["center"][keep], course.result.center.numpy()[keep])


def test_effective_seed_rebuilds_any_episode_in_a_fresh_course(device):
    course = build(device, seeds=100)
    for _ in range(3):
        course.regenerate(mask=mask_of(device, [7]), advance=True)
    epoch = int(course.result.generation.numpy()[7])
    fresh = build(device, seeds=effective_seed(107, epoch), num_envs=1)
    n = int(course.result.count.numpy()[7])
    assert same_bits(fresh.result.center.numpy()[0, :n], course.result.center.numpy()[7, :n])
    assert fresh.result.generation.numpy()[0] == 0


def test_generate_reseeds_everyone_and_zeroes_epochs(device):
    course = build(device, seeds=1)
    course.regenerate(advance=True)
    assert (course.result.generation.numpy() == 1).all()
    course.generate(seeds=55)
    fresh = build(device, seeds=55)
    assert all(same_bits(snapshot(course)[f], snapshot(fresh)[f]) for f in FIELDS)
    assert (course.rng.epochs.numpy() == 0).all()


def test_regenerate_without_a_mask_regenerates_every_env(device):
    course = build(device)
    before = snapshot(course)
    course.regenerate()
    assert (course.result.generation.numpy() == 1).all()
    assert all(not same_bits(before["center"][e], course.result.center.numpy()[e]) for e in range(E))


def test_seeds_array_and_per_env_rng(device):
    seeds = np.arange(E, dtype=np.uint32) * 3
    a = build(device, seeds=seeds)
    b = Course.track(presets.track(num_envs=E, device=device, sdf_resolution=16),
                     seeds=PerEnvSeededRNG(seeds, E, device))
    assert same_bits(a.result.center.numpy(), b.result.center.numpy())


def test_deprecated_aliases_warn_and_still_work(device):
    course = build(device)
    with pytest.warns(DeprecationWarning, match="Course.rng"):
        assert course.seeds is course.rng
    before = course.result.generation.numpy().copy()
    with pytest.warns(DeprecationWarning, match="enqueue"):
        course.generator.enqueue_generate(mask=course.generator.everyone, advance=True)
    np.testing.assert_array_equal(course.result.generation.numpy(), before + 1)


def test_generation_entry_points_take_the_mask_first_and_advance_by_keyword(device):
    course = build(device)
    with pytest.raises(TypeError):
        course.generator.generate(course.generator.everyone, False)  # advance is keyword-only
    with pytest.raises(TypeError, match="mask"):
        course.generator.enqueue(False)  # the old (advance, mask) order fails loudly


@pytest.mark.parametrize("make,error,match", [
    (lambda d: np.zeros(E, np.int32), TypeError, "must be a warp array"),
    (lambda d: wp.zeros(E, dtype=wp.float32, device=d), TypeError, "dtype int32"),
    (lambda d: wp.zeros(E + 1, dtype=wp.int32, device=d), ValueError, r"shape \[12\]"),
    (lambda d: wp.zeros((2 * E,), dtype=wp.int32, device=d)[::2], ValueError, "contiguous"),
])
def test_bad_masks_raise_and_change_nothing(device, make, error, match):
    course = build(device)
    before = snapshot(course)
    epochs = course.rng.epochs.numpy().copy()
    with pytest.raises(error, match=match):
        course.regenerate(mask=make(device), advance=True)
    assert all(same_bits(before[f], snapshot(course)[f]) for f in FIELDS)
    assert same_bits(epochs, course.rng.epochs.numpy())


def test_construction_inside_a_capture_raises(device):
    spec = presets.track(num_envs=2, device=device)
    with wp.ScopedCapture(device=device):
        with pytest.raises(CaptureError):
            Course.track(spec)


def test_bad_construction_arguments():
    with pytest.raises(ValueError, match="collision"):
        Course.track(presets.track(num_envs=2), collision="disc")
    with pytest.raises(ValueError, match="num_envs"):
        presets.track(num_envs=0)
    with pytest.raises(ValueError, match="checkpoint_spacing"):
        Course.track(presets.track(num_envs=2), checkpoint_spacing=0.0)
    with pytest.raises(ValueError, match="scale"):
        presets.track(num_envs=2, scale=-1.0)
