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


def _compiles(item: pytest.Item) -> bool:
    return item.nodeid.split("::")[0].endswith("test_compile.py")


def pytest_collection_modifyitems(session: pytest.Session, config: pytest.Config, items: list[pytest.Item]) -> None:
    """The sm_90 compile tests run last: the fast tests report first."""
    items.sort(key=_compiles)


def pytest_collection_finish(session: pytest.Session) -> None:
    """Say what the long, quiet part of a first run is doing."""
    count = sum(_compiles(item) for item in session.items)
    reporter = session.config.pluginmanager.get_plugin("terminalreporter")
    if count and reporter is not None:
        reporter.write_line(f"rl_triton: the last {count} tests compile every code path and tile of the kernels "
                            "for sm_90 with Triton's ptxas: minutes on 2 cores with a cold Triton cache "
                            "(~/.triton/cache), seconds with a warm one")
