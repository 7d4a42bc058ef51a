#!/usr/bin/env bash
# The GPU check of issue #30 in one call of the device tool (a bare machine: the image's python3
# with torch, plus the wheels this repo carries in .whl/ and Fashion-MNIST in .gpudata/):
#   bash bench/gpu_check.sh [STEP ...]     STEP: bench fast mpi slow probe fit column (default: bench probe fast mpi)
# Each step has its own time limit and writes its output under $OUT, so one that fails or
# runs out of time leaves the others' results.
set -u
OUT=${OUT:-/tmp/gpu-out}
mkdir -p "$OUT"
STEPS=${*:-bench probe fast mpi}
export PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1
t0=$(date +%s)
stamp() { echo "== $1 at +$(( $(date +%s) - t0 ))s"; }
nvidia-smi --query-gpu=name,memory.total,memory.used,driver_version --format=csv,noheader
python3 -c "import sys, torch; print(sys.version.split()[0], torch.__version__, torch.cuda.is_available())"
# a venv over the image's python3, so its torch stays visible, with mpich + mpi4py + mnist1d from the wheels
SITE=$(python3 -c 'import site; print(site.getsitepackages()[0])')
python3 -m venv --without-pip /tmp/v
VS=$(/tmp/v/bin/python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
echo "import site; site.addsitedir('$SITE')" > "$VS/zz_image.pth"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --ignore-installed --prefix /tmp/v .whl/*.whl 2>&1 | grep -v WARNING
PY=/tmp/v/bin/python
export PATH=/tmp/v/bin:$PATH
mkdir -p /usr/share/datasets/fashion-mnist && cp .gpudata/*.gz /usr/share/datasets/fashion-mnist/
$PY -c "import torch, mpi4py, h5py, sklearn, yaml, mnist1d; from mpi4py import MPI; print('env ok', MPI.Get_library_version().split(chr(10))[0])"
stamp setup
for s in $STEPS; do case $s in
bench)  # alone on the machine: its timings are the ones reported
    timeout 150 $PY bench/gpu.py --out /tmp/gpu-bench > "$OUT/bench.txt" 2>&1; echo "bench exit $?"
    cp /tmp/gpu-bench/gpu.json "$OUT/" 2>/dev/null; tail -16 "$OUT/bench.txt"; stamp bench ;;
probe)  # one DPFL-scale run (cnn_dpfl, all of Fashion-MNIST, 5 epochs a round), 4 rounds, in the background
    (timeout 200 $PY -m mpifl.main jobs/dpfl-fashionmnist-dir.yaml model.name=cnn_dpfl data.subsample=1.0 \
        train.local_epochs=5 dpfl.tau_init=10 dpfl.tau_train=5 run.rounds=4 algorithm.name=dpfl \
        run.out_dir=/tmp/probe run.checkpoint_every=0 > "$OUT/probe.txt" 2>&1; echo "probe exit $?" >> "$OUT/probe.txt") &
    ;;
fast)
    MPIFL_TEST_DEVICE=cuda timeout 120 $PY -m pytest -q -m "not slow" -n 8 -p no:cacheprovider tests \
        > "$OUT/fast.txt" 2>&1; echo "fast exit $?"; tail -25 "$OUT/fast.txt"; stamp fast ;;
mpi)
    MPIFL_TEST_DEVICE=cuda timeout 120 mpiexec -n 2 $PY -m mpi4py -m pytest -q -p no:cacheprovider tests/mpi \
        > "$OUT/mpi2.txt" 2>&1; echo "mpi exit $?"; grep -E "passed|failed|FAILED|Error" "$OUT/mpi2.txt" | tail -15; stamp mpi ;;
slow)
    MPIFL_TEST_DEVICE=cuda timeout ${SLOW_S:-200} $PY -m pytest -v -m slow -n 12 -p no:cacheprovider tests \
        > "$OUT/slow.txt" 2>&1; echo "slow exit $?"; grep -E "FAILED|ERROR" "$OUT/slow.txt" | tail -30; tail -3 "$OUT/slow.txt"; stamp slow ;;
rerun)  # the tests listed in .gpudata/rerun.txt (node ids, one a line), on 12 workers
    MPIFL_TEST_DEVICE=cuda timeout ${RERUN_S:-170} $PY -c "import sys, pytest; sys.exit(pytest.main(['-v', '-n', '12', \
        '-p', 'no:cacheprovider'] + open('.gpudata/rerun.txt').read().splitlines()))" > "$OUT/rerun.txt" 2>&1
    echo "rerun exit $?"; grep -E "^(FAILED|ERROR)|^E  " "$OUT/rerun.txt" | cut -c1-300 | tail -30; tail -2 "$OUT/rerun.txt"
    MPIFL_TEST_DEVICE=cuda timeout 60 mpiexec -n 2 $PY -m mpi4py -m pytest -q -p no:cacheprovider tests/mpi/algorithms/test_pfedgraph.py \
        tests/mpi/algorithms/test_knn_per.py tests/mpi/comm/test_setup.py > "$OUT/rerun_mpi.txt" 2>&1; echo "rerun mpi exit $?"
    tail -2 "$OUT/rerun_mpi.txt"; stamp rerun ;;
fit)  # the largest N: the MLP at --clients N, batched, one round (OUT of memory is a result too)
    timeout ${FIT_S:-150} $PY bench/gpu.py --only throughput fit --models mlp --clients ${FIT_N:-100000} \
        --loop-clients 8 --repeats 1 --rounds 1 --samples ${FIT_SAMPLES:-10} --out /tmp/gpu-fit > "$OUT/fit.txt" 2>&1; echo "fit exit $?"
    tail -6 "$OUT/fit.txt"; stamp fit ;;
column)  # DPFL's Dir(0.1) column at the paper's scale, in the background until COLUMN_S, then compared
    # at the last round every run reached (bench/common_round.py)
    (timeout ${COLUMN_S:-300} $PY -m mpifl.sweep jobs/tables/dpfl-table1-gpu.sweep.yaml --local --parallel ${PAR:-8} \
        --set run.checkpoint_every=0 > "$OUT/column.txt" 2>&1; echo "column sweep exit $?" >> "$OUT/column.txt") &
    COLUMN=1 ;;
esac; done
if [ -n "${COLUMN:-}" ]; then
    wait
    pkill -f mpifl.sweep; pkill -f mpifl.sweep.worker; pkill -f mpifl.main; sleep 2
    $PY bench/common_round.py results/dpfl-table1-gpu >> "$OUT/column.txt" 2>&1
    tail -24 "$OUT/column.txt"
    tar czf "$OUT/column.tgz" $(find results/dpfl-table1-gpu -name run.h5 -o -name config.yaml -o -name '*.sweep.yaml')
    stamp column
fi
wait
tail -20 "$OUT/probe.txt" 2>/dev/null
stamp end
