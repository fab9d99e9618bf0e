"""racing_env.seeds against NumPy's SeedSequence (the independent reference)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from racing_env import seeds

N_ROWS = 4096
N_WORDS = (1, 2, 5, 8)
EDGE_WORDS = (0, 1, 2**31 - 1, 2**31, 2**32 - 2, 2**32 - 1)


def _random_entropy(n_rows: int, seed: int) -> np.ndarray:
    """uint32 [n_rows, 4]: edge rows first, then uniform words over the full uint32 range."""
    rng = np.random.default_rng(seed)
    edges = np.array(
        [[w, w, w, w] for w in EDGE_WORDS]
        + [[0, 0, 0, 2**32 - 1], [2**32 - 1, 0, 0, 0], [2**31, 2**31 - 1, 0, 2**32 - 1]],
        dtype=np.uint64,
    )
    uniform = rng.integers(0, 2**32, size=(n_rows - len(edges), 4), dtype=np.uint64)
    return np.concatenate([edges, uniform]).astype(np.uint32)


def _numpy_state(entropy: np.ndarray, n_words: int) -> np.ndarray:
    """uint32 [rows, n_words] from NumPy's SeedSequence, one row at a time."""
    return np.array(
        [
            np.random.SeedSequence([int(w) for w in row]).generate_state(n_words, np.uint32)
            for row in entropy
        ],
        dtype=np.uint32,
    ).reshape(len(entropy), n_words)


def _numpy_word(root: int, domain: int, world: int, episode: int) -> int:
    seq = np.random.SeedSequence([root, domain, world, episode])
    return int(seq.generate_state(1, np.uint32)[0])


@pytest.fixture(scope="module")
def entropy() -> np.ndarray:
    return _random_entropy(N_ROWS, seed=20261201)


@pytest.fixture(scope="module")
def numpy_states(entropy: np.ndarray) -> dict[int, np.ndarray]:
    return {n: _numpy_state(entropy, n) for n in N_WORDS}


def test_entropy_covers_the_full_uint32_range(entropy: np.ndarray) -> None:
    assert entropy.dtype == np.uint32
    assert entropy.min() == 0 and entropy.max() == 2**32 - 1
    assert (entropy >= 2**31).mean() > 0.4


@pytest.mark.parametrize("jitted", [False, True], ids=["eager", "jit"])
@pytest.mark.parametrize("n_words", N_WORDS)
def test_generate_state_matches_numpy(
    entropy: np.ndarray, numpy_states: dict[int, np.ndarray], n_words: int, jitted: bool
) -> None:
    fn = jax.jit(seeds.generate_state, static_argnums=1) if jitted else seeds.generate_state
    got = fn(jnp.asarray(entropy), n_words)
    assert got.dtype == jnp.uint32
    assert got.shape == (N_ROWS, n_words)
    np.testing.assert_array_equal(np.asarray(got), numpy_states[n_words])


def test_generate_state_batch_dims_and_vmap(
    entropy: np.ndarray, numpy_states: dict[int, np.ndarray]
) -> None:
    ref = numpy_states[5]
    batched = entropy[:24].reshape(2, 3, 4, 4)
    got = seeds.generate_state(batched, 5)
    assert got.shape == (2, 3, 4, 5) and got.dtype == jnp.uint32
    np.testing.assert_array_equal(np.asarray(got).reshape(24, 5), ref[:24])

    one_row = seeds.generate_state(entropy[7], 5)
    assert one_row.shape == (5,)
    np.testing.assert_array_equal(np.asarray(one_row), ref[7])

    vmapped = jax.jit(jax.vmap(lambda row: seeds.generate_state(row, 5)))(jnp.asarray(entropy))
    np.testing.assert_array_equal(np.asarray(vmapped), ref)


def test_generate_state_accepts_numpy_and_zero_words(entropy: np.ndarray) -> None:
    np.testing.assert_array_equal(
        np.asarray(seeds.generate_state(entropy[:16])), _numpy_state(entropy[:16], 1)
    )
    empty = seeds.generate_state(entropy[:3], 0)
    assert empty.shape == (3, 0) and empty.dtype == jnp.uint32
    assert np.random.SeedSequence([1, 2, 3, 4]).generate_state(0, np.uint32).shape == (0,)


_X64_SCRIPT = textwrap.dedent(
    """
    import jax
    import jax.numpy as jnp
    import numpy as np
    from racing_env import seeds

    assert jax.config.jax_enable_x64
    rng = np.random.default_rng(7)
    edges = np.array([[0, 0, 0, 0], [2**32 - 1] * 4, [2**31, 2**31 - 1, 0, 2**32 - 1]], np.uint64)
    entropy = np.concatenate([edges, rng.integers(0, 2**32, size=(2045, 4), dtype=np.uint64)])
    entropy = entropy.astype(np.uint32)
    for n_words in (1, 2, 5, 8):
        ref = np.array(
            [np.random.SeedSequence([int(w) for w in row]).generate_state(n_words, np.uint32)
             for row in entropy],
            dtype=np.uint32,
        )
        for fn in (seeds.generate_state, jax.jit(seeds.generate_state, static_argnums=1)):
            got = fn(jnp.asarray(entropy), n_words)
            assert got.dtype == jnp.uint32, got.dtype
            np.testing.assert_array_equal(np.asarray(got), ref)

    world = jnp.arange(64, dtype=jnp.uint32)
    closed = jax.jit(lambda w, e: seeds.seed_word(2**32 - 1, seeds.TRACK_DOMAIN, w, e))
    for fn in (lambda w, e: seeds.seed_word(2**32 - 1, seeds.TRACK_DOMAIN, w, e), closed):
        got = fn(world, jnp.asarray(np.uint32(2**31 + 5)))
        assert got.dtype == jnp.uint32, got.dtype
        ref = [seeds.host_seed_word(2**32 - 1, 2, w, 2**31 + 5) for w in range(64)]
        np.testing.assert_array_equal(np.asarray(got), np.array(ref, np.uint32))

    words = jnp.asarray(entropy[:, 0])
    for size in (1, 3, 10000, 2**31 - 1):
        rows = jax.jit(lambda w: seeds.pool_row(w, size))(words)
        assert rows.dtype == jnp.int32, rows.dtype
        ref = [(int(w) * size) >> 32 for w in entropy[:, 0]]
        np.testing.assert_array_equal(np.asarray(rows), np.array(ref, np.int64))
    print("X64_OK")
    """
)


def test_bitwise_equal_with_x64_on() -> None:
    env = dict(os.environ, JAX_ENABLE_X64="1", JAX_PLATFORMS="cpu")
    result = subprocess.run(
        [sys.executable, "-c", _X64_SCRIPT], env=env, capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, result.stderr[-4000:]
    assert "X64_OK" in result.stdout


def test_x64_is_off_in_this_process() -> None:
    # The x64 check above must not have leaked its global flag into this process.
    assert not jax.config.jax_enable_x64
    assert jnp.asarray(1).dtype == jnp.int32


@pytest.mark.parametrize("jitted", [False, True], ids=["eager", "jit"])
def test_seed_word_broadcasts_world_and_episode(jitted: bool) -> None:
    num_worlds, num_episodes = 37, 11
    world = jnp.arange(num_worlds, dtype=jnp.uint32)[:, None]
    episode = np.arange(num_episodes, dtype=np.uint32)[None, :] + np.uint32(2**32 - 5)
    root = 2**32 - 1
    def fn(world, episode):
        return seeds.seed_word(root, seeds.EPISODE_DOMAIN, world, episode)

    got = (jax.jit(fn) if jitted else fn)(world, episode)
    assert got.dtype == jnp.uint32
    assert got.shape == (num_worlds, num_episodes)
    ref = np.array(
        [
            [_numpy_word(root, 0, w, int(e)) for e in episode[0]]
            for w in range(num_worlds)
        ],
        dtype=np.uint32,
    )
    np.testing.assert_array_equal(np.asarray(got), ref)


def test_seed_word_scalar_and_traced_root() -> None:
    got = seeds.seed_word(5, 0, 0, 0)
    assert got.shape == () and got.dtype == jnp.uint32
    # NumPy pads short entropy with zeros: SeedSequence(5) == SeedSequence([5, 0, 0, 0]).
    assert int(got) == int(np.random.SeedSequence(5).generate_state(1, np.uint32)[0])
    assert int(got) == _numpy_word(5, 0, 0, 0)

    roots = np.array([0, 1, 2**31, 2**32 - 1], dtype=np.uint32)
    traced = jax.jit(jax.vmap(lambda r: seeds.seed_word(r, seeds.CONTROLLER_DOMAIN, 3, 4)))
    np.testing.assert_array_equal(
        np.asarray(traced(jnp.asarray(roots))),
        np.array([_numpy_word(int(r), 1, 3, 4) for r in roots], dtype=np.uint32),
    )


def test_seed_word_equals_generate_state(
    entropy: np.ndarray, numpy_states: dict[int, np.ndarray]
) -> None:
    cols = [jnp.asarray(entropy[:, i]) for i in range(4)]
    np.testing.assert_array_equal(np.asarray(seeds.seed_word(*cols)), numpy_states[1][:, 0])


def test_domains_are_separated_and_match_numpy(entropy: np.ndarray) -> None:
    rows = entropy[:512]
    root, world, episode = (rows[:, i] for i in (0, 1, 2))
    assert (seeds.EPISODE_DOMAIN, seeds.CONTROLLER_DOMAIN, seeds.TRACK_DOMAIN) == (0, 1, 2)
    got = np.stack(
        [
            np.asarray(jax.jit(seeds.seed_word)(root, np.uint32(domain), world, episode))
            for domain in (seeds.EPISODE_DOMAIN, seeds.CONTROLLER_DOMAIN, seeds.TRACK_DOMAIN)
        ]
    )
    ref = np.array(
        [
            [_numpy_word(int(r), domain, int(w), int(e)) for r, w, e in zip(root, world, episode)]
            for domain in (0, 1, 2)
        ],
        dtype=np.uint32,
    )
    np.testing.assert_array_equal(got, ref)
    assert (ref[0] != ref[1]).all() and (ref[0] != ref[2]).all() and (ref[1] != ref[2]).all()


def test_host_seed_word_is_numpy() -> None:
    for args in [(0, 0, 0, 0), (2**32 - 1, 2, 2**32 - 1, 2**31), (12345, 1, 7, 99)]:
        assert seeds.host_seed_word(*args) == _numpy_word(*args)
        assert seeds.host_seed_word(*args) == int(seeds.seed_word(*args))
    assert seeds.host_seed_word(np.uint32(3), np.int64(1), 2, 3) == _numpy_word(3, 1, 2, 3)


def test_seed_word_stays_on_device_under_jit() -> None:
    fn = jax.jit(lambda root, world: seeds.seed_word(root, seeds.TRACK_DOMAIN, world, 2**32 - 1))
    root = jnp.asarray(np.uint32(2**31 + 1))
    world = jnp.arange(16, dtype=jnp.uint32)
    with jax.transfer_guard("disallow"):
        got = fn(root, world)
    ref = [_numpy_word(2**31 + 1, 2, w, 2**32 - 1) for w in range(16)]
    np.testing.assert_array_equal(np.asarray(got), np.array(ref, dtype=np.uint32))


POOL_SIZES = (1, 2, 3, 7, 640, 1000, 10000, 65535, 65536, 65537, 2**24 + 3, 2**31 - 1)


@pytest.mark.parametrize("pool_size", POOL_SIZES)
def test_pool_row_matches_host_reference(entropy: np.ndarray, pool_size: int) -> None:
    words = np.concatenate([np.array(EDGE_WORDS, dtype=np.uint32), entropy.reshape(-1)])
    got = jax.jit(lambda w: seeds.pool_row(w, pool_size))(jnp.asarray(words))
    assert got.dtype == jnp.int32 and got.shape == words.shape
    got = np.asarray(got)
    ref = np.array([seeds.host_pool_row(int(w), pool_size) for w in words], dtype=np.int64)
    np.testing.assert_array_equal(got, ref)
    assert got.min() >= 0 and got.max() < pool_size
    assert got[0] == 0  # word 0
    assert got[len(EDGE_WORDS) - 1] == pool_size - 1  # word 2**32 - 1


def test_pool_row_shapes_and_host_reference() -> None:
    assert seeds.host_pool_row(0, 5) == 0
    assert seeds.host_pool_row(2**32 - 1, 5) == 4
    assert seeds.host_pool_row(2**31, 10) == 5
    assert seeds.host_pool_row(2**32 - 1, 2**31 - 1) == 2**31 - 2
    scalar = seeds.pool_row(2**32 - 1, 10000)
    assert scalar.shape == () and scalar.dtype == jnp.int32 and int(scalar) == 9999
    grid = seeds.pool_row(np.full((3, 5), 2**31, dtype=np.uint32), 10)
    assert grid.shape == (3, 5) and (np.asarray(grid) == 5).all()


def test_track_row_is_track_domain_word_mapped() -> None:
    world = jnp.arange(32, dtype=jnp.uint32)
    rows = seeds.pool_row(seeds.seed_word(99, seeds.TRACK_DOMAIN, world, 4), 10000)
    ref = [seeds.host_pool_row(_numpy_word(99, 2, w, 4), 10000) for w in range(32)]
    np.testing.assert_array_equal(np.asarray(rows), np.array(ref))


# Bad inputs: the error names the argument.

BAD_WORDS = [
    (-1, ValueError),
    (2**32, ValueError),
    (2**40, ValueError),
    (1.0, TypeError),
    (True, TypeError),
    (np.bool_(False), TypeError),
    ("3", TypeError),
]
WORD_ARGS = ("root", "domain", "world", "episode")


@pytest.mark.parametrize("position", range(4), ids=WORD_ARGS)
@pytest.mark.parametrize(("bad", "error"), BAD_WORDS)
def test_seed_word_rejects_bad_ints(position: int, bad, error) -> None:
    name = WORD_ARGS[position]
    args = [1, 2, 3, 4]
    args[position] = bad
    with pytest.raises(error, match=name):
        seeds.seed_word(*args)
    with pytest.raises(error, match=name):
        seeds.host_seed_word(*args)


@pytest.mark.parametrize("position", range(4), ids=WORD_ARGS)
def test_seed_word_rejects_non_uint32_arrays(position: int) -> None:
    name = WORD_ARGS[position]
    for bad in (jnp.arange(3), np.arange(3, dtype=np.int64), np.zeros(3, np.float32)):
        args: list = [1, 2, 3, 4]
        args[position] = bad
        with pytest.raises(TypeError, match=name):
            seeds.seed_word(*args)
    args = [1, 2, 3, 4]
    args[position] = [1, 2]
    with pytest.raises(TypeError, match=name):
        seeds.seed_word(*args)


def test_seed_word_rejects_mismatched_shapes() -> None:
    with pytest.raises(ValueError, match="world"):
        seeds.seed_word(1, 0, np.zeros(3, np.uint32), np.zeros(4, np.uint32))


def test_generate_state_rejects_bad_inputs(entropy: np.ndarray) -> None:
    with pytest.raises(TypeError, match="entropy"):
        seeds.generate_state(entropy.astype(np.int64))
    with pytest.raises(TypeError, match="entropy"):
        seeds.generate_state([1, 2, 3, 4])
    with pytest.raises(ValueError, match="entropy"):
        seeds.generate_state(entropy[:, :3])
    with pytest.raises(ValueError, match="entropy"):
        seeds.generate_state(np.uint32(5))
    for bad, error in ((-1, ValueError), (2.0, TypeError), (True, TypeError)):
        with pytest.raises(error, match="n_words"):
            seeds.generate_state(entropy[:2], bad)


@pytest.mark.parametrize(
    ("bad", "error"),
    [(0, ValueError), (-1, ValueError), (2**31, ValueError), (10.0, TypeError), (True, TypeError)],
)
def test_pool_row_rejects_bad_pool_size(bad, error) -> None:
    words = np.zeros(3, np.uint32)
    with pytest.raises(error, match="pool_size"):
        seeds.pool_row(words, bad)
    with pytest.raises(error, match="pool_size"):
        seeds.host_pool_row(0, bad)


@pytest.mark.parametrize(("bad", "error"), BAD_WORDS)
def test_pool_row_rejects_bad_word(bad, error) -> None:
    with pytest.raises(error, match="word"):
        seeds.pool_row(bad, 10)
    with pytest.raises(error, match="word"):
        seeds.host_pool_row(bad, 10)
    with pytest.raises(TypeError, match="word"):
        seeds.pool_row(jnp.arange(3), 10)


def test_seed_word_refuses_python_ints_traced_by_jit() -> None:
    # jit turns a Python int argument into an int32 tracer whose value is unknown: refused,
    # since a negative one would wrap silently. Close over ints or pass uint32 arrays instead.
    with pytest.raises(TypeError, match="episode"):
        jax.jit(seeds.seed_word)(np.uint32(1), np.uint32(0), np.uint32(2), 3)
