"""The learning features and the shaped reward against independent
references: the NumPy and JAX feature paths on real tracks, the wheel
margins (`racing_env.geometry.road_geometry`, tested on hand-built roads in
racing_env) against the Race Core's own off-track test, and
`ShapedReward`'s endings step by step."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from racing_env import LEVEL_0, ProjectConfig, TerminationReason, Track, VecCarRacingEnv, level0_track
from racing_env.car import wheel_points
from racing_env.race import points_on_track, track_arrays
from racing_env.geometry import road_geometry
from racing_stack.features import LocalTrack
from racing_stack.reward import MARGIN, MAX_CRASH_SPEED_MPS, NO_ENDING, STALL, Endings, ShapedReward

CONFIG = ProjectConfig()
FIELDS = ("position", "yaw", "velocity_body", "yaw_rate", "steering_angle", "centerline", "left_boundary",
          "right_boundary", "track_mask", "track_length")


def wrap(angle):
    """Angles into (-pi, pi], float64."""
    return np.angle(np.exp(1j * np.asarray(angle, np.float64)))


def wheels_by_hand(position, yaw, wheelbase, track_width):
    """[E, 4, 2] front left, front right, rear left, rear right, float64."""
    c, s = np.cos(yaw), np.sin(yaw)
    out = []
    for ahead, left in ((wheelbase, track_width / 2), (wheelbase, -track_width / 2), (0.0, track_width / 2),
                        (0.0, -track_width / 2)):
        out.append(np.stack([position[:, 0] + c * ahead - s * left, position[:, 1] + s * ahead + c * left], 1))
    return np.stack(out, 1)


# ----------------------------------------------------------------- features on real tracks


def ellipse_track(points=301, a=80.0, b=50.0, half_width=4.0, track_id=7):
    theta = 2 * np.pi * np.arange(points) / points
    return Track.from_centerline(np.stack([a * np.cos(theta), b * np.sin(theta)], 1), half_width, track_id)


#: Level 0, an ellipse of another width and point count, and one whose
#: width changes along the lap.
TRACKS = (level0_track(), ellipse_track(),
          ellipse_track(257, 70.0, 55.0, 3.5 + 0.8 * np.sin(6 * np.pi * np.arange(257) / 257), 8))


@pytest.fixture(scope="module")
def env_obs():
    """The env's own reset observation (its fields, shapes and dtypes)."""
    env = VecCarRacingEnv(1, config=CONFIG, level=LEVEL_0, backend="cpu_reference", track=level0_track())
    obs, _ = env.reset(seed=11)
    return {k: np.asarray(v) for k, v in obs.items()}


def random_obs(rng, env_obs, worlds, spread=2.0):
    """World 0 is the env's own reset observation; the rest stand on random
    rows of `TRACKS` at random poses near the centerline, in the env's dtypes."""
    rows = rng.integers(len(TRACKS), size=worlds)
    obs = {k: np.repeat(env_obs[k][:1], worlds, axis=0) for k in FIELDS}
    for w in range(1, worlds):
        track = TRACKS[rows[w]]
        for k in ("centerline", "left_boundary", "right_boundary", "track_mask", "track_length"):
            obs[k][w] = getattr(track, k)
        i = rng.integers(track.num_points)
        obs["position"][w] = track.centerline[i] + rng.normal(0.0, spread, 2)
        obs["yaw"][w] = rng.uniform(-np.pi, np.pi)
        obs["velocity_body"][w] = rng.normal(0.0, 10.0, 2)
        obs["yaw_rate"][w] = rng.normal()
        obs["steering_angle"][w] = rng.uniform(-0.6, 0.6)
    rows[0] = 0
    assert all(obs[k].dtype == env_obs[k].dtype for k in FIELDS)
    return obs, rows


@pytest.mark.parametrize("interpolate", [False, True], ids=["rounded", "interpolated"])
@pytest.mark.parametrize("points, spacing, scale", [(20, 6.0, 25.0), (1, 3.0, 10.0), (7, 17.5, 50.0)])
def test_numpy_and_jax_features_agree_on_real_tracks(env_obs, points, spacing, scale, interpolate):
    rng = np.random.default_rng(points)
    worlds = 33
    obs, _ = random_obs(rng, env_obs, worlds)
    previous = np.stack([rng.uniform(-0.6, 0.6, worlds), rng.uniform(-8.0, 4.0, worlds)], 1).astype(np.float32)
    previous[0] = 0.0  # an episode's first step
    previous[1] = [0.6, -8.0]
    previous[2] = [-0.6, 4.0]
    wrapper = LocalTrack(points=points, spacing_m=spacing, scale_m=scale, interpolate=interpolate)

    host = wrapper.host(obs, previous)
    device = np.asarray(wrapper({k: jnp.asarray(v) for k, v in obs.items()}, jnp.asarray(previous)))

    assert host.shape == device.shape == (worlds, wrapper.size) == (worlds, 14 + 6 * points)
    assert host.dtype == device.dtype == np.float32
    assert np.all(np.isfinite(host))
    np.testing.assert_allclose(host, device, rtol=1e-5, atol=2e-5)
    for got in (host, device):
        np.testing.assert_allclose(got[:, 4], previous[:, 0] / 0.6, rtol=1e-6)
        np.testing.assert_allclose(got[:, 5], previous[:, 1] / 8.0, rtol=1e-6)
    assert np.all(host[0, 4:6] == 0.0)


def sliding_obs(track, first, slides, yaw=None):
    """One world per pose: the car's rear axle ``slides`` cm along the
    centerline from point ``first``, at the yaw of that point's segment (or
    ``yaw``), on ``track``."""
    line = track.centerline[:track.num_points].astype(np.float64)
    step = np.linalg.norm(np.roll(line, -1, 0) - line, axis=1)
    arc = np.concatenate([[0.0], np.cumsum(step)])
    s = arc[first] + 0.01 * np.arange(slides)
    i = np.searchsorted(arc, s, side="right") - 1
    position = line[i] + ((s - arc[i]) / step[i])[:, None] * (line[(i + 1) % len(line)] - line[i])
    d = line[first + 1] - line[first]
    obs = {"position": position.astype(np.float32),
           "yaw": np.full(slides, np.arctan2(d[1], d[0]) if yaw is None else yaw, np.float32),
           "velocity_body": np.zeros((slides, 2), np.float32), "yaw_rate": np.zeros(slides, np.float32),
           "steering_angle": np.zeros(slides, np.float32)}
    for k in ("centerline", "left_boundary", "right_boundary", "track_mask", "track_length"):
        obs[k] = np.repeat(np.asarray(getattr(track, k))[None], slides, axis=0)
    return obs


@pytest.mark.parametrize("track", TRACKS, ids=["level0", "ellipse", "ellipse-of-changing-width"])
def test_the_interpolated_preview_moves_continuously_with_the_car(track):
    """The car slides 1 cm at a time over three points of centerline at a
    fixed yaw. Interpolated, every preview coordinate moves by about the
    slide (at most the slide times the ratio of the segments' lengths where
    a place is, plus the slide itself); rounded, the preview jumps by about
    a point's spacing wherever the nearest point changes."""
    line = track.centerline[:track.num_points].astype(np.float64)
    step = np.linalg.norm(np.roll(line, -1, 0) - line, axis=1)
    first = 10
    obs = sliding_obs(track, first, int(300 * step[first:first + 3].mean()))
    previous = np.zeros((len(obs["yaw"]), 2), np.float32)
    left = track.left_boundary[:track.num_points].astype(np.float64)
    right = track.right_boundary[:track.num_points].astype(np.float64)
    longest = max(np.max(np.linalg.norm(np.roll(b, -1, 0) - b, axis=1)) for b in (line, left, right))
    bound = 0.01 * (1 + longest / step.min()) / 25.0
    smooth = np.abs(np.diff(LocalTrack(interpolate=True).host(obs, previous)[:, 14:], axis=0)).max()
    rounded = np.abs(np.diff(LocalTrack().host(obs, previous)[:, 14:], axis=0)).max()
    assert smooth <= bound + 1e-5, (smooth, bound)
    assert rounded >= 0.4 * step.min() / 25.0  # a point's spacing, seen along the car's axis


def test_the_interpolated_preview_is_spacing_apart_on_a_straight_road():
    """A square loop of 1 m points (100 m sides, the road 8 m wide), the car
    on its first side at x = 10.3 m, 0.2 m left of the centerline, facing
    along it: the k-th interpolated place is exactly 6 k m ahead on the
    centerline (0.2 m to the car's right) and on each edge; the rounded
    preview starts at the nearest point, 0.3 m behind."""
    side = np.arange(100, dtype=np.float32)
    loop = np.concatenate([np.stack([side, 0 * side], 1), np.stack([100 + 0 * side, side], 1),
                           np.stack([100 - side, 100 + 0 * side], 1), np.stack([0 * side, 100 - side], 1)])
    inward = np.concatenate([np.repeat([[0.0, 1.0]], 100, 0), np.repeat([[-1.0, 0.0]], 100, 0),
                             np.repeat([[0.0, -1.0]], 100, 0), np.repeat([[1.0, 0.0]], 100, 0)]).astype(np.float32)
    track = {"centerline": loop, "left_boundary": loop + 4 * inward, "right_boundary": loop - 4 * inward,
             "track_mask": np.ones(400, bool), "track_length": np.float32(400.0)}
    obs = {"position": np.array([[10.3, 0.2]], np.float32), "yaw": np.zeros(1, np.float32),
           "velocity_body": np.zeros((1, 2), np.float32), "yaw_rate": np.zeros(1, np.float32),
           "steering_angle": np.zeros(1, np.float32), **{k: np.asarray(v)[None] for k, v in track.items()}}
    ahead = 6.0 * np.arange(12)  # all on the first side
    for interpolate, start in ((True, 0.0), (False, -0.3)):
        wrapper = LocalTrack(points=12, interpolate=interpolate)
        got = wrapper.host(obs, np.zeros((1, 2), np.float32))[0, 14:].reshape(3, 12, 2)
        for line, y in zip(got, (-0.2, 3.8, -4.2)):  # centerline, left, right
            np.testing.assert_allclose(line[:, 0] * 25.0, start + ahead, atol=1e-4)
            np.testing.assert_allclose(line[:, 1] * 25.0, y, atol=1e-5)


def brute_force_road(obs, w, wheelbase, track_width):
    """(half width, lateral, heading error, margins [4]) of world ``w``: the
    distance to every segment of the loop, float64."""
    n = int(obs["track_mask"][w].sum())
    a = obs["centerline"][w, :n].astype(np.float64)
    b = np.roll(a, -1, axis=0)
    position = obs["position"][w : w + 1].astype(np.float64)
    yaw = float(obs["yaw"][w])
    points = np.concatenate([position, wheels_by_hand(position, np.array([yaw]), wheelbase, track_width)[0]])
    ab, ap = b - a, points[:, None, :] - a
    t = np.clip(np.sum(ap * ab, -1) / np.sum(ab * ab, -1), 0.0, 1.0)
    dist = np.linalg.norm(ap - t[..., None] * ab, axis=-1)  # [5, n]
    best = np.argmin(dist, axis=1)
    k = np.arange(5)
    side = np.sign(ab[best, 0] * ap[k, best, 1] - ab[best, 1] * ap[k, best, 0])
    nearest = np.argmin(np.sum((a - position) ** 2, -1))
    half = np.linalg.norm(obs["left_boundary"][w, nearest].astype(np.float64) - a[nearest])
    heading = wrap(yaw - np.arctan2(ab[best[0], 1], ab[best[0], 0]))
    return half, side[0] * dist[0, best[0]], heading, half - dist[1:, :][k[:4], best[1:]]


def test_road_features_match_a_brute_force_search_on_real_tracks(env_obs):
    """Features 6-13 (half width, lateral offset / half width, sine and
    cosine of the heading error, margins) against the nearest of *all* the
    loop's segments. At a corner's outside the rear axle may be as near to
    two segments: the heading error then differs by one segment's turn."""
    rng = np.random.default_rng(3)
    worlds = 48
    obs, rows = random_obs(rng, env_obs, worlds, spread=3.0)
    got = LocalTrack().host(obs, np.zeros((worlds, 2), np.float32))
    for w in range(worlds):
        half, lateral, heading, margins = brute_force_road(obs, w, CONFIG.wheelbase_m, CONFIG.track_width_m)
        line = TRACKS[rows[w]].centerline[:TRACKS[rows[w]].num_points].astype(np.float64)
        d = np.roll(line, -1, 0) - line
        turn = np.max(np.abs(wrap(np.diff(np.arctan2(d[:, 1], d[:, 0]), append=np.arctan2(d[0, 1], d[0, 0])))))
        np.testing.assert_allclose(got[w, 6], half / 6.0, atol=1e-5)
        np.testing.assert_allclose(got[w, 7], lateral / half, atol=1e-4)
        np.testing.assert_allclose(got[w, 8:10], [np.sin(heading), np.cos(heading)], atol=turn + 1e-5)
        np.testing.assert_allclose(got[w, 10:14], margins / 6.0, atol=1e-4)


def test_wheel_margins_agree_with_the_race_cores_off_track_test():
    """On tracks of one width (as track_gen makes them), a wheel more than
    1 cm beyond the edge by its margin is off the road by `points_on_track`
    (the env's own test), one 1 cm inside it is on it. (Measured: they agree
    to 0.3 mm; the margins take the half width at the rear axle's nearest
    point, so where the width changes along the lap they may not.)"""
    rng = np.random.default_rng(0)
    worlds, constant = 1000, TRACKS[:2]
    stacked = {k: jnp.asarray(np.stack([getattr(t, k) for t in constant])) for k in
               ("centerline", "left_boundary", "right_boundary", "track_mask", "track_length", "track_id")}
    tracks = jax.jit(track_arrays)(**stacked)
    rows = rng.integers(len(constant), size=worlds)
    position = []
    for w in range(worlds):
        track = constant[rows[w]]
        i = rng.integers(track.num_points)
        normal = track.left_boundary[i] - track.centerline[i]
        position.append(track.centerline[i] + rng.uniform(-1.6, 1.6) * normal + rng.normal(0.0, 0.5, 2))
    position = jnp.asarray(np.asarray(position, np.float32))
    yaw = jnp.asarray(rng.uniform(-np.pi, np.pi, worlds).astype(np.float32))
    nearest, _, _, _, margins, _ = jax.jit(road_geometry, static_argnums=(0, 6, 7))(
        jnp, position, yaw, stacked["centerline"][rows], stacked["left_boundary"][rows], tracks.num_points[rows],
        CONFIG.wheelbase_m, CONFIG.track_width_m)
    on = np.asarray(jax.jit(points_on_track)(tracks, jnp.asarray(rows, jnp.int32), nearest,
                                             wheel_points(CONFIG, position, yaw)))
    margins = np.asarray(margins)
    off_by_margin, on_by_margin = margins < -0.01, margins > 0.01
    assert off_by_margin.mean() > 0.2 and on_by_margin.mean() > 0.4  # both sides are well tested
    assert not np.any(on[off_by_margin]), np.argwhere(on & off_by_margin)
    assert np.all(on[on_by_margin]), np.argwhere(~on & on_by_margin)


def test_the_env_ends_off_track_where_a_margin_turns_negative():
    """Drive the real env (cpu_reference, Level 0) hard left until it ends
    the episode off track: every earlier step has all four margins above
    -1 cm, the terminal observation one below +1 cm."""
    env = VecCarRacingEnv(1, config=CONFIG, level=LEVEL_0, backend="cpu_reference", track=level0_track())
    obs, _ = env.reset(seed=1)
    action = np.array([[0.6, 4.0]], np.float32)
    wrapper = LocalTrack(points=1)
    least = []
    for _ in range(400):
        obs, _, terminated, _, info = env.step(action)
        host = {k: np.asarray(v) for k, v in obs.items()}
        least.append(float(wrapper.host(host, action)[0, 10:14].min() * 6.0))
        if bool(terminated[0]):
            break
    assert int(info["termination_reason"][0]) == TerminationReason.OFF_TRACK
    assert len(least) > 5 and min(least[:-1]) > -0.01 and least[-1] < 0.01, least


# ----------------------------------------------------------------- ShapedReward, step by step

HALF = 3.0  # the straight road's half width, m
LENGTH = 150.0  # its lap length, m
#: Lateral offsets (m) of a car heading along the road: on the centre, in
#: the 0.75 m band (the outer wheels 0.2 m inside the edge), off the road.
CENTRE, BAND, OFF = 0.0, 2.0, 2.5
SHAPER = ShapedReward(metres_scale=0.1, step_cost=0.01, off_track_penalty=2.0, crash_energy_cost=0.05,
                      edge_margin_m=0.75, stall_steps=5, stall_penalty=7.0)
WORLDS = 4


def road_obs(lateral, speed=10.0, length=LENGTH):
    """A straight road along +x (120 points, 1.25 m apart), each world's car
    on it at x = 75 m heading along it, `lateral` m to the left, at `speed`
    m/s (split between the body's axes)."""
    lateral = np.broadcast_to(np.asarray(lateral, np.float32), (WORLDS,))
    speed = np.broadcast_to(np.asarray(speed, np.float32), (WORLDS,))
    x = 1.25 * np.arange(120, dtype=np.float32)
    line = np.zeros((WORLDS, 128, 2), np.float32)
    line[:, :120, 0] = x
    left = line.copy()
    left[:, :120, 1] = HALF
    mask = np.zeros((WORLDS, 128), np.int8)
    mask[:, :120] = 1
    return {"position": jnp.asarray(np.stack([np.full(WORLDS, 75.0), lateral], 1), jnp.float32),
            "yaw": jnp.zeros(WORLDS, jnp.float32),
            "velocity_body": jnp.asarray(np.stack([0.8 * speed, -0.6 * speed], 1)),
            "centerline": jnp.asarray(line), "left_boundary": jnp.asarray(left), "track_mask": jnp.asarray(mask),
            "track_length": jnp.full(WORLDS, length, jnp.float32)}


def run(shaper, steps, memory=None):
    """Call the shaper once per step: each step a dict of per-world values
    (``lateral``, ``reward``, ``reason``, ``done``, ``active``, ``speed``).
    Returns rewards [T, E], endings [T, E] and the memories after each step."""
    memory = shaper.start(WORLDS) if memory is None else memory
    rewards, endings, memories = [], [], []
    for step in steps:
        def field(name, default, dtype, step=step):
            return jnp.asarray(np.broadcast_to(np.asarray(step.get(name, default)), (WORLDS,)), dtype)
        reward, ending, memory = shaper(
            memory, field("reward", 0.01, jnp.float32), road_obs(step.get("lateral", CENTRE), step.get("speed", 10.0)),
            {"termination_reason": field("reason", TerminationReason.NONE, jnp.int32)},
            field("done", False, bool), field("active", 1, jnp.int32))
        assert reward.shape == ending.shape == (WORLDS,) and reward.dtype == jnp.float32 and ending.dtype == jnp.int32
        rewards.append(np.asarray(reward))
        endings.append(np.asarray(ending))
        memories.append(Endings(*(np.asarray(m) for m in memory)))
    low, high = shaper.bounds(LENGTH)
    assert np.all(np.asarray(rewards) >= low - 1e-3) and np.all(np.asarray(rewards) <= high + 1e-3)
    return np.asarray(rewards), np.asarray(endings), memories


def crash(shaper, speed):
    return shaper.off_track_penalty + shaper.crash_energy_cost * min(speed, MAX_CRASH_SPEED_MPS) ** 2


def slide(shaper, speed):
    """The lateral speed (m/s) beyond the free one of a `road_obs` car at
    ``speed``: its body's lateral speed is 0.6 x ``speed``."""
    return max(min(0.6 * speed, MAX_CRASH_SPEED_MPS) - shaper.slip_free_mps, 0.0)


def test_progress_is_metres_less_the_step_cost():
    rng = np.random.default_rng(1)
    challenge = rng.uniform(0.0, 0.02, (3, WORLDS)).astype(np.float32)
    challenge[:, 0] = [0.5, 1.0, 0.001]
    rewards, endings, _ = run(SHAPER, [{"reward": r} for r in challenge])
    np.testing.assert_allclose(rewards, 0.1 * challenge * LENGTH - 0.01, rtol=1e-5, atol=1e-6)
    assert np.all(endings == NO_ENDING)


def test_entering_the_band_ends_once_per_entry_with_a_speed_priced_crash():
    """The band ends the episode on the step of entry only (not the steps
    spent inside), again after leaving and coming back; the cost grows with
    the speed squared up to the cap."""
    speeds = np.array([0.0, 5.0, 30.0, 250.0])  # the last one beyond MAX_CRASH_SPEED_MPS
    laterals = [CENTRE, BAND, BAND, -BAND, CENTRE, -BAND, OFF]
    rewards, endings, memories = run(SHAPER, [{"lateral": y, "speed": speeds} for y in laterals])
    entry = np.array([0, 1, 0, 0, 0, 1, 0], bool)
    np.testing.assert_array_equal(endings, np.where(entry, MARGIN, NO_ENDING)[:, None].repeat(WORLDS, 1))
    costs = np.array([crash(SHAPER, v) for v in speeds])
    np.testing.assert_allclose(rewards, 0.1 * 0.01 * LENGTH - 0.01 - entry[:, None] * costs, rtol=1e-5, atol=1e-5)
    assert [bool(m.inside[0]) for m in memories] == [False, True, True, True, False, True, True]


def test_an_env_off_track_costs_one_crash():
    """The env's OFF_TRACK termination costs the crash, once even where the
    step also enters the band; other terminations cost nothing."""
    off = TerminationReason.OFF_TRACK
    first = {"lateral": [CENTRE, BAND, CENTRE, CENTRE]}
    second = {"lateral": [OFF, OFF, CENTRE, CENTRE], "reason": [off, off, off, TerminationReason.TIMEOUT],
              "done": True, "speed": 20.0}
    rewards, endings, memories = run(SHAPER, [first, second])
    progress = 0.1 * 0.01 * LENGTH - 0.01
    np.testing.assert_allclose(rewards[1], progress - np.array([1, 1, 1, 0]) * crash(SHAPER, 20.0), rtol=1e-5)
    np.testing.assert_array_equal(endings[1], [MARGIN, NO_ENDING, NO_ENDING, NO_ENDING])
    assert not memories[1].inside.any() and not memories[1].still.any()  # done: fresh memory


def test_a_stall_ends_after_exactly_stall_steps_and_counts_again():
    """World 0 makes no progress at all; world 1 makes some at step 3;
    world 2 drives the wrong way (Challenge reward 0) inside the band."""
    zero = [0.0, 0.0, 0.0, 0.0]
    steps = [{"reward": zero} for _ in range(13)]
    steps[2] = {"reward": [0.0, 0.01, 0.0, 0.01]}
    for step in steps:
        step["lateral"] = [CENTRE, CENTRE, BAND, CENTRE]
    rewards, endings, memories = run(SHAPER, steps)
    want = np.full((13, WORLDS), NO_ENDING)
    want[[4, 9], 0] = STALL  # the 5th and the 10th step without progress
    want[[7, 12], 1] = want[[7, 12], 3] = STALL  # 5 after the progress at step 3 (index 2)
    want[0, 2] = MARGIN  # the band does not stop the count
    want[[4, 9], 2] = STALL
    np.testing.assert_array_equal(endings, want)
    stalled = np.zeros((13, WORLDS), bool)
    stalled[[4, 9], 0] = stalled[[7, 12], 1] = stalled[[7, 12], 3] = stalled[[4, 9], 2] = True
    progress = np.array([s["reward"] for s in steps]) * 0.1 * LENGTH - 0.01
    np.testing.assert_allclose(rewards, progress - 7.0 * stalled - (want == MARGIN) * crash(SHAPER, 10.0),
                               rtol=1e-5, atol=1e-5)
    assert [int(m.still[0]) for m in memories[:6]] == [1, 2, 3, 4, 0, 1]


def test_a_crawl_stalls_when_the_stall_needs_progress():
    """With ``stall_progress_m`` = 1.5 the count restarts only once the
    progress since the last restart exceeds 1.5 m: world 0 crawls 0.28 m a
    step (1.4 m in 5 steps: a stall at the 5th, and again 5 later); world 1
    makes 0.6 m a step (restarts at the 3rd, 6th, ...); world 2 makes 1.4 m
    once, then nothing (a stall at the 5th); world 3 jumps 1.65 m at its 3rd
    step (a restart there) and then stands."""
    shaper = dataclasses.replace(SHAPER, stall_progress_m=1.5)
    metres = np.zeros((10, WORLDS))
    metres[:, 0], metres[:, 1], metres[0, 2], metres[2, 3] = 0.28, 0.6, 1.4, 1.65
    rewards, endings, memories = run(shaper, [{"reward": m / LENGTH} for m in metres])
    want = np.full((10, WORLDS), NO_ENDING)
    want[[4, 9], 0] = want[[4, 9], 2] = STALL
    want[7, 3] = STALL
    np.testing.assert_array_equal(endings, want)
    assert [int(m.still[0]) for m in memories] == [1, 2, 3, 4, 0, 1, 2, 3, 4, 0]
    assert [int(m.still[1]) for m in memories] == [1, 2, 0, 1, 2, 0, 1, 2, 0, 1]
    assert [int(m.still[3]) for m in memories] == [1, 2, 0, 1, 2, 3, 4, 0, 1, 2]
    np.testing.assert_allclose([m.progress[1] for m in memories], [0.6, 1.2, 0, 0.6, 1.2, 0, 0.6, 1.2, 0, 0.6],
                               atol=1e-5)
    np.testing.assert_allclose([m.progress[0] for m in memories[:5]], [0.28, 0.56, 0.84, 1.12, 0], atol=1e-5)
    np.testing.assert_allclose(rewards[:, 0], 0.1 * 0.28 - 0.01 - 7.0 * (want[:, 0] == STALL), rtol=1e-5)


def test_done_resets_the_memory():
    """After ``done`` the next step starts fresh: in the band again it is a
    new entry, and the stall count restarts."""
    steps = [{"lateral": BAND, "reward": 0.0}, {"lateral": BAND, "reward": 0.0, "done": True},
             {"lateral": BAND, "reward": 0.0}] + [{"lateral": CENTRE, "reward": 0.0}] * 4
    _, endings, memories = run(SHAPER, steps)
    np.testing.assert_array_equal(endings[:, 0], [MARGIN, NO_ENDING, MARGIN, NO_ENDING, NO_ENDING, NO_ENDING, STALL])
    assert not memories[1].inside.any() and not memories[1].still.any()
    assert memories[2].inside.all() and (memories[2].still == 1).all()


def test_inactive_worlds_never_end_and_stay_fresh():
    """Held worlds (active 0) in the band without progress never end nor
    pay a crash, even one held after 4 steps without progress (world 1);
    once driven, the stall count starts from zero."""
    before = [{"lateral": CENTRE, "reward": 0.0, "active": [0, 1, 1, 1]} for _ in range(4)]
    held = [{"lateral": BAND, "reward": 0.0, "active": [0, 0, 1, 1]} for _ in range(8)]
    driven = [{"lateral": CENTRE, "reward": 0.0, "active": 1} for _ in range(5)]
    rewards, endings, memories = run(SHAPER, before + held + driven)
    assert (memories[3].still == [0, 4, 4, 4]).all()
    assert np.all(endings[:12, :2] == NO_ENDING)
    np.testing.assert_allclose(rewards[4:12, :2], -0.01, rtol=1e-6)
    for m in memories[4:12]:
        assert not m.inside[:2].any() and not m.still[:2].any()
    np.testing.assert_array_equal(endings[12:, :2], [[NO_ENDING] * 2] * 4 + [[STALL] * 2])
    # World 2 enters the band on its 5th step without progress: MARGIN is the
    # code, the stall's penalty is paid as well and its count restarts.
    np.testing.assert_array_equal(endings[4:10, 2], [MARGIN, NO_ENDING, NO_ENDING, NO_ENDING, NO_ENDING, STALL])
    np.testing.assert_allclose(rewards[4, 2], -0.01 - crash(SHAPER, 10.0) - 7.0, rtol=1e-6)


def test_a_stall_of_one_step_ends_every_driven_step_and_no_held_one():
    shaper = ShapedReward(stall_steps=1)
    steps = [{"reward": 0.0, "active": [0, 1, 0, 1]}] * 3
    rewards, endings, _ = run(shaper, steps)
    np.testing.assert_array_equal(endings, [[NO_ENDING, STALL, NO_ENDING, STALL]] * 3)
    np.testing.assert_allclose(rewards, [[0.0, -10.0, 0.0, -10.0]] * 3)


def test_no_band_without_an_edge_margin():
    shaper = ShapedReward(edge_margin_m=0.0, stall_steps=1000)
    rewards, endings, _ = run(shaper, [{"lateral": y} for y in (CENTRE, BAND, OFF, CENTRE, OFF)])
    assert np.all(endings == NO_ENDING)
    np.testing.assert_allclose(rewards, 0.1 * 0.01 * LENGTH, rtol=1e-5)


def reference_step(shaper, memory, reward, lateral, speed, off, done, active):
    """One world's step from the docstring, in plain Python: (reward, ending,
    memory), the progress summed in float32 as the device does."""
    inside = shaper.edge_margin_m > 0 and HALF - abs(lateral) - CONFIG.track_width_m / 2 < shaper.edge_margin_m
    entered = inside and not memory[0] and active
    progress = np.float32(memory[2]) + np.float32(reward) * np.float32(LENGTH)
    moved = progress > shaper.stall_progress_m
    still = 0 if moved else memory[1] + 1
    stalled = still >= shaper.stall_steps and active
    shaped = shaper.metres_scale * reward * LENGTH - shaper.step_cost
    shaped -= crash(shaper, speed) if (off or entered) else 0.0
    shaped -= shaper.stall_penalty if stalled else 0.0
    shaped -= shaper.slip_cost * slide(shaper, speed) ** 2
    ending = MARGIN if entered else STALL if stalled else NO_ENDING
    fresh = done or not active
    return shaped, ending, (inside and not fresh, 0 if (fresh or stalled) else still,
                            0.0 if (fresh or stalled or moved) else float(progress))


@pytest.mark.parametrize("shaper", [SHAPER, dataclasses.replace(SHAPER, stall_progress_m=2.0),
                                    dataclasses.replace(SHAPER, slip_cost=0.002, slip_free_mps=20.0)])
def test_random_timelines_match_a_plain_python_reference(shaper):
    rng = np.random.default_rng(5)
    steps, t = [], 60
    for _ in range(t):
        steps.append({"lateral": rng.choice([CENTRE, 1.0, BAND, -BAND, OFF, -OFF], WORLDS),
                      "reward": np.where(rng.random(WORLDS) < 0.7, 0.0, rng.uniform(0, 0.01, WORLDS)),
                      "speed": rng.uniform(0.0, 150.0, WORLDS),
                      "reason": np.where(rng.random(WORLDS) < 0.1, TerminationReason.OFF_TRACK,
                                         TerminationReason.NONE),
                      "done": rng.random(WORLDS) < 0.1, "active": (rng.random(WORLDS) < 0.85).astype(np.int32)})
    rewards, endings, memories = run(shaper, steps)
    memory = [(False, 0, 0.0)] * WORLDS
    for i, s in enumerate(steps):
        for w in range(WORLDS):
            want, ending, memory[w] = reference_step(
                shaper, memory[w], float(np.float32(s["reward"][w])), s["lateral"][w], float(np.float32(s["speed"][w])),
                s["reason"][w] == TerminationReason.OFF_TRACK, s["done"][w], bool(s["active"][w]))
            assert rewards[i, w] == pytest.approx(want, rel=1e-5, abs=1e-4), (i, w)
            assert endings[i, w] == ending, (i, w)
            got = memories[i]
            assert (bool(got.inside[w]), int(got.still[w])) == memory[w][:2], (i, w)
            assert float(got.progress[w]) == pytest.approx(memory[w][2], rel=1e-6), (i, w)  # an FMA's rounding
    assert {MARGIN, STALL, NO_ENDING} <= set(endings.ravel().tolist())


def test_bounds_are_the_extremes_a_step_can_reach():
    """The least: a capped-speed crash sliding sideways at the cap that is
    also a stall; the greatest: a whole lap in one step."""
    shaper = ShapedReward(metres_scale=0.2, step_cost=0.05, off_track_penalty=3.0, crash_energy_cost=0.02,
                          stall_steps=1, stall_penalty=4.0, slip_cost=0.001, slip_free_mps=1.5)
    low, high = shaper.bounds(LENGTH)
    assert (low, high) == pytest.approx((-0.05 - 3.0 - 0.02 * MAX_CRASH_SPEED_MPS**2 - 0.001 * 98.5**2 - 4.0,
                                         0.2 * LENGTH - 0.05))
    rewards, _, _ = run(shaper, [{"lateral": [BAND, CENTRE, CENTRE, CENTRE], "reward": [0.0, 1.0, 0.5, 0.0],
                                  "speed": [1e4, 0.0, 0.0, 0.0]}])
    np.testing.assert_allclose(rewards[0, :2], [low, high], rtol=1e-6)


def test_a_slide_costs_its_lateral_speed_beyond_the_free_one_squared_shared_with_the_crash_weight():
    """Cars on the centre of the road (no crash, no ending) sliding at
    0.6 x speed sideways: nothing up to ``slip_free_mps``, then ``slip_cost``
    x the excess squared, the lateral speed capped at `MAX_CRASH_SPEED_MPS`;
    the crash weight scales it; without a slide cost a slide costs nothing."""
    shaper = dataclasses.replace(SHAPER, slip_cost=0.02, slip_free_mps=1.5)
    speeds = np.float32([2.0, 2.5, 10.0, 400.0])  # lateral 1.2 (free), 1.5 (the edge), 6.0, 240 (capped at 100)
    obs = road_obs(CENTRE, speeds)
    step = [shaper.start(WORLDS), jnp.full(WORLDS, 0.01, jnp.float32), obs,
            {"termination_reason": jnp.zeros(WORLDS, jnp.int32)}, jnp.zeros(WORLDS, bool), jnp.ones(WORLDS)]
    progress = 0.1 * 0.01 * LENGTH - 0.01
    excess = np.array([0.0, 0.0, 4.5, 98.5])
    for weight in (1.0, 0.25, 0.0):
        reward, ending, _ = shaper(*step, crash_weight=weight)
        np.testing.assert_allclose(reward, progress - weight * 0.02 * excess**2, rtol=1e-5, atol=1e-6)
        assert (np.asarray(ending) == NO_ENDING).all()
    assert np.asarray(shaper(*step)[0])[3] == pytest.approx(shaper.bounds(LENGTH)[0] + 0.01 + 2.0 + 0.05 * 100**2
                                                            + 7.0 + progress, rel=1e-5)  # the bound's slide
    np.testing.assert_allclose(SHAPER(*step)[0], progress, rtol=1e-6)


FIELDS_OF_SHAPER = ("metres_scale", "step_cost", "off_track_penalty", "crash_energy_cost", "stall_penalty",
                    "slip_cost")


@pytest.mark.parametrize("name, bad", [(name, bad) for name in FIELDS_OF_SHAPER
                                       for bad in (-1.0, float("nan"), float("inf"), 1e7, True, "1", None)]
                         + [(name, bad) for name in ("edge_margin_m", "stall_progress_m")
                            for bad in (-0.1, float("nan"), 1e5, True, "0.5")]
                         + [("slip_free_mps", bad) for bad in (-0.1, float("nan"), float("inf"), 100.5, True, "1")]
                         + [("stall_steps", bad) for bad in (0, -3, 2.0, True, 2**31, None)])
def test_bad_shaper_settings_are_refused_by_name(name, bad):
    wrong_type = isinstance(bad, (bool, str)) or bad is None or (isinstance(bad, float) and name == "stall_steps")
    error = TypeError if wrong_type else ValueError
    with pytest.raises(error, match=f"^{name} must be"):
        ShapedReward(**{name: bad})


def test_largest_allowed_settings_are_accepted():
    ShapedReward(metres_scale=1e6, step_cost=0, off_track_penalty=1e6, crash_energy_cost=0.0,
                 edge_margin_m=1e4, stall_steps=2**31 - 1, stall_penalty=0, stall_progress_m=1e4, slip_cost=1e6,
                 slip_free_mps=100.0)
