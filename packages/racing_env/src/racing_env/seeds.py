"""Deterministic, domain-separated seeds: NumPy's ``SeedSequence`` in pure JAX.

Every random choice the environment makes for world ``world`` in its episode
``episode`` of a run rooted at ``root`` comes from one uint32 word, the first
word that NumPy's ``SeedSequence`` draws from four entropy words:

```text
word = np.random.SeedSequence([root, domain, world, episode]).generate_state(1, np.uint32)[0]
```

The words drawn, exactly:

- episode seed = ``seed_word(root, EPISODE_DOMAIN, world, episode)``
  (``EPISODE_DOMAIN = 0``);
- controller seed = ``seed_word(root, CONTROLLER_DOMAIN, world, episode)``
  (``CONTROLLER_DOMAIN = 1``);
- TrackPool row = ``pool_row(seed_word(root, TRACK_DOMAIN, world, episode), pool_size)``
  (``TRACK_DOMAIN = 2``), i.e. ``floor(word * pool_size / 2**32)``: rows are
  drawn with replacement.

Here ``root``, ``world`` (the world index in ``[0, num_worlds)``) and
``episode`` (that world's episode counter; the env decides when it advances)
are each one full uint32 word in ``[0, 2**32)``. The domain word comes second,
so the three streams of a world differ even where root, world and episode
agree.

:func:`seed_word` and :func:`generate_state` compute these words in uint32
JAX arithmetic only (wrapping multiply, logical shifts, no float, no int64),
so they run inside a jitted step on any device without a host round trip,
under ``jit`` and ``vmap``, with ``jax_enable_x64`` on or off, and are bitwise
equal to NumPy. :func:`host_seed_word` and :func:`host_pool_row` are the host
references that the tests compare against.

Only the case the environment needs is implemented: exactly four entropy
words, NumPy's default pool size of 4, no spawn key. (NumPy pads shorter
entropy with zeros, so ``SeedSequence(5)`` equals ``SeedSequence([5, 0, 0,
0])``; an int ``>= 2**32`` would become two words, which is why every word is
checked to lie in ``[0, 2**32)``.)
"""

from __future__ import annotations

from typing import Union

import jax
import jax.numpy as jnp
import numpy as np

from racing_env.checks import integer_in

__all__ = [
    "CONTROLLER_DOMAIN",
    "EPISODE_DOMAIN",
    "TRACK_DOMAIN",
    "generate_state",
    "host_pool_row",
    "host_seed_word",
    "pool_row",
    "seed_word",
]

EPISODE_DOMAIN: int = 0
"""Domain word of episode seeds."""
CONTROLLER_DOMAIN: int = 1
"""Domain word of controller seeds."""
TRACK_DOMAIN: int = 2
"""Domain word of the TrackPool row choice."""

#: A word argument: a Python/NumPy int in ``[0, 2**32)`` or a uint32 array.
WordLike = Union[int, np.integer, np.ndarray, jax.Array]

_UINT32_END = 2**32
_POOL_SIZE_END = 2**31
_MASK32 = 0xFFFFFFFF

# numpy/random/bit_generator.pyx (SeedSequence), uint32 words.
_POOL_SIZE = 4
_INIT_A = 0x43B0D7E5
_MULT_A = 0x931E8875
_INIT_B = 0x8B51F9DD
_MULT_B = 0x58F38DED
_MIX_MULT_L = np.uint32(0xCA01F9DD)
_MIX_MULT_R = np.uint32(0x4973F715)
_XSHIFT = np.uint32(16)
_LOW16 = np.uint32(0xFFFF)


def _hash_constants(init: int, mult: int, count: int) -> list[tuple[np.uint32, np.uint32]]:
    """(xor constant, multiplier) of ``count`` successive hashmix calls.

    NumPy's running hash constant never depends on the data (``h <- h * mult``
    after each use), so it is unrolled here on the host with Python ints and
    enters the traced code as uint32 literals.
    """
    constants = []
    h = init
    for _ in range(count):
        h_next = (h * mult) & _MASK32
        constants.append((np.uint32(h), np.uint32(h_next)))
        h = h_next
    return constants


# mix_entropy: one hashmix per pool word, then one per ordered pair (src != dst).
_MIX_ENTROPY_CONSTANTS = _hash_constants(_INIT_A, _MULT_A, _POOL_SIZE * _POOL_SIZE)


def _hashmix(value: jax.Array, xor_constant: np.uint32, multiplier: np.uint32) -> jax.Array:
    # The JAX array stays the left operand so NumPy scalars never take over the op.
    value = (value ^ xor_constant) * multiplier
    return value ^ (value >> _XSHIFT)


def _mix(x: jax.Array, y: jax.Array) -> jax.Array:
    result = x * _MIX_MULT_L - y * _MIX_MULT_R
    return result ^ (result >> _XSHIFT)


def _pool(words: list[jax.Array]) -> list[jax.Array]:
    """SeedSequence.mix_entropy for exactly four uint32 words (broadcast shapes)."""
    constants = iter(_MIX_ENTROPY_CONSTANTS)
    mixer = [_hashmix(word, *next(constants)) for word in words]
    for i_src in range(_POOL_SIZE):
        for i_dst in range(_POOL_SIZE):
            if i_src != i_dst:
                mixer[i_dst] = _mix(mixer[i_dst], _hashmix(mixer[i_src], *next(constants)))
    return mixer


def _draw(pool: list[jax.Array], n_words: int) -> list[jax.Array]:
    """SeedSequence.generate_state(n_words, np.uint32) from the mixed pool."""
    constants = _hash_constants(_INIT_B, _MULT_B, n_words)
    return [
        _hashmix(pool[i % _POOL_SIZE], xor_constant, multiplier)
        for i, (xor_constant, multiplier) in enumerate(constants)
    ]


def _as_word(value: object, name: str) -> jax.Array:
    """A word argument as a uint32 JAX array (a scalar one for ints)."""
    if isinstance(value, (bool, np.bool_, int, np.integer)):
        return jnp.asarray(np.uint32(integer_in(value, name, 0, _UINT32_END, "2**32")))
    dtype = getattr(value, "dtype", None)
    if dtype is None:
        raise TypeError(
            f"{name} must be an int in [0, 2**32) or a uint32 array, got {type(value).__name__}"
        )
    if dtype != np.uint32:
        # Casting would silently wrap negatives and truncate wider ints.
        raise TypeError(
            f"{name} must be a uint32 array, got dtype {dtype}; "
            f"cast it explicitly (e.g. {name}.astype(jnp.uint32)) once its values are known "
            f"to lie in [0, 2**32)"
        )
    return jnp.asarray(value)


def generate_state(entropy: jax.Array, n_words: int = 1) -> jax.Array:
    """NumPy's ``SeedSequence(list(row)).generate_state(n_words, np.uint32)`` per row, in JAX.

    Args:
      entropy: uint32 ``[..., 4]``: exactly four entropy words per row, each a
        full uint32 (pool size 4, no spawn key). A JAX or NumPy array; traced
        values are fine.
      n_words: number of uint32 words to draw per row, an int ``>= 0``
        (static under ``jit``: ``jax.jit(generate_state, static_argnums=1)``).

    Returns:
      uint32 ``[..., n_words]``: row ``r`` equals
      ``np.random.SeedSequence([int(w) for w in entropy[r]]).generate_state(n_words, np.uint32)``
      bitwise. Works under ``jit`` and ``vmap``, with x64 on or off.

    Raises:
      TypeError: ``entropy`` is not a uint32 array, or ``n_words`` is not an int.
      ValueError: ``entropy``'s last axis is not 4, or ``n_words < 0``.
    """
    n_words = integer_in(n_words, "n_words", 0, _UINT32_END, "2**32")
    dtype = getattr(entropy, "dtype", None)
    if dtype is None or dtype != np.uint32:
        got = f"dtype {dtype}" if dtype is not None else type(entropy).__name__
        raise TypeError(f"entropy must be a uint32 array [..., 4], got {got}")
    shape = tuple(entropy.shape)
    if len(shape) == 0 or shape[-1] != _POOL_SIZE:
        raise ValueError(f"entropy must have shape [..., 4] (four words per row), got {shape}")
    entropy = jnp.asarray(entropy)
    if n_words == 0:
        return jnp.zeros(shape[:-1] + (0,), dtype=jnp.uint32)
    words = [entropy[..., i] for i in range(_POOL_SIZE)]
    return jnp.stack(_draw(_pool(words), n_words), axis=-1)


def seed_word(root: WordLike, domain: WordLike, world: WordLike, episode: WordLike) -> jax.Array:
    """The first word of ``SeedSequence([root, domain, world, episode])``, in JAX.

    Each argument is a Python/NumPy int in ``[0, 2**32)`` or a uint32 array
    (JAX or NumPy, traced or not); arrays broadcast against each other like
    NumPy's. Arrays of other dtypes are refused rather than cast, since a cast
    would wrap negatives silently; so are Python ints passed *through*
    ``jax.jit`` as arguments (they arrive as int32 tracers): close over them
    or pass uint32 arrays.

    Args:
      root: the run's root seed.
      domain: ``EPISODE_DOMAIN``, ``CONTROLLER_DOMAIN`` or ``TRACK_DOMAIN``
        (any word is accepted).
      world: world index.
      episode: the world's episode counter.

    Returns:
      uint32 of the broadcast shape (``()`` when all four are scalars), equal
      bitwise to ``np.random.SeedSequence([root, domain, world, episode])
      .generate_state(1, np.uint32)[0]`` elementwise.

    Raises:
      TypeError: an argument is a bool, float, non-uint32 array or other type
        (the message names it).
      ValueError: an int argument lies outside ``[0, 2**32)`` (the message
        names it), or the shapes do not broadcast.
    """
    named = {"root": root, "domain": domain, "world": world, "episode": episode}
    words = [_as_word(value, name) for name, value in named.items()]
    try:
        shape = jnp.broadcast_shapes(*(word.shape for word in words))
    except ValueError:
        shapes = ", ".join(f"{name} {tuple(word.shape)}" for name, word in zip(named, words))
        raise ValueError(f"root, domain, world and episode do not broadcast: {shapes}") from None
    words = [jnp.broadcast_to(word, shape) for word in words]
    return _draw(_pool(words), 1)[0]


def host_seed_word(root: int, domain: int, world: int, episode: int) -> int:
    """The NumPy reference of :func:`seed_word`, on the host.

    Returns:
      ``int(np.random.SeedSequence([root, domain, world, episode])
      .generate_state(1, np.uint32)[0])``, an int in ``[0, 2**32)``.

    Raises:
      TypeError: an argument is not an int (bools and floats included); the
        message names it.
      ValueError: an argument lies outside ``[0, 2**32)``; the message names it.
    """
    named = {"root": root, "domain": domain, "world": world, "episode": episode}
    entropy = [integer_in(value, name, 0, _UINT32_END, "2**32") for name, value in named.items()]
    return int(np.random.SeedSequence(entropy).generate_state(1, np.uint32)[0])


def pool_row(word: WordLike, pool_size: int) -> jax.Array:
    """Map uint32 selection words to rows in ``[0, pool_size)``, with replacement.

    ``row = floor(word * pool_size / 2**32)``: the high 32 bits of the 64-bit
    product, computed from 16-bit limbs in uint32 so it needs no x64. Each row
    receives either ``floor(2**32 / pool_size)`` or one more of the ``2**32``
    words.

    Args:
      word: uint32 array of any shape (JAX or NumPy, traced or not) or a
        Python/NumPy int in ``[0, 2**32)``.
      pool_size: number of rows, an int in ``[1, 2**31)``.

    Returns:
      int32 of ``word``'s shape, each in ``[0, pool_size)``.

    Raises:
      TypeError: ``word`` is not a uint32 array or int, or ``pool_size`` is not
        an int (the message names it).
      ValueError: ``word`` (an int) or ``pool_size`` is out of range (the
        message names it).
    """
    pool_size = integer_in(pool_size, "pool_size", 1, _POOL_SIZE_END, "2**31")
    word = _as_word(word, "word")
    size_low = np.uint32(pool_size & 0xFFFF)
    size_high = np.uint32(pool_size >> 16)
    word_low = word & _LOW16
    word_high = word >> _XSHIFT
    low_low = word_low * size_low
    low_high = word_low * size_high
    high_low = word_high * size_low
    high_high = word_high * size_high
    # Bits 16..31 of the product plus the carries out of them; each term < 2**16.
    middle = (low_low >> _XSHIFT) + (low_high & _LOW16) + (high_low & _LOW16)
    high = high_high + (low_high >> _XSHIFT) + (high_low >> _XSHIFT) + (middle >> _XSHIFT)
    return high.astype(jnp.int32)


def host_pool_row(word: int, pool_size: int) -> int:
    """The reference of :func:`pool_row`: ``(word * pool_size) >> 32`` with Python ints.

    Raises:
      TypeError: ``word`` or ``pool_size`` is not an int (the message names it).
      ValueError: ``word`` outside ``[0, 2**32)`` or ``pool_size`` outside
        ``[1, 2**31)`` (the message names it).
    """
    word = integer_in(word, "word", 0, _UINT32_END, "2**32")
    pool_size = integer_in(pool_size, "pool_size", 1, _POOL_SIZE_END, "2**31")
    return (word * pool_size) >> 32
