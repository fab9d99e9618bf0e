"""A PPO run's settings (`PPOConfig`) and the presets."""

from __future__ import annotations

import ast
import dataclasses
from typing import Any

from racing_env import checks

from racing_stack.pools import SPLITS
from racing_stack.prior import PursuitPrior
from racing_stack.ppo.networks import MIN_RESIDUAL
from racing_stack.features import LocalTrack
from racing_stack.reward import ShapedReward

__all__ = ["MATMUL_PRECISIONS", "MAX_WEIGHTS", "MAX_WIDTH", "POLICY_LAGS", "PRESETS", "SCHEDULES", "UPDATE_PATHS",
           "PPOConfig"]

#: The tables a setting can name (dotted), what each holds and whether it may be None.
_TABLES = {"features": (LocalTrack, False), "reward": (ShapedReward, False), "features.prior": (PursuitPrior, True)}
#: The widest hidden layer a config accepts.
MAX_WIDTH = 16384
#: The most weights a config's policy or value network may hold (4 GiB of
#: float32; its gradient and the optimizer's moments hold three times that).
MAX_WEIGHTS = 2**30
#: How the step size moves: on the KL of each update, linearly to
#: ``learning_rate / updates``, or not at all.
SCHEDULES = ("adaptive", "linear", "constant")
#: How an update's minibatch steps run (`racing_stack.ppo.algorithm.PPOUpdate`).
UPDATE_PATHS = ("eager", "graph")
#: The precisions of the policy's matmuls a run may train with (`PPOConfig.matmul_precision`).
MATMUL_PRECISIONS = ("highest", "high", "bf16")
#: How many updates the acting policy may lag the learned one (`PPOConfig.policy_lag`).
POLICY_LAGS = (0, 1)


@dataclasses.dataclass(frozen=True)
class PPOConfig:
    """Everything a training run depends on.

    Attributes:
        worlds: env worlds of this process (its GPU), each one rollout row;
            under ``torchrun`` every process drives this many.
        steps: calls per world per rollout.
        updates: rollouts (and optimisation phases) in the run.
        epochs: passes over a rollout per update.
        minibatches: minibatches per pass.
        gamma, gae_lambda: the discount and the GAE trace parameter.
        clip: PPO's ratio clip.
        learning_rate: Adam's step size at the first update.
        schedule: ``"adaptive"`` (the step size x or / 1.5 after an update
            whose mean KL is below half or above twice ``desired_kl``, kept in
            [``min_learning_rate``, ``max_learning_rate``]), ``"linear"`` (down to
            ``learning_rate / updates`` at the last update) or ``"constant"``.
        desired_kl: the adaptive schedule's target KL per update.
        min_learning_rate, max_learning_rate: the adaptive schedule's bounds.
        value_coef, entropy_coef: loss weights.
        max_grad_norm: gradient clipping, of the actor's and the critic's
            gradients apart.
        hidden: hidden layer widths of both networks.
        init_log_std: the initial log standard deviation of the normalised
            action, per dimension (steering, acceleration).
        residual: 0, or the policy is a residual on ``features.prior`` (the
            pure-pursuit prior) of this share of the action's half range, in
            [1e-6, 2] (`ActorCritic`).
        seed: the env's root reset seed and Torch's generator seed.
        max_episode_steps: the training Level's timeout (control steps).
        crash_warmup_updates: the crash and slide costs (`ShapedReward`) are phased in
            linearly over this many counted updates (0: paid in full from
            the start), so that steering is learned before caution.
        crash_warmup_success: an update counts towards the warm-up only if
            the episodes its rollout ended lapped at least this share (0:
            every update counts; `warms_up`), so that the cost is not
            charged while the policy cannot yet lap.
        stagger_steps: at the start, world w is held braked (its calls
            masked out of training) for a uniform random 0 to
            ``stagger_steps`` calls, so that the worlds' laps are out of phase.
        tracks: Train pool rows trained on (its first N, at most 10,000; None: all).
        checkpoint_every: updates between checkpoints.
        validate_every: updates between validations (0: none).
        validation_tracks: Validation rows a validation drives (its first N
            of 1,000, the "select" rows); the chosen policy is confirmed on
            the next N.
        select_success_rate: the validation success rate that is enough:
            among validations that reach it the faster median lap wins;
            below it the higher success rate (then the faster lap). 1.0:
            the most laps first, whatever the lap time.
        validation_steps: a validation counts a world that has not ended
            after this many calls (or made no progress for
            `racing_stack.ppo.validation.STALL_S`, 5 s) as failed.
        features: the observation wrapper.
        reward: the reward wrapper.
        update_path: ``"eager"`` (every kernel launched from Python: the
            reference, and the path on the CPU) or ``"graph"`` (on one
            CUDA device: the policy's work of each rollout step and, from
            the second update on, the whole optimisation (every
            minibatch's forward, backward, clipping and fused optimizer
            step) replayed as captured CUDA graphs: the eager kernels on
            the same data, so the eager numbers; on the CPU and in a
            ``torchrun`` of several processes, eager).
            How, not what: a run may resume on the other path.
        matmul_precision: the precision of the policy's matmuls in the
            rollout steps and the update: ``"highest"`` (float32),
            ``"high"`` (TF32 on the tensor cores of GPUs that have them:
            another rounding of every matmul's inputs, so other numbers) or
            ``"bf16"`` (under Torch's autocast: the matmuls, their outputs
            and the hidden activations in bfloat16, the losses, the
            feature statistics and the optimizer in float32).
        policy_lag: 0, or 1: the rollout of update u + 1 is driven by the
            policy (and pays the crash weight) of update u - 1, the one
            update u starts from, so that it can be collected while update
            u optimises (on a CUDA device, concurrently: the env's steps
            on a stream of their own). The loss is then PPO's decoupled
            one (`racing_stack.ppo.losses.ppo_losses`): ratio and clip
            against the policy update u + 1 starts from, each row weighted
            by that policy's probability over the acting one's. What, not
            how: a resume keeps it.
        compiled: a minibatch's forward pass and loss, and with them its
            backward pass, through ``torch.compile`` (Inductor: the
            elementwise passes between the matmuls fused into a few
            kernels, which keep float32 inside where autocast rounds each
            pass's output to bfloat16: other roundings, so other numbers).
            Compiled at the first update (seconds to a minute, in the
            first update's time). What, not how: a resume keeps it.
        act_in_jax: the rollout as one JAX program
            (`racing_stack.ppo.jax_rollout`): the policy's acting half
            (normaliser, mean network, noise, log probability, the env's
            action) inside the env's jitted step and all ``steps`` calls
            one ``lax.scan``, the values computed after it in Torch over
            all its rows; no host work and no framework crossing between
            the env's calls. XLA's products, not Torch's: other roundings,
            so other numbers. What, not how: a resume keeps it.
    """

    worlds: int = 8192
    steps: int = 32
    updates: int = 200
    epochs: int = 4
    minibatches: int = 4
    gamma: float = 0.998
    gae_lambda: float = 0.95
    clip: float = 0.2
    learning_rate: float = 3e-4
    schedule: str = "adaptive"
    desired_kl: float = 0.01
    min_learning_rate: float = 1e-5
    max_learning_rate: float = 1e-3
    value_coef: float = 0.5
    entropy_coef: float = 0.0
    max_grad_norm: float = 1.0
    hidden: tuple[int, ...] = (256, 256)
    init_log_std: tuple[float, float] = (-1.6, -0.9)
    residual: float = 0.0
    seed: int = 0
    max_episode_steps: int = 2500
    crash_warmup_updates: int = 0
    crash_warmup_success: float = 0.0
    stagger_steps: int = 1500
    tracks: int | None = None
    checkpoint_every: int = 500
    validate_every: int = 150
    validation_tracks: int = 500
    validation_steps: int = 2500
    select_success_rate: float = 0.99
    features: LocalTrack = LocalTrack()
    reward: ShapedReward = ShapedReward()
    update_path: str = "eager"
    matmul_precision: str = "highest"
    policy_lag: int = 0
    compiled: bool = False
    act_in_jax: bool = False

    def __post_init__(self) -> None:
        for name in ("worlds", "steps", "updates", "epochs", "minibatches", "max_episode_steps",
                     "checkpoint_every", "validation_tracks", "validate_every", "stagger_steps",
                     "validation_steps", "crash_warmup_updates"):
            value, low = getattr(self, name), 0 if name in ("validate_every", "stagger_steps",
                                                          "crash_warmup_updates") else 1
            object.__setattr__(self, name, checks.integer_in(value, name, low, 2**31, "2**31"))
        for name, choices in (("schedule", SCHEDULES), ("update_path", UPDATE_PATHS),
                              ("matmul_precision", MATMUL_PRECISIONS)):
            value = getattr(self, name)
            if not isinstance(value, str):
                raise TypeError(f"{name} must be a str, one of {choices}, got {checks.shown(value)}")
            if value not in choices:
                raise ValueError(f"{name} must be one of {choices}, got {checks.shown(value)}")
            object.__setattr__(self, name, str(value))
        for name in ("compiled", "act_in_jax"):
            if not isinstance(getattr(self, name), bool):
                raise TypeError(f"{name} must be a bool, got {checks.shown(getattr(self, name))}")
        object.__setattr__(self, "policy_lag", checks.integer_in(self.policy_lag, "policy_lag", 0, len(POLICY_LAGS)))
        if (self.worlds * self.steps) % self.minibatches:
            raise ValueError(f"minibatches ({self.minibatches}) must divide worlds x steps "
                             f"({self.worlds * self.steps})")
        # Beyond these bounds training cannot work (a step size above 1, a
        # standard deviation that underflows or spans the action range many
        # times over): refused by name rather than stopped by the guard.
        for name, low, high, closed in (("gamma", 0.0, 1.0, True), ("gae_lambda", 0.0, 1.0, True),
                                        ("clip", 0.0, 10.0, False), ("learning_rate", 0.0, 1.0, False),
                                        ("desired_kl", 0.0, 10.0, False),
                                        ("min_learning_rate", 0.0, 1.0, False),
                                        ("max_learning_rate", 0.0, 1.0, False),
                                        ("max_grad_norm", 0.0, 1e6, False),
                                        ("value_coef", 0.0, 1e3, True), ("entropy_coef", 0.0, 1e3, True),
                                        ("crash_warmup_success", 0.0, 1.0, True), ("residual", 0.0, 2.0, True),
                                        ("select_success_rate", 0.0, 1.0, False)):
            object.__setattr__(self, name, checks.real_in(getattr(self, name), name, low, high, low_open=not closed))
        if self.min_learning_rate > self.max_learning_rate:
            raise ValueError(f"min_learning_rate ({self.min_learning_rate}) exceeds max_learning_rate "
                             f"({self.max_learning_rate})")
        std = self.init_log_std
        if not isinstance(std, tuple) or len(std) != 2:
            raise ValueError(f"init_log_std must be a pair (steering, acceleration), got {checks.shown(std)}")
        object.__setattr__(self, "init_log_std", tuple(checks.real_in(value, "init_log_std", -10.0, 2.0)
                                                       for value in std))
        if not isinstance(self.hidden, tuple):
            raise TypeError(f"hidden must be a tuple of ints, got {checks.shown(self.hidden)}")
        if not self.hidden:
            raise ValueError("hidden must be a non-empty tuple of layer widths, got ()")
        object.__setattr__(self, "hidden", tuple(checks.integer_in(h, "hidden's widths", 1, MAX_WIDTH + 1)
                                                 for h in self.hidden))
        object.__setattr__(self, "seed", checks.integer_in(self.seed, "seed", 0, 2**32, "2**32"))
        if not isinstance(self.features, LocalTrack) or not isinstance(self.reward, ShapedReward):
            raise TypeError("features must be a LocalTrack and reward a ShapedReward")
        widths = (self.features.size, *self.hidden, 2)
        weights = sum(a * b for a, b in zip(widths, widths[1:]))
        if weights > MAX_WEIGHTS:
            raise ValueError(f"hidden makes a network of {weights:,} weights on {self.features.size} features; "
                             f"at most {MAX_WEIGHTS:,} (2**30)")
        if 0.0 < self.residual < MIN_RESIDUAL:
            raise ValueError(f"residual must be 0 or in [1e-6, 2], got {self.residual!r}")
        if self.residual and self.features.prior is None:
            raise ValueError("residual needs a prior to correct: set features.prior (e.g. features.prior={})")
        if self.tracks is not None:
            size = SPLITS["train"].size
            object.__setattr__(self, "tracks", checks.integer_in(self.tracks, "tracks", 1, size + 1))
        if self.validation_tracks > SPLITS["validation"].size:
            raise ValueError(f"validation_tracks must be at most the Validation split's "
                             f"{SPLITS['validation'].size} tracks, got {self.validation_tracks}")

    def warms_up(self, success_rate: float) -> bool:
        """Whether an update whose rollout's ended episodes lapped
        ``success_rate`` of the time (NaN: none ended) counts towards the
        crash cost's warm-up."""
        return self.crash_warmup_success == 0.0 or success_rate >= self.crash_warmup_success

    def to_json(self) -> dict[str, Any]:
        """A JSON-ready dict (the wrappers as dicts)."""
        return dataclasses.asdict(self)

    def override(self, settings: list[str]) -> PPOConfig:
        """A copy with ``name=value`` settings replaced (``features.NAME`` and
        ``reward.NAME`` reach into the wrappers); a value is a Python literal
        (``3e-4``, ``True``, ``(128, 128)``, ``None``). A table's settings
        may be given at once as a dict or None (``features.prior={}``: the
        prior at its defaults, whose gains later settings can then name).

        Raises:
            ValueError: a setting that is not ``name=value``, an unknown
                name, a value that is not a literal, or one the config
                refuses (a table's values as soon as it is given, the
                others once every setting is in: one may need the next).
            TypeError: a setting that is not a string.
        """
        if not isinstance(settings, (list, tuple)):
            raise TypeError(f"settings must be a list of name=value strings, got {checks.shown(settings)}")
        data = self.to_json()
        for setting in settings:
            if not isinstance(setting, str):
                raise TypeError(f"a setting must be a str, name=value, got {checks.shown(setting)}")
            name, sep, text = setting.partition("=")
            path = name.strip().split(".")
            if not sep or not all(path):
                raise ValueError(f"a setting must be name=value, got {checks.shown(setting)}")
            node = data
            for key in path[:-1]:
                if not isinstance(node.get(key), dict):
                    raise ValueError(f"unknown setting {checks.shown(name)}")
                node = node[key]
            if path[-1] not in node:
                raise ValueError(f"unknown setting {checks.shown(name)}; the settings are "
                                 f"{sorted(flat(self.to_json()))}")
            try:
                value = ast.literal_eval(text.strip())
            except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
                raise ValueError(f"setting {checks.shown(name)}: {checks.shown(text)} is not a Python "
                                 f"literal") from None
            table = _TABLES.get(".".join(path))
            if table is not None:  # checked at once, and every name of it is there for the next settings
                if value is None and not table[1]:
                    raise ValueError(f"setting {checks.shown(name)} is a table: give a dict of its settings")
                try:
                    value = None if value is None else dataclasses.asdict(checks.settings_table(table[0], value,
                                                                                                name))
                except TypeError as error:
                    raise ValueError(f"setting {checks.shown(name)}: {error}") from None
            node[path[-1]] = value
        try:
            return PPOConfig.from_json(data)
        except TypeError as error:  # e.g. hidden=3: not a sequence
            raise ValueError(f"bad settings: {error}") from None

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> PPOConfig:
        """The inverse of `to_json`.

        Raises:
            TypeError: ``hidden`` or ``init_log_std`` not a list or tuple,
                ``features`` or ``reward`` not a mapping; and as `PPOConfig`.
            ValueError: as `PPOConfig`, and a table's unknown name.
        """
        data = dict(data)
        for name in ("hidden", "init_log_std"):
            if not isinstance(data[name], (list, tuple)):
                raise TypeError(f"{name} must be a list or tuple, got {checks.shown(data[name])}")
            data[name] = tuple(data[name])
        data["features"] = checks.settings_table(LocalTrack, data["features"], "features")
        data["reward"] = checks.settings_table(ShapedReward, data["reward"], "reward")
        return cls(**data)


def flat(tree: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """A config's JSON (or any nested dict) as ``{dotted setting name: value}``."""
    out: dict[str, Any] = {}
    for key, value in tree.items():
        if isinstance(value, dict):
            out.update(flat(value, f"{prefix}{key}."))
        else:
            out[prefix + key] = value
    return out


#: The CPU preset finishes in minutes (16 worlds, the first 16 Train tracks,
#: 200-step episodes, 4 Validation tracks); it shows the loop working, it
#: does not learn a lap. The GPU preset is the full run on one GPU (8,192
#: worlds, the update captured as CUDA graphs with bf16 matmuls, the
#: fastest path that passes the release's gates; the PPO page's recipe and
#: ledger say why each setting).
PRESETS = {
    "cpu": PPOConfig(worlds=16, steps=32, updates=30, epochs=4, minibatches=2, hidden=(64, 64),
                     max_episode_steps=200, stagger_steps=50, tracks=16, checkpoint_every=10, learning_rate=1e-3,
                     validate_every=10, validation_tracks=4, validation_steps=200),
    "gpu": PPOConfig(update_path="graph", matmul_precision="bf16", updates=600, schedule="linear",
                     learning_rate=1e-3, clip=0.1, crash_warmup_updates=200, crash_warmup_success=0.5,
                     validate_every=300, init_log_std=(-1.6, -1.6),
                     reward=ShapedReward(crash_energy_cost=1.0, stall_progress_m=1.0, slip_cost=0.1)),
}
