import os
import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).parent))

INTERPRET = os.environ.get("TRITON_INTERPRET", "0") == "1"


@pytest.fixture
def kernel_device() -> str:
    """Where the Triton kernels run: CUDA, or CPU through Triton's interpreter."""
    if INTERPRET:
        return "cpu"
    if torch.cuda.is_available():
        return "cuda"
    pytest.skip("runs the Triton kernels: needs CUDA, or TRITON_INTERPRET=1 in its own process")


@pytest.fixture
def cuda() -> str:
    if INTERPRET or not torch.cuda.is_available():
        pytest.skip("needs a CUDA device and compiled kernels")
    return "cuda"
