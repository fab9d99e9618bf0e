#!/usr/bin/env bash
# Several dev runs of the PPO benchmark at once on one GPU (the ledger's
# experiments on the PPO page): Level 1's pools are built first, then each
# experiment trains in its own process for the same wall time.
#
#   benchmarks/racing_stack/ppo_experiments.sh OUT_DIR SECONDS NAME[:SETTING;SETTING...] ...
#
# e.g. ppo_experiments.sh out 300 base 'margin2:reward.edge_margin_m=2.0;--seed=1' \
#          'noise:init_log_std=(-1.6, -0.5)'
# writes OUT_DIR/NAME.json, .png, .out and NAME/log.csv per experiment, and
# prints their ledger rows at the end (ppo_ledger.py). A
# setting that starts with -- is passed to the benchmark as it is; any other
# becomes --set SETTING.
set -euo pipefail
out=$1 seconds=$2
shift 2
mkdir -p "$out"
python -m racing_stack.pools --splits train validation > "$out/pools.out" 2>&1
pids=()
for spec in "$@"; do
  name=${spec%%:*} args=()
  if [[ $spec == *:* ]]; then
    IFS=';' read -ra settings <<< "${spec#*:}"
    for s in "${settings[@]}"; do
      if [[ $s == --* ]]; then args+=("$s"); else args+=(--set "$s"); fi
    done
  fi
  python benchmarks/racing_stack/ppo_level1.py --dev --train-seconds "$seconds" --out "$out/$name.json" \
    "${args[@]}" > "$out/$name.out" 2>&1 &
  pids+=($!)
done
status=0
for pid in "${pids[@]}"; do wait "$pid" || status=1; done
python "$(dirname "$0")/ppo_ledger.py" "$out" || status=1
exit $status
