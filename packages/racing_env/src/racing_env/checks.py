"""The validation vocabulary of racing_env and racing_stack: argument checks
whose errors name the argument and what was expected.

One exception type per fault: a wrong type (a bool or a float where an int
belongs, a string where a number belongs) raises ``TypeError``; a value of
the right type outside its range (NaN, an infinity, a negative count)
raises ``ValueError``. Scalars: ``integer_in``, ``real``, ``real_in``,
``positive``, ``check_name``; a table of settings: ``settings_table``;
then the shapes, kinds and values of tracks and pools, which ``Track``,
``TrackPool`` and ``track_files`` share.
"""

from __future__ import annotations

import dataclasses
import math
import numbers
import operator
import re
import reprlib
from collections.abc import Mapping, Sequence
from typing import Any, TypeVar

import jax.numpy as jnp
import numpy as np

from racing_env.types import MIN_TRACK_POINTS, TRACK_CAPACITY

UINT32_LIMIT = 2**32
_D = TypeVar("_D")
NAME_PATTERN = re.compile(r"[0-9A-Za-z._-]{1,32}")
#: The pool fields that hold points (float32, m).
FLOAT_FIELDS = ("centerline", "left_boundary", "right_boundary")


def integer_in(value: object, name: str, low: int, end: int | None = None, end_text: str | None = None) -> int:
    """``value`` as a Python int in ``[low, end)`` (``[low, inf)`` for ``end=None``).

    Takes what ``operator.index`` takes (ints, NumPy and JAX integer
    scalars, 0-d integer arrays) but bools.

    Raises:
        TypeError: bools, floats and non-integers.
        ValueError: an int outside the range; the message spells it
            ``[low, end - 1]``, or ``[low, end_text)`` when given (e.g.
            ``"2**32"``).
    """
    if isinstance(value, (bool, np.bool_)) or getattr(value, "dtype", None) == np.bool_:
        raise TypeError(f"{name} must be an int, got a bool")
    try:
        value = operator.index(value)
    except TypeError:
        raise TypeError(f"{name} must be an int, got {type(value).__name__} {shown(value)}") from None
    if end is None and value < low:
        raise ValueError(f"{name} must be >= {low}, got {shown(value)}")
    if end is not None and not low <= value < end:
        interval = f"[{low}, {end_text})" if end_text else f"[{low}, {end - 1}]"
        raise ValueError(f"{name} must be in {interval}, got {shown(value)}")
    return value


def _real(value: object, name: str) -> float:
    """``value`` as a Python float (``inf`` for an int beyond a float's range)."""
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, numbers.Real):
        raise TypeError(f"{name} must be a real number, got {type(value).__name__} {shown(value)}")
    try:
        return float(value)
    except OverflowError:
        return math.inf


def real(value: object, name: str) -> float:
    """``value`` as a finite Python float.

    Raises:
        TypeError: bools and non-reals (strings, None, complex numbers).
        ValueError: NaN, an infinity, or an int too large for a float.
    """
    result = _real(value, name)
    if not math.isfinite(result):
        raise ValueError(f"{name} must be finite, got {shown(value)}")
    return result


def real_in(value: object, name: str, low: float, high: float, *, low_open: bool = False,
            high_open: bool = False, unit: str = "") -> float:
    """``value`` as a finite Python float in the interval from ``low`` to
    ``high``, either end open or closed.

    Raises:
        TypeError: as ``real``.
        ValueError: NaN, an infinity, or a value outside the interval.
    """
    result = _real(value, name)
    below = result <= low if low_open else result < low
    above = result >= high if high_open else result > high
    if not math.isfinite(result) or below or above:
        interval = f"{'(' if low_open else '['}{low:g}, {high:g}{')' if high_open else ']'}"
        raise ValueError(f"{name} must be in {interval}{' ' + unit if unit else ''}, got {shown(value)}")
    return result


def positive(value: object, name: str) -> float:
    """``value`` as a finite Python float ``> 0``.

    Raises:
        TypeError: as ``real``.
        ValueError: NaN, an infinity, or a value ``<= 0``.
    """
    result = _real(value, name)
    if not (math.isfinite(result) and result > 0):
        raise ValueError(f"{name} must be finite and > 0, got {shown(value)}")
    return result


def settings_table(kind: type[_D], value: object, name: str) -> _D:
    """``kind`` (a dataclass of settings) built from ``value``, a mapping of
    some of its settings by name (the others take their defaults).

    Raises:
        TypeError: ``value`` is not a mapping.
        ValueError: a name that is not one of ``kind``'s settings (or not
            a string). ``kind``'s own refusals of a value pass through
            (they name the setting).
    """
    if not isinstance(value, Mapping):
        raise TypeError(f"{name} must be a table (a mapping of its settings by name), got {shown(value)}")
    known = [field.name for field in dataclasses.fields(kind)]
    unknown = [key for key in value if not isinstance(key, str) or key not in known]
    if unknown:
        raise ValueError(f"{name} has no setting {shown(unknown[0])}; its settings are {known}")
    return kind(**value)


_REPR = reprlib.Repr()
_REPR.maxstring = _REPR.maxother = _REPR.maxlong = 60


def shown(value: object) -> str:
    """``repr(value)``, at most 60 characters (an int of 400 digits is cut)."""
    return _REPR.repr(value)


def no_render_mode(render_mode: object, env: str) -> None:
    """Refuse any ``render_mode`` but None: the envs render nothing
    themselves (their ``metadata["render_modes"]`` is empty).

    Raises:
        ValueError: any other value, naming ``render_mode`` and the way to
            watch or record episodes.
    """
    if render_mode is not None:
        raise ValueError(
            f"render_mode must be None, got {render_mode!r}: {env} renders nothing itself "
            "(metadata['render_modes'] is empty); to watch or record episodes pass a "
            "racing_env.render.EpisodeView to racing_env.runner.run(..., view=...), or run "
            "sim/evaluate with --render or --record FILE"
        )


def is_floating(dtype: Any) -> bool:
    # jnp.issubdtype knows the ml_dtypes floats (bfloat16, ...), np.issubdtype does not.
    return bool(jnp.issubdtype(dtype, jnp.floating))


def is_integer_or_bool(dtype: Any) -> bool:
    return bool(jnp.issubdtype(dtype, jnp.integer) or jnp.issubdtype(dtype, jnp.bool_))


def host_array(name: str, value: Any) -> np.ndarray:
    """``np.asarray(value)``, with errors that name the argument."""
    try:
        return np.asarray(value)
    except (ValueError, TypeError) as err:
        raise ValueError(f"{name} must be a rectangular numeric array: {err}") from None


def to_float32(arr: np.ndarray) -> np.ndarray:
    """A fresh float32 copy; values beyond float32's range become inf (callers check finiteness)."""
    with np.errstate(over="ignore"):
        return arr.astype(np.float32, copy=True)


def check_shape(name: str, shape: tuple[int, ...], expected: tuple[int, ...], how: str) -> None:
    if tuple(shape) != expected:
        raise ValueError(f"{name} must have shape {how} = {expected}, got {tuple(shape)}")


def check_float_kind(name: str, dtype: Any) -> None:
    if not is_floating(dtype):
        raise TypeError(f"{name} must have a real floating dtype (converted to float32), "
                        f"got {str(dtype)}")


def check_int_kind(name: str, dtype: Any) -> None:
    if not is_integer_or_bool(dtype):
        raise TypeError(f"{name} must have an integer dtype, got {str(dtype)}")


def check_id_kind(name: str, dtype: Any) -> None:
    if jnp.issubdtype(dtype, jnp.bool_) or not jnp.issubdtype(dtype, jnp.integer):
        raise TypeError(f"{name} must have an integer dtype (converted to uint32), got {str(dtype)}")


def check_track_id(name: str, value: Any) -> np.uint32:
    return np.uint32(integer_in(value, name, 0, UINT32_LIMIT, "2**32"))


def positive_length(name: str, value: Any) -> np.float32:
    """A float32 scalar, finite and > 0, from a real number (bools refused)."""
    if isinstance(value, (bool, np.bool_)):
        raise TypeError(f"{name} must be a real number, got a bool")
    arr = host_array(name, value)
    if arr.shape != ():
        raise ValueError(f"{name} must be a scalar, got shape {arr.shape}")
    if not (is_floating(arr.dtype) or jnp.issubdtype(arr.dtype, jnp.integer)):
        raise TypeError(f"{name} must be a real number, got {str(arr.dtype)}")
    length = np.float32(to_float32(arr))
    if not (np.isfinite(length) and length > 0):
        raise ValueError(f"{name} must be finite and > 0 (m, as float32), got {arr.item()!r}")
    return length


def check_name(name: str, value: Any) -> str:
    """A short identifier: a str of 1-32 characters from ``[0-9A-Za-z._-]``."""
    if not isinstance(value, str):
        raise TypeError(f"{name} must be a str, got {type(value).__name__}")
    if not NAME_PATTERN.fullmatch(value):
        raise ValueError(f"{name} must be 1-32 characters from [0-9A-Za-z._-], got {value!r}")
    return value


def check_items(name: str, items: Any, kind: type) -> None:
    """Refuse anything but a non-empty sequence of ``kind``, naming the item."""
    if isinstance(items, (str, bytes)) or not isinstance(items, Sequence):
        raise TypeError(f"{name} must be a sequence of {kind.__name__}, got {type(items).__name__}")
    for i, item in enumerate(items):
        if not isinstance(item, kind):
            raise TypeError(f"{name}[{i}] must be a {kind.__name__}, got {type(item).__name__}")
    if len(items) == 0:
        raise ValueError(f"{name} must hold at least one {kind.__name__}")


def check_level_id(value: Any) -> int:
    return integer_in(value, "level_id", 0)


def check_values(arrays: dict[str, np.ndarray], rows: bool = True) -> None:
    """Value checks on host arrays of a pool (leading ``[P]``), already in their final dtypes.

    Mask values other than 0/1 are refused before the int8 cast by the caller (a cast could
    hide them). ``rows=False`` drops the row from messages (a single Track).
    """
    ids = arrays["track_id"]

    def _row(index: int, ids: np.ndarray) -> str:
        return f"row {index} (track_id {int(ids[index])})" if rows else "(a Track)"

    mask = arrays["track_mask"]
    counts = mask.sum(axis=1, dtype=np.int64)
    prefix = np.arange(TRACK_CAPACITY)[None, :] < counts[:, None]
    bad = np.flatnonzero(~np.all(mask == prefix, axis=1))
    if bad.size:
        raise ValueError(f"track_mask {_row(int(bad[0]), ids)} must be a prefix of ones followed by zeros")
    bad = np.flatnonzero(counts < MIN_TRACK_POINTS)
    if bad.size:
        i = int(bad[0])
        raise ValueError(f"track_mask {_row(i, ids)} has {int(counts[i])} valid points, "
                         f"needs at least MIN_TRACK_POINTS = {MIN_TRACK_POINTS}")
    for name in FLOAT_FIELDS:
        values = arrays[name]
        bad = np.flatnonzero(~np.all(np.isfinite(values), axis=(1, 2)))
        if bad.size:
            raise ValueError(f"{name} {_row(int(bad[0]), ids)} is not finite")
        bad = np.flatnonzero(np.any((values != 0) & ~prefix[:, :, None], axis=(1, 2)))
        if bad.size:
            raise ValueError(f"{name} {_row(int(bad[0]), ids)} must be zero beyond the valid prefix")
    lengths = arrays["track_length"]
    bad = np.flatnonzero(~(np.isfinite(lengths) & (lengths > 0)))
    if bad.size:
        i = int(bad[0])
        raise ValueError(f"track_length {_row(i, ids)} must be finite and > 0, got {float(lengths[i])!r}")
    unique, counts_id = np.unique(ids, return_counts=True)
    if np.any(counts_id > 1):
        dup = int(unique[np.argmax(counts_id > 1)])
        where = np.flatnonzero(ids == dup).tolist()
        raise ValueError(f"track_id {dup} appears in rows {where}; ids must be unique within a pool")


def loop_segment_lengths(name: str, points: np.ndarray, advice: str = "") -> np.ndarray:
    """The segments' lengths of the closed loop ``points`` ([N, 2], m):
    point i to i + 1, the last to the first ([N], m, in the points' dtype).

    Raises:
        ValueError: two neighbours coincide (a segment of no length):
            "``name`` i and i + 1 coincide``advice``" of the first such.
    """
    segment = np.linalg.norm(np.roll(points, -1, axis=0) - points, axis=-1)
    bad = np.flatnonzero(segment == 0)
    if bad.size:
        i = int(bad[0])
        raise ValueError(f"{name} {i} and {(i + 1) % len(points)} coincide{advice}")
    return segment


def check_host_mask_values(name: str, mask: np.ndarray) -> None:
    """Refuse mask values other than 0 and 1 before any cast to int8."""
    bad = ~((mask == 0) | (mask == 1))
    if np.any(bad):
        where = np.argwhere(bad)[0]
        raise ValueError(f"{name} must hold only 0 and 1, got {mask[tuple(where)]!r} at index {tuple(where.tolist())}")


def check_host_id_values(name: str, ids: np.ndarray) -> None:
    """Refuse ids outside [0, 2**32) before any cast to uint32."""
    if ids.dtype == np.uint32 or ids.size == 0:
        return
    lo, hi = int(ids.min()), int(ids.max())
    if lo < 0 or hi >= UINT32_LIMIT:
        bad = lo if lo < 0 else hi
        row = int(np.flatnonzero(ids == bad)[0])
        raise ValueError(f"{name} must be in [0, 2**32), got {bad} at row {row}")



def check_pool_shapes(shapes: dict[str, tuple[int, ...]]) -> int:
    """Check the six shapes agree on one ``P >= 1``; returns ``P``."""
    first = tuple(shapes["centerline"])
    if len(first) != 3 or first[1:] != (TRACK_CAPACITY, 2):
        raise ValueError(f"centerline must have shape [P, TRACK_CAPACITY, 2] = [P, {TRACK_CAPACITY}, 2], got {first}")
    pool_size = first[0]
    if pool_size < 1:
        raise ValueError("a TrackPool must hold at least one track (P >= 1), got P = 0")
    expected = {
        "left_boundary": ((pool_size, TRACK_CAPACITY, 2), "[P, TRACK_CAPACITY, 2]"),
        "right_boundary": ((pool_size, TRACK_CAPACITY, 2), "[P, TRACK_CAPACITY, 2]"),
        "track_mask": ((pool_size, TRACK_CAPACITY), "[P, TRACK_CAPACITY]"),
        "track_length": ((pool_size,), "[P]"),
        "track_id": ((pool_size,), "[P]"),
    }
    for name, (shape, how) in expected.items():
        check_shape(name, shapes[name], shape, f"{how} with P = {pool_size} from centerline")
    return pool_size
