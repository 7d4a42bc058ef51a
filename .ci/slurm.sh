#!/usr/bin/env bash
# A real SLURM test on a two-node cluster on this machine (two slurmd daemons,
# `slurmd -N NAME`, which Debian's SLURM supports; where the second one does not
# come up, the one-node parts still run and the two-node part says SKIPPED):
# - `srun -n 2 python -m mpifl.check jobs/quickstart.yaml` reports and exits 0,
#   and under `srun --mpi=none` (a PMI MPICH does not use) names the mismatch;
# - two nodes: `srun -N 2 -n 4` mpifl.check reports 2 nodes of 2 ranks, and the
#   quickstart over them logs /clients/node and equals `srun -N 1 -n 2` bitwise;
# - a 2 x 2 sweep (.ci/slurm-sweep.yaml: two algorithms x two seeds of
#   jobs/quickstart.yaml) submitted with `python -m mpifl.sweep --submit`, then
#   `python -m mpifl.analyze` must give a 2-row table with mean +- std over 2 seeds;
# - a seed table's slice (.ci/slurm-table.yaml: FedC2I's table on Fashion-MNIST,
#   shortened by that file) submitted as written with `--submit` (its preflight
#   included), then analysed with the table's layout; without Debian's
#   dataset-fashion-mnist the preflight must refuse it in one line;
# - preemption: `scancel --signal=USR1 --batch` -> checkpoint -> exit 75 ->
#   requeue -> resume, and the final log equals an uninterrupted run's bitwise.
#
#   .ci/slurm.sh [PYTHON]        PYTHON: the venv's python (or $MPIFL_PYTHON)
#
# Needs root (apt-get install of Debian's slurmctld slurmd slurm-client munge,
# daemons started here). Where SLURM cannot start it prints a SKIPPED line and
# exits 0; once it has started, any failure exits 1. The daemons are stopped at
# the end whatever happens. Runs in 4 to 8 minutes on 2 cores (busy: 7m45s) without
# the two-node and seed-table parts.
set -euo pipefail

PY=${1:-${MPIFL_PYTHON:-python3}}
ROOT=$(cd "$(dirname "$0")/.." && pwd)
cd "$ROOT"
# this checkout's mpifl, also in the jobs (sbatch passes the environment on),
# whichever checkout the venv was installed from
export PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}"
skip() { echo "SKIPPED: .ci/slurm.sh: $*"; exit 0; }
say() { echo "[slurm.sh $(date +%T)] $*"; }

"$PY" -c "import mpifl, mpi4py" 2>/dev/null || { echo "error: $PY cannot import mpifl and mpi4py" >&2; exit 1; }
[ "$(id -u)" = 0 ] || skip "needs root to install and start SLURM"

if ! command -v slurmctld >/dev/null || ! command -v slurmd >/dev/null || ! command -v sbatch >/dev/null \
        || ! command -v munged >/dev/null; then
    command -v apt-get >/dev/null || skip "SLURM is not installed and there is no apt-get"
    say "installing slurmctld slurmd slurm-client munge"
    export DEBIAN_FRONTEND=noninteractive
    if ! timeout 240 apt-get install -y --no-install-recommends slurmctld slurmd slurm-client munge >/tmp/mpifl-slurm-apt.log 2>&1; then
        timeout 120 apt-get update >>/tmp/mpifl-slurm-apt.log 2>&1 || true
        timeout 240 apt-get install -y --no-install-recommends slurmctld slurmd slurm-client munge \
            >>/tmp/mpifl-slurm-apt.log 2>&1 || skip "apt-get install failed (see /tmp/mpifl-slurm-apt.log)"
    fi
fi

WORK=$(mktemp -d /tmp/mpifl-slurm.XXXXXX)
chmod 755 "$WORK"
HOST=$(hostname -s)
NODE2="$HOST-b"  # the second node's name (same host)
CPUS=$(nproc)
MEM_MB=$(( $(awk '/MemTotal/ {print $2}' /proc/meminfo) / 1024 - 1024 ))
mkdir -p "$WORK"/{state,spool,munge,log}
chown munge:munge "$WORK/munge"
chmod 755 "$WORK/munge"  # munged wants its socket folder reachable by all

cleanup() {
    local rc=$?
    # jobs first (their slurmstepd outlive slurmd), then the daemons, by pid
    if [ -n "${SLURM_CONF:-}" ] && [ -f "$WORK/slurmctld.pid" ]; then
        local pids
        pids=$(scontrol listpids 2>/dev/null | awk 'NR > 1 && $1 ~ /^[0-9]+$/ {print $1}' || true)
        scancel --quiet --user=root 2>/dev/null || true
        for _ in $(seq 20); do [ -z "$(squeue -h 2>/dev/null)" ] && break; sleep 1; done
        for pid in $pids; do kill "$pid" 2>/dev/null || true; done
    fi
    for f in "$WORK"/slurmd-*.pid "$WORK"/slurmctld.pid "$WORK"/munge/munged.pid; do
        [ -f "$f" ] && kill "$(cat "$f")" 2>/dev/null || true
    done
    sleep 1
    say "daemons stopped; files in $WORK"
    exit "$rc"
}
trap cleanup EXIT

# munge under its own user, with its socket in our folder: nothing system-wide changes
KEY=/etc/munge/munge.key
if [ ! -s "$KEY" ]; then
    KEY="$WORK/munge/munge.key"
    dd if=/dev/urandom of="$KEY" bs=1 count=1024 2>/dev/null
    chown munge:munge "$KEY"; chmod 400 "$KEY"
fi
SOCK="$WORK/munge/munge.socket"
runuser -u munge -- munged --socket="$SOCK" --key-file="$KEY" --pid-file="$WORK/munge/munged.pid" \
    --log-file="$WORK/munge/munged.log" --seed-file="$WORK/munge/munged.seed" \
    || skip "munged did not start: $(tail -n 3 "$WORK/munge/munged.log" 2>/dev/null)"

export SLURM_CONF="$WORK/slurm.conf"
FIRST_JOB=$(( ($(date +%s) % 100000) * 100 + 1000 ))
cat >"$SLURM_CONF" <<EOF
ClusterName=mpifl-ci
SlurmctldHost=$HOST(127.0.0.1)
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket=$SOCK
StateSaveLocation=$WORK/state
SlurmdSpoolDir=$WORK/spool/%n
SlurmctldPidFile=$WORK/slurmctld.pid
SlurmdPidFile=$WORK/slurmd-%n.pid
SlurmctldLogFile=$WORK/log/slurmctld.log
SlurmdLogFile=$WORK/log/slurmd-%n.log
SlurmctldPort=16817
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
SchedulerType=sched/backfill
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
MpiDefault=none
ReturnToService=2
# MPICH names its shared-memory segments after the PMI job step: job ids that
# restart at 1 with every fresh cluster meet the segments a killed run left in
# /dev/shm and fail in MPI_Init, so each cluster starts at its own job id
FirstJobId=$FIRST_JOB
SlurmdTimeout=60
# two nodes on this host, each with its own slurmd (port, spool, log): the same
# CPUs counted twice, so jobs on both share the cores
NodeName=$HOST NodeHostname=$HOST NodeAddr=127.0.0.1 Port=16818 CPUs=$CPUS RealMemory=$MEM_MB State=UNKNOWN
NodeName=$NODE2 NodeHostname=$HOST NodeAddr=127.0.0.1 Port=16819 CPUs=$CPUS RealMemory=$MEM_MB State=UNKNOWN
PartitionName=ci Nodes=$HOST,$NODE2 Default=YES MaxTime=INFINITE State=UP
EOF

node_up() {  # node_up NAME SECONDS: the node reaches idle within SECONDS, else says its state
    local state=""
    for _ in $(seq "$2"); do
        state=$(sinfo -h -N -n "$1" -o %T 2>/dev/null | head -n 1 || true)
        [ "$state" = idle ] && return 0
        sleep 1
    done
    echo "state '${state:-none}'"
    return 1
}
slurmctld -f "$SLURM_CONF" || skip "slurmctld did not start: $(tail -n 3 "$WORK/log/slurmctld.log" 2>/dev/null)"
slurmd -f "$SLURM_CONF" -N "$HOST" || skip "slurmd did not start: $(tail -n 3 "$WORK/log/slurmd-$HOST.log" 2>/dev/null)"
why=$(node_up "$HOST" 60) \
    || skip "the SLURM node did not come up ($why); $(tail -n 2 "$WORK/log/slurmd-$HOST.log" 2>/dev/null)"
# a second slurmd on the same host needs SLURM built with --enable-multiple-slurmd
TWO_NODES=1
why=""
if ! slurmd -f "$SLURM_CONF" -N "$NODE2" >"$WORK/log/slurmd-start-$NODE2.out" 2>&1 || ! why=$(node_up "$NODE2" 30); then
    TWO_NODES=0
    say "a second slurmd (slurmd -N $NODE2) did not come up (${why:-$(tail -n 1 "$WORK/log/slurmd-start-$NODE2.out")})"
    scontrol update NodeName="$NODE2" State=DOWN Reason="no second slurmd" 2>/dev/null || true
fi
say "cluster up: $HOST$([ "$TWO_NODES" = 1 ] && echo " and $NODE2 (two slurmd on one host)"), $CPUS CPUs, ${MEM_MB} MB each"

# every module compiled before the MPI steps: with PYTHONDONTWRITEBYTECODE each rank compiles
# mpifl from source at start, and MPICH's PMI2 address exchange over the two slurmd then sent
# bytes of that freed source text as its value (seen 2 of 2 tries, 2026-11-27: "mpi/pmi2: invalid
# client request", the request the hex of a docstring of mpifl/comm/collectives.py); compiled first,
# the same steps pass
"$PY" -m compileall -q "$ROOT/mpifl" >/dev/null

# the srun MPI plugin must start the MPI library's ranks; check it on a tiny step first
if ! timeout 60 srun -n 2 --mpi=pmi2 "$PY" -m mpi4py -c \
        "from mpi4py import MPI; c = MPI.COMM_WORLD; assert c.Get_size() == 2, c.Get_size(); print('rank', c.Get_rank(), 'of', c.Get_size(), MPI.Get_library_version().splitlines()[0])"; then
    echo "error: srun --mpi=pmi2 did not start 2 MPI ranks" >&2
    exit 1
fi

say "mpifl.check through srun"
timeout 120 srun -n 2 --mpi=pmi2 "$PY" -m mpi4py -m mpifl.check jobs/quickstart.yaml run.out_dir="$WORK/check" \
    | tee "$WORK/check.out"
grep -q "mpifl.check: ok, no problems" "$WORK/check.out" || { echo "error: mpifl.check found problems" >&2; exit 1; }

say "mpifl.check under srun --mpi=none: MPICH's ranks start alone, which it must name in one line"
if timeout 120 srun -n 2 --mpi=none "$PY" -m mpifl.check jobs/quickstart.yaml run.out_dir="$WORK/check" \
        >"$WORK/check-none.out" 2>&1; then
    cat "$WORK/check-none.out"; echo "error: mpifl.check passed a PMI mismatch" >&2; exit 1
fi
grep "problem:" "$WORK/check-none.out" || true
[ "$(grep -c "problem: srun --mpi=none started 2 tasks but MPI sees 1 rank(s) in each" "$WORK/check-none.out")" = 1 ] \
    || { cat "$WORK/check-none.out"; echo "error: no one-line PMI diagnosis" >&2; exit 1; }

if [ "$TWO_NODES" = 1 ]; then
    say "two nodes: srun -N 2 -n 4, the preflight and the quickstart against srun -N 1 -n 2"
    timeout 300 srun -N 2 -n 4 --mpi=pmi2 "$PY" -m mpi4py -m mpifl.check jobs/quickstart.yaml \
        run.out_dir="$WORK/check" | tee "$WORK/check-nodes.out"
    grep -q "4 rank(s) on 2 node(s)" "$WORK/check-nodes.out" && grep -q "2 rank(s) per node" "$WORK/check-nodes.out" \
        && grep -q "mpifl.check: ok, no problems" "$WORK/check-nodes.out" \
        || { echo "error: mpifl.check did not see 2 nodes of 2 ranks" >&2; exit 1; }
    NODES_RUN=(jobs/quickstart.yaml run.out_dir="$WORK/nodes" run.threads=1)
    timeout 300 srun -N 2 -n 4 --mpi=pmi2 "$PY" -m mpi4py -m mpifl.main "${NODES_RUN[@]}" run.name=n4 | tail -n 1
    timeout 300 srun -N 1 -n 2 --mpi=pmi2 "$PY" -m mpi4py -m mpifl.main "${NODES_RUN[@]}" run.name=n2 | tail -n 1
    "$PY" - "$WORK/nodes/n2" "$WORK/nodes/n4" <<'EOF'
import sys
import numpy as np
from mpifl.logging.h5 import open_run
a, b = open_run(sys.argv[1]), open_run(sys.argv[2])
assert b.attrs["n_nodes"] == 2 and b.attrs["n_ranks"] == 4, dict(b.attrs)
assert np.array_equal(b.get("clients/node"), np.repeat([0, 1], 10)), b.get("clients/node")  # srun's block layout
placement = {"clients/rank", "clients/node", "rounds/wall_s", "rounds/comm_s", "rounds/compute_s"}
keys = set(a.keys()) - placement
assert keys == set(b.keys()) - placement and a.n_rounds == b.n_rounds == 30
for k in sorted(keys):
    assert np.array_equal(a.get(k), b.get(k), equal_nan=True), k
print(f"srun -N 2 -n 4 == srun -N 1 -n 2: {len(keys)} datasets, {a.n_rounds} rounds, bitwise")
EOF
else
    echo "SKIPPED: .ci/slurm.sh: two nodes (this SLURM starts one slurmd per host); the simulated nodes of tests/test_nodes.py stand in"
fi

OUT="$WORK/results"
say "submitting the sweep"
"$PY" -m mpifl.sweep .ci/slurm-sweep.yaml --out-dir "$OUT" --submit | tee "$WORK/submit.out"
JOB=$(awk '/submitted array job/ {print $4}' "$WORK/submit.out")
[ -n "$JOB" ] || { echo "error: no job id from --submit" >&2; exit 1; }

DEADLINE=$((SECONDS + 400))  # a guard against a hang; 200 s seen on a busy 2-core box
while [ -n "$(squeue -h -j "$JOB" 2>/dev/null)" ] && [ "$SECONDS" -lt "$DEADLINE" ]; do sleep 2; done
if [ -n "$(squeue -h -j "$JOB" 2>/dev/null)" ]; then
    squeue -j "$JOB"; echo "error: array $JOB still running after ${SECONDS} s" >&2; exit 1
fi
say "array $JOB finished; logs:"
tail -n 2 "$OUT"/ci-slurm/logs/*.out

say "resubmitting: every run is complete, nothing must be submitted"
"$PY" -m mpifl.sweep .ci/slurm-sweep.yaml --out-dir "$OUT" --submit | tee "$WORK/resubmit.out"
grep -q "nothing to submit" "$WORK/resubmit.out" || { echo "error: complete runs were resubmitted" >&2; exit 1; }

say "analysis"
"$PY" -m mpifl.analyze "$OUT/ci-slurm" --out "$WORK/analysis"
"$PY" - "$WORK/analysis/table.csv" <<'EOF'
import csv, sys
rows = list(csv.DictReader(open(sys.argv[1])))
assert len(rows) == 2, f"expected 2 rows (fedavg, oracle), got {len(rows)}: {rows}"
for r in rows:
    assert int(r["n_seeds"]) == 2, r
    assert r["final_acc_pct_std"] not in ("", "nan"), r
print("table: 2 rows x 2 seeds, mean +- std present")
EOF

# a seed table as written: a slice of FedC2I's table on Fashion-MNIST (shortened by
# .ci/slurm-table.yaml, nothing by hand), submitted with its preflight, then analysed
# with the table's own layout
TABLE_OUT="$WORK/table"
if [ -d /usr/share/datasets/fashion-mnist ]; then
    say "a seed table's slice: .ci/slurm-table.yaml --submit"
    "$PY" -m mpifl.sweep .ci/slurm-table.yaml --out-dir "$TABLE_OUT" --submit | tee "$WORK/table-submit.out"
    JOB=$(awk '/submitted array job/ {print $4}' "$WORK/table-submit.out")
    [ -n "$JOB" ] || { echo "error: no job id from the table's --submit" >&2; exit 1; }
    DEADLINE=$((SECONDS + 600))
    while [ -n "$(squeue -h -j "$JOB" 2>/dev/null)" ] && [ "$SECONDS" -lt "$DEADLINE" ]; do sleep 2; done
    [ -z "$(squeue -h -j "$JOB" 2>/dev/null)" ] || { squeue -j "$JOB"; echo "error: array $JOB still running" >&2; exit 1; }
    tail -q -n 1 "$TABLE_OUT"/ci-fedc2i-table1/logs/*.out
    "$PY" -m mpifl.analyze "$TABLE_OUT/ci-fedc2i-table1" --out "$WORK/table-analysis" --heatmaps none \
        --layout jobs/tables/fedc2i-table1.layout.yaml | tee "$WORK/table-analysis.out"
    for row in Local FedC2I; do
        grep -qE "^\| $row \| [0-9.]+ ± [0-9.]+ \[2\] \|" "$WORK/table-analysis/fedc2i-table1.md" \
            || { echo "error: the table's row $row has no mean ± std over 2 seeds" >&2; exit 1; }
    done
else
    say "no Debian dataset-fashion-mnist: the table's preflight must refuse it in one line"
    if "$PY" -m mpifl.sweep .ci/slurm-table.yaml --out-dir "$TABLE_OUT" --submit 2>"$WORK/table-refused.err"; then
        echo "error: a sweep whose data is missing was submitted" >&2; exit 1
    fi
    cat "$WORK/table-refused.err"
    grep -q "install Debian's package dataset-fashion-mnist" "$WORK/table-refused.err" \
        || { echo "error: the refusal does not say what is missing" >&2; exit 1; }
fi

# preemption as SLURM does it near the time limit: USR1 to the batch shell, which
# passes it to the ranks; they checkpoint and exit 75, the script requeues the job
say "preemption: USR1 -> checkpoint -> exit 75 -> requeue -> resume"
RUN=(jobs/quickstart.yaml run.out_dir="$WORK/preempt" run.rounds=60 run.threads=1)
"$PY" -m mpifl.sweep --run "${RUN[@]}" run.name=cut --ntasks 2 --allow-local-paths --submit | tee "$WORK/preempt.out"
JOB=$(awk '/submitted job/ {print $3}' "$WORK/preempt.out")
[ -n "$JOB" ] || { echo "error: no job id from --run --submit" >&2; exit 1; }
timeout 180 "$PY" - "$WORK/preempt/cut" <<'EOF' || { squeue; echo "error: the run logged no rounds" >&2; exit 1; }
import sys, time
from mpifl.logging.h5 import open_run
while True:  # signal it once a few rounds are in its log
    try:
        if open_run(sys.argv[1]).n_rounds >= 3:
            break
    except (OSError, KeyError):
        pass
    time.sleep(0.1)
EOF
scancel --signal=USR1 --batch "$JOB"
# a requeued job waits in PD (BeginTime) for two minutes, SLURM's own hold; CI
# does not wait for it: StartTime=now lets it start at once, but only once the
# first start's step is torn down: a new step 0 started while the old one's
# slurmstepd still cleans up loses its PMI (seen: exit 137 at MPI_Finalize)
DEADLINE=$((SECONDS + 300))
while [ -n "$(squeue -h -j "$JOB" 2>/dev/null)" ] && [ "$SECONDS" -lt "$DEADLINE" ]; do
    if [ "$(squeue -h -j "$JOB" -o '%T %r' 2>/dev/null)" = "PENDING BeginTime" ] \
            && cat "$WORK"/log/slurmd-*.log | grep -q "\[$JOB.0\] done with job"; then
        say "job $JOB requeued and held: $(squeue -h -j "$JOB" -o '%T (%r)'); scontrol update StartTime=now"
        scontrol update JobId="$JOB" StartTime=now
    fi
    sleep 1
done
[ -z "$(squeue -h -j "$JOB" 2>/dev/null)" ] || { squeue -j "$JOB"; echo "error: job $JOB not done" >&2; exit 1; }
LOG="$WORK/preempt/cut/slurm-$JOB.out"
grep -E "^mpifl:|resumed|done:" "$LOG" || true
grep -q "checkpointed; requeueing" "$LOG" || { echo "error: the job did not checkpoint and requeue" >&2; exit 1; }
grep -q "restart 1" "$LOG" && grep -q "resumed after round" "$LOG" \
    || { echo "error: the requeued job did not resume" >&2; exit 1; }
STATE=$(scontrol show job -o "$JOB" | grep -oE "JobState=\S+|ExitCode=\S+" | tr '\n' ' ')
[ "$STATE" = "JobState=COMPLETED ExitCode=0:0 " ] || { echo "error: job $JOB ended $STATE" >&2; exit 1; }

say "the same run uninterrupted, for comparison"
timeout 180 srun -n 2 --mpi=pmi2 "$PY" -m mpi4py -m mpifl.main "${RUN[@]}" run.name=whole | tail -n 1
"$PY" - "$WORK/preempt/cut" "$WORK/preempt/whole" <<'EOF'
import sys
import numpy as np
from mpifl.logging.h5 import open_run
a, b = open_run(sys.argv[1]), open_run(sys.argv[2])
timing = {"rounds/wall_s", "rounds/comm_s", "rounds/compute_s"}
keys = set(a.keys()) - timing
assert keys == set(b.keys()) - timing and a.n_rounds == b.n_rounds == 60, (a.n_rounds, b.n_rounds)
for k in sorted(keys):
    x, y = a.get(k), b.get(k)
    assert x.shape == y.shape and np.array_equal(x, y, equal_nan=True), k
print(f"preempted and resumed run == uninterrupted run: {len(keys)} datasets, {a.n_rounds} rounds, bitwise")
EOF
echo "PASSED: .ci/slurm.sh"
