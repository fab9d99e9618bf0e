"""Benchmark every rl_triton op against its floor and its peers, in one run.

    python benchmarks/rl_triton/bench_scans.py [--peer-src PATH] [--out FILE]

On a CUDA device, for each op and shape (default 4096x2048, 65536x32,
16x262144, float32) it measures, in the same process:

- ``per_call_us``: median wall time of back-to-back eager calls (what a caller pays),
  after 0.1 s of untimed calls;
- ``device_us``: median time per call under CUDA-graph replay, rotating over
  enough input sets that they exceed the 60 MB L2;
- ``floor_us``: the call's own input and output bytes over the copy bandwidth
  of a 1 GiB buffer measured in this run;
- peers: a PyTorch Python loop and ``jax.lax.associative_scan`` (jitted, timed
  with ``block_until_ready``), and, with ``--peer-src``, the public rl-triton
  package (its ``src`` folder), timed like ours in a subprocess.

It writes a JSON report (environment, versions, device, shapes, medians, peers,
gates), and a Markdown table and a plot beside it. Without CUDA it checks the peers and
runs small shapes on CPU, and evaluates no gate.

Gates (one H200):
- GAE 4096x2048 ``compute_gae(r, v, terminateds, last_value=lv)``: per call
  <= 40 us and >= 5x faster than ``jax.lax.associative_scan``;
- every op's device time <= 1.5x its floor at 4096x2048 and 65536x32;
- every op's device time <= 2x its floor at 16x262144.
"""

from __future__ import annotations

import argparse
import gc
import json
import math
import os
import platform
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
sys.path.insert(0, str(Path(__file__).parent))

import numpy as np  # noqa: E402
import torch  # noqa: E402

from cases import OPS, call, make_inputs, nbytes, output_count  # noqa: E402
import peers  # noqa: E402

L2_BYTES = 60 * 2**20
GPU_SHAPES = ((4096, 2048), (65536, 32), (16, 262144))
CPU_SHAPES = ((64, 128), (4, 1024))
GATES = {(4096, 2048): 1.5, (65536, 32): 1.5, (16, 262144): 2.0}
HEADLINE = ("gae", (4096, 2048))
HEADLINE_PER_CALL_US = 40.0
HEADLINE_JAX_SPEEDUP = 5.0


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


#: Seconds of untimed calls before per-call timing.
WARMUP_S = 0.1


def per_call_seconds(fn: Callable[[], Any], device: str, calls: int, reps: int,
                     wait: Callable[[Any], Any] | None = None) -> float:
    """Median over ``reps`` of the wall time of ``calls`` back-to-back calls, per call
    (garbage collection off while timing, as ``timeit`` does), after calls for
    at least ``WARMUP_S`` (the host's clocks and caches settle)."""
    done = wait or (lambda _: sync(device))
    start = time.perf_counter()
    while True:
        for _ in range(calls):
            out = fn()
        done(out)
        if time.perf_counter() - start >= WARMUP_S:
            break
    times = []
    gc.disable()
    try:
        for _ in range(reps):
            sync(device)
            t0 = time.perf_counter()
            for _ in range(calls):
                out = fn()
            done(out)
            times.append((time.perf_counter() - t0) / calls)
    finally:
        gc.enable()
    return statistics.median(times)


def device_seconds(fn: Callable[[dict], Any], sets: list[dict], reps: int = 20) -> float:
    """Median per-call time under CUDA-graph replay of one call per input set."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for x in sets:
            fn(x)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for x in sets:
            fn(x)
    graph.replay()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    times = []
    for _ in range(reps):
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / 1e3 / len(sets))
    del graph
    return statistics.median(times)


def copy_bandwidth() -> float:
    """Bytes/s of a 1 GiB device-to-device copy (read + write counted)."""
    src = torch.empty(2**30, dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    times = []
    for _ in range(21):
        start.record()
        dst.copy_(src)
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / 1e3)
    del src, dst
    return 2 * 2**30 / statistics.median(times[1:])


def input_sets(op: str, shape: tuple[int, int], device: str) -> list[dict]:
    first = make_inputs(op, *shape, device=device, seed=0)
    count = max(2, math.ceil(2 * L2_BYTES / nbytes(op, first))) if device == "cuda" else 1
    return [first] + [make_inputs(op, *shape, device=device, seed=s) for s in range(1, count)]


def time_library(lib: Any, op: str, shape: tuple[int, int], device: str) -> dict[str, Any]:
    """Per-call and device time of ``lib``'s op (ours, or the public rl-triton)."""
    sets = input_sets(op, shape, device)
    row: dict[str, Any] = {"bytes": nbytes(op, sets[0])}
    calls = 200 if device == "cuda" else 3
    row["per_call_us"] = 1e6 * per_call_seconds(lambda: call(op, lib, sets[0]), device, calls, 15)
    if device == "cuda":
        row["device_us"] = 1e6 * device_seconds(lambda x: call(op, lib, x), sets)
        row["input_sets"] = len(sets)
    return row


def time_peers(op: str, shape: tuple[int, int], device: str) -> dict[str, Any]:
    x = make_inputs(op, *shape, device=device, seed=0)
    out: dict[str, Any] = {}
    long_loop = shape[1] > 10_000
    out["torch_loop_per_call_us"] = 1e6 * per_call_seconds(
        lambda: peers.torch_loop(op, x), device, 1, 1 if long_loop else 3)
    import jax

    xj = {k: jax.dlpack.from_dlpack(v) for k, v in x.items()}
    fn = peers.jax_scan(op)

    def ready(y: Any) -> Any:
        return jax.block_until_ready(y)

    out["jax_per_call_us"] = 1e6 * per_call_seconds(lambda: fn(xj), device, 20, 5, wait=ready)
    return out


def check_peers() -> None:
    """Ours (whatever path runs here) and both peers against the NumPy references."""
    import jax

    import rl_triton

    for op in OPS:
        x = make_inputs(op, 5, 33, device="cpu", seed=3)
        ours = call(op, rl_triton, x)
        ours = ours if isinstance(ours, tuple) else (ours,)
        loop = peers.torch_loop(op, x)
        loop = loop if isinstance(loop, tuple) else (loop,)
        js = peers.jax_scan(op)({k: jax.numpy.asarray(v.numpy()) for k, v in x.items()})
        js = js if isinstance(js, tuple) else (js,)
        for o, lp, j in zip(ours, loop, js):
            np.testing.assert_allclose(lp.numpy(), o.numpy(), rtol=1e-4, atol=1e-4)
            np.testing.assert_allclose(np.asarray(j), o.numpy(), rtol=1e-4, atol=1e-4)
    log("peers agree with rl_triton on every op")


def environment(device: str) -> dict[str, Any]:
    import triton

    env: dict[str, Any] = {
        "python": platform.python_version(), "numpy": np.__version__,
        "torch": torch.__version__, "triton": triton.__version__,
        "platform": platform.platform(), "device": device,
    }
    try:
        import jax

        env["jax"] = jax.__version__
        env["jax_devices"] = [str(d) for d in jax.devices()]
    except ImportError:
        env["jax"] = None
    if device == "cuda":
        props = torch.cuda.get_device_properties(0)
        env.update(gpu=props.name, sm_count=props.multi_processor_count,
                   gpu_memory_gib=round(props.total_memory / 2**30, 1),
                   cuda=torch.version.cuda)
    return env


def run_peer_library(src: str, shapes: list[tuple[int, int]], ops: list[str]) -> dict[str, Any]:
    """Time the public rl-triton (its ``src`` folder) in a subprocess, like ours."""
    out = Path(os.environ.get("TMPDIR", "/tmp")) / "rl_triton_peer.json"
    cmd = [sys.executable, __file__, "--library-only", "--out", str(out),
           "--shapes", ",".join(f"{e}x{t}" for e, t in shapes), "--ops", ",".join(ops)]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([src, os.environ.get("PYTHONPATH", "")]))
    subprocess.run(cmd, env=env, check=True)
    return json.loads(out.read_text())


def gates(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    found = []
    for r in rows:
        shape = (r["num_envs"], r["seq_len"])
        ours = r["rl_triton"]
        if (r["op"], shape) == HEADLINE:
            found.append(dict(gate=f"GAE {shape[0]}x{shape[1]} per call <= {HEADLINE_PER_CALL_US} us",
                              value=ours["per_call_us"], passed=ours["per_call_us"] <= HEADLINE_PER_CALL_US))
            if "jax_per_call_us" in r:
                speedup = r["jax_per_call_us"] / ours["per_call_us"]
                found.append(dict(gate=f"GAE {shape[0]}x{shape[1]} >= {HEADLINE_JAX_SPEEDUP}x faster "
                                       "than jax.lax.associative_scan (per call)",
                                  value=speedup, passed=speedup >= HEADLINE_JAX_SPEEDUP))
        if shape in GATES and "device_us" in ours:
            ratio = ours["device_us"] / r["floor_us"]
            found.append(dict(gate=f"{r['op']} {shape[0]}x{shape[1]} device time <= {GATES[shape]}x floor",
                              value=ratio, passed=ratio <= GATES[shape]))
    return found


def markdown(report: dict[str, Any]) -> str:
    """The report as a Markdown table: only the columns this run measured,
    and on the CPU a line saying what such a run can and cannot show."""
    env = report["environment"]
    cpu = env["device"] == "cpu"
    bandwidth = report.get("copy_bandwidth_gbps")
    head = f"Device: {env.get('gpu', env['device'])}"
    if bandwidth is not None and math.isfinite(bandwidth):
        head += f"; copy bandwidth {bandwidth:.0f} GB/s"
    lines = [f"{head}; torch {env['torch']}, triton {env['triton']}, jax {env.get('jax')}. "
             "Times in microseconds (medians)."]
    if cpu:
        lines.append("On the CPU this run checks every op against its NumPy reference and times the peers; "
                     "`ours` is rl_triton's float64 reference path (no Triton kernel runs on a CPU), so these "
                     "times say nothing about kernel speed: the GPU report does.")

    def ratio(r: dict[str, Any]) -> float | None:
        ours = r["rl_triton"]
        return ours["device_us"] / r["floor_us"] if "device_us" in ours and r.get("floor_us") else None

    def peer(r: dict[str, Any]) -> dict[str, Any]:
        return r.get("public_rl_triton") or {}

    columns = [
        ("floor", lambda r: r.get("floor_us")),
        ("ours, device", lambda r: r["rl_triton"].get("device_us")),
        ("ours, per call", lambda r: r["rl_triton"].get("per_call_us")),
        ("x floor", ratio),
        ("public rl-triton, device", lambda r: peer(r).get("device_us", peer(r).get("error"))),
        ("public rl-triton, per call", lambda r: peer(r).get("per_call_us")),
        ("jax assoc. scan, per call", lambda r: r.get("jax_per_call_us")),
        ("torch loop, per call", lambda r: r.get("torch_loop_per_call_us")),
    ]
    rows = report["results"]
    columns = [(name, get) for name, get in columns if any(get(r) is not None for r in rows)]

    def fmt(v: Any) -> str:
        return "-" if v is None else (f"{v:,.2f}" if isinstance(v, float) and v < 10 else
                                      f"{v:,.1f}" if isinstance(v, float) else str(v))

    lines += ["", "| op | E x T | " + " | ".join(name for name, _ in columns) + " |",
              "|---|---|" + "---|" * len(columns)]
    for r in rows:
        lines.append(f"| {r['op']} | {r['num_envs']} x {r['seq_len']} | "
                     + " | ".join(fmt(get(r)) for _, get in columns) + " |")
    if report["gates"]:
        lines += ["", "| gate | value | passed |", "|---|---|---|"]
        lines += [f"| {g['gate']} | {g['value']:.2f} | {'yes' if g['passed'] else 'NO'} |"
                  for g in report["gates"]]
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--shapes", help="comma-separated ExT list")
    parser.add_argument("--ops", default=",".join(OPS))
    parser.add_argument("--out", help="report path (default benchmarks/out/rl_triton.json on a "
                                      "CUDA device, rl_triton_cpu.json otherwise)")
    parser.add_argument("--publish", action="store_true",
                        help="write the committed report (benchmarks/results/rl_triton.json on a CUDA device)")
    parser.add_argument("--peer-src", help="src folder of the public rl-triton package")
    parser.add_argument("--no-peers", action="store_true", help="skip the torch-loop and JAX peers")
    parser.add_argument("--library-only", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()

    import rl_triton

    device = "cuda" if torch.cuda.is_available() else "cpu"
    if args.out is None:
        folder = "benchmarks/results/" if args.publish else "benchmarks/out/"
        args.out = folder + ("rl_triton.json" if device == "cuda" else "rl_triton_cpu.json")
    shapes = ([tuple(int(v) for v in s.split("x")) for s in args.shapes.split(",")]
              if args.shapes else list(GPU_SHAPES if device == "cuda" else CPU_SHAPES))
    ops = args.ops.split(",")
    results: dict[str, Any] = {}
    if args.library_only:
        for op in ops:
            for shape in shapes:
                try:
                    results[f"{op}:{shape[0]}x{shape[1]}"] = time_library(rl_triton, op, shape, device)
                except Exception as exc:  # a peer that cannot run a case: record it
                    results[f"{op}:{shape[0]}x{shape[1]}"] = {"error": f"{type(exc).__name__}: {exc}"[:200]}
                log(f"peer {op} {shape}: {results[f'{op}:{shape[0]}x{shape[1]}']}")
        Path(args.out).write_text(json.dumps(results))
        return

    report: dict[str, Any] = {"benchmark": "rl_triton scans", "environment": environment(device),
                              "rl_triton_version": rl_triton.__version__, "dtype": "float32",
                              "timing": {"per_call": "median wall time of back-to-back eager calls "
                                                     "after 0.1 s of untimed ones",
                                         "device": "median per call under CUDA-graph replay over "
                                                   "rotating input sets larger than the 60 MB L2",
                                         "floor": "call's input+output bytes / 1 GiB copy bandwidth"}}
    bandwidth = copy_bandwidth() if device == "cuda" else None
    if bandwidth:
        report["copy_bandwidth_gbps"] = bandwidth / 1e9
    rows = []
    for op in ops:
        for shape in shapes:
            log(f"{op} {shape[0]}x{shape[1]} ...")
            row: dict[str, Any] = {"op": op, "num_envs": shape[0], "seq_len": shape[1],
                                   "outputs": output_count(op)}
            row["rl_triton"] = time_library(rl_triton, op, shape, device)
            row["path"] = rl_triton.last_path()
            if bandwidth:
                row["floor_us"] = 1e6 * row["rl_triton"]["bytes"] / bandwidth
            rows.append(row)
            log(f"  {json.dumps({k: v for k, v in row.items() if k != 'op'})}")
            torch.cuda.empty_cache() if device == "cuda" else None
    # The peers run after every measurement of ours, so that nothing they
    # leave behind (JAX's runtime threads, a subprocess) shares the host with
    # our eager calls.
    if args.peer_src and device == "cuda":
        peer = run_peer_library(args.peer_src, shapes, ops)
        for row in rows:
            row["public_rl_triton"] = peer.get(f"{row['op']}:{row['num_envs']}x{row['seq_len']}")
    if not args.no_peers:
        for row in rows:
            log(f"peers: {row['op']} {row['num_envs']}x{row['seq_len']} ...")
            row.update(time_peers(row["op"], (row["num_envs"], row["seq_len"]), device))
        check_peers()
    report["results"] = rows
    report["gates"] = gates(rows)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=2) + "\n")
    table = markdown(report)
    out.with_suffix(".md").write_text(table)
    print(table)
    log(f"wrote {out} and {out.with_suffix('.md')}")
    try:
        import plot
    except ImportError:  # matplotlib is optional here
        log("matplotlib not installed: no plot")
    else:
        log(f"plot: {plot.draw(report, out.with_suffix('.png'))}")
    failed = [g["gate"] for g in report["gates"] if not g["passed"]]
    if failed:
        log("gates failed: " + "; ".join(failed))


if __name__ == "__main__":
    main()
