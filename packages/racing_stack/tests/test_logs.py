"""The training's progress line (`racing_stack.ppo.logs.progress_line`)."""

import math

from racing_stack.ppo.logs import LOG_FIELDS, NOT_VALIDATED, progress_line


def _row(**values):
    row = dict.fromkeys(LOG_FIELDS, 0.0)
    row.update(NOT_VALIDATED, update=1, episodes=0, margin_endings=0, transitions_per_s=48663.3)
    row.update(values)
    return row


def test_an_update_without_an_ended_episode_reads_a_dash_not_nan():
    line = progress_line(_row(success_rate=math.nan, mean_progress=math.nan), 600)
    assert "nan" not in line
    assert line == ("ppo [..............................] 1/600  48,663 transitions/s  episodes 0  success -  "
                    "progress -  edge-band endings 0")


def test_an_update_with_ended_episodes_and_a_validation_reads_their_values():
    row = _row(update=600, episodes=205, success_rate=1.0, mean_progress=0.9996, margin_endings=1,
               validation_success_rate=0.998)
    assert progress_line(row, 600) == ("ppo [##############################] 600/600  48,663 transitions/s  "
                                       "episodes 205  success 1.00  progress 1.000  edge-band endings 1  "
                                       "validation success 0.998")


def _log(tmp_path, rows):
    import csv

    path = tmp_path / "log.csv"
    with open(path, "w", newline="") as f:
        writer = csv.DictWriter(f, LOG_FIELDS)
        writer.writeheader()
        writer.writerows(rows)
    return path


def _drawn(tmp_path, monkeypatch, rows):
    """The figure `draw_curve` draws from ``rows``: its axes' titles, each
    one's finite plotted points and texts."""
    import numpy as np

    from racing_stack.ppo import logs

    figures = []
    monkeypatch.setattr(logs, "save_figure", lambda fig, path: figures.append(fig))
    logs.draw_curve(_log(tmp_path, rows), tmp_path / "curve.png")
    (fig,) = figures
    return {ax.get_title(): (sum(int(np.isfinite(line.get_ydata()).sum()) for line in ax.get_lines()),
                             [t.get_text() for t in ax.texts]) for ax in fig.axes}


def test_a_curve_without_laps_shows_its_rewards_and_says_it_has_no_lap(tmp_path, monkeypatch):
    """The CPU preset's kind of run: episodes rarely end and none laps.
    Its one ended episode is a point, the reward shows every update, and
    the lap panel says why it is empty."""
    rows = [_row(update=u, transitions=32 * u, success_rate=math.nan, mean_progress=math.nan,
                 median_lap_time_s=math.nan, mean_reward=0.01 * u) for u in range(1, 9)]
    rows[4].update(success_rate=0.0, mean_progress=0.3)
    drawn = _drawn(tmp_path, monkeypatch, rows)
    assert drawn["ended episodes"] == (2, [])
    assert drawn["median lap time of the completed laps"] == (0, ["no lap completed yet"])
    assert drawn["Train rollouts: mean reward a step"] == (8, [])


def test_a_curve_with_laps_and_validations_draws_them_without_the_note(tmp_path, monkeypatch):
    rows = [_row(update=u, transitions=32 * u, success_rate=0.5, mean_progress=0.9, median_lap_time_s=30.0 - u,
                 mean_reward=0.02, validation_success_rate=0.9 if u == 4 else math.nan,
                 validation_median_lap_time_s=27.0 if u == 4 else math.nan) for u in range(1, 5)]
    drawn = _drawn(tmp_path, monkeypatch, rows)
    assert drawn["ended episodes"] == (4 + 4 + 1, [])
    assert drawn["median lap time of the completed laps"] == (4 + 1, [])
