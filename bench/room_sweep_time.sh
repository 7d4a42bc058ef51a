#!/usr/bin/env bash
# Wall time of the room's nine cells for one seed, end to end: Local, Oracle, FedAvg
# and the four seed methods (63 runs of 150 rounds), `python -m mpifl.sweep ...
# --local --parallel 2` into a fresh output folder, from the checkout given (this one
# by default). Performance V, item 6: run it for the checkout before and after, with
# nothing else on the machine, then compare the logs:
#
#   bash bench/room_sweep_time.sh /path/to/before    # prints the output folder
#   bash bench/room_sweep_time.sh                     # this checkout
#   python bench/room_sweep_time.py --compare OUT_BEFORE OUT_AFTER
#
# The sweep is the room's (jobs/room-fashionmnist.yaml: 2, 5, 25 clients a group x
# 10, 50, 400 samples; DPFL at one local epoch a round, as fair-primary runs it),
# seed 0, written into the output folder so the same file runs in both checkouts.
set -uo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
repo=$(cd "${1:-$here}" && pwd)
py=${PYTHON:-$here/.venv/bin/python}
out=$(mktemp -d /tmp/mpifl-roomtime-XXXXXX)
cat > "$out/room-one-seed.sweep.yaml" <<YAML
name: room-one-seed
base: $repo/jobs/room-fashionmnist.yaml
set:
  dpfl.tau_init: 1
  dpfl.tau_train: 1
grid:
  algorithm.name: [local, oracle, fedavg, federico, dpfl, pfedlia, fedc2i]
  data.n_clients: [100, 20, 8]
  data.train_per_client: [400, 50, 10]
  run.seed: [0]
YAML
export MPIFL_CACHE=$out/cache PYTHONPATH=$repo
cd "$repo" || exit 1
echo "code: $repo ($(git -C "$repo" rev-parse --short HEAD 2>/dev/null || echo '?')); output: $out"
echo "load average before: $(cut -d' ' -f1-3 /proc/loadavg)"
start=$(date +%s.%N)
"$py" -m mpifl.sweep "$out/room-one-seed.sweep.yaml" --local --parallel 2 --out-dir "$out/runs" > "$out/sweep.log" 2>&1
rc=$?
end=$(date +%s.%N)
runs=$(find "$out/runs" -name run.h5 | wc -l)
awk -v s="$start" -v e="$end" -v rc="$rc" -v n="$runs" -v o="$out" \
  'BEGIN { printf "room, one seed: %.1f s  exit %d  %d runs  output %s\n", e - s, rc, n, o }'
echo "load average after: $(cut -d' ' -f1-3 /proc/loadavg)"
