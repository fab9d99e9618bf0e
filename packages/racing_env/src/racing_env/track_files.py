"""Pool files: a ``TrackPool`` as an ``.npz`` and its ``.json`` manifest, and
the geometry hash that binds a track id to exact bytes.

The geometry hash is sha256, hex digest, over

1. ``centerline``     float32 ``[640, 2]``, C order, little-endian (5,120 bytes)
2. ``left_boundary``  the same
3. ``right_boundary`` the same
4. ``track_mask``     int8 ``[640]`` (640 bytes)
5. ``track_length``   float32 scalar, little-endian (4 bytes)

concatenated in that order, padding included (16,004 bytes in all).

A pool file is two files side by side: ``<name>.npz`` holds the six arrays
(keys ``centerline``, ``left_boundary``, ``right_boundary``, ``track_mask``,
``track_length``, ``track_id``, leading dimension ``P``) and ``<name>.json``
is the manifest:

```text
{"format": 1, "benchmark_version": "0.1", "level_id": 1, "split": "train",
 "capacity": 640, "tracks": [{"track_id": 7, "geometry_hash": "ab12..."}, ...]}
```

with one ``tracks`` entry per row, in row order. ``read`` recomputes every
row's hash from the loaded bytes and rejects the pool on any mismatch.
``TrackPool.save`` and ``TrackPool.load`` are the public doors to this module.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import stat
import tempfile
from pathlib import Path
from typing import Any, NamedTuple

import jax.numpy as jnp
import numpy as np
from numpy.typing import ArrayLike

from racing_env import checks
from racing_env.types import POOL_DTYPES, TRACK_CAPACITY, PoolArrays

__all__ = ["PoolFile", "destination", "geometry_hash", "hash_rows", "read", "write"]

_HASH_PATTERN = re.compile(r"[0-9a-f]{64}")
_MANIFEST_FORMAT = 1
_MANIFEST_KEYS = ("format", "benchmark_version", "level_id", "split", "capacity", "tracks")


class PoolFile(NamedTuple):
    """What ``read`` found in a pool file, every check passed.

    Attributes:
        arrays: the six host arrays by name (``PoolArrays._fields``), in
            their ``POOL_DTYPES``, leading dimension ``P``.
        level_id: the manifest's Level.
        split: the manifest's split.
        benchmark_version: the manifest's benchmark version.
        hashes: each row's geometry hash, recomputed from the bytes read
            (equal to the manifest's).
    """

    arrays: dict[str, np.ndarray]
    level_id: int
    split: str
    benchmark_version: str
    hashes: tuple[str, ...]


# --------------------------------------------------------------------------- the geometry hash


def hash_row(centerline: np.ndarray, left: np.ndarray, right: np.ndarray,
             mask: np.ndarray, length: Any) -> str:
    """The sha256 hex digest of one row's bytes (no checks: ``geometry_hash`` checks)."""
    digest = hashlib.sha256()
    for values in (centerline, left, right):
        digest.update(np.ascontiguousarray(values, dtype="<f4").tobytes(order="C"))
    digest.update(np.ascontiguousarray(mask, dtype=np.int8).tobytes(order="C"))
    digest.update(np.asarray(length, dtype="<f4").tobytes())
    return digest.hexdigest()


def hash_rows(arrays: dict[str, np.ndarray]) -> tuple[str, ...]:
    """Each row's ``geometry_hash`` of a pool's host arrays ``[P, ...]``, in row order."""
    return tuple(
        hash_row(arrays["centerline"][i], arrays["left_boundary"][i], arrays["right_boundary"][i],
                 arrays["track_mask"][i], arrays["track_length"][i])
        for i in range(arrays["centerline"].shape[0]))


def geometry_hash(centerline: ArrayLike, left_boundary: ArrayLike, right_boundary: ArrayLike,
                  track_mask: ArrayLike, track_length: Any) -> str:
    """The sha256 hex digest that binds a track id to exact geometry bytes.

    Hashes, in this order: ``centerline``, ``left_boundary``, ``right_boundary``
    (each float32 ``[640, 2]``, C order, little-endian), ``track_mask`` (int8
    ``[640]``) and ``track_length`` (float32, 4 bytes, little-endian).

    Args:
        centerline: ``[640, 2]`` any real floating dtype (m), converted to float32.
        left_boundary: ``[640, 2]`` as ``centerline``.
        right_boundary: ``[640, 2]`` as ``centerline``.
        track_mask: ``[640]`` integer or bool, values 0 or 1, converted to int8.
        track_length: a real scalar (m), converted to float32.

    The hash is over bytes only: it does not check that the arrays form a
    valid Track (``Track`` does).

    Raises:
        TypeError: a wrong dtype.
        ValueError: a wrong shape or a mask value other than 0 and 1.
    """
    floats = []
    for name, value in zip(checks.FLOAT_FIELDS, (centerline, left_boundary, right_boundary)):
        arr = checks.host_array(name, value)
        checks.check_float_kind(name, arr.dtype)
        checks.check_shape(name, arr.shape, (TRACK_CAPACITY, 2), "[TRACK_CAPACITY, 2]")
        floats.append(checks.to_float32(arr))
    mask = checks.host_array("track_mask", track_mask)
    checks.check_int_kind("track_mask", mask.dtype)
    checks.check_shape("track_mask", mask.shape, (TRACK_CAPACITY,), "[TRACK_CAPACITY]")
    checks.check_host_mask_values("track_mask", mask)
    if isinstance(track_length, (bool, np.bool_)):
        raise TypeError("track_length must be a real number, got a bool")
    length = checks.host_array("track_length", track_length)
    if length.shape != ():
        raise ValueError(f"track_length must be a scalar, got shape {length.shape}")
    if not (checks.is_floating(length.dtype) or jnp.issubdtype(length.dtype, jnp.integer)):
        raise TypeError(f"track_length must be a real number, got {str(length.dtype)}")
    return hash_row(*floats, mask.astype(np.int8), checks.to_float32(length))

# --------------------------------------------------------------------------- writing


def destination(path: Any) -> tuple[Path, Path]:
    """The ``.npz`` and ``.json`` paths a pool is to be written to.

    Raises:
        TypeError: ``path`` is not a path.
        ValueError: ``path`` does not end in ``.npz``.
        FileExistsError: either file already exists (pool files are never overwritten).
    """
    npz_path, manifest_path = _paths(path)
    for existing in (npz_path, manifest_path):
        if existing.exists():
            raise FileExistsError(f"{existing} already exists; TrackPool files are never overwritten")
    return npz_path, manifest_path


def write(paths: tuple[Path, Path], arrays: dict[str, np.ndarray], hashes: tuple[str, ...], *,
          level_id: int, split: str, benchmark_version: str) -> None:
    """Write a pool's checked host arrays and its manifest to ``paths`` (from ``destination``).

    Both files go through temporary files in the same folder
    (``.<name>.npz.*.tmp`` and ``.<name>.json.*.tmp``, fsynced, removed on
    any failure; a killed writer leaves them behind), renamed into place the
    manifest last, then the folder is fsynced.
    """
    npz_path, manifest_path = paths
    manifest = {
        "format": _MANIFEST_FORMAT,
        "benchmark_version": benchmark_version,
        "level_id": level_id,
        "split": split,
        "capacity": TRACK_CAPACITY,
        "tracks": [{"track_id": int(tid), "geometry_hash": h} for tid, h in zip(arrays["track_id"], hashes)],
    }
    folder = npz_path.parent
    temporaries: list[str] = []
    try:
        fd, tmp_npz = tempfile.mkstemp(dir=folder, prefix=f".{npz_path.name}.", suffix=".tmp")
        temporaries.append(tmp_npz)
        with os.fdopen(fd, "wb") as f:
            np.savez(f, **arrays)
            f.flush()
            os.fsync(f.fileno())
        fd, tmp_json = tempfile.mkstemp(dir=folder, prefix=f".{manifest_path.name}.", suffix=".tmp")
        temporaries.append(tmp_json)
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            json.dump(manifest, f, indent=1)
            f.write("\n")
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp_npz, npz_path)
        temporaries.remove(tmp_npz)
        os.replace(tmp_json, manifest_path)
        temporaries.remove(tmp_json)
    finally:
        for leftover in temporaries:
            with contextlib.suppress(OSError):
                os.unlink(leftover)
    folder_fd = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(folder_fd)
    finally:
        os.close(folder_fd)


# --------------------------------------------------------------------------- reading


def read(path: Any) -> PoolFile:
    """Read and check a pool file: ``path`` (``.npz``) and its ``.json`` manifest.

    Every check and error is ``TrackPool.load``'s, which documents them: the
    manifest's form, the six arrays' dtypes and shapes, the counts and ids
    row by row, the values, and each row's hash recomputed from the bytes.
    """
    npz_path, manifest_path = _paths(path)
    with open(_regular(manifest_path), encoding="utf-8") as f:
        try:
            manifest = json.load(f)
        except (json.JSONDecodeError, UnicodeDecodeError) as err:
            raise ValueError(f"manifest {manifest_path} is not valid JSON: {err}") from None
    level_id, split, benchmark_version, entries = _parse_manifest(manifest, manifest_path)

    host = _read_npz(npz_path)
    for name, value in host.items():
        if value.dtype != POOL_DTYPES[name]:
            raise ValueError(f"{npz_path}: {name} must have dtype {POOL_DTYPES[name]}, got {value.dtype}")
    try:
        pool_size = checks.check_pool_shapes({name: value.shape for name, value in host.items()})
    except ValueError as err:
        raise ValueError(f"{npz_path}: {err}") from None
    if pool_size != len(entries):
        raise ValueError(f"manifest {manifest_path} lists {len(entries)} tracks, {npz_path} holds {pool_size}")
    ids = host["track_id"]
    for i, (tid, _) in enumerate(entries):
        if int(ids[i]) != tid:
            raise ValueError(f"row {i}: manifest {manifest_path} has track_id {tid}, "
                             f"{npz_path} has {int(ids[i])}")
    try:
        checks.check_values(host)
    except ValueError as err:
        raise ValueError(f"{npz_path}: {err}") from None
    hashes = hash_rows(host)
    for i, (tid, expected) in enumerate(entries):
        if hashes[i] != expected:
            raise ValueError(f"row {i} (track_id {tid}) of {npz_path}: geometry hash {hashes[i]} "
                             f"does not match the manifest's {expected}")
    return PoolFile(host, level_id, split, benchmark_version, hashes)


def _paths(path: Any) -> tuple[Path, Path]:
    try:
        npz = Path(os.fspath(path))
    except TypeError:
        raise TypeError(f"path must be a str or os.PathLike, got {type(path).__name__}") from None
    if npz.suffix != ".npz":
        raise ValueError(f"path must name the .npz file (the manifest is the same name with .json), got {str(npz)!r}")
    return npz, npz.with_suffix(".json")


#: What `_regular` calls the files that are not regular, by their ``stat`` test.
_NOT_REGULAR = ((stat.S_ISFIFO, "a named pipe"), (stat.S_ISDIR, "a folder"), (stat.S_ISCHR, "a device"),
                (stat.S_ISBLK, "a device"), (stat.S_ISSOCK, "a socket"))


def _regular(path: Path) -> Path:
    """``path``, once it is known to be a regular file: opening a named
    pipe would wait for a writer for good, and a device may never end.

    Raises:
        OSError: ``path`` is missing or cannot be looked at.
        ValueError: it is not a regular file, naming what it is.
    """
    mode = os.stat(path).st_mode
    if not stat.S_ISREG(mode):
        kind = next((name for test, name in _NOT_REGULAR if test(mode)), "not a file")
        raise ValueError(f"{path} is not a regular file ({kind}): a pool's parts are files")
    return path


def _read_npz(npz_path: Path) -> dict[str, np.ndarray]:
    """The six arrays of a pool's npz, by name.

    Raises:
        OSError: the file is missing or cannot be opened.
        ValueError: the file is not a readable npz (truncated, damaged:
            whatever the zip or npy reader refuses, including a seek that a
            damaged offset sends past the file), or holds other arrays than
            the six; the message names the file.
    """
    with open(_regular(npz_path), "rb") as f:
        try:
            with np.load(f, allow_pickle=False) as data:
                keys = set(data.files)
                host = {name: data[name] for name in PoolArrays._fields} if keys == set(PoolArrays._fields) else {}
        except Exception as err:  # BadZipFile, EOFError, a seek past either end, ...: the bytes are damaged
            raise ValueError(f"{npz_path} is not a readable .npz file (truncated or damaged): "
                             f"{type(err).__name__}: {err}") from None
    if keys != set(PoolArrays._fields):
        raise ValueError(f"{npz_path} must hold exactly the arrays {list(PoolArrays._fields)}, got {sorted(keys)}")
    return host


def _parse_manifest(manifest: Any, where: Path) -> tuple[int, str, str, list[tuple[int, str]]]:
    """The (level_id, split, benchmark_version, [(track_id, hash)]) of a well-formed manifest."""

    def fail(message: str) -> ValueError:
        return ValueError(f"manifest {where}: {message}")

    def json_int(value: Any) -> bool:
        return isinstance(value, int) and not isinstance(value, bool)

    if not isinstance(manifest, dict):
        raise fail(f"must be a JSON object, got {type(manifest).__name__}")
    missing = [key for key in _MANIFEST_KEYS if key not in manifest]
    extra = sorted(set(manifest) - set(_MANIFEST_KEYS))
    if missing or extra:
        raise fail(f"must have exactly the keys {list(_MANIFEST_KEYS)}; missing {missing}, unexpected {extra}")
    if not json_int(manifest["format"]) or manifest["format"] != _MANIFEST_FORMAT:
        raise fail(f"format must be {_MANIFEST_FORMAT}, got {manifest['format']!r}")
    if not json_int(manifest["capacity"]) or manifest["capacity"] != TRACK_CAPACITY:
        raise fail(f"capacity must be TRACK_CAPACITY = {TRACK_CAPACITY}, got {manifest['capacity']!r}")
    try:
        if not json_int(manifest["level_id"]):
            raise TypeError(f"level_id must be an integer, got {manifest['level_id']!r}")
        level_id = checks.check_level_id(manifest["level_id"])
        split = checks.check_name("split", manifest["split"])
        benchmark_version = checks.check_name("benchmark_version", manifest["benchmark_version"])
    except (TypeError, ValueError) as err:
        raise fail(str(err)) from None
    tracks = manifest["tracks"]
    if not isinstance(tracks, list):
        raise fail(f"tracks must be a list, got {type(tracks).__name__}")
    entries: list[tuple[int, str]] = []
    for i, entry in enumerate(tracks):
        if not isinstance(entry, dict) or set(entry) != {"track_id", "geometry_hash"}:
            raise fail(f"tracks[{i}] must be an object with exactly the keys track_id and geometry_hash, got {entry!r}")
        tid, digest = entry["track_id"], entry["geometry_hash"]
        if not json_int(tid) or not 0 <= tid < checks.UINT32_LIMIT:
            raise fail(f"tracks[{i}].track_id must be an integer in [0, 2**32), got {tid!r}")
        if not isinstance(digest, str) or not _HASH_PATTERN.fullmatch(digest):
            raise fail(f"tracks[{i}].geometry_hash must be 64 lowercase hex digits, got {digest!r}")
        entries.append((tid, digest))
    return level_id, split, benchmark_version, entries

