from track_gen.course import Course
from track_gen.draw import save_png
from track_gen.pipeline import presets


def test_save_png_draws_valid_and_invalid_courses(tmp_path):
    course = Course.track(presets.track(num_envs=6, device="cpu", sdf_resolution=8, width=0.9), seeds=4)
    assert (course.result.valid.numpy() == 0).any()  # the wide track makes some invalid
    out = save_png(course, tmp_path / "courses.png", columns=3, title="test")
    data = out.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 10_000
