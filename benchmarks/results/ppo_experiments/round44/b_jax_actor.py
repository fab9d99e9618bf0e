"""Does a rollout step as one jitted JAX call (the actor's MLP, the env's
core step and the training wrappers) cost the env's own time? (experiment)

python benchmarks/results/ppo_experiments/round44/b_jax_actor.py WORLDS[,WORLDS] STEPS OUT.json
"""
import dataclasses
import json
import sys
import time
import numpy as np
import jax
import jax.numpy as jnp
sys.path.insert(0, "benchmarks/racing_env")
sys.path.insert(0, "benchmarks/racing_stack")
from protocol import random_actions  # noqa: E402
from racing_env import core  # noqa: E402
from racing_stack.ppo import PRESETS, make_env  # noqa: E402
from racing_stack.ppo.env_step import Clock, after_step  # noqa: E402

sizes, steps, out = [int(x) for x in sys.argv[1].split(",")], int(sys.argv[2]), sys.argv[3]
report = {"device": str(jax.devices()[0]), "steps": steps, "runs": {}}
for worlds in sizes:
    cfg = dataclasses.replace(PRESETS["gpu" if jax.default_backend() == "gpu" else "cpu"], worlds=worlds)
    env = make_env(cfg)
    env.reset(seed=0)
    actions = jnp.stack(random_actions(env, 0))
    D = cfg.features.size
    keys = jax.random.split(jax.random.PRNGKey(1), 6)
    h = cfg.hidden
    W = {"w1": jax.random.normal(keys[0], (D, h[0])) / np.sqrt(D), "b1": jnp.zeros(h[0]),
         "w2": jax.random.normal(keys[1], (h[0], h[1])) / np.sqrt(h[0]), "b2": jnp.zeros(h[1]),
         "w3": jax.random.normal(keys[2], (h[1], 2)) / np.sqrt(h[1]), "b3": jnp.zeros(2)}
    weight = jnp.float32(1.0)
    params, physics = env.params, env.physics

    def one(carry, W, k, mlp):
        state, data, endings, clock, feats = carry
        a = actions[k % actions.shape[0]]
        if mlp:
            z = jnp.tanh(feats.astype(jnp.bfloat16) @ W["w1"].astype(jnp.bfloat16) + W["b1"].astype(jnp.bfloat16))
            z = jnp.tanh(z @ W["w2"].astype(jnp.bfloat16) + W["b2"].astype(jnp.bfloat16))
            mean = (z @ W["w3"].astype(jnp.bfloat16)).astype(jnp.float32) + W["b3"]
            noise = jax.random.normal(jax.random.fold_in(keys[3], k), mean.shape)
            a = a + 1e-3 * jnp.tanh(mean + 0.5 * noise)
        state, data, obs, reward, term, trunc, info = core.step(params, physics, state, data, a)
        pack, endings, clock, _ = after_step(cfg.reward, cfg.features, endings, clock, reward, obs,
                                              info["termination_reason"], info["lap_time_s"], term, trunc, a, weight)
        return (state, data, endings, clock, pack[:, :D]), pack

    run = {}
    for mlp in (False, True):
        fn = jax.jit(lambda c, W, k, mlp=mlp: one(c, W, k, mlp), donate_argnums=(0,))
        state, data = jax.tree.map(jnp.copy, env.core_state())
        carry = (state, data, cfg.reward.start(worlds), Clock(jnp.zeros(worlds, jnp.int32), jnp.zeros(worlds, bool)),
                 jnp.zeros((worlds, D), jnp.float32))
        t0 = time.perf_counter()
        carry, pack = fn(carry, W, jnp.int32(0))
        jax.block_until_ready(pack)
        compile_s = time.perf_counter() - t0
        times = []
        for r in range(5):
            s = time.perf_counter()
            packs = []
            for k in range(steps):
                carry, pack = fn(carry, W, jnp.int32(r * steps + k))
                packs.append(pack)
            jax.block_until_ready(packs)
            times.append(time.perf_counter() - s)
        run["fused_mlp" if mlp else "fused"] = {"compile_s": compile_s, "ms": float(np.median(times) * 1e3)}
        print(worlds, "fused" + ("+mlp" if mlp else ""), run["fused_mlp" if mlp else "fused"], flush=True)
    # the whole rollout as one jitted scan of `steps` steps (the actor inside): no host work between steps
    for mlp in (False, True):
        def rollout(c, W, k0, mlp=mlp):
            return jax.lax.scan(lambda cc, k: one(cc, W, k, mlp), c, k0 + jnp.arange(steps))
        fn = jax.jit(rollout, donate_argnums=(0,))
        state, data = jax.tree.map(jnp.copy, env.core_state())
        carry = (state, data, cfg.reward.start(worlds), Clock(jnp.zeros(worlds, jnp.int32), jnp.zeros(worlds, bool)),
                 jnp.zeros((worlds, D), jnp.float32))
        t0 = time.perf_counter()
        carry, packs = fn(carry, W, jnp.int32(0))
        jax.block_until_ready(packs)
        compile_s = time.perf_counter() - t0
        times = []
        for r in range(5):
            s = time.perf_counter()
            carry, packs = fn(carry, W, jnp.int32((r + 1) * steps))
            jax.block_until_ready(packs)
            times.append(time.perf_counter() - s)
        name = "scan_mlp" if mlp else "scan"
        run[name] = {"compile_s": compile_s, "ms": float(np.median(times) * 1e3)}
        print(worlds, name, run[name], flush=True)
    # the baseline: the env's step, then the wrappers' call, from Python (`WrappedEnvStepper`'s loop)
    from ppo_speed import WrappedEnvStepper
    stepper = WrappedEnvStepper(env, cfg)
    stepper.run(3)
    run["env_with_wrappers"] = {"ms": float(np.median([stepper.run(steps) for _ in range(5)]) * 1e3)}
    print(worlds, "env with wrappers", run["env_with_wrappers"], flush=True)
    report["runs"][worlds] = run
    del env
with open(out, "w") as f:
    json.dump(report, f, indent=1)
