"""CPU tensors work without a GPU and say which path answered."""

import os

import numpy as np
import pytest

import rl_triton
from rollouts import OPS, REFERENCES, assert_matches, rollout, run

pytestmark = pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") == "1",
                                reason="the reference path is taken only without the interpreter")


@pytest.mark.parametrize("op", sorted(OPS))
def test_cpu_tensors_take_the_reference_path(op):
    batch = rollout(3, 17, seed=12)
    got = run(op, batch, "cpu")
    assert rl_triton.last_path() == "reference"
    assert_matches(got, REFERENCES[op](batch))
    assert all(g.dtype == np.float32 for g in got)


def test_public_module_paths():
    """The module paths of the public rl-triton 0.1.x API."""
    from rl_triton.ops.gae import compute_gae
    from rl_triton.ops.prefix_sum import compute_episodic_prefix_sum
    from rl_triton.ops.retrace import compute_retrace
    from rl_triton.ops.returns import (compute_discounted_returns, compute_eligibility_traces,
                                       compute_lambda_returns)
    from rl_triton.ops.vtrace import compute_vtrace

    assert compute_gae is rl_triton.compute_gae
    assert compute_vtrace is rl_triton.compute_vtrace
    assert compute_retrace is rl_triton.compute_retrace
    assert compute_lambda_returns is rl_triton.compute_lambda_returns
    assert compute_discounted_returns is rl_triton.compute_discounted_returns
    assert compute_eligibility_traces is rl_triton.compute_eligibility_traces
    assert compute_episodic_prefix_sum is rl_triton.compute_episodic_prefix_sum
