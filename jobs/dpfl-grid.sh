#!/usr/bin/env bash
# The DPFL grid on built-in data (every budget, the random graph and the two baselines) (docs/reproductions/dpfl.md): for each
# partition and seed, DPFL at budgets inf/0.2N/0.1N/0.05N, the random graph at
# 0.2N/0.1N/0.05N, FedAvg and Local, all from one jobs file by command-line overrides.
# Usage: jobs/dpfl-grid.sh [DATASET=mnist1d] [PARALLEL=2]   (from the repo root)
set -euo pipefail
DATASET=${1:-mnist1d}
PARALLEL=${2:-2}
PY=${PY:-python}
for part in dir patho; do
  for seed in 0 1 2; do
    f=jobs/dpfl-$DATASET-$part.yaml
    n=dpfl-$DATASET-$part
    for b in inf 0.2N 0.1N 0.05N; do
      echo "$f run.name=$n-dpfl-$b-s$seed run.seed=$seed dpfl.budget=$b"
    done
    for b in 0.2N 0.1N 0.05N; do
      echo "$f run.name=$n-random-$b-s$seed run.seed=$seed dpfl.budget=$b dpfl.random_graph=true"
    done
    echo "$f run.name=$n-fedavg-s$seed run.seed=$seed algorithm.name=fedavg"
    echo "$f run.name=$n-local-s$seed run.seed=$seed algorithm.name=local"
  done
done | xargs -P "$PARALLEL" -L 1 sh -c "$PY -m mpifl.main \"\$@\" run.threads=1 > /dev/null && echo done: \$2" _
