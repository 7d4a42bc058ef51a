#!/usr/bin/env bash
# Wall time of each paper-table sweep (jobs/tables/*.sweep.yaml) run here with
# `python -m mpifl.sweep ... --local --parallel 2`, each into a fresh output folder,
# one table after another.
#
#   bash bench/table_walltime.sh                          # this checkout, every table
#   bash bench/table_walltime.sh /path/to/other/checkout  # the same for another checkout's code
#   bash bench/table_walltime.sh . fedc2i-table1          # only the tables named
#   EXTRA=--mpiexec bash bench/table_walltime.sh          # extra sweep options (here: no warm workers)
#
# Run it with nothing else on the machine. The dataset cache (mpifl/data/cache.py)
# starts empty in the scratch folder, so the first points pay for making the data
# as on a first run. Prints one line per table: wall seconds, exit status, points
# run, and where its sweep output and log are (kept).
set -uo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
repo=$(cd "${1:-$here}" && pwd)
shift $(( $# > 0 ? 1 : 0 ))
tables=("$@")
if [ ${#tables[@]} -eq 0 ]; then
  tables=(dpfl-table1 fedc2i-table1 federico-table1 pfedlia-table1)
fi
py=${PYTHON:-$here/.venv/bin/python}
out=$(mktemp -d /tmp/mpifl-tables-XXXXXX)
export MPIFL_CACHE=$out/cache PYTHONPATH=$repo
cd "$repo" || exit 1
echo "code: $repo ($(git -C "$repo" rev-parse --short HEAD 2>/dev/null || echo '?')); python: $py; output: $out"
echo "load average before: $(cut -d' ' -f1-3 /proc/loadavg)"
for t in "${tables[@]}"; do
  start=$(date +%s.%N)
  # shellcheck disable=SC2086  # EXTRA holds several options
  "$py" -m mpifl.sweep "jobs/tables/$t.sweep.yaml" --local --parallel 2 ${EXTRA:-} --out-dir "$out/$t" \
    > "$out/$t.log" 2>&1
  rc=$?
  end=$(date +%s.%N)
  runs=$(find "$out/$t" -name run.h5 2>/dev/null | wc -l)
  awk -v t="$t" -v s="$start" -v e="$end" -v rc="$rc" -v n="$runs" -v lf="$out/$t.log" \
    'BEGIN { printf "%-18s %9.1f s  exit %d  %3d runs  log %s\n", t, e - s, rc, n, lf }'
done
echo "load average after: $(cut -d' ' -f1-3 /proc/loadavg)"
