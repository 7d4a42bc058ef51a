#!/bin/bash
# usage: bench/fedc2i_featshift.sh JOB TAG [extra overrides]
cd /work/wt/fedc2i
job=$1; tag=$2; shift 2
PY=/work/main/.venv/bin/python
for seed in 0 1 2; do
  for m in fedc2i fedavg local client_only class_only_local class_only_global; do
    case $m in
      fedc2i|fedavg|local) ov="algorithm.name=$m";;
      *) ov="fedc2i.ablation=$m";;
    esac
    timeout 600 $PY -m mpifl.main $job run.threads=1 run.out_dir=results/fc2i run.seed=$seed run.name=$tag-$m-s$seed $ov "$@" > /dev/null || echo FAIL $m $seed
  done
  for a in 0.5 1 2 10; do
    timeout 600 $PY -m mpifl.main $job run.threads=1 run.out_dir=results/fc2i run.seed=$seed run.name=$tag-alpha$a-s$seed fedc2i.alpha=$a "$@" > /dev/null || echo FAIL alpha $a $seed
  done
done
echo DONE
