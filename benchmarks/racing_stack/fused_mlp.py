"""The update's fused MLP kernels (`racing_stack.ppo.fused`, `PPOConfig.fused_mlp`)
against Torch's autocast to bfloat16, on the GPU preset's actor-critic.

    python benchmarks/racing_stack/fused_mlp.py [--rows 65536 524288] [--repeats 20] [--sweep]
        [--out FILE] [--publish]

At each of ``--rows`` (a minibatch of the preset at 8,192 and 65,536
worlds: 32 steps x worlds / 4), one minibatch step's network work, both
ways in this process, on the same weights and features: the actor's and
the critic's forward, a loss of their outputs against fixed random
gradients and its backward into the parameters' gradients. Each way is
timed with CUDA events around the whole step, after three untimed ones,
its median over ``--repeats``; then the two ways' outputs (max absolute
difference) and gradients (each parameter's relative difference, as a
norm) are compared. ``--sweep`` times the fused step at the largest row
count under other tile shapes (rows, column chunk, feature chunk, warps,
backward columns), to choose the module's defaults.

Gates (one GPU, named in the report), at the largest row count: the fused
step at most `GATE_SPEEDUP` of autocast's time, its outputs within
`GATE_OUTPUT` of autocast's and every gradient within `GATE_GRADIENT` of
it (relative: the two round differently, float32 against bfloat16, and
both against float64 by bfloat16's steps). Without CUDA the kernels run
through Triton's interpreter on 100 and 300 rows (no gate; the comparison
is reported) into ``benchmarks/out/fused_mlp_cpu.json``; on a GPU
``benchmarks/out/fused_mlp.json``, or with ``--publish`` the committed
``benchmarks/results/fused_mlp.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
from importlib.metadata import version
from pathlib import Path
from typing import Any

import numpy as np
import torch

if not torch.cuda.is_available():  # the kernels through Triton's interpreter: set before Triton is imported
    os.environ["TRITON_INTERPRET"] = "1"

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "racing_env"))

from protocol import gate, logger, source_hashes  # noqa: E402

from racing_stack.ppo import PRESETS, fused  # noqa: E402
from racing_stack.ppo.algorithm import matmul_precision  # noqa: E402
from racing_stack.ppo.networks import ActorCritic  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
#: The fused step's time at most this share of autocast's.
GATE_SPEEDUP = 0.5
#: The outputs' largest difference from autocast's (their size is about 1).
GATE_OUTPUT = 0.05
#: Each parameter's gradient's difference from autocast's, over its norm.
GATE_GRADIENT = 0.05
#: The module's tile settings, in the order of a `SWEEP` shape.
TILE_SETTINGS = ("BLOCK_M", "BLOCK_N", "BLOCK_K", "NUM_WARPS", "BLOCK_J")
#: Tile shapes ``--sweep`` times: (rows, column chunk, feature chunk, warps, backward columns).
SWEEP = ((64, 32, 32, 8, 64), (64, 16, 16, 8, 64), (32, 32, 32, 4, 64), (64, 32, 32, 8, 128), (64, 32, 32, 8, 256),
         (64, 16, 16, 8, 32))
log = logger("fused-mlp")


def network_step(policy: ActorCritic, z: torch.Tensor, grad: torch.Tensor, fuse: bool) -> torch.Tensor:
    """One minibatch step's network work: the actor's and critic's outputs
    [rows, 3] (float32) on ``z``, and ``(outputs * grad).sum()``'s
    gradients added to the parameters' (zeroed first)."""
    policy.zero_grad(set_to_none=False)
    with matmul_precision("bf16", z.device):
        if fuse:
            out = torch.cat([fused.mlp(policy.actor, z), fused.mlp(policy.critic, z)], 1)
        else:
            out = torch.cat([policy.actor(z), policy.critic(z)], 1).float()
        (out * grad).sum().backward()
    return out.detach()


def timed(step, repeats: int, cuda: bool) -> float | None:
    """The median milliseconds of ``step()`` over ``repeats`` (CUDA events; None on the CPU)."""
    for _ in range(3):
        step()
    if not cuda:
        return None
    times = []
    for _ in range(repeats):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        step()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end))
    return float(np.median(times))


def measure(policy: ActorCritic, rows: int, repeats: int, device: torch.device) -> dict[str, Any]:
    """Both ways at ``rows``: their median step times and their differences."""
    generator = torch.Generator(device="cpu").manual_seed(rows)
    z = (torch.randn(rows, policy.normalizer.mean.shape[0], generator=generator) * 2).clamp(-10, 10).to(device)
    grad = torch.randn(rows, 3, generator=generator).to(device)
    results = {}
    for fuse in (False, True):
        ms = timed(lambda: network_step(policy, z, grad, fuse), repeats, device.type == "cuda")
        out = network_step(policy, z, grad, fuse)
        results[fuse] = (ms, out, {name: p.grad.clone() for name, p in policy.named_parameters() if p.grad is not None})
    (plain_ms, plain, plain_grads), (fused_ms, out, grads) = results[False], results[True]
    return {"rows": rows, "autocast_ms": plain_ms, "fused_ms": fused_ms,
            "fused_share": None if plain_ms is None else fused_ms / plain_ms,
            "output_max_difference": float((out - plain).abs().max()) if rows else 0.0,
            "gradient_relative_difference": {
                name: float((grads[name] - g).norm() / g.norm().clamp(min=1e-30)) for name, g in plain_grads.items()}}


def sweep(policy: ActorCritic, rows: int, repeats: int, device: torch.device) -> list[dict[str, Any]]:
    """The fused step's median time at ``rows`` under each tile shape of `SWEEP` (the defaults restored after)."""
    defaults = [getattr(fused, name) for name in TILE_SETTINGS]
    z = torch.randn(rows, policy.normalizer.mean.shape[0], device=device)
    grad = torch.randn(rows, 3, device=device)
    out = []
    try:
        for shape in SWEEP:
            for name, value in zip(TILE_SETTINGS, shape):
                setattr(fused, name, value)
            ms = timed(lambda: network_step(policy, z, grad, True), repeats, device.type == "cuda")
            out.append({"shape": dict(zip(("rows", "column_chunk", "feature_chunk", "warps", "backward_columns"),
                                          shape)), "fused_ms": ms})
            log(f"sweep {shape}: {ms:.3f} ms" if ms is not None else f"sweep {shape}: ran")
    finally:
        for name, value in zip(TILE_SETTINGS, defaults):
            setattr(fused, name, value)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, nargs="+", default=None,
                        help="minibatch rows (65,536 and 524,288 on a GPU; 100 and 300 on the CPU)")
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--sweep", action="store_true", help="time the fused step under other tile shapes")
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("--publish", action="store_true", help="write benchmarks/results/fused_mlp.json (GPU only)")
    args = parser.parse_args()
    cuda = torch.cuda.is_available()
    if args.publish and not cuda:
        parser.error("--publish needs a CUDA GPU")
    rows = args.rows or ([65_536, 524_288] if cuda else [100, 300])
    if any(not 1 <= r <= 2**24 for r in rows) or not 1 <= args.repeats <= 10_000:
        parser.error("--rows must be in [1, 2**24] and --repeats in [1, 10000]")
    out_path = args.out or ROOT / ("benchmarks/results/fused_mlp.json" if args.publish else
                                   "benchmarks/out/fused_mlp.json" if cuda else "benchmarks/out/fused_mlp_cpu.json")
    device = torch.device("cuda" if cuda else "cpu")
    preset = PRESETS["gpu"]
    torch.manual_seed(0)
    low, high = np.array([-1.0, -1.0], np.float32), np.array([1.0, 1.0], np.float32)
    policy = ActorCritic(preset.features.size, preset.hidden, preset.init_log_std, low, high).to(device)
    with torch.no_grad():  # weights as a trained network's, not the initial zero-mean output layer
        for p in policy.parameters():
            p.add_(torch.randn(p.shape, generator=torch.Generator().manual_seed(1)).to(device) * 0.05)
    measured = []
    for r in rows:
        measured.append(measure(policy, r, args.repeats, device))
        log(json.dumps({k: v for k, v in measured[-1].items() if k != "gradient_relative_difference"}))
    report: dict[str, Any] = {
        "protocol": "fused_mlp",
        "environment": {"python": platform.python_version(), "torch": torch.__version__,
                        "triton": version("triton"), "numpy": np.__version__,
                        "gpu": torch.cuda.get_device_name() if cuda else None,
                        "interpreter": not cuda},
        "source_sha256": source_hashes(__file__),
        "network": {"features": preset.features.size, "hidden": list(preset.hidden), "outputs": [2, 1]},
        "defaults": {name: getattr(fused, name) for name in TILE_SETTINGS},
        "repeats": args.repeats, "measured": measured,
        "sweep": sweep(policy, max(rows), args.repeats, device) if args.sweep else None,
    }
    largest = max(measured, key=lambda m: m["rows"])
    worst_gradient = max(largest["gradient_relative_difference"].values())
    report["gates"] = [] if not cuda else [
        gate(f"fused step / autocast's at {largest['rows']:,} rows", round(largest["fused_share"], 3),
             f"<= {GATE_SPEEDUP}", largest["fused_share"] <= GATE_SPEEDUP),
        gate("outputs' largest difference from autocast's", round(largest["output_max_difference"], 5),
             f"<= {GATE_OUTPUT}", largest["output_max_difference"] <= GATE_OUTPUT),
        gate("gradients' largest relative difference from autocast's", round(worst_gradient, 5),
             f"<= {GATE_GRADIENT}", worst_gradient <= GATE_GRADIENT)]
    report["passed"] = all(g["passed"] for g in report["gates"]) if cuda else None
    out_path.parent.mkdir(parents=True, exist_ok=True)
    out_path.write_text(json.dumps(report, indent=2) + "\n")
    log(f"wrote {out_path}" + ("" if not cuda else f": {'passed' if report['passed'] else 'FAILED'}"))


if __name__ == "__main__":
    main()
