"""Every code path of every kernel, and every tile, compiles for an sm_90
(Hopper) target, here, without a GPU (``RL_TRITON_COMPILE_ALL=1``: every
combination of the two), with FP fusion on as the launches ask for it.

Compiler crashes abort the process, so each op compiles in a subprocess.
"""

import os
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).with_name("compile_sm90.py")


@pytest.mark.parametrize("op", ["gae", "vtrace", "retrace", "returns", "forward"])
def test_kernels_compile_for_sm90(op):
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    out = subprocess.run([sys.executable, str(SCRIPT), op], capture_output=True, text=True,
                         env=env, timeout=900)
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.count(" ok") > 0
    assert "TRITON_DEFAULT_FP_FUSION" not in out.stderr  # FP fusion named as the launches name it
