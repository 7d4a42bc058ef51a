#!/bin/bash
# Cluster recovery of the who-collaborates-with-whom baselines beside pFedLIA's:
# mnist1d, 100 clients in 5 clusters of disjoint label pairs, 10% sampled per
# round (jobs/pfedlia-mnist1d.yaml), seeds 0-2, then python -m mpifl.analyze.
#
#     bash bench/whom_ari.sh [OUT=results/whom-ari] [ROUNDS=100] [RANKS=2]
#
# CFL runs twice: with the paper's reference thresholds (eps1 0.4, eps2 1.6) and
# with thresholds read off this setting's update norms (cfl-tuned: eps1 0.25,
# eps2 0.45; bench/README.md says how).
set -euo pipefail
OUT=${1:-results/whom-ari}
ROUNDS=${2:-100}
RANKS=${3:-2}
PY=${PYTHON:-python}
MPIEXEC=${MPIEXEC:-mpiexec}
declare -A EXTRA=(
  [pfedlia]="" [cfl]="" [cfl-tuned]="cfl.eps1=0.25 cfl.eps2=0.45"
  [fesem]="" [fedfomo]="" [pfedgraph]=""
)
for name in pfedlia cfl cfl-tuned fesem fedfomo pfedgraph; do
  for seed in 0 1 2; do
    start=$(date +%s)
    # shellcheck disable=SC2086
    $MPIEXEC -n "$RANKS" "$PY" -m mpi4py -m mpifl.main jobs/pfedlia-mnist1d.yaml \
      algorithm.name="${name%-tuned}" run.rounds="$ROUNDS" run.seed="$seed" run.threads=1 \
      run.name="$name-s$seed" run.out_dir="$OUT/runs" ${EXTRA[$name]} | tail -1
    echo "$name seed $seed: $(( $(date +%s) - start )) s"
  done
done
"$PY" -m mpifl.analyze "$OUT/runs" --out "$OUT/analysis" --heatmaps first
