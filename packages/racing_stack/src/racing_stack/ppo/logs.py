"""A run's log: ``log.csv`` (one row per update, `LOG_FIELDS`), its
TensorBoard events and the learning curve drawn from it."""

from __future__ import annotations

import csv
import io
import math
import shutil
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from racing_stack import checkpoints
from racing_stack._files import save_figure
from racing_stack.ppo.losses import LOSS_FIELDS
from racing_stack.ppo.validation import VALIDATION_FIELDS

__all__ = ["LOG_FIELDS", "NOT_VALIDATED", "add_events", "draw_curve", "log_rows", "progress_line", "start_log",
           "tensorboard", "write_log"]

#: The log's columns, in order.
LOG_FIELDS = ("update", "transitions", "seconds", "transitions_per_s", "episodes", "success_rate",
              "off_track_rate", "timeout_rate", "mean_progress", "median_lap_time_s", "margin_endings",
              "stall_endings", "mean_speed_mps", "mean_reward", *LOSS_FIELDS, "explained_variance",
              "std_steering", "std_acceleration", "actor_grad_norm", "critic_grad_norm", "learning_rate",
              "crash_weight", *VALIDATION_FIELDS)
#: The validation columns of an update without validation.
NOT_VALIDATED = {k: math.nan for k in VALIDATION_FIELDS}


def log_rows(path: Path, update: int) -> list[dict[str, str]]:
    """The complete rows of a run's log up to ``update`` (none without a
    log); a row cut by a kill or a full disk, or otherwise unreadable, is
    dropped."""
    if not path.exists():
        return []
    kept = []
    with open(path, newline="", errors="replace") as f:
        for row in csv.DictReader(f):
            try:
                complete = None not in row and all(row.get(k) not in (None, "") for k in LOG_FIELDS) and \
                    all(math.isfinite(float(row[k])) or row[k] == "nan" for k in LOG_FIELDS)
                number = int(row["update"]) if complete else None
            except (ValueError, TypeError):
                number = None
            if number is not None and 1 <= number <= update:
                kept.append(row)
    return kept


def start_log(out: Path, update: int, say: Callable[[str], None] = lambda text: print(text, file=sys.stderr)):
    """Start (``update`` 0) or continue (after update ``update``) the log
    of the run in ``out``: stale temporary files removed, ``log.csv``
    rewritten with its complete rows up to ``update``, and the
    TensorBoard events rewritten from them (`tensorboard`), so that
    neither loses nor repeats an update. Where the log lacks the rows of
    some of those updates (damaged or edited), ``say`` names them once:
    the resumed log keeps that gap; where it repeats some, ``say`` says so
    and the first row of each is kept. Returns the TensorBoard writer."""
    for name in ("checkpoint.pt", "log.csv"):
        checkpoints.remove_stale(out, name)
    rows = log_rows(out / "log.csv", update) if update else []
    first: dict[int, dict[str, str]] = {}
    for row in rows:
        first.setdefault(int(row["update"]), row)
    kept = [first[number] for number in sorted(first)]
    extra = len(rows) - len(kept)
    if extra:
        say(f"train-ppo: {out / 'log.csv'} repeats the rows of some updates ({extra} row{'s' * (extra > 1)} more "
            "than updates): an edited log; the first row of each update is kept")
    missing = sorted(set(range(1, update + 1)) - set(first))
    if missing:
        say(f"train-ppo: {out / 'log.csv'} lacks the rows of {len(missing)} of the {update} updates before the "
            f"checkpoint ({_spans(missing)}): a damaged or edited log; the resumed log and its TensorBoard "
            "events keep that gap")
    write_log(out / "log.csv", kept)
    return tensorboard(out / "tensorboard", kept)


def _spans(numbers: list[int]) -> str:
    """Sorted ints as runs: [9, 10, 11, 12, 15] -> "updates 9-12, 15"."""
    runs: list[list[int]] = []
    for n in numbers:
        if runs and n == runs[-1][1] + 1:
            runs[-1][1] = n
        else:
            runs.append([n, n])
    return "updates " + ", ".join(f"{a}-{b}" if b > a else f"{a}" for a, b in runs)


def progress_line(row: dict[str, Any], updates: int) -> str:
    """An update's progress line, from its log ``row``, of a run of ``updates``
    updates; where no episode ended in the update, its success and progress
    read "-" (the log holds NaN)."""
    done = row["update"] / updates
    bar = "#" * int(30 * done) + "." * (30 - int(30 * done))
    validated = ""
    if math.isfinite(row["validation_success_rate"]):
        validated = f"  validation success {row['validation_success_rate']:.3f}"
    success, progress = (f"{row[k]:.{d}f}" if math.isfinite(row[k]) else "-"
                         for k, d in (("success_rate", 2), ("mean_progress", 3)))
    return (f"ppo [{bar}] {row['update']}/{updates}  {row['transitions_per_s']:,.0f} transitions/s  "
            f"episodes {row['episodes']}  success {success}  "
            f"progress {progress}  edge-band endings {row['margin_endings']}{validated}")


def write_log(path: Path, rows: list[dict[str, str]]) -> None:
    """``log.csv`` replaced, atomically, by its header and ``rows``."""
    text = io.StringIO()
    log = csv.DictWriter(text, LOG_FIELDS)
    log.writeheader()
    log.writerows(rows)
    checkpoints.write_atomic(path, text.getvalue().encode())


class _NoEvents:
    """Stands in for the event writer when tensorboardX is not installed."""

    def add(self, step: int, scalars: dict[str, float]) -> None:
        pass

    def close(self) -> None:
        pass


class _Events:
    """TensorBoard scalars in an event folder (tensorboardX's `FileWriter`):
    each `add` is one event holding all of a log row's scalars, a tenth of
    the host time of one event a scalar (about 0.15 against 1.8 ms a row
    on a 2-core CPU), which the trainer spends between its updates."""

    def __init__(self, path: Path) -> None:
        from tensorboardX import FileWriter
        from tensorboardX.proto.summary_pb2 import Summary

        self._summary = Summary
        self._file = FileWriter(str(path))

    def add(self, step: int, scalars: dict[str, float]) -> None:
        """``scalars`` (tag -> value) at ``step``, in one event."""
        values = [self._summary.Value(tag=tag, simple_value=value) for tag, value in scalars.items()]
        self._file.add_summary(self._summary(value=values), step)

    def close(self) -> None:
        self._file.close()


def tensorboard(path: Path, rows: list[dict[str, Any]]) -> _Events | _NoEvents:
    """A fresh TensorBoard event folder (tensorboardX, the ``train`` extra)
    holding ``rows`` (a resumed run's kept log rows): events written after
    the checkpoint by a killed run are gone, none is repeated. Without
    tensorboardX the run says so once and logs to the CSV only."""
    try:
        import tensorboardX  # noqa: F401
    except ImportError:
        print("ppo: no TensorBoard events (pip install 'racing-stack[train]' for them); log.csv has every row",
              file=sys.stderr)
        return _NoEvents()
    if path.exists():
        shutil.rmtree(path)
    writer = _Events(path)
    for row in rows:
        add_events(writer, row)
    return writer


def add_events(writer: _Events | _NoEvents, row: dict[str, Any]) -> None:
    """One log row as TensorBoard scalars against transitions, in one event
    (NaN ones left out: no episode ended)."""
    values = {key: float(row[key]) for key in LOG_FIELDS[3:]}
    writer.add(int(float(row["transitions"])), {key: value for key, value in values.items() if math.isfinite(value)})


def draw_curve(log: Path, path: Path) -> None:
    """The learning curve of a run's ``log.csv`` against transitions: the
    success rate and mean progress of the Train rollouts' ended episodes,
    their median lap time, with the validations' where they ran, and the
    rollouts' mean reward a step (defined at every update, so a run whose
    episodes rarely end, as the CPU preset's, still shows its learning);
    every update a point, and a panel without a lap says so. ``path`` is
    replaced atomically (`racing_stack._files.save_figure`)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    with open(log, newline="") as f:
        rows = list(csv.DictReader(f))
    x = np.array([float(r["transitions"]) for r in rows])
    fig, (left, right, reward) = plt.subplots(1, 3, figsize=(15, 4))
    for key, label in (("success_rate", "success rate"), ("mean_progress", "mean progress (laps)")):
        left.plot(x, [float(r[key]) for r in rows], ".-", markersize=3, label=f"Train rollouts: {label}")
    laps = np.array([float(r["median_lap_time_s"]) for r in rows])
    right.plot(x, laps, ".-", markersize=3, label="Train rollouts")
    validated = np.array([math.isfinite(float(r.get("validation_success_rate") or "nan")) for r in rows])
    if validated.any():
        picked = [r for r, v in zip(rows, validated) if v]
        left.plot(x[validated], [float(r["validation_success_rate"]) for r in picked], "o-", color="tab:green",
                  label="Validation: success rate")
        lap = [float(r["validation_median_lap_time_s"]) for r in picked]
        right.plot(x[validated], lap, "o-", color="tab:green", label="Validation")
        laps = np.concatenate([laps, lap])
    if not np.isfinite(laps).any():
        right.text(0.5, 0.5, "no lap completed yet", ha="center", va="center", transform=right.transAxes)
    reward.plot(x, [float(r["mean_reward"]) for r in rows], ".-", markersize=3, color="tab:purple")
    left.set(xlabel="transitions", ylim=(0, 1.05), title="ended episodes")
    left.legend()
    right.set(xlabel="transitions", ylabel="s", title="median lap time of the completed laps")
    right.legend()
    reward.set(xlabel="transitions", title="Train rollouts: mean reward a step")
    fig.tight_layout()
    save_figure(fig, path)
    plt.close(fig)

