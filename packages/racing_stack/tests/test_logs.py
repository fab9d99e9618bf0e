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
                    "progress -  margin endings 0")


def test_an_update_with_ended_episodes_and_a_validation_reads_their_values():
    row = _row(update=600, episodes=205, success_rate=1.0, mean_progress=0.9996, margin_endings=1,
               validation_success_rate=0.998)
    assert progress_line(row, 600) == ("ppo [##############################] 600/600  48,663 transitions/s  "
                                       "episodes 205  success 1.00  progress 1.000  margin endings 1  "
                                       "validation success 0.998")
