import pytest
import warp as wp


@pytest.fixture
def cuda() -> str:
    """A CUDA device for the tests marked ``gpu`` (skipped, never passed, without one)."""
    wp.init()
    if wp.get_cuda_device_count() == 0:
        pytest.skip("needs a CUDA device")
    return "cuda:0"


@pytest.fixture(params=["cpu", pytest.param("cuda:0", marks=pytest.mark.gpu)])
def device(request) -> str:
    """Every rule test runs on the CPU device and, marked ``gpu``, on CUDA
    (skipped, never passed, without a CUDA device)."""
    if request.param != "cpu":
        wp.init()
        if wp.get_cuda_device_count() == 0:
            pytest.skip("needs a CUDA device")
    return request.param
