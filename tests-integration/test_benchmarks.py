"""The racing_env and PPO benchmark protocols run end to end on the CPU (their
smoke runs: a few worlds and steps on Warp's CPU device, no throughput or
memory gate), so a change to the env cannot silently break them."""

import json
import re
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).parents[1]


@pytest.mark.parametrize("script, gates", [
    ("m4_environment.py", {"nonfinite_public_values", "health_every_world_times_out_once",
                           "transfer_guard_mixed_autoreset_step"}),
    ("m5_track_pool.py", {"jax_compiles_after_e0", "reset_events_observed", "reset_rows_match_host_reference",
                          "terminal_rows_keep_their_track", "privacy_env_fields_exact",
                          "privacy_controller_sees_public_host_values_only", "source_and_pool_binding"}),
])
def test_the_cpu_smoke_runs_and_passes_its_gates(tmp_path, script, gates):
    out = tmp_path / "report.json"
    run = subprocess.run([sys.executable, str(ROOT / "benchmarks/racing_env" / script), "--out", str(out)],
                         capture_output=True, text=True, timeout=900, cwd=tmp_path)
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-2000:]
    assert "NVIDIA CUDA driver" not in run.stderr  # Warp's no-driver line: a CPU machine's normal state
    report = json.loads(out.read_text())
    assert report["passed"] is False  # a CPU smoke is never the formal report, and says so
    assert "passed=False (a smoke run: only a GPU run can pass)" in run.stdout
    assert gates <= {g["name"] for g in report["gates"]}
    failed = [g for g in report["gates"] if not g["passed"]]
    assert failed == []
    assert all(len(h) == 64 for h in report["source_sha256"].values())


@pytest.mark.parametrize("script", ["generate.py", "step.py"])
def test_the_track_gen_benchmarks_run_on_the_cpu_quietly(tmp_path, script):
    """``make benchmark-track-gen``'s two scripts on one small CPU batch:
    each writes its report, and Warp's no-driver line stays off stderr."""
    out = tmp_path / "report.json"
    run = subprocess.run([sys.executable, str(ROOT / "benchmarks/track_gen" / script), "--sizes", "64",
                          "--cpu-sizes", "64", "--out", str(out)], capture_output=True, text=True, timeout=600,
                         cwd=tmp_path)
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-2000:]
    assert "NVIDIA CUDA driver" not in run.stderr and json.loads(out.read_text())


def test_the_ppo_speed_benchmark_smoke_runs_every_phase(tmp_path):
    """The speed benchmark's CPU smoke: the env alone and with its
    wrappers, each update path, precision, policy lag and rollout (Torch's
    or one JAX program) timed (its calls replayed alone, bit for bit) and
    profiled, one time-to-skill run with its curve; no gate on a CPU."""
    out = tmp_path / "speed.json"
    run = subprocess.run([sys.executable, str(ROOT / "benchmarks/racing_stack/ppo_speed.py"), "--profile", "--out",
                          str(out), "--paths", "eager/highest", "graph/high/lag1", "eager/highest/serial",
                          "eager/highest/compiled", "graph/bf16/lag1/jax", "--skill-path", "eager/high/lag1",
                          "--trace", str(tmp_path / "trace.json"), "--warmup-updates", "3"],
                         capture_output=True, text=True, timeout=600, cwd=tmp_path)
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-2000:]
    report = json.loads(out.read_text())
    assert report["device"] == "cpu" and report["passed"] is False and report["gates"] == []
    (throughput,) = report["throughput"]
    assert set(throughput["env"]) == {"env", "env_with_wrappers"} and min(throughput["env"].values()) > 0
    assert set(throughput["variants"]) == {"eager/highest", "graph/high/lag1", "eager/highest/serial",
                                           "eager/highest/compiled", "graph/bf16/lag1/jax"}
    # Reading an update's results before the next rollout is launched changes none of its numbers; the compiled
    # update changes their roundings alone.
    pipelined, serial, compiled = (throughput["variants"][v]["last_losses"]
                                   for v in ("eager/highest", "eager/highest/serial", "eager/highest/compiled"))
    assert json.dumps(pipelined) == json.dumps(serial)
    assert compiled == pytest.approx(pipelined, rel=1e-3, abs=1e-6)
    for variant in throughput["variants"].values():
        assert variant["median_transitions_per_s"] > 0 and variant["ratio_to_env_with_wrappers"] > 0
        assert variant["warmup_updates"] == 3 and variant["env_replayed_transitions_per_s"] > 0
        assert variant["recorded_transitions_per_s"] > 0
        # The replay of the timed updates' calls redoes the trainer's physics: it ends where they did.
        assert variant["replay_ends_equal"] is True and variant["ratio_to_env_replayed"] > 0
        assert set(variant["phases"]["fractions"]) == {"env", "policy", "gae", "update"}
        assert set(variant["profile"]) == {"optimise", "rollout", "update"}
        assert variant["profile"]["optimise"]["host_ms"] > 0 and variant["profile"]["update"]["wall_ms"] > 0
        assert variant["profile"]["update"]["device_busy_ms"] == 0.0  # no device on a CPU
    for variant in ("eager_highest", "graph_high_lag1", "eager_highest_serial", "eager_highest_compiled"):
        assert "traceEvents" in json.loads((tmp_path / f"trace_4_{variant}.json").read_text())
    (skill,) = report["skill"]
    assert skill["worlds"] == 4 and skill["training_s"] > 0 and skill["curve"]  # validated on the way
    assert skill["policy_lag"] == 1 and skill["validation_and_check_s"] > 0  # measured apart from the training
    assert skill["first_validated_update"] == 1 and skill["validations"] == len(skill["curve"])
    assert [p["update"] for p in skill["curve"]] == list(range(1, len(skill["curve"]) + 1))
    assert [p["update"] for p in skill["training"]] == [p["update"] for p in skill["curve"]]
    assert (skill["update_s_median"] is None) == (skill["updates"] <= 2)
    assert skill["update_s_median"] is None or 0 < skill["update_s_median"] < skill["training_s"]
    assert all(0.0 <= p["validation_success_rate"] <= 1.0 for p in skill["curve"])
    assert out.with_suffix(".png").stat().st_size > 0
    for variant in ("jit/high", "graph/high/lag", "graph/high/lag2", "graph", "graph/serial", "graph/high/serial/lag1",
                    "graph/bf16/fused", "graph/bf16/beside", "graph/bf16/compiled/lag1",
                    "graph/bf16/compiled/compiled"):
        usage = subprocess.run([sys.executable, str(ROOT / "benchmarks/racing_stack/ppo_speed.py"), "--paths",
                                variant], capture_output=True, text=True, timeout=300, cwd=tmp_path)
        assert usage.returncode == 2 and f"argument --paths: {variant!r}" in usage.stderr, usage.stderr


def test_the_ppo_benchmark_dev_smoke_runs_every_phase(tmp_path):
    """The PPO benchmark's CPU smoke in dev mode: train, confirm, every
    Validation track of the smoke against pure pursuit's committed laps,
    the phases; no gate on a CPU."""
    out = tmp_path / "ppo.json"
    start = time.perf_counter()
    run = subprocess.run([sys.executable, str(ROOT / "benchmarks/racing_stack/ppo_level1.py"), "--dev", "--out",
                          str(out), "--set", "reward.edge_margin_m=0.5"],
                         capture_output=True, text=True, timeout=900, cwd=tmp_path)
    measured = time.perf_counter() - start
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-2000:]
    report = json.loads(out.read_text())
    # The command's wall time (imports included) holds its timed phases and fits in what this test's clock saw.
    assert report["setup_s"] + report["training"]["wall_s"] < report["command_wall_s"] <= measured + 0.05
    assert report["dev"] is True and report["passed"] is False and report["gates"] == []
    assert report["config"]["reward"]["edge_margin_m"] == 0.5  # --set reaches the run
    assert report["training"]["updates"] >= 1 and report["training"]["transitions"] > 0
    confirmation, every = report["confirmation"], report["validation_all"]
    assert confirmation["tracks"] == 2 and every["tracks"] == 4  # rows 2-3 alone, and rows 0-3
    assert every["pursuit_success_rate"] == 1.0
    assert every["success_rate"] * 4 + len(every["failures"]) == 4
    assert all(f["reason"] in ("off_track", "timeout", "invalid_action") for f in every["failures"])
    # The smoke's Validation episodes end at its short timeout: what it costs never hangs on its policy.
    assert report["validation_max_episode_steps"] == 150
    assert every["lap_over_t_lim"] == {"laps": 0, "median": None, "p90": None, "min": None}  # no lap in 3 s
    assert all(f["steps"] <= 150 for f in every["failures"]) and every["success_rate"] == 0.0
    edge = report["validation_edge"]  # the same 4 tracks under 1 % action noise, twice
    assert edge["tracks"] == 4 and [p["noise_seed"] for p in edge["passes"]] == [1, 2]
    failed = [{f["track_id"] for f in every["failures"]}] + [set(p["failed_tracks"]) for p in edge["passes"]]
    assert all(p["success_rate"] * 4 + len(p["failed_tracks"]) == 4 for p in edge["passes"])
    assert edge["failed_in_any"] == len(set.union(*failed)) and edge["failed_in_all"] == len(set.intersection(*failed))
    starts = report["standing_starts"]  # the chosen policy's first action on the same 4 tracks
    lowest = [s["acceleration_mps2"] for s in starts["lowest"]]
    assert starts["tracks"] == 4 and len(lowest) == 4 and lowest == sorted(lowest)
    assert starts["holding"] == sum(a <= 0 for a in lowest) and lowest[0] <= starts["median_mps2"] <= lowest[-1]
    held = {s["track_id"] for s in starts["lowest"] if s["acceleration_mps2"] <= 0}
    assert held <= {f["track_id"] for f in every["failures"]}  # a car held at the start never laps
    assert report["phases"]["rollout_s"] > 0 and "evaluation" not in report  # dev: no Runner, no Test


def test_the_ppo_replay_drives_a_committed_plugin_under_every_rule(tmp_path):
    """The replay of round 10's E1 plugin on the first 2 Validation tracks:
    a result per rule, each track accounted for once, beside pure
    pursuit's committed laps; for a policy that acts alone the inner rule
    is the mean action."""
    out = tmp_path / "replay.json"
    plugin = ROOT / "benchmarks/results/ppo_experiments/round10/E1_plugin"
    run = subprocess.run([sys.executable, str(ROOT / "benchmarks/racing_stack/ppo_replay.py"), str(plugin),
                          "--tracks", "2", "--rules", "mean", "clipped", "inner", "--out", str(out)],
                         capture_output=True, text=True, timeout=900, cwd=tmp_path)
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-2000:]
    report = json.loads(out.read_text())
    assert set(report["rules"]) == {"mean", "clipped", "inner"} and report["tracks"] == 2
    assert len(report["log_std"]) == 2
    drop = ("seconds",)
    assert ({k: v for k, v in report["rules"]["inner"].items() if k not in drop}
            == {k: v for k, v in report["rules"]["mean"].items() if k not in drop})
    for result in report["rules"].values():
        assert result["tracks"] == 2 and result["pursuit_success_rate"] == 1.0
        assert result["success_rate"] * 2 + len(result["failures"]) == 2
        assert sum(result["off_track_progress_histogram"]) == result["off_track"]


def test_the_ppo_replay_under_action_noise(tmp_path):
    """Every rule drives under the edge check's noise (the clipped mean's
    driver too: it lends the policy's bounds); a noise out of [0, 1] is
    refused by name before anything is driven."""
    script, plugin = ROOT / "benchmarks/racing_stack/ppo_replay.py", ROOT / "benchmarks/results/ppo_level1/plugin"
    out = tmp_path / "noisy.json"
    run = subprocess.run([sys.executable, str(script), str(plugin), "--tracks", "2", "--seed", "0", "--rules",
                          "clipped", "--action-noise", "0.3", "--noise-seed", "3", "--out", str(out)],
                         capture_output=True, text=True, timeout=900, cwd=tmp_path)
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-2000:]
    report = json.loads(out.read_text())
    assert (report["action_noise"], report["noise_seed"], list(report["rules"])) == (0.3, 3, ["clipped"])
    result = report["rules"]["clipped"]
    assert result["tracks"] == 2 and result["success_rate"] * 2 + len(result["failures"]) == 2
    for bad, match in [(["--action-noise", "1.5"], "action_noise must be in [0, 1]"),
                       (["--action-noise", "nan"], "action_noise must be in [0, 1]"),
                       (["--noise-seed", "-1"], "noise_seed must be in [0, 2**64)"),
                       (["--noise-seed", str(2**64)], "noise_seed must be in [0, 2**64)")]:
        refused = subprocess.run([sys.executable, str(script), str(plugin), *bad, "--out", str(tmp_path / "x.json")],
                                 capture_output=True, text=True, timeout=300, cwd=tmp_path)
        assert refused.returncode == 2 and match in refused.stderr and not (tmp_path / "x.json").exists()


def test_the_ledger_rows_of_a_committed_round(tmp_path):
    """`ppo_ledger.py` on round 14's reports prints the PPO page's rows for
    them (the settings against the GPU preset at this checkout), and
    refuses a folder without reports by name."""
    script = ROOT / "benchmarks/racing_stack/ppo_ledger.py"
    run = subprocess.run([sys.executable, str(script), str(ROOT / "benchmarks/results/ppo_experiments/round14"),
                          "--round", "14"], capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-2000:]
    rows = [line for line in run.stdout.splitlines() if line.startswith("|")]
    assert [r.split(" | ")[1] for r in rows] == ["R0", "R1", "W0", "W1"]
    assert ("| 14 | W0 | init_log_std=[-1.6, -0.9]; reward.crash_energy_cost=0.3; reward.stall_progress_m=0.0; "
            "updates=500; validate_every=125 | 500, 131 "
            "| 99.4 / 99.8 / 99.3 % | 7, 0 | 24.20 s (0.71) |") in rows
    assert rows[0].startswith("| 14 | R0 | features.prior={}; crash_warmup_success=0.0; crash_warmup_updates=0; "
                              "init_log_std=[-1.6, -0.9]; residual=1.0; reward.crash_energy_cost=0.3; "
                              "reward.stall_progress_m=0.0; updates=500; validate_every=125 "
                              "| 475, 125 | 95.6 / 95.0 / 95.0 %")
    assert "1,403,637" not in run.stdout and "407,687 transitions/s" in run.stdout
    assert "edge check" not in run.stdout  # round 14's reports predate it
    report = json.loads((ROOT / "benchmarks/results/ppo_experiments/round14/W0.json").read_text())
    report["validation_edge"] = {"passes": [{"success_rate": 0.996}, {"success_rate": 1.0}], "failed_in_any": 9}
    report["standing_starts"] = {"tracks": 1000, "holding": 11, "median_mps2": 4.0, "lowest": []}
    (tmp_path / "E0.json").write_text(json.dumps(report))
    # A round's other kinds of report: a speed report (its settings, no training) and an evaluation's.
    (tmp_path / "speed.json").write_text(json.dumps({"protocol": "PPO speed", "config": report["config"]}))
    (tmp_path / "eval.json").write_text(json.dumps({"protocol": "batched evaluation"}))
    edged = subprocess.run([sys.executable, str(script), str(tmp_path)], capture_output=True, text=True, timeout=300)
    assert edged.returncode == 0, edged.stderr[-2000:]
    for name in ("speed", "eval"):
        assert f"{name}.json: not a training report" in edged.stderr and f"| {name} |" not in edged.stdout
    assert ("overhead 10.1 %; edge check 99.6 / 100.0 %, 9 tracks failed in any of 3 passes; 11 of 1,000 standing "
            "starts hold the car") in edged.stdout
    empty = subprocess.run([sys.executable, str(script), str(tmp_path / "none")], capture_output=True, text=True,
                           timeout=300)
    assert empty.returncode == 2 and "folder: no reports" in empty.stderr


def test_the_prior_at_the_reference_gains_reproduces_pure_pursuits_laps(tmp_path):
    """`prior_gains.py` on the first 3 Validation tracks: the prior (a
    residual policy whose correction is zeroed, through the trainer's
    validation) at the reference's gains laps each in the time the pursuit
    plugin took there in the committed Runner run (its parity gate), and at
    faster gains it laps faster."""
    out = tmp_path / "gains.json"
    run = subprocess.run([sys.executable, str(ROOT / "benchmarks/racing_stack/prior_gains.py"), "--tracks", "3",
                          "--gains", "", "--gains", "lateral_accel_mps2=6.5", "--out", str(out)],
                         capture_output=True, text=True, timeout=900, cwd=tmp_path)
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-2000:]
    report = json.loads(out.read_text())
    reference, faster = report["runs"]
    assert report["passed"] is True and [g["name"] for g in report["gates"]] == [
        "reference_gains_reproduce_pursuit_laps_s"]
    assert reference["same_outcomes"] and reference["largest_lap_difference_s"] <= 0.021
    assert reference["success_rate"] == faster["success_rate"] == 1.0 and reference["median_per_track_ratio"] == 1.0
    assert faster["gains"]["lateral_accel_mps2"] == 6.5 and faster["median_per_track_ratio"] < 0.97


def _ppo_benchmark():
    """The PPO benchmark script as a module."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("ppo_level1", ROOT / "benchmarks/racing_stack/ppo_level1.py")
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    return bench


def test_the_ppo_benchmark_drives_a_plugin_on_test_in_a_child_process(tmp_path):
    """The release drives each plugin on Test in a child process (beside
    its Validation checks): on the first Test track the child's summary is
    the one the Runner in this process gives, run beside it; a child that
    fails is an error naming where its output is."""
    from racing_env.plugins import PURSUIT
    from racing_stack import evaluate

    bench = _ppo_benchmark()
    out = tmp_path / "pursuit_test.json"
    child = bench.start_runner(PURSUIT, 1, out)
    here = bench.summary(evaluate.evaluate(PURSUIT, level=1, split="test", tracks=1, backend="mjx_warp",
                                           worlds=1, isolate=False))
    there = bench.runner_result(child, out)
    assert there["episodes"] == 1 and there["success_rate"] == 1.0 and there["controller_errors"] == 0
    assert {k: v for k, v in there.items() if k != "seconds"} == {k: v for k, v in here.items() if k != "seconds"}
    missing = tmp_path / "no_plugin"
    with pytest.raises(RuntimeError, match="exited with status 2; its output is in .*no_plugin_test.log"):
        bench.runner_result(bench.start_runner(missing, 1, tmp_path / "no_plugin_test.json"),
                            tmp_path / "no_plugin_test.json")
    assert "does not exist" in (tmp_path / "no_plugin_test.log").read_text()
    raising = tmp_path / "raising"  # every episode a controller error: exit status 1, and a result that says so
    raising.mkdir()
    (raising / "config.toml").write_text("")
    (raising / "controller.py").write_text("from racing_env.controller import Controller\n\n\n"
                                           "class Raising(Controller):\n"
                                           "    def compute_control(self, obs, info=None):\n"
                                           "        raise RuntimeError('no action')\n")
    failed = bench.runner_result(bench.start_runner(raising, 1, tmp_path / "raising.json"), tmp_path / "raising.json")
    assert failed["episodes"] == failed["controller_errors"] == 1 and failed["success_rate"] == 0.0


def test_the_release_drives_its_learned_plugin_through_the_batched_controller(tmp_path, monkeypatch):
    """The learned plugin's Runner child is started with ``--batched`` (its
    batched controller equals the per-episode one bit for bit on the CPU:
    the batched evaluation's own tests), pure pursuit's without."""
    bench = _ppo_benchmark()
    started = []
    monkeypatch.setattr(bench.subprocess, "Popen", lambda argv, **kwargs: started.append(argv))
    bench.start_runner(tmp_path / "plugin", 7, tmp_path / "learned_test.json", batched=True)
    bench.start_runner(tmp_path / "pursuit", 7, tmp_path / "pursuit_test.json")
    assert [argv.count("--batched") for argv in started] == [1, 0]
    assert all(argv[argv.index("--tracks") + 1] == argv[argv.index("--worlds") + 1] == "7" for argv in started)


def test_a_runner_child_is_interrupted_then_killed_when_the_benchmark_stops():
    """`stop_runner` interrupts a child (as Ctrl-C does: a Runner writes the
    episodes that had ended), kills one that is still running after the
    grace, and leaves one that has ended as it was."""
    import signal

    bench = _ppo_benchmark()

    def started(code: str) -> subprocess.Popen:
        program = f"{code}\nprint('up', flush=True)\nimport time\ntime.sleep(60)"
        # As start_runner starts it: SIGINT's default whatever this test inherited (a job started in the
        # background ignores SIGINT, and so would its children).
        with bench.sigint_heard():
            child = subprocess.Popen([sys.executable, "-c", program], stdout=subprocess.PIPE, text=True)
        assert child.stdout.readline() == "up\n"
        return child

    polite = started("")
    bench.stop_runner(polite, grace_s=30.0)
    assert polite.returncode == -signal.SIGINT  # ended by the interrupt (an uncaught KeyboardInterrupt)
    stubborn = started("import signal\nsignal.signal(signal.SIGINT, signal.SIG_IGN)")
    start = time.perf_counter()
    bench.stop_runner(stubborn, grace_s=0.5)
    assert stubborn.returncode == -signal.SIGKILL and time.perf_counter() - start < 10.0
    ended = subprocess.Popen([sys.executable, "-c", "pass"])
    ended.wait()
    bench.stop_runner(ended)
    assert ended.returncode == 0
    for child in (polite, stubborn):
        child.stdout.close()


def test_a_runner_child_hears_ctrl_c_whatever_the_benchmark_inherited():
    """Started where SIGINT is ignored (a benchmark run in the background),
    a Runner child still takes SIGINT as Ctrl-C: `stop_runner` can
    interrupt it politely. It starts without a fork that runs Python in
    this process, which JAX (its threads started) warns of; SIGINT is
    ignored here again after."""
    import signal
    import warnings

    import jax.numpy as jnp

    bench = _ppo_benchmark()
    jnp.zeros(1).block_until_ready()  # JAX's threads: its at-fork hook now warns of a fork
    code = "import signal; print(signal.getsignal(signal.SIGINT) is signal.default_int_handler)"
    before = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        with warnings.catch_warnings(record=True) as warned:
            warnings.simplefilter("always")  # not once a process: the test can fail after another warned
            with bench.sigint_heard():
                child = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
            forked = subprocess.run([sys.executable, "-c", "pass"], preexec_fn=lambda: None)
        after = signal.getsignal(signal.SIGINT)
        bare = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    finally:
        signal.signal(signal.SIGINT, before)
    assert child.stdout.strip() == "True" and bare.stdout.strip() == "False"  # the test can fail
    assert after == signal.SIG_IGN and forked.returncode == 0
    # The one warning is the deliberate fork's (the test can fail): none came from starting the child.
    assert sum("os.fork() was called" in str(w.message) for w in warned) == 1


def test_the_ppo_benchmark_gates_read_the_report():
    """The release gates on hand-built reports: a guard stop fails the
    integrity gate (and nothing else is measured), overhead at 10 % fails,
    Test's gates appear only outside dev mode."""
    import types

    bench = _ppo_benchmark()
    config = types.SimpleNamespace(worlds=8192)
    stopped = bench.gates({"error": "GuardError: update 7: 3 of 8 reward values are not finite"}, config, True)
    assert [(g["name"], g["value"], g["passed"]) for g in stopped] == [("guard_stops", 1, False)]
    training = {"median_transitions_per_s_after_2": 1.2e6, "overhead_share": 0.10}
    every = {"success_rate": 0.995, "median_per_track_ratio": 0.85}
    dev = {g["name"]: g["passed"] for g in bench.gates({"training": training, "validation_all": every}, config, True)}
    assert dev == {"guard_stops": True, "training_transitions_per_s": True,
                   "validation_and_checkpoint_share_of_training_wall_time": False,
                   "validation_success_rate": True, "validation_median_per_track_lap_ratio_to_pursuit": True}
    test = {"learned": {"success_rate": 1.0, "lap_time_s": {"median": 25.0}},
            "pursuit": {"success_rate": 1.0, "lap_time_s": {"median": 34.0}}}
    report = {"training": {**training, "overhead_share": 0.05}, "validation_all": every,
              "evaluation": {"test": test}}
    release = bench.gates(report, config, False)
    assert len(release) == 7 and all(g["passed"] for g in release)
    assert bench.gates(report, types.SimpleNamespace(worlds=2048), False)[1]["passed"] is False  # < 4,096 worlds


def test_the_ppo_scaling_smoke_runs_one_and_two_processes(tmp_path):
    """The scaling benchmark's CPU smoke: the same trainer under torchrun
    in 1 and 2 gloo processes, each row measured; no gate on a CPU."""
    out = tmp_path / "scaling.json"
    run = subprocess.run([sys.executable, str(ROOT / "benchmarks/racing_stack/ppo_scaling.py"), "--out", str(out)],
                         capture_output=True, text=True, timeout=900, cwd=tmp_path)
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-2000:]
    report = json.loads(out.read_text())
    assert report["passed"] is False and report["gates"] == [] and report["gpus_on_host"] == 0
    assert [(r["gpus"], r["worlds_per_gpu"], r["updates"]) for r in report["runs"]] == [(1, 2, 3), (2, 2, 3)]
    assert all(r["transitions_per_s"] > 0 and len(r["mean_reward"]) == 3 for r in report["runs"])
    assert report["runs"][1]["allreduce_s"] > 0 and report["runs"][0]["allreduce_share_estimated"] == 0.0


def test_the_ppo_scaling_gates_read_the_report():
    """Efficiency against the one-GPU row of the same worlds per GPU (a row
    without one, or failed, is not gated); the curve against the seeds'
    spread, once its three runs exist."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("ppo_scaling", ROOT / "benchmarks/racing_stack/ppo_scaling.py")
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    runs = [{"gpus": 1, "worlds_per_gpu": 8192, "transitions_per_s": 1.0e6},
            {"gpus": 2, "worlds_per_gpu": 8192, "transitions_per_s": 1.9e6},
            {"gpus": 4, "worlds_per_gpu": 8192, "transitions_per_s": 3.5e6},
            {"gpus": 8, "worlds_per_gpu": 8192, "error": "a traceback"},
            {"gpus": 2, "worlds_per_gpu": 65536, "transitions_per_s": 6.0e6}]
    got = {g["name"]: (round(g["value"], 4), g["passed"]) for g in bench.gates({"runs": runs, "curve": {}})}
    assert got == {"efficiency_2_gpus_8192_worlds": (0.95, True), "efficiency_4_gpus_8192_worlds": (0.875, False)}
    flat = [1.0] * 20
    curve = {"one_gpu_seed0": {"mean_reward": flat}, "one_gpu_seed1": {"mean_reward": [1.2] * 20},
             "two_gpus": {"mean_reward": [1.25] * 20}}
    (g,) = bench.gates({"runs": [], "curve": curve})
    assert g["name"] == "curve_gap_2_gpus_over_seed_spread" and g["passed"] and g["value"] == pytest.approx(1.25)
    curve["two_gpus"] = {"mean_reward": [1.4] * 20}
    assert not bench.gates({"runs": [], "curve": curve})[0]["passed"]


@pytest.mark.parametrize("args, message", [
    (["--worlds", "0"], "argument --worlds: worlds must be in"),
    (["--worlds", "2147483648"], "argument --worlds: worlds must be in"),
    (["--seed", "-1"], "argument --seed: seed must be in"),
    (["--seed", "4294967296"], "argument --seed: seed must be in"),
    (["--set", "hidden=3"], "argument --set: bad settings: hidden must be a list or tuple"),
    (["--out", "{tmp}/new/deep/r.json", "--run-dir", "{tmp}/notes"], "argument --run-dir: the run's folder"),
    (["--train-seconds", "nan"], "argument --train-seconds: must be finite and > 0, got nan"),
    (["--train-seconds", "-1"], "argument --train-seconds: must be finite and > 0"),
    (["--train-seconds", "inf"], "argument --train-seconds: must be finite and > 0"),
    (["--eval-tracks", "0"], r"argument --eval-tracks: must be in \[1, 1000\] \(the Test split's tracks\), got 0"),
    (["--eval-tracks", "1001"], r"argument --eval-tracks: must be in \[1, 1000\]"),
    (["--out", "{tmp}/report.txt"], "argument --out: must end in one of .json"),
    (["--out", "{tmp}/folder.json"], "argument --out: '.*folder.json' is a folder, not a file"),
    (["--out", "{tmp}/notes.json"], "argument --out: the run's folder '.*notes' holds files but no training run"),
    (["--run-dir", "{tmp}/notes"], "argument --run-dir: the run's folder '.*notes' holds files but no training run"),
    (["--run-dir", "{tmp}/file"], "argument --run-dir: the run's folder '.*file' is a file"),
])
def test_the_ppo_benchmark_refuses_bad_arguments_before_touching_anything(tmp_path, monkeypatch, capsys, args,
                                                                           message):
    """A bad number or output is a usage error (exit 2) naming the flag,
    and a folder the run would replace that holds something else than a
    run is left as it is."""
    (tmp_path / "folder.json").mkdir()
    (tmp_path / "notes").mkdir()
    (tmp_path / "notes" / "mine.txt").write_text("keep")
    (tmp_path / "file").write_text("keep")
    bench = _ppo_benchmark()
    monkeypatch.setattr(sys, "argv", ["ppo_level1.py", "--dev", "--out", str(tmp_path / "r.json"),
                                      *(a.format(tmp=tmp_path) for a in args)])
    with pytest.raises(SystemExit) as stopped:
        bench.main()
    assert stopped.value.code == 2
    assert re.search(message, capsys.readouterr().err), message
    assert (tmp_path / "notes" / "mine.txt").read_text() == "keep" and (tmp_path / "file").read_text() == "keep"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["file", "folder.json", "notes"]  # no folder made


def test_the_batched_comparison_counts_lap_differences_in_env_calls():
    """Laps one call apart read 0.0200005 s in float32: the comparison
    counts the calls (1), as well as the seconds, and an outcome that
    differs is counted apart (its lap not compared)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("batched_eval", ROOT / "benchmarks/racing_stack/batched_eval.py")
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)

    def episode(track, reason, steps):
        lap = float(np.float32(steps) * np.float32(0.02)) if reason == "success" else None
        return {"track_id": track, "termination_reason": reason, "lap_time_s": lap, "steps": steps}

    one = {"episodes": [episode(1, "success", 991), episode(2, "success", 1036), episode(3, "off_track", 40)],
           "summary": {"success_rate": 2 / 3}, "seconds": 2.0}
    many = {"episodes": [episode(1, "success", 992), episode(2, "success", 1036), episode(3, "success", 1200)],
            "summary": {"success_rate": 1.0}, "seconds": 1.0}
    c = bench.compared(one, many, exact=False)
    assert c["outcomes_differing"] == 1 and c["max_lap_difference_calls"] == 1
    assert 0.02 < c["max_lap_difference_s"] < 0.0201 and c["bitwise_equal"] is None


def test_the_batched_shadow_counts_every_action_the_per_episode_controller_would_not_give():
    """The benchmark's shadow: each world's row also through a Controller
    made at its episode's start; a differing action (in any bit, NaN
    against a number too) is counted, one that forgets its state at a
    start is caught at the next episode, and the plugin loader is
    restored even when the run raises."""
    import importlib.util

    from racing_env import BatchController, Controller
    from racing_env.plugins import Plugin

    spec = importlib.util.spec_from_file_location("batched_eval", ROOT / "benchmarks/racing_stack/batched_eval.py")
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)

    class Batch(BatchController):
        forgets = False

        def __init__(self, config, worlds):
            super().__init__(config, worlds)
            self.calls = np.zeros(worlds)

        def start(self, worlds, obs, info):
            if not self.forgets:
                self.calls[worlds] = 0

        def compute_controls(self, worlds, obs, info):
            self.calls[worlds] += 1
            return np.stack([obs["x"] * self.calls[worlds], obs["x"]], -1)

    class One(Controller):
        def __init__(self, obs, info, config):
            super().__init__(obs, info, config)
            self.calls = 0

        def compute_control(self, obs, info=None):
            self.calls += 1
            odd = {3: 1e-9, 4: np.nan}.get(self.calls, 0.0) if obs["x"] == 2.0 else 0.0
            return np.array([obs["x"] * self.calls, obs["x"] + odd])

    tally = {"rows": 0, "differing": 0, "max_abs": 0.0}
    shadow = bench.shadowed(Batch, One, tally)({}, 2)
    worlds, obs = np.array([0, 1]), {"x": np.array([1.0, 2.0])}
    shadow.start(worlds, obs, {})
    for _ in range(4):
        shadow.compute_controls(worlds, obs, {})
    assert tally["rows"] == 8 and tally["differing"] == 2 and tally["max_abs"] == np.inf  # calls 3 and 4 of world 1

    Batch.forgets = True
    tally = {"rows": 0, "differing": 0, "max_abs": 0.0}
    shadow = bench.shadowed(Batch, One, tally)({}, 1)
    for _ in range(2):  # two episodes of two calls on world 0
        shadow.start(np.array([0]), {"x": np.array([1.0])}, {})
        for _ in range(2):
            shadow.compute_controls(np.array([0]), {"x": np.array([1.0])}, {})
    assert tally["rows"] == 4 and tally["differing"] == 2 and tally["max_abs"] == 2.0  # the second episode's

    original = Plugin._classes
    with pytest.raises(RuntimeError, match="a failed run"):
        with bench.shadowing(tally):
            assert Plugin._classes is not original
            raise RuntimeError("a failed run")
    assert Plugin._classes is original


def test_the_batched_evaluation_benchmark_smoke_compares_and_times(tmp_path):
    """The batched-evaluation benchmark's CPU smoke: the release policy
    with this version's controller, the batched command timed twice in a
    fresh process, then on two Test tracks batched (one world, two waves)
    with every row's action also from its episode's Controller (bit for bit
    the same), one episode at a time and batched again: bit for bit the
    same episodes each time, and the isolated command's; no gate on a CPU."""
    out = tmp_path / "batched.json"
    run = subprocess.run([sys.executable, str(ROOT / "benchmarks/racing_stack/batched_eval.py"), "--out", str(out)],
                         capture_output=True, text=True, timeout=600, cwd=tmp_path)
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-2000:]
    report = json.loads(out.read_text())
    assert report["device"] == "cpu" and report["gates"] == [] and report["passed"] is False
    comparison = report["comparison"]
    assert comparison["episodes"] == 2 and comparison["bitwise_equal"] is True
    assert comparison["outcomes_differing"] == 0
    assert comparison["max_lap_difference_s"] == 0.0 and comparison["max_lap_difference_calls"] == 0
    actions = report["actions"]
    assert actions["episodes"] == 2 and actions["rows"] > 200 and actions["differing"] == 0
    assert actions["max_abs"] == 0.0 and actions["controller_errors"] == 0
    for name, other in (("repeat", "shadowed"), ("isolated", "command")):
        again = report[name]
        assert again["episodes"] == 2 and again["bitwise_equal"] is True and again["tracks_whose_laps_differ"] == 0
        assert set(again["seconds"]) == {other, "batched"}
    command = report["command"]
    assert command["episodes"] == 2 and command["seconds"] > 0 and command["seconds_first"] > 0
    usage = subprocess.run([sys.executable, str(ROOT / "benchmarks/racing_stack/batched_eval.py"), "--plugin",
                            str(tmp_path)], capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert usage.returncode == 2 and "argument --plugin" in usage.stderr
    fewer = subprocess.run([sys.executable, str(ROOT / "benchmarks/racing_stack/batched_eval.py"), "--tracks", "1",
                            "--compare", "2"], capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert fewer.returncode == 2 and "argument --tracks" in fewer.stderr and "must hold the compared" in fewer.stderr


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the attacks read /proc")
def test_the_fault_benchmark_quick_set_holds_every_gate(tmp_path):
    """The fault report's quick set (one attack of each kind: a plugin's
    SIGKILL to the evaluator and SIGSTOP to its group, a daemon, closed
    descriptors, the evaluator killed twice, /dev/full, a named pipe with
    a reader): every gate holds, each attack's expected and observed
    outcome reported."""
    out = tmp_path / "faults.json"
    run = subprocess.run([sys.executable, str(ROOT / "benchmarks/racing_stack/faults.py"), "--quick", "--out",
                          str(out)], capture_output=True, text=True, timeout=900, cwd=tmp_path)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-2000:]
    report = json.loads(out.read_text())
    assert report["passed"] is True and report["quick"] is True and report["signal_guard_holds"] is True
    assert report["attacks_run"] == len(report["attacks"]) == 8
    assert report["gates"][0]["threshold"] == "8 (--quick: a few of each kind)"
    assert {a["category"] for a in report["attacks"]} == {"plugin", "evaluator killed", "outputs"}
    for attack in report["attacks"]:
        assert attack["expected"] and attack["observed"] and attack["passed"] is True
        assert attack["observed"]["left_behind"] == []
    refused = [a for a in report["attacks"] if a["name"] == "SIGKILL to the evaluating process"]
    assert refused[0]["observed"]["attack_log"][0] == {"attack": "refused", "errno": 1}
    usage = subprocess.run([sys.executable, str(ROOT / "benchmarks/racing_stack/faults.py"), "--quick",
                            "--publish"], capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert usage.returncode == 2 and "--publish takes the full set" in usage.stderr


def test_the_committed_batched_report_meets_its_gates_on_its_own_numbers():
    """``benchmarks/results/batched_eval.json`` (the runner page's
    numbers): a GPU's report of the release plugin, every gate passed,
    and each gate's value the one its data gives: no action of a
    compared row differing, no outcome differing, the command on all
    1,000 Test tracks within 60 s warm, every track lapped."""
    report = json.loads((ROOT / "benchmarks/results/batched_eval.json").read_text())
    assert report["passed"] is True and report["device"] != "cpu" and report["backend"] == "mjx_warp"
    assert report["plugin"] == "benchmarks/results/ppo_level1/plugin"
    gates = {g["name"].split(",")[0]: g for g in report["gates"]}
    assert len(gates) == 3 and all(g["passed"] for g in gates.values())
    actions, comparison, command = report["actions"], report["comparison"], report["command"]
    assert gates["actions differing from the per-episode controller's on the same observations"]["value"] == \
        actions["differing"] == 0 and actions["rows"] > 0 and actions["controller_errors"] == 0
    assert actions["episodes"] == comparison["episodes"] == report["compared_tracks"] == 20
    assert gates["outcomes differing"]["value"] == comparison["outcomes_differing"] == 0
    assert report["repeat"]["outcomes_differing"] == report["isolated"]["outcomes_differing"] == 0
    assert gates["evaluate --batched on 1000 Test tracks"]["value"] == round(command["seconds"], 1) <= 60.0
    assert command["episodes"] == report["command_tracks"] == 1000 and command["success_rate"] == 1.0
