"""The same courses on CUDA as on the CPU device (run on the GPU machine)."""

import numpy as np
import pytest
import warp as wp

from track_gen.course import Course
from track_gen.pipeline import presets

pytestmark = pytest.mark.gpu

# Transcendentals (sin, cos, atan2, sqrt) may differ in the last bits between
# the CPU and CUDA builds, so coordinates agree to a tolerance, not bitwise.
ATOL_M = 1e-4


@pytest.mark.parametrize("kind", ["track", "gates"])
def test_cpu_and_cuda_build_the_same_courses(kind, cuda):
    make = {"track": lambda d: Course.track(presets.track(num_envs=256, device=d), seeds=9),
            "gates": lambda d: Course.gates(presets.gates(num_envs=256, device=d, gate_width=0.6), seeds=9)}[kind]
    cpu, gpu = make("cpu").result, make(cuda).result
    count_cpu, count_gpu = cpu.count.numpy(), gpu.count.numpy()
    same = count_cpu == count_gpu  # ceil(L / ds) can flip at a rounding boundary
    assert same.mean() >= 0.99
    np.testing.assert_allclose(gpu.length.numpy(), cpu.length.numpy(), rtol=1e-5)
    for e in np.nonzero(same)[0]:
        n = count_cpu[e]
        np.testing.assert_allclose(gpu.center.numpy()[e, :n], cpu.center.numpy()[e, :n], atol=ATOL_M)
    assert (cpu.valid.numpy() == gpu.valid.numpy()).mean() >= 0.99
    np.testing.assert_array_equal(cpu.generation.numpy(), gpu.generation.numpy())


def test_masked_regeneration_on_cuda_keeps_unmasked_envs_bitwise(cuda):
    course = Course.track(presets.track(num_envs=128, device=cuda), seeds=3)
    before = course.result.center.numpy().copy()
    mask = wp.array((np.arange(128) % 7 == 0).astype(np.int32), dtype=wp.int32, device=cuda)
    course.regenerate(mask=mask)
    after = course.result.center.numpy()
    keep = np.arange(128) % 7 != 0
    assert before[keep].tobytes() == after[keep].tobytes()
    course.regenerate(mask=course.inputs["regen_mask"])
    assert after.tobytes() == course.result.center.numpy().tobytes()
