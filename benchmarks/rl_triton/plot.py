"""Draw a benchmark report: device time and per-call time of every op against
its floor and peers, one panel per shape.

    python benchmarks/rl_triton/plot.py [REPORT.json] [OUT.png]
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

SERIES = [
    ("floor", lambda r: r.get("floor_us"), "#bbbbbb"),
    ("ours, device", lambda r: r["rl_triton"].get("device_us"), "#1f77b4"),
    ("ours, per call", lambda r: r["rl_triton"].get("per_call_us"), "#6baed6"),
    ("public rl-triton, device", lambda r: (r.get("public_rl_triton") or {}).get("device_us"), "#ff7f0e"),
    ("jax associative_scan, per call", lambda r: r.get("jax_per_call_us"), "#2ca02c"),
    ("torch loop, per call", lambda r: r.get("torch_loop_per_call_us"), "#9467bd"),
]


def draw(report: dict, out: Path) -> Path:
    """Draw ``report`` (the JSON of ``bench_scans.py``) to the PNG ``out``."""
    rows = report["results"]
    shapes = sorted({(r["num_envs"], r["seq_len"]) for r in rows}, key=lambda s: -s[0] * s[1])
    ops = list(dict.fromkeys(r["op"] for r in rows))
    # Only the series this run measured (on CPU: no device times, no public rl-triton).
    series = [s for s in SERIES if any(_measured(s[1](r)) for r in rows)]
    fig, axes = plt.subplots(len(shapes), 1, figsize=(11, 3.2 * len(shapes)), squeeze=False)
    width = 0.8 / len(series)
    for ax, shape in zip(axes[:, 0], shapes):
        by_op = {r["op"]: r for r in rows if (r["num_envs"], r["seq_len"]) == shape}
        x = np.arange(len(ops))
        for k, (label, get, color) in enumerate(series):
            values = [get(by_op[o]) if o in by_op else None for o in ops]
            heights = [v if _measured(v) else np.nan for v in values]
            ax.bar(x + (k - len(series) / 2 + 0.5) * width, heights, width, label=label, color=color)
        ax.set_yscale("log")
        ax.set_xticks(x, [o.replace("_", "\n") for o in ops], fontsize=8)
        ax.set_ylabel("µs (log)")
        ax.set_title(f"E x T = {shape[0]} x {shape[1]}, float32", fontsize=10)
        ax.grid(axis="y", alpha=0.3)
    env = report["environment"]
    cpu = env["device"] == "cpu"
    handles, labels = axes[0, 0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="upper center", ncol=len(series), fontsize=8,
               bbox_to_anchor=(0.5, 0.93 if cpu else 0.965))
    fig.suptitle(f"rl_triton on {env.get('gpu', env['device'])} (triton {env['triton']}, "
                 f"torch {env['torch']}); lower is better"
                 + ("\non the CPU, ours is the float64 reference path: not kernel speed" if cpu else ""),
                 fontsize=11, y=0.995)
    fig.tight_layout(rect=(0, 0, 1, 0.88 if cpu else 0.94))
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out


def _measured(value) -> bool:
    """A number that was measured (not None, not NaN)."""
    return isinstance(value, (int, float)) and not isinstance(value, bool) and np.isfinite(value)


def main() -> None:
    report_path = Path(sys.argv[1] if len(sys.argv) > 1 else "benchmarks/results/rl_triton.json")
    out = Path(sys.argv[2] if len(sys.argv) > 2 else report_path.with_suffix(".png"))
    print(draw(json.loads(report_path.read_text()), out))


if __name__ == "__main__":
    main()
