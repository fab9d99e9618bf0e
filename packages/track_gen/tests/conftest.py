import pytest
import warp as wp


@pytest.fixture
def cuda() -> str:
    """A CUDA device for the tests marked ``gpu`` (skipped, never passed, without one)."""
    wp.init()
    if wp.get_cuda_device_count() == 0:
        pytest.skip("needs a CUDA device")
    return "cuda:0"
