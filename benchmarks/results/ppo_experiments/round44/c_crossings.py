"""Where a rollout step's trainer time goes on the host: each crossing and
launch alone, then a step's chain of them, against the jitted call alone.
(experiment)  python benchmarks/results/ppo_experiments/round44/c_crossings.py WORLDS[,WORLDS] OUT.json"""
import json
import sys
import time
import jax
import jax.numpy as jnp
import torch
from racing_stack.interop import Handover

sizes, out = [int(x) for x in sys.argv[1].split(",")], sys.argv[2]
dev = torch.device("cuda" if torch.cuda.is_available() else "cpu")
jdev = jax.devices()[0]
report = {"device": torch.cuda.get_device_name() if dev.type == "cuda" else "cpu", "jax": jax.__version__,
          "torch": torch.__version__, "external_ready_stream": hasattr(jdev, "get_stream_for_external_ready_events"),
          "runs": {}}


def sync():
    if dev.type == "cuda":
        torch.cuda.synchronize()


def timed(fn, n=200):
    for _ in range(10):
        fn()
    sync()
    s = time.perf_counter()
    for _ in range(n):
        fn()
    host = (time.perf_counter() - s) / n
    sync()
    return round(host * 1e6, 1), round((time.perf_counter() - s) / n * 1e6, 1)  # us a call: host, with the device


for E in sizes:
    D = 41
    cross = Handover(dev)
    action = torch.zeros(E, 2, device=dev)
    pack_j = jnp.zeros((E, D + 10), jnp.float32)
    step = jax.jit(lambda a, p: p.at[:, :2].add(a))
    ident = jax.jit(lambda a: a + 1.0)
    a_j = jnp.zeros((E, 2), jnp.float32)
    static = torch.zeros(E, D + 10, device=dev)
    noise = torch.empty(E, 2, device=dev)
    g = torch.Generator(dev).manual_seed(0)
    run = {}
    run["to_jax [E,2]"] = timed(lambda: (cross.to_jax(action), cross.fence()))
    run["to_torch [E,D+10]"] = timed(lambda: (cross.to_torch(pack_j), cross.fence()))
    run["fence alone"] = timed(cross.fence)
    run["jit dispatch, 1 arg"] = timed(lambda: ident(a_j))
    run["jit dispatch, 2 args"] = timed(lambda: step(a_j, pack_j))
    run["torch.randn out="] = timed(lambda: torch.randn(noise.shape, generator=g, device=dev, out=noise))
    run["copy_ [E,D+10]"] = timed(lambda: static.copy_(static))
    state = {"p": pack_j}

    def chain():
        sent = cross.to_jax(action)
        state["p"] = step(sent, state["p"])
        static.copy_(cross.to_torch(state["p"]))
        cross.fence()

    def chain_jax():
        state["p"] = step(a_j, state["p"])

    run["chain: to_jax, jit, to_torch, copy, fence"] = timed(chain)
    run["chain without crossings: jit alone"] = timed(chain_jax)
    cross.drain()
    report["runs"][E] = run
    for k, v in run.items():
        print(E, f"{k}: host {v[0]} us, with device {v[1]} us", flush=True)
with open(out, "w") as f:
    json.dump(report, f, indent=1)
