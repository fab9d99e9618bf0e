"""The checked container for checkpoints and weights (round trips; every
kind of damage refused by name, nothing unpickled that could run code;
atomic writes that leave the old file whole) and the trainer's guard
against a NumPy reference."""

from __future__ import annotations

import builtins
import hashlib
import io
import math
import os
import pickle

import numpy as np
import pytest
import torch

from racing_stack import checkpoints
from racing_stack.checkpoints import CorruptFile
from racing_stack.guard import GuardError, Violation, check, violations


def payload():
    g = torch.Generator().manual_seed(3)
    return {
        "policy": {"w": torch.randn(7, 5, generator=g), "b": torch.zeros(5, dtype=torch.float64),
                   "steps": torch.arange(4), "mask": torch.tensor([True, False]),
                   "half": torch.randn(3, generator=g).to(torch.bfloat16), "empty": torch.zeros(0, 3)},
        "generator": g.get_state(),
        "update": 7, "rate": 3e-4, "nan": math.nan, "inf": -math.inf, "big": 2**62, "flag": True, "none": None,
        "name": "run ü", "rows": [1, 2.5, "x", [None]], "pair": (1, "b"), "view": torch.arange(10)[2:8:2],
    }


def assert_same(a, b):
    assert type(a) is type(b), (a, b)
    if isinstance(a, torch.Tensor):
        assert a.dtype == b.dtype and a.shape == b.shape
        assert torch.equal(a, b)
    elif isinstance(a, dict):
        assert list(a) == list(b)
        for key in a:
            assert_same(a[key], b[key])
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b)
        for x, y in zip(a, b):
            assert_same(x, y)
    elif isinstance(a, float) and math.isnan(a):
        assert math.isnan(b)
    else:
        assert a == b


@pytest.fixture
def saved(tmp_path):
    path = tmp_path / "checkpoint.pt"
    checkpoints.save(path, "checkpoint", payload())
    return path


def refused(path, kind="checkpoint", match=None):
    """The CorruptFile `load` raises for ``path``; its message names the file."""
    with pytest.raises(CorruptFile, match=match) as caught:
        checkpoints.load(path, kind)
    assert str(path) in str(caught.value)
    return caught.value


def split(path):
    data = path.read_bytes()
    header, _, body = data.partition(b"\n")
    return header + b"\n", body


def test_tensors_and_plain_data_round_trip(saved, tmp_path):
    assert_same(checkpoints.load(saved, "checkpoint"), payload())
    assert_same(checkpoints.load(saved, "checkpoint", map_location="cpu"), payload())
    # The documented header: racing_stack KIND VERSION SHA256 BYTES
    header, body = split(saved)
    magic, kind, version, digest, size = header.decode("ascii").split()
    assert (magic, kind, version) == ("racing_stack", "checkpoint", str(checkpoints.FORMAT_VERSION))
    assert digest == hashlib.sha256(body).hexdigest() and int(size) == len(body)
    # Saving again replaces the file; nothing else is left in the folder.
    checkpoints.save(saved, "checkpoint", {"update": 8})
    assert checkpoints.load(saved, "checkpoint") == {"update": 8}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["checkpoint.pt"]


def test_save_refuses_a_kind_that_is_not_one_word_and_load_a_missing_file(tmp_path):
    for kind in ("", "two words", "a\nb", "1abc"):
        with pytest.raises(ValueError, match="kind must be one word"):
            checkpoints.save(tmp_path / "x.pt", kind, {})
    assert not list(tmp_path.iterdir())
    with pytest.raises(FileNotFoundError):
        checkpoints.load(tmp_path / "missing.pt", "checkpoint")


def test_a_truncated_file_is_refused(saved):
    data = saved.read_bytes()
    header, _ = split(saved)
    rng = np.random.default_rng(0)
    cuts = {0, 1, 5, len(header) - 1, len(header), len(header) + 1, len(data) - 1}
    cuts |= set(rng.integers(len(header) + 1, len(data) - 1, 20).tolist())
    for cut in sorted(cuts):
        saved.write_bytes(data[:cut])
        error = refused(saved)
        if cut < len(header):  # the header line itself is cut
            assert "not a racing_stack file" in str(error), cut
        else:
            assert "truncated" in str(error) and f"header says {len(data) - len(header)}" in str(error), cut
    saved.write_bytes(b"")
    assert "0 bytes" in str(refused(saved))


def test_an_extended_file_is_refused(saved):
    data = saved.read_bytes()
    for extra in (b"\0", b"\n", os.urandom(1000), data):
        saved.write_bytes(data + extra)
        assert "extended" in str(refused(saved))


def test_flipped_bytes_are_refused(saved):
    data = saved.read_bytes()
    header, body = split(saved)
    rng = np.random.default_rng(1)
    for _ in range(40):
        damaged = bytearray(data)
        for position in rng.integers(len(header), len(data), int(rng.integers(1, 4))):
            damaged[position] ^= int(rng.integers(1, 256))
        saved.write_bytes(bytes(damaged))
        assert "checksum does not match" in str(refused(saved))
    # A flipped bit of the header's checksum is a mismatch too.
    at = header.index(hashlib.sha256(body).hexdigest().encode()) + 10
    damaged = bytearray(data)
    damaged[at] = ord("0") if damaged[at] != ord("0") else ord("1")
    saved.write_bytes(bytes(damaged))
    assert "checksum does not match" in str(refused(saved))


def test_another_kind_another_version_and_a_damaged_header_are_refused(saved, tmp_path):
    assert "'checkpoint' file, expected a 'weights' file" in str(refused(saved, kind="weights"))
    header, body = split(saved)
    digest = hashlib.sha256(body).hexdigest()
    for version in (0, 2, "1.0", "x"):
        saved.write_bytes(f"racing_stack checkpoint {version} {digest} {len(body)}\n".encode() + body)
        assert f"format version {version}" in str(refused(saved))
    for line in (f"racing_stack checkpoint 1 {digest} many\n", f"racing_stack checkpoint 1 {digest} 1e3\n",
                 f"racing_stack checkpoint 1 {digest} \n"):
        saved.write_bytes(line.encode() + body)
        assert "damaged header" in str(refused(saved))
    for line in (b"racing_stack checkpoint 1 " + digest.encode() + b"\n",  # a field missing
                 b"racing_stackX checkpoint 1 " + digest.encode() + b" 10\n", b"\n",
                 b"racing_stack " + b"x" * 300 + b"\n"):  # no newline within a header's length
        saved.write_bytes(line + body)
        assert "not a racing_stack file" in str(refused(saved))


def test_foreign_and_random_files_are_refused(tmp_path):
    foreign = tmp_path / "foreign.pt"
    torch.save({"policy": {"w": torch.ones(3)}, "update": 1}, foreign)
    assert "not a racing_stack file" in str(refused(foreign))
    rng = np.random.default_rng(2)
    for n in (1, 17, 255, 256, 257, 5000):
        junk = tmp_path / f"junk{n}.pt"
        junk.write_bytes(rng.integers(0, 256, n, dtype=np.uint8).tobytes())
        refused(junk, match="not a racing_stack file|damaged header")
    text = tmp_path / "text.pt"
    text.write_text("racing_stack\n")
    refused(text, match="not a racing_stack file")


class _Runs:
    """Pickles as a call of ``function(*args)``: unpickling it runs the call."""

    def __init__(self, function, *args):
        self.function, self.args = function, args

    def __reduce__(self):
        return self.function, self.args


@pytest.mark.parametrize("how", ["open", "os.system"])
def test_a_valid_file_whose_payload_would_run_code_is_refused_without_running_it(tmp_path, how):
    marker = tmp_path / "ran"
    call = _Runs(builtins.open, str(marker), "w") if how == "open" else _Runs(os.system, f"touch '{marker}'")
    buffer = io.BytesIO()
    torch.save({"policy": {"w": torch.ones(2)}, "evil": call}, buffer)
    body = buffer.getvalue()
    # The crafted payload does run code when unpickled without weights_only: the test can fail.
    torch.load(io.BytesIO(body), weights_only=False)
    assert marker.exists()
    marker.unlink()
    path = tmp_path / "checkpoint.pt"
    path.write_bytes(f"racing_stack checkpoint 1 {hashlib.sha256(body).hexdigest()} {len(body)}\n".encode() + body)
    message = str(refused(path))
    assert "holds something other than tensors and plain data" in message
    assert how.removeprefix("os.") in message  # what was refused: builtins.open, posix.system
    assert "weights_only" not in message and "file an issue" not in message  # no advice to load it unsafely
    assert not marker.exists()
    # A bare pickle (not torch.save's container) in a valid header is refused the same way.
    body = pickle.dumps(call)
    path.write_bytes(f"racing_stack checkpoint 1 {hashlib.sha256(body).hexdigest()} {len(body)}\n".encode() + body)
    message = str(refused(path, match="holds something other than tensors"))
    assert "weights_only" not in message and "file an issue" not in message
    assert not marker.exists()


def test_a_numpy_payload_is_refused_by_its_global_without_advice_or_escapes(tmp_path):
    """NumPy arrays are no tensors: the safe load refuses them, and the
    message names what it refused, not Torch's advice (in bold) to load the
    file unsafely or to allow-list the global."""
    path = tmp_path / "checkpoint.pt"
    checkpoints.save(path, "checkpoint", {"update": 1, "w": np.zeros(3)})
    message = str(refused(path, match="holds something other than tensors"))
    assert "an object of numpy." in message and "only an unsafe load would rebuild" in message
    for advice in ("\x1b", "weights_only", "trust", "safe_globals", "can still be loaded"):
        assert advice not in message, advice


@pytest.mark.parametrize("fault", [OSError(28, "No space left on device"), KeyboardInterrupt()])
@pytest.mark.parametrize("where", ["fsync", "replace", "write"])
def test_a_failed_write_leaves_the_old_file_whole_and_no_temporary_file(tmp_path, monkeypatch, fault, where):
    path = tmp_path / "checkpoint.pt"
    checkpoints.save(path, "checkpoint", {"update": 1, "w": torch.ones(1000)})
    old = path.read_bytes()
    (tmp_path / "other.txt").write_text("kept")

    def fail(*args, **kwargs):
        raise fault

    if where == "write":  # fails after a part of the data was written
        real_open = builtins.open

        class Half:
            def __init__(self, f):
                self.f = f

            def __enter__(self):
                return self

            def __exit__(self, *exc):
                self.f.close()

            def write(self, data):
                self.f.write(data[:len(data) // 2])
                self.f.flush()
                raise fault

            def __getattr__(self, name):
                return getattr(self.f, name)

        def opener(file, mode="r", *args, **kwargs):
            f = real_open(file, mode, *args, **kwargs)
            return Half(f) if str(file).endswith(".tmp") and "w" in mode else f

        monkeypatch.setattr(builtins, "open", opener)
    else:
        monkeypatch.setattr(os, where, fail)
    with pytest.raises(type(fault)):
        checkpoints.save(path, "checkpoint", {"update": 2, "w": torch.zeros(1000)})
    with pytest.raises(type(fault)):
        checkpoints.write_atomic(tmp_path / "new.pt", b"new")
    monkeypatch.undo()
    assert path.read_bytes() == old
    assert checkpoints.load(path, "checkpoint")["update"] == 1
    assert sorted(p.name for p in tmp_path.iterdir()) == ["checkpoint.pt", "other.txt"]


def test_write_atomic_replaces_the_whole_file(tmp_path):
    path = tmp_path / "log.csv"
    checkpoints.write_atomic(path, b"a much longer first version\n" * 100)
    checkpoints.write_atomic(path, b"short")
    assert path.read_bytes() == b"short"
    assert [p.name for p in tmp_path.iterdir()] == ["log.csv"]
    checkpoints.write_atomic(path, (b"head\n", memoryview(b"a body"), b""))  # parts, one after another
    assert path.read_bytes() == b"head\na body"


def test_remove_stale_removes_the_temporary_files_of_that_name_only(tmp_path):
    stale = [".checkpoint.pt.123.tmp", ".checkpoint.pt.7.tmp", ".checkpoint.pt.99999999.tmp"]
    kept = ["checkpoint.pt", ".log.csv.123.tmp", ".checkpoint.pt.bak", "checkpoint.pt.1.tmp", "x.tmp",
            ".checkpoint.ptx.1.tmp", ".checkpoint.pt.1.tmpx"]
    for name in stale + kept:
        (tmp_path / name).write_bytes(b"x")
    removed = checkpoints.remove_stale(tmp_path, "checkpoint.pt")
    assert sorted(p.name for p in removed) == sorted(stale)
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(kept)
    assert checkpoints.remove_stale(tmp_path, "checkpoint.pt") == []
    assert [p.name for p in checkpoints.remove_stale(tmp_path, "log.csv")] == [".log.csv.123.tmp"]
    # A temporary file left by a writer killed in write_atomic is one of them.
    tmp = tmp_path / f".weights.pt.{os.getpid()}.tmp"
    tmp.write_bytes(b"half")
    assert checkpoints.remove_stale(tmp_path, "weights.pt") == [tmp] and not tmp.exists()


# -- the guard -------------------------------------------------------------------


def reference(values, low, high):
    """(count, worst) of one field: float32 values, NaN/inf always out; the
    worst is the first non-finite value, else the one furthest outside (the
    first of equals), else 0."""
    x = np.concatenate([np.asarray(v, np.float64).reshape(-1) for v in values]).astype(np.float32)
    finite = np.isfinite(x)
    with np.errstate(invalid="ignore"):
        outside = np.maximum(np.float32(low) - x, x - np.float32(high))
    bad = ~finite | (outside > 0)
    if not bad.any():
        return 0, 0.0
    if not finite.all():
        return int(bad.sum()), float(x[np.argmin(finite)])
    return int(bad.sum()), float(x[np.argmax(outside)])


def random_field(rng):
    low, high = sorted(rng.uniform(-100, 100, 2).round(2))
    if rng.random() < 0.2:
        low, high = -math.inf, math.inf
    parts = []
    for _ in range(int(rng.integers(1, 4))):
        shape = tuple(rng.integers(0, 6, int(rng.integers(0, 4))))
        v = rng.uniform(max(low, -1e3), min(high, 1e3), shape).astype(np.float32)
        flat = v.reshape(-1)
        for _ in range(int(rng.integers(0, 4)) if flat.size else 0):
            i = int(rng.integers(flat.size))
            kind = rng.integers(5)
            if kind == 0:
                flat[i] = np.nan
            elif kind == 1:
                flat[i] = np.inf
            elif kind == 2:
                flat[i] = -np.inf
            elif kind == 3 and math.isfinite(high):
                flat[i] = high + rng.uniform(0.5, 50)
            elif math.isfinite(low):
                flat[i] = low - rng.uniform(0.5, 50)
        dtype = [torch.float32, torch.float64, torch.float16][int(rng.integers(3))] if rng.random() < 0.3 \
            else torch.float32
        parts.append(torch.from_numpy(v).to(dtype))
    return parts, low, high


def test_violations_count_and_worst_value_match_the_reference():
    rng = np.random.default_rng(5)
    for trial in range(300):
        fields, want = [], []
        for _ in range(int(rng.integers(1, 5))):
            parts, low, high = random_field(rng)
            values = parts if len(parts) > 1 or rng.random() < 0.5 else parts[0]
            fields.append(Violation(f"f{len(fields)}", values, low, high))
            want.append(reference([p.float().numpy() for p in parts], low, high))
        got = violations(fields)
        assert got.dtype == torch.float32 and got.shape == (len(fields), 2)
        for (count, worst), (want_count, want_worst) in zip(got.tolist(), want):
            assert count == want_count, trial
            assert worst == want_worst or (math.isnan(worst) and math.isnan(want_worst)), (trial, worst, want_worst)


def test_violations_bounds_are_inclusive_and_the_first_non_finite_value_is_the_worst():
    x = torch.tensor([-2.5, 3.0, 0.0, 1e4, -math.inf, math.nan, math.inf])
    assert violations([Violation("v", x[:3], -2.5, 3.0)]).tolist() == [[0.0, 0.0]]
    assert violations([Violation("v", x[:4], -2.5, 3.0)]).tolist() == [[1.0, 1e4]]
    [[count, worst]] = violations([Violation("v", x, -2.5, 3.0)]).tolist()
    assert (count, worst) == (4.0, -math.inf)
    [[count, worst]] = violations([Violation("v", x[5:], -2.5, 3.0)]).tolist()
    assert count == 2.0 and math.isnan(worst)
    assert violations([Violation("v", torch.zeros(0))]).tolist() == [[0.0, 0.0]]
    assert violations([Violation("v", torch.tensor([1e300], dtype=torch.float64), 0, 1)]).tolist() == [[1.0, math.inf]]


def test_check_raises_naming_the_update_the_field_and_the_worst_value():
    fields = [Violation("observation feature", torch.zeros(4, 3)),
              Violation("reward", torch.tensor([[0.5, 224.0], [-1.0, 3.0]]), -2.01, 150.0),
              Violation("value", torch.tensor([math.nan]))]
    read = violations(fields).tolist()
    with pytest.raises(GuardError) as caught:
        check(fields, read, 12, "the last checkpoint, ckpt (update 11), is whole")
    message = str(caught.value)
    assert "update 12" in message and "reward" in message and "224.0" in message
    assert "1 of 4" in message and "[-2.01, 150]" in message and "ckpt (update 11)" in message
    assert "value" not in message.replace("values", "")  # the first bad field is the one named
    check(fields[:1], read[:1], 12, "")  # nothing outside: no error
    fields[1] = Violation("reward", torch.tensor([0.5]), -2.01, 150.0)
    with pytest.raises(GuardError, match=r"update 3: 1 of 1 value values are not finite; the worst is nan"):
        check(fields, violations(fields).tolist(), 3, "")
