#!/usr/bin/env bash
# The one-GPU RL step with the code of today against the code before the early copies' content check, on the same
# card in one call (the check's cost in what a user pays, whatever else differs between the cards of the records).
# From the repository root, with the older tree unpacked beside it (plain files, not a git repository):
#   C=$(git log --format=%H --grep='^One word per meaning: the copy-ahead stage' | tail -n 1)
#   mkdir precheck && git archive "$C" | tar -x -C precheck/ && bash bench/gpu/run_precheck_compare.sh precheck
# (that tree, the one measured on 2026-12-05, predates the check and a few store changes off the step's path: the
# guard of as_subclass, the release stage's undo, attached views' bases, local_dedup's replica digest).
# Each run: torchrun --nproc-per-node=1 bench/gpu/rl_step.py --steps 3
# --policy DESTROY_DEFERRED --mode streamed --new-tokens 16 --batch B --seq 1024 --offload-in-backward --sync-first,
# B = 32 (the records) where the GPU has over 100 GiB, else 16 (32 does not fit 80 GiB). Order: rl_today, rl_before,
# rl_today_again, rl_today_base (today without the N-GPU mechanism). Writes $OUT/precheck_compare.txt
# (bench/gpu/switch_summary.py of every run) and $OUT/precheck_compare.tgz.
set -u
OLD=${1:?the older tree}
cd "$(dirname "$0")/../.."
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TIMESHARE_PIN_PREFAULT=${TIMESHARE_PIN_PREFAULT:-touch}
OUT=${OUT:-/tmp/precheck_out}; mkdir -p "$OUT"; W=$(mktemp -d)
MEM=$(python3 -c 'import torch; print(torch.cuda.get_device_properties(0).total_memory >> 30)')
B=$([ "$MEM" -gt 100 ] && echo 32 || echo 16)
echo "$(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader) ${MEM} GiB: batch $B" | tee "$W/log.txt"
ARGS="--steps 3 --policy DESTROY_DEFERRED --mode streamed --new-tokens 16 --batch $B --seq 1024 --offload-in-backward --sync-first"
run() {  # run NAME TREE FLAGS...
  local name=$1 tree=$2; shift 2
  echo "=== $name" | tee -a "$W/log.txt"
  # shellcheck disable=SC2086
  (cd "$tree" && PYTHONPATH="/tmp/site:$PWD" timeout -k 5 "${RUN_S:-110}" python3 -m torch.distributed.run --standalone \
    --nproc-per-node=1 bench/gpu/rl_step.py $ARGS --out "$W/$name" "$@") >>"$W/log.txt" 2>&1
  echo "=== $name rc=$?" | tee -a "$W/log.txt"
}
run rl_today .
run rl_before "$OLD"
run rl_today_again .
run rl_today_base . --no-managed-mesh --no-flat-mesh --no-rebuild-ahead --no-sync-in-backward --no-gather-in-rollout-dtype
PYTHONPATH="$PWD" python3 bench/gpu/switch_summary.py "$W" >"$OUT/precheck_compare.txt" 2>&1
cat "$OUT/precheck_compare.txt"
tar -C "$W" -czf "$OUT/precheck_compare.tgz" .
