"""Kept for one release: the learning wrappers' names, each given from its
new home with a `DeprecationWarning`. Import them from there:

- `racing_stack.features`: `LocalTrack` (the policy's features) and
  `MAX_LENGTH_M`;
- `racing_stack.reward`: `ShapedReward`, `Endings`, `NO_ENDING`, `MARGIN`,
  `STALL`, `MAX_REWARD_TERM`, `MAX_CRASH_SPEED_MPS`;
- `racing_env.geometry`: `road_geometry` (where a car sits on its road).

Plugins exported before the split (``from racing_stack.wrappers import
LocalTrack``) load through this module.
"""

from racing_env.moved import moved_names

#: Each old name and its new home.
MOVED = {**{name: f"racing_stack.features.{name}" for name in ("LocalTrack", "MAX_LENGTH_M")},
         **{name: f"racing_stack.reward.{name}" for name in ("ShapedReward", "Endings", "NO_ENDING", "MARGIN",
                                                              "STALL", "MAX_REWARD_TERM", "MAX_CRASH_SPEED_MPS")},
         "road_geometry": "racing_env.geometry.road_geometry"}

__all__: list[str] = []
__getattr__ = moved_names(__name__, MOVED)
