"""Triton associative-scan kernels for RL recurrences: GAE, V-trace, Retrace,
λ-returns, discounted returns, eligibility traces and episodic prefix sums."""

from importlib.metadata import PackageNotFoundError, version

from rl_triton._launch import LaunchConfig, last_path, launch_config
from rl_triton.ops.gae import compute_gae
from rl_triton.ops.prefix_sum import compute_episodic_prefix_sum
from rl_triton.ops.retrace import compute_retrace
from rl_triton.ops.returns import (
    compute_discounted_returns,
    compute_eligibility_traces,
    compute_lambda_returns,
)
from rl_triton.ops.vtrace import compute_vtrace

try:  # the installed distribution's version: pyproject.toml is the one place it is written
    __version__ = version("rl-triton")
except PackageNotFoundError:  # a source tree on the path, not installed
    __version__ = "0+unknown"

__all__ = [
    "LaunchConfig",
    "compute_discounted_returns",
    "compute_eligibility_traces",
    "compute_episodic_prefix_sum",
    "compute_gae",
    "compute_lambda_returns",
    "compute_retrace",
    "compute_vtrace",
    "last_path",
    "launch_config",
]
