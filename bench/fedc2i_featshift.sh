#!/bin/bash
# FedC2I vs Local/FedAvg, its three ablations and the alpha grid, 3 seeds.
# usage: bench/fedc2i_featshift.sh JOB TAG [extra overrides]
#   e.g. bench/fedc2i_featshift.sh jobs/fedc2i-featshift.yaml digits
# runs land in ${OUT:-results/fc2i}/TAG-<method>-s<seed>; summarise with
#   python bench/fedc2i_summary.py ${OUT:-results/fc2i} TAG
cd "$(dirname "$0")/.." || exit 1
job=$1; tag=$2; shift 2
out=${OUT:-results/fc2i}
PY=${PY:-/work/main/.venv/bin/python}
for seed in 0 1 2; do
  for m in fedc2i fedavg local client_only class_only_local class_only_global; do
    case $m in
      fedc2i|fedavg|local) ov="algorithm.name=$m";;
      *) ov="fedc2i.ablation=$m";;
    esac
    timeout 900 $PY -m mpifl.main "$job" run.threads=1 run.out_dir="$out" run.seed=$seed \
      run.name="$tag-$m-s$seed" "$ov" "$@" > /dev/null || echo "FAIL $m seed $seed"
  done
  for a in 0.5 1 2 10; do
    timeout 900 $PY -m mpifl.main "$job" run.threads=1 run.out_dir="$out" run.seed=$seed \
      run.name="$tag-alpha$a-s$seed" fedc2i.alpha=$a "$@" > /dev/null || echo "FAIL alpha $a seed $seed"
  done
done
echo DONE
