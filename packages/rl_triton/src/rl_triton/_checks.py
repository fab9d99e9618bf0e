"""Argument checks: cheap structural ones on every call, data checks behind a flag.

Structural checks look only at tensor metadata (type, dtype, device, shape) and
never synchronise with the device, so every op stays capturable in a CUDA
graph. Data checks read values (one host synchronisation each) and run only
when ``RL_TRITON_CORRECTNESS_WARNINGS=1``.
"""

from __future__ import annotations

import math
import os
import sys
import warnings
from typing import Literal

import torch

CORRECTNESS_FLAG = "RL_TRITON_CORRECTNESS_WARNINGS"

Kind = Literal["float", "flag", "index"]

_FLOAT_DTYPES = (torch.float32, torch.float16, torch.bfloat16, torch.float64)
_INDEX_DTYPES = (torch.int64, torch.int32, torch.int16, torch.int8, torch.uint8)
_FLAG_DTYPES = _FLOAT_DTYPES + _INDEX_DTYPES + (torch.bool,)
_ALLOWED = {"float": _FLOAT_DTYPES, "flag": _FLAG_DTYPES, "index": _INDEX_DTYPES}
_DESCRIBED = {
    "float": "a floating-point dtype (float32, float16, bfloat16 or float64)",
    "flag": "a float, integer or bool dtype (nonzero means set)",
    "index": "an integer dtype",
}


def correctness_warnings_enabled() -> bool:
    """True when ``RL_TRITON_CORRECTNESS_WARNINGS=1`` turns the data checks on."""
    return os.environ.get(CORRECTNESS_FLAG, "0") == "1"


def sequence(name: str, x: object) -> tuple[int, int]:
    """Check the op's leading ``[num_envs, seq_len]`` float tensor; return ``(E, T)``."""
    x = tensor(name, x, "float")
    if x.dim() != 2:
        raise ValueError(f"{name} must have shape [num_envs, seq_len], got {tuple(x.shape)}")
    num_envs, seq_len = x.shape
    if num_envs < 1 or seq_len < 1:
        raise ValueError(f"{name} must have num_envs >= 1 and seq_len >= 1, got {tuple(x.shape)}")
    return num_envs, seq_len


def tensor(name: str, x: object, kind: Kind) -> torch.Tensor:
    """``x`` is a torch tensor of the dtype family ``kind``; returned as is."""
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(x).__name__}")
    if x.dtype not in _ALLOWED[kind]:
        raise TypeError(f"{name} must have {_DESCRIBED[kind]}, got {x.dtype}")
    return x


def like(name: str, x: object, ref: torch.Tensor, ref_name: str, kind: Kind,
         shape: tuple[int, ...] | None = None) -> torch.Tensor:
    """``x`` matches ``ref``'s device and ``shape`` (default ``ref.shape``); made contiguous."""
    if not isinstance(x, torch.Tensor) or x.dtype not in _ALLOWED[kind]:
        tensor(name, x, kind)
    if x.device != ref.device:
        raise ValueError(f"{name} must be on {ref_name}'s device {ref.device}, got {x.device}")
    expected = ref.shape if shape is None else shape
    if x.shape != expected:
        raise ValueError(f"{name} must have shape {list(expected)}, got {list(x.shape)}")
    return x.contiguous()


def unit_interval(name: str, value: object) -> float:
    """A real number in [0, 1] (discounts and trace parameters)."""
    v = real(name, value)
    if not 0.0 <= v <= 1.0:
        raise ValueError(f"{name} must be in [0, 1], got {v}")
    return v


def positive(name: str, value: object) -> float:
    """A real number > 0 (importance-ratio clips)."""
    v = real(name, value)
    if not v > 0.0:
        raise ValueError(f"{name} must be > 0, got {v}")
    return v


def real(name: str, value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"{name} must be a Python float, got {type(value).__name__}")
    try:
        v = float(value)
    except OverflowError:  # an int beyond float64's range
        raise ValueError(f"{name} must be a real number a float can hold, got an int of "
                         f"{value.bit_length()} bits") from None
    if math.isnan(v):
        raise ValueError(f"{name} must not be NaN")
    return v


def exclusive(**named: object) -> None:
    """At most one of the named arguments is given (not None)."""
    given = [k for k, v in named.items() if v is not None]
    if len(given) > 1:
        raise ValueError(f"{' and '.join(given)} are mutually exclusive: pass one of them")


def episode_ends(
    ref: torch.Tensor, ref_name: str, terminateds: object, truncateds: object,
    bootstrap_values: object, last_value: object = None,
) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None, torch.Tensor | None]:
    """Check the episode-boundary arguments shared by the backward ops.

    ``terminateds`` (and ``truncateds``) are ``[E, T]`` flags like ``ref``;
    ``bootstrap_values`` is ``[E, T]``; ``last_value`` is ``[E]`` and excludes
    both ``bootstrap_values`` and ``truncateds``. Runs the data checks when the
    correctness flag is on. Returns the four, contiguous.
    """
    terminateds = like("terminateds", terminateds, ref, ref_name, "flag")
    if truncateds is not None:
        truncateds = like("truncateds", truncateds, ref, ref_name, "flag")
    if last_value is not None:
        if bootstrap_values is not None:
            exclusive(last_value=last_value, bootstrap_values=bootstrap_values)
        if truncateds is not None:
            exclusive(last_value=last_value, truncateds=truncateds)
        last_value = like("last_value", last_value, ref, ref_name, "float", (ref.shape[0],))
    if bootstrap_values is not None:
        bootstrap_values = like("bootstrap_values", bootstrap_values, ref, ref_name, "float")
    if correctness_warnings_enabled():
        warn_data(terminateds=terminateds, truncateds=truncateds, bootstrap_values=bootstrap_values)
    return terminateds, truncateds, bootstrap_values, last_value


def boundary_mode(value: object) -> str:
    if value not in ("ends_at", "starts_at"):
        raise ValueError(f"boundary must be 'ends_at' or 'starts_at', got {value!r}")
    return str(value)


def warn_data(
    terminateds: torch.Tensor | None = None,
    truncateds: torch.Tensor | None = None,
    bootstrap_values: torch.Tensor | None = None,
    truncation_zeroed: tuple[str, torch.Tensor] | None = None,
    actions: tuple[torch.Tensor, int] | None = None,
) -> None:
    """The data checks behind ``RL_TRITON_CORRECTNESS_WARNINGS=1``; each finding is a
    ``RuntimeWarning`` naming the argument."""
    if terminateds is not None and truncateds is not None:
        if bool(((terminateds != 0) & (truncateds != 0)).any()):
            _warn("terminateds and truncateds are both set at one step; a step ends "
                  "one way: terminated wins for the bootstrap")
    if bootstrap_values is not None:
        interior = bootstrap_values[:, :-1] != 0
        if truncateds is not None:
            interior &= truncateds[:, :-1] == 0
        if bool(interior.any()):
            _warn("bootstrap_values is nonzero at interior non-truncated steps; "
                  "those entries are ignored")
    if truncation_zeroed is not None and truncateds is not None:
        name, x = truncation_zeroed
        if bool(((truncateds != 0) & (x != 0)).any()):
            _warn(f"{name} is nonzero at truncated steps; zero it there "
                  "(bootstrap_values carries the continuation value)")
    if actions is not None:
        idx, num_actions = actions
        if bool(((idx < 0) | (idx >= num_actions)).any()):
            _warn(f"actions has entries outside [0, {num_actions}); their probability is taken as 0")


#: This package's folder: a warning is attributed to the first frame outside it.
_PACKAGE = os.path.dirname(os.path.abspath(__file__))


def _warn(message: str) -> None:
    """A ``RuntimeWarning`` attributed to the caller's line (the first frame
    outside rl_triton), whatever the op's call depth."""
    frame, level = sys._getframe(1), 2  # stacklevel 2 is the frame that called _warn
    while frame is not None and os.path.abspath(frame.f_code.co_filename).startswith(_PACKAGE + os.sep):
        frame, level = frame.f_back, level + 1
    warnings.warn(message, RuntimeWarning, stacklevel=level)
