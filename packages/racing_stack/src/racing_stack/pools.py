"""Level 1's TrackPools: disjoint track_gen seed namespaces per split, built
reproducibly into a local cache and verified against committed manifests.

    python -m racing_stack.pools [--splits train validation test] [--cache DIR] [--write-manifests] [--verbose]

Split ``s`` draws its tracks from the seed namespace ``[first, first +
NAMESPACE)`` of `SPLITS`: seeds are generated in order, in batches, at
track_gen's default preset, and the first ``size`` valid courses become the
pool's rows, in seed order (``track_id`` = the seed). The namespaces are
disjoint, so no track is in two splits. Pools are always built on the CPU
device (track_gen and JAX), the reference whose bytes the committed
manifests' geometry hashes bind: a GPU build agrees only to a tolerance.

A pool file is big (the 10,000-track Train pool is ~160 MB), so it lives in
a cache (``$RACING_STACK_CACHE`` or ``~/.cache/racing_stack``); its manifest
(ids and geometry hashes, a few hundred kB) is committed as package data.
A second run finds the cache and verifies it instead of rebuilding.
Concurrent runs take turns (a lock file per pool), a killed run's temporary
files are removed by the next, and a damaged cache entry (a part missing,
truncated or failing verification) is rebuilt, never loaded: see
`materialize`.

Exit status: 0 when every split asked for is in the cache and verified; 1
when a build or a verification failed (the message says which split and
why); 2 for a usage error (a bad option, or a cache folder that cannot be
written in: empty, a file, under a file, read-only), refused before any
build.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from racing_stack._cli import add_verbose_argument, check_folder, folder_path, quiet_warp
from racing_stack._files import exclusive_lock, remove_stale

if TYPE_CHECKING:
    from racing_env import TrackPool


#: Seeds in each split's namespace.
NAMESPACE = 100_000_000
#: Envs generated per batch while building a pool.
BATCH = 2048
#: The committed manifests.
MANIFESTS = Path(__file__).parent / "manifests"


@dataclasses.dataclass(frozen=True)
class Split:
    """One split of Level 1: its first seed and its number of tracks."""

    first_seed: int
    size: int


#: Level 1's splits: disjoint namespaces of NAMESPACE seeds each.
SPLITS = {
    "train": Split(first_seed=1 * NAMESPACE, size=10_000),
    "validation": Split(first_seed=2 * NAMESPACE, size=1_000),
    "test": Split(first_seed=3 * NAMESPACE, size=1_000),
}


def cache_dir() -> Path:
    """Where pool files live: ``$RACING_STACK_CACHE`` or ``~/.cache/racing_stack``.

    Raises:
        ValueError: ``$RACING_STACK_CACHE`` is set but empty (it would put
            the pools in the working folder).
    """
    if "RACING_STACK_CACHE" not in os.environ:
        return Path.home() / ".cache" / "racing_stack"
    if not os.environ["RACING_STACK_CACHE"].strip():
        raise ValueError("$RACING_STACK_CACHE is set but empty: it must name a folder (or be unset)")
    return Path(os.environ["RACING_STACK_CACHE"])


def cache_dir_for(parser: argparse.ArgumentParser) -> Path:
    """`cache_dir`, its `ValueError` a usage error of ``parser``'s command
    (exit 2, before any work)."""
    try:
        return cache_dir()
    except ValueError as error:
        parser.error(str(error))


def pool_name(split: str) -> str:
    from racing_env import BENCHMARK_VERSION

    return f"level1_{split}_v{BENCHMARK_VERSION}"


def build_pool(split: str, size: int | None = None, progress: Callable[[int, int], None] | None = None):
    """Build a split's pool on the CPU (the first ``size`` valid seeds of its
    namespace; default the split's size).

    Raises:
        ValueError: an unknown split, or a size beyond what the namespace holds.
    """
    import jax.numpy as jnp
    from racing_env import LEVEL_1, TrackPool
    from track_gen.course import Course
    from track_gen.pipeline import presets

    from racing_stack.bridge import pool_from_course

    want = _checked_size(split, size, NAMESPACE // 2)
    # Seeds are consecutive whatever the batch, so the batch only sets the pace.
    batch = min(BATCH, want + want // 8 + 16)
    course = Course.track(presets.track(num_envs=batch, device="cpu"), seeds=SPLITS[split].first_seed)
    parts, have, offset = [], 0, 0
    while have < want:
        if offset:
            course.generate(seeds=SPLITS[split].first_seed + offset)
        part = pool_from_course(course, level_id=LEVEL_1.level_id, split=split)
        parts.append(part)
        have += len(part)
        offset += batch
        if progress is not None:
            progress(min(have, want), want)
    fields = ("centerline", "left_boundary", "right_boundary", "track_mask", "track_length", "track_id")
    arrays = {f: jnp.concatenate([getattr(p, f) for p in parts])[:want] for f in fields}
    return TrackPool.from_arrays(**arrays, level_id=LEVEL_1.level_id, split=split)


def _entries(manifest_path: Path) -> dict:
    with open(manifest_path, encoding="utf-8") as f:
        return json.load(f)


def materialize(split: str, cache: Path | None = None, write_manifest: bool = False,
                progress: Callable[[str], None] | None = None, on_build: Callable[[str], None] | None = None):
    """The split's pool from the cache, verified against its committed
    manifest; built and saved first when the cache lacks it.

    The cache entry is ``<name>.npz`` and its ``<name>.json`` (`pool_name`).
    Runs for the same split take turns: the first holds the lock file
    ``.<name>.lock`` in the cache while it checks, builds and saves; the
    others wait for it, then verify and reuse what it saved. The run
    holding the lock first removes the temporary files killed runs left
    (``.<name>.npz.*.tmp``, ``.<name>.json.*.tmp``). A damaged entry (one
    part missing, or one that `TrackPool.load` refuses: truncated, not a
    zip, not JSON, a hash that does not match), and a whole one that is
    not the committed pool (another split's files under this name), is
    never used: it is removed and rebuilt once, saying why through
    ``progress``; a fresh build that differs from the committed manifest
    is an error.

    Args:
        split: ``"train"``, ``"validation"`` or ``"test"``.
        cache: the cache folder (default `cache_dir()`).
        write_manifest: write the committed manifest from this build
            instead of checking against it (for a new benchmark version).
        progress: called with a line of progress.
        on_build: called with one line just before the pool is built into
            the cache: where, and why (it is not there, or the damage
            that made the cached one unusable); not called when the cache
            holds it. For a caller that shows no progress (`evaluate`).

    Raises:
        ValueError: the cached or built pool's ids or geometry hashes differ
            from the committed manifest (naming the split and the first
            differing row), or no committed manifest exists (checked before
            any build).
        OSError: the cache cannot be read or written (permissions, a full
            disk).
    """
    say = progress or (lambda line: None)
    cache = cache_dir() if cache is None else Path(cache)
    name = pool_name(split)
    path = cache / f"{name}.npz"
    committed = MANIFESTS / f"{name}.json"
    if not write_manifest and not committed.exists():
        raise ValueError(f"no committed manifest for split {split!r} ({committed})")
    cache.mkdir(parents=True, exist_ok=True)
    lock = cache / f".{name}.lock"
    with exclusive_lock(lock, waiting=lambda: say(f"{split}: waiting for another run that holds {lock}")):
        for part in (path, path.with_suffix(".json")):
            for stale in remove_stale(cache, part.name):
                say(f"{split}: removed {stale}, left by a killed run")
        pool, damage = _cached(split, path, say)
        if pool is not None and not write_manifest:
            pool, damage = _committed(split, pool, path, committed, say)
        fresh = pool is None  # else `_committed` has compared it with the committed manifest
        if fresh:
            if on_build is not None:
                on_build(_why_built(split, path, damage))
            pool = build_pool(split, progress=lambda n, want: say(f"{split}: {_bar(n, want)} {n}/{want} tracks"))
            pool.save(path)
            say(f"{split}: wrote {path}")
        built = _entries(path.with_suffix(".json")) if fresh or write_manifest else None
    if write_manifest:
        committed.parent.mkdir(parents=True, exist_ok=True)
        committed.write_text(json.dumps(built, indent=1) + "\n")
        say(f"{split}: wrote the manifest {committed}")
        return pool
    if fresh:
        _compare(split, _entries(committed), built)
    say(f"{split}: {len(pool)} tracks match the committed manifest")
    return pool


def _why_built(split: str, path: Path, damage: str | None) -> str:
    """`materialize`'s one line before it builds ``split``'s pool into
    ``path``: why (``damage``: what made the cached one unusable; None:
    the cache had none of it)."""
    if damage is None:
        return (f"{split}: building its pool of {SPLITS[split].size:,} tracks into {path} (not in the cache yet; "
                "built once, then verified at each use)")
    return f"{split}: rebuilding its pool in {path}: the cached one is damaged ({damage})"


def _cached(split: str, path: Path, say: Callable[[str], None]) -> tuple[TrackPool | None, str | None]:
    """(the pool cached at ``path``, verified by `TrackPool.load`, None);
    (None, None) when the cache has no part of it; (None, the damage) when a
    part is missing or damaged (then both parts are removed, saying why, so
    that the caller rebuilds it)."""
    from racing_env import TrackPool

    parts = (path, path.with_suffix(".json"))
    missing = [part for part in parts if not part.exists()]
    if len(missing) == len(parts):
        return None, None
    if missing:
        damage = f"{missing[0]} is missing"
    else:
        say(f"{split}: verifying {path}")
        try:
            return TrackPool.load(path), None
        except ValueError as error:
            damage = str(error)
    say(f"{split}: the cached pool is damaged ({damage}); removing it and rebuilding")
    for part in parts:
        part.unlink(missing_ok=True)
    return None, damage


def _committed(split: str, pool: TrackPool, path: Path, committed: Path,
               say: Callable[[str], None]) -> tuple[TrackPool | None, str | None]:
    """(``pool``, None) when the cache entry at ``path``, whole by its own
    manifest, is the committed one's; else (None, why) with both parts
    removed (another split's files under this name, an older benchmark's),
    so that the caller rebuilds it."""
    want, cached = _entries(committed), _entries(path.with_suffix(".json"))
    try:
        _compare(split, want, cached)
    except ValueError as error:
        damage = f"another pool's files: {error}"
        say(f"{split}: the cached pool is damaged ({damage}); removing it and rebuilding")
        for part in (path, path.with_suffix(".json")):
            part.unlink(missing_ok=True)
        return None, damage
    return pool, None


def _checked_size(split: str, size: int | None, highest: int | None = None) -> int:
    """``size`` (the split's size when None), after checking ``split`` and
    that ``size`` is an int in ``[1, highest]`` (default the split's size).

    Raises:
        TypeError: a size that is not an int (a bool, a float).
        ValueError: an unknown split or a size out of range, naming it.
    """
    if split not in SPLITS:
        raise ValueError(f"split must be one of {sorted(SPLITS)}, got {split!r}")
    highest = SPLITS[split].size if highest is None else highest
    if size is None:
        return SPLITS[split].size
    from racing_env import checks  # here: the pool command's --help stays without JAX

    return checks.integer_in(size, f"size (None or an int, for split {split!r})", 1, highest + 1)


def materialize_prefix(split: str, size: int | None = None, cache: Path | None = None,
                       progress: Callable[[str], None] | None = None, on_build: Callable[[str], None] | None = None):
    """The split's first ``size`` tracks, verified against the first
    ``size`` entries of its committed manifest: the whole split from the
    cache (`materialize`) when ``size`` is None or the split's size, else
    built here (small prefixes are quicker to build than to load).
    ``progress`` and ``on_build`` are `materialize`'s (``on_build`` is
    also called before a prefix is built).

    Raises:
        ValueError: a bad split or size, or rows that differ from the manifest.
    """
    size = _checked_size(split, size)
    if size == SPLITS[split].size:
        return materialize(split, cache, progress=progress, on_build=on_build)
    if on_build is not None:
        on_build(f"{split}: building its first {size:,} tracks (a part of a split is built for each run, not cached)")
    pool = build_pool(split, size=size)
    committed = _entries(MANIFESTS / f"{pool_name(split)}.json")["tracks"][:size]
    got = [{"track_id": int(i), "geometry_hash": h} for i, h in zip(pool.track_id.tolist(), pool.geometry_hashes)]
    want = [{"track_id": t["track_id"], "geometry_hash": t["geometry_hash"]} for t in committed]
    if got != want:
        raise ValueError(f"split {split!r}: the first {size} built tracks differ from the committed manifest")
    return pool


def _bar(done: int, total: int, width: int = 30) -> str:
    filled = width * done // total
    return "[" + "#" * filled + "." * (width - filled) + "]"


def _compare(split: str, committed: dict, built: dict) -> None:
    for key in committed:
        if key != "tracks" and committed[key] != built.get(key):
            raise ValueError(f"split {split!r}: manifest field {key!r} is {built.get(key)!r}, "
                             f"the committed manifest says {committed[key]!r}")
    want, got = committed["tracks"], built["tracks"]
    if len(want) != len(got):
        raise ValueError(f"split {split!r}: {len(got)} tracks, the committed manifest has {len(want)}")
    for row, (a, b) in enumerate(zip(want, got)):
        if a != b:
            raise ValueError(f"split {split!r}: row {row} is {b}, the committed manifest says {a}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="materialize-track-pool", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--splits", nargs="+", choices=sorted(SPLITS), default=["train", "validation", "test"],
                        help="the pools to build or verify (default all three)")
    parser.add_argument("--cache", type=folder_path, default=None,
                        help="the pool cache (default $RACING_STACK_CACHE, else ~/.cache/racing_stack)")
    parser.add_argument("--write-manifests", action="store_true",
                        help="write the committed manifests from this build instead of checking against them "
                             "(for a new benchmark version)")
    add_verbose_argument(parser)
    args = parser.parse_args(argv)
    cache = cache_dir_for(parser) if args.cache is None else args.cache
    source = "--cache" if args.cache is not None else (
        "$RACING_STACK_CACHE" if "RACING_STACK_CACHE" in os.environ else "--cache (by default ~/.cache/racing_stack)")
    check_folder(parser, source, cache)
    quiet_warp(args.verbose)
    for split in args.splits:
        try:
            materialize(split, args.cache, args.write_manifests, progress=lambda line: print(line, file=sys.stderr))
        except (ValueError, OSError) as error:
            print(f"materialize-track-pool: {error}", file=sys.stderr)
            return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
