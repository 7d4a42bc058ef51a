#!/usr/bin/env bash
# Interleaved A/B pairs of bench/logging_share.py's first row (N = 100, FedAvg, log.flush_s = 0):
# A is the checkout this script sits in, B another checkout (a git worktree of the change).
#   bash bench/logging_ab.sh PAIRS OTHER_CHECKOUT
# Each line: pair, side, load average, the bench's table row. Both sides use their own
# .venv/bin/python if they have one, else python3.
set -euo pipefail
pairs=${1:?pairs}; other=$(cd "${2:?other checkout}" && pwd); here=$(cd "$(dirname "$0")/.." && pwd)
for i in $(seq 1 "$pairs"); do
  for side in A B; do
    dir=$here; [ "$side" = B ] && dir=$other
    py=$dir/.venv/bin/python; [ -x "$py" ] || py=python3
    row=$(cd "$dir" && PYTHONPATH=$dir "$py" bench/logging_share.py --clients 100 --rounds 100 --dense-max 1024 \
          --algorithms fedavg --flush-s 0 2>&1 | grep -E "^\| fedavg")
    echo "$i $side $(cut -d' ' -f1 /proc/loadavg) $row"
  done
done
