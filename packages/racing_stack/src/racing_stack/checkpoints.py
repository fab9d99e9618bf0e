"""Files a run cannot lose: atomic writes, and a checked container for
Torch data (the trainer's ``checkpoint.pt``, an exported plugin's
``weights.pt``).

A file is written to a temporary file in the same folder, flushed and
fsynced, then renamed over the old one (and the folder fsynced): a kill, an
interrupt or a full disk at any moment leaves either the old file or the
new one, never a part of either. A temporary file left by a killed writer
is named ``.NAME.PID.tmp``; `remove_stale` clears those of a folder.
(Both live in the Torch-free ``racing_stack._files`` and are re-exported
here.)

The container is one header line, then the payload:

    racing_stack KIND FORMAT_VERSION SHA256 BYTES\\n
    PAYLOAD  (torch.save of tensors and plain data: dict, list, str, int, float, bool, None)

`load` checks the header, the kind, the version, the length and the
checksum before it unpickles anything, and unpickles with
``torch.load(weights_only=True)``: tensors and plain data only, so a
crafted file cannot run code. Each fault is a `CorruptFile` naming the file
and what is wrong.
"""

from __future__ import annotations

import hashlib
import io
import pickle
import re
from pathlib import Path
from typing import Any

import torch

from racing_stack._files import remove_stale, write_atomic

__all__ = ["FORMAT_VERSION", "CorruptFile", "load", "remove_stale", "save", "write_atomic"]

#: The container's version; a file of another version is refused by name.
FORMAT_VERSION = 1
_MAGIC = b"racing_stack"
#: A header is one short line; anything longer is not ours.
_MAX_HEADER = 256
#: Terminal escapes (colours, bold) that a message of Torch's may hold.
_ESCAPES = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")


class CorruptFile(ValueError):
    """A checkpoint or weights file that is not a complete, unchanged
    racing_stack file of the expected kind."""


def save(path: Path, kind: str, payload: Any) -> None:
    """Write ``payload`` (tensors and plain data) as a ``kind`` file at
    ``path``, atomically.

    Raises:
        ValueError: ``kind`` is not one word.
        OSError: the write failed; ``path`` is as it was.
    """
    if not kind or not kind.isidentifier():
        raise ValueError(f"kind must be one word, got {kind!r}")
    buffer = io.BytesIO()
    torch.save(payload, buffer)
    body = buffer.getbuffer()  # a view: a checkpoint's 136 MB (8,192 worlds) are not copied to be written
    header = f"racing_stack {kind} {FORMAT_VERSION} {hashlib.sha256(body).hexdigest()} {len(body)}\n"
    write_atomic(path, (header.encode("ascii"), body))


def load(path: Path, kind: str, map_location: torch.device | str | None = None) -> Any:
    """The payload of a ``kind`` file written by `save`, checked first.

    Raises:
        FileNotFoundError: there is no file at ``path``.
        CorruptFile: not a racing_stack file, another kind, another format
            version, truncated or extended, its checksum does not match, or
            its payload holds anything but tensors and plain data; the
            message names the file.
    """
    path = Path(path)
    with open(path, "rb") as f:
        data = f.read()
    line, newline, body = data[:_MAX_HEADER].partition(b"\n")
    fields = line.split(b" ")
    if not newline or len(fields) != 5 or fields[0] != _MAGIC:
        raise CorruptFile(f"{path} is not a racing_stack file (no header line; {len(data)} bytes)")
    try:
        their_kind, version, digest = (f.decode("ascii") for f in fields[1:4])
        size = int(fields[4])
    except (UnicodeDecodeError, ValueError):
        raise CorruptFile(f"{path} has a damaged header line: {line[:80]!r}") from None
    if their_kind != kind:
        raise CorruptFile(f"{path} is a racing_stack {their_kind!r} file, expected a {kind!r} file")
    if version != str(FORMAT_VERSION):
        raise CorruptFile(f"{path} is of format version {version}; this racing_stack reads version {FORMAT_VERSION}")
    body = data[len(line) + 1:]
    if len(body) != size:
        raise CorruptFile(f"{path} is {'truncated' if len(body) < size else 'extended'}: its payload is "
                          f"{len(body)} bytes, its header says {size}")
    if hashlib.sha256(body).hexdigest() != digest:
        raise CorruptFile(f"{path} is corrupt: its checksum does not match its contents")
    try:
        return torch.load(io.BytesIO(body), map_location=map_location, weights_only=True)
    except pickle.UnpicklingError as error:  # weights_only refuses anything that would run code
        raise CorruptFile(f"{path} holds something other than tensors and plain data: {_why(error)}") from None
    except Exception as error:  # e.g. CUDA tensors on a machine without CUDA: pass map_location
        raise CorruptFile(f"{path}: its payload cannot be read here: {error}") from None


def _why(error: pickle.UnpicklingError) -> str:
    """What Torch's safe unpickler refused (the object's global where it
    names one), without its advice to load the file unsafely
    (``weights_only=False``, allow-listing the global) or to file an issue,
    and without terminal escapes."""
    text = _ESCAPES.sub("", str(error))
    found = re.search(r"GLOBAL (\S+) was not an allowed global", text)
    if found:
        return f"an object of {found.group(1)}, which only an unsafe load would rebuild"
    advice = ("Check the documentation", "Please file an issue", "Weights only load failed")
    kept = [line.strip().removeprefix("WeightsUnpickler error:").strip() for line in text.splitlines()
            if "weights_only" not in line and not line.strip().startswith(advice)]
    return "; ".join(line for line in kept if line) or "a payload the safe unpickler refuses"
