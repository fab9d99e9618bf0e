"""A trained policy out of the trainer, as a controller plugin directory
that the Runner loads like any other:

    DIR/controller.py   `racing_stack/learned/controller.py`: the policy's mean action
    DIR/config.toml     the plugin's name (what captions and titles call it), the
                        network's widths, its residual, the feature settings
                        (the prior's gains, if any), the device
    DIR/weights.pt      the network with its feature statistics: a Torch
                        state dict in a checked `racing_stack.checkpoints`
                        file of kind "weights", with the settings of
                        config.toml it was trained with (all but the device)

Each file is written atomically: an interrupted export leaves every file
either old or new, never cut (and the next export clears its temporary
files). An export killed between the weights and config.toml leaves new
weights beside the old settings: `load_policy` refuses them by name, as
it refuses a config.toml whose network or feature settings were edited
(features computed otherwise than in training would drive silently
worse). Importing this module imports the networks alone: not JAX, not
the trainer.
"""

from __future__ import annotations

import dataclasses
import json
import tomllib
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from racing_stack import checkpoints
from racing_stack.ppo.networks import ActorCritic

if TYPE_CHECKING:
    from racing_stack.ppo.config import PPOConfig
    from racing_stack.features import LocalTrack

__all__ = ["export_plugin", "load_policy"]

#: The plugin's controller, copied into every exported directory.
CONTROLLER = Path(__file__).parents[1] / "learned" / "controller.py"
#: The entry of weights.pt that holds, as JSON text, the settings of
#: config.toml it was trained with (a weights.pt exported before has none).
_TRAINED_WITH = "trained_with"


def export_plugin(policy: ActorCritic, config: PPOConfig, directory: Path, device: str = "cpu",
                  name: str | None = None) -> Path:
    """Write ``policy`` (trained with ``config``) as a plugin in ``directory``
    (created; its three files replaced) and return the directory.

    Args:
        device: where the plugin runs the network: ``"cpu"`` or ``"cuda"``.
        name: what captions and titles call the plugin (its config.toml's
            ``name``, `racing_env.plugins.Plugin.name`): `racing_stack.ppo.cli.finish`
            gives the run's folder name; None: ``directory``'s name.

    Raises:
        TypeError: a name that is not a string.
        ValueError: a device other than ``"cpu"`` or ``"cuda"``, an empty
            name, or a policy whose residual is not ``config``'s.
    """
    if device not in ("cpu", "cuda"):
        raise ValueError(f"device must be 'cpu' or 'cuda', got {device!r}")
    if name is not None and not isinstance(name, str):
        raise TypeError(f"name must be a string or None, got {type(name).__name__}")
    if name is not None and not name.strip():
        raise ValueError(f"name must not be empty, got {name!r}")
    if policy.residual_share != float(np.float32(config.residual)):  # the policy keeps it in float32
        raise ValueError(f"the policy is a residual of {policy.residual_share:g}, "
                         f"config.residual is {config.residual:g}")
    directory = Path(directory)
    shown = directory.resolve().name if name is None else name
    directory.mkdir(parents=True, exist_ok=True)
    for part in ("controller.py", "weights.pt", "config.toml"):
        checkpoints.remove_stale(directory, part)  # left by a killed export
    f = config.features
    prior = "" if f.prior is None else "\n[features.prior]\n" + "".join(
        f"{k} = {float(v)!r}\n" for k, v in dataclasses.asdict(f.prior).items())
    settings = (
        "# A policy trained by racing_stack.ppo (see controller.py).\n"
        f"name = {_toml_string(shown)}\n"
        f'device = "{device}"\n'
        f"hidden = [{', '.join(str(h) for h in config.hidden)}]\n"
        f"residual = {float(config.residual)!r}\n\n"
        "[features]\n"
        f"points = {f.points}\n"
        f"spacing_m = {float(f.spacing_m)!r}\n"
        f"scale_m = {float(f.scale_m)!r}\n"
        f"interpolate = {'true' if f.interpolate else 'false'}\n" + prior)
    weights = {k: v.detach().cpu() for k, v in policy.state_dict().items()}
    parsed = tomllib.loads(settings)  # as load_policy will read it
    weights[_TRAINED_WITH] = json.dumps({key: parsed[key] for key in ("hidden", "residual", "features")})
    checkpoints.write_atomic(directory / "controller.py", CONTROLLER.read_bytes())
    checkpoints.save(directory / "weights.pt", "weights", weights)
    checkpoints.write_atomic(directory / "config.toml", settings.encode())
    return directory


def _toml_string(text: str) -> str:
    """``text`` as a TOML basic string: JSON's escapes (quotes, backslashes,
    control characters) are TOML's, and DEL, which TOML wants escaped too."""
    return json.dumps(text, ensure_ascii=False).replace("\x7f", "\\u007f")


def load_policy(settings: Mapping[str, Any], weights: Path, low: np.ndarray, high: np.ndarray,
                device: torch.device) -> tuple[ActorCritic, LocalTrack]:
    """The inverse of `export_plugin`: an exported plugin's network, in
    evaluation mode on ``device``, and its features.

    Args:
        settings: the plugin's config.toml, parsed (``hidden``,
            ``residual`` (0 where absent) and the ``features`` table are read).
        weights: its weights.pt.
        low, high: the env's action bounds ([2] each).

    Raises:
        racing_stack.checkpoints.CorruptFile: ``weights`` is damaged, of
            another kind, was trained with other settings than ``settings``
            or does not fit the network of ``settings``.
    """
    from racing_stack.features import LocalTrack  # JAX only when a plugin is loaded, not when one is exported

    features = LocalTrack(**settings["features"])
    policy = ActorCritic(features.size, tuple(settings["hidden"]), 0.0, np.asarray(low), np.asarray(high),
                         settings.get("residual", 0.0))
    state = checkpoints.load(weights, "weights", map_location=device)
    if isinstance(state, dict) and _TRAINED_WITH in state:
        state = dict(state)
        text = state.pop(_TRAINED_WITH)
        try:
            trained = json.loads(text)
            same = ([int(h) for h in trained["hidden"]] == [int(h) for h in settings["hidden"]]
                    and float(trained["residual"]) == float(settings.get("residual", 0.0))
                    and LocalTrack(**trained["features"]) == features)  # 4 and 4.0 are the same setting
        except (TypeError, ValueError, KeyError) as error:
            raise checkpoints.CorruptFile(f"{weights} holds no readable training settings ({error})") from None
        if not same:
            raise checkpoints.CorruptFile(f"{weights} was trained with other settings than its config.toml's "
                                          f"(an interrupted export, or an edit): trained with {text}")
    policy.load_checked(state, f"{weights} (for the network of config.toml)")
    return policy.to(device).eval(), features

