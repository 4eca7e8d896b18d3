#!/usr/bin/env bash
# The switch at the line and under it, on one GPU, one command, under 9 minutes. From the repo root:
#   export PYTHONPATH=/tmp/site:$PWD        # (LD_PRELOAD of the NCCL to test already set, e.g. 2.32.3)
#   bash bench/gpu/run_switch.sh
# Runs, each under its own timeout and each allowed to fail without stopping the rest (budget-gated):
#   rl_auto_*   bench/gpu/rl_step.py --policy auto (the default the loaded NCCL allows) in each --mode
#               sequential | overlapped | streamed: phases, switch_cost_s vs copies at line vs the step
#   steady      bench/gpu/steady_profile.py: a real 0.85 B model's steady offload/reload under each
#               device-cache mode (shared = before, keep, private), bitwise, a profiler table each
#   rl_dd_*     the RL step with DESTROY_DEFERRED in each mode
#   peers       timeshare bench offload --model qwen2-0.85b: the store, verl's way, verl's functions (if installed)
#   rl_live_*   the RL step with PAUSED_LIVE (keeps NCCL memory: the floor), sequential and streamed
# PARTS (default: all of the above, by prefix) picks parts, e.g. PARTS="rl_auto steady"; MODES (default
# "sequential overlapped streamed") the RL step's modes; BUDGET_S (default 520)
# bounds when a part may still start; NEW_TOKENS (default 16) the rollout length.
# Writes $OUT/switch.tgz (every record and the log), $OUT/records/*.json and $OUT/summary.txt.
set -u
cd "$(dirname "$0")/../.."
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
OUT=${OUT:-/tmp/switch_out}
mkdir -p "$OUT/records"
W=$(mktemp -d)
LOG=$W/log.txt
T0=$(date +%s)
PY=${PYTHON:-python3}
BUDGET=${BUDGET_S:-520}
NT=${NEW_TOKENS:-16}
if ! $PY -c "import transformers" 2>/dev/null && ls .whl/*.whl >/dev/null 2>&1; then  # carried wheels, as run_loop.sh
  $PY -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl >>"$LOG" 2>&1
  export PYTHONPATH="/tmp/site:${PYTHONPATH:-$PWD}"
fi
export PYTHONPATH="${PYTHONPATH:-$PWD}"
elapsed() { echo $(( $(date +%s) - T0 )); }
on() { case " ${PARTS:-rl_auto steady rl_dd peers rl_live} " in *" $1 "*) return 0;; esac; return 1; }
step() {  # step NAME TIMEOUT CMD...: runs if the budget leaves at least 25 s, under min(TIMEOUT, what is left)
  local name=$1 to=$2; shift 2
  local left=$(( BUDGET - $(elapsed) ))
  if [ "$left" -lt 25 ]; then echo "=== $name skipped (only ${left}s left)" | tee -a "$LOG"; return 0; fi
  [ "$to" -gt "$left" ] && to=$left
  echo "=== $name (timeout ${to}s, at $(elapsed)s)" | tee -a "$LOG"
  timeout -k 5 "$to" "$@" >>"$LOG" 2>&1
  local rc=$?
  echo "=== $name rc=$rc at $(elapsed)s" | tee -a "$LOG"
  if [ "$rc" != 0 ]; then grep -E "Error|error|Traceback" "$LOG" | tail -n 3; fi
}
{ nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader; $PY -c "import torch,sys;print(sys.version.split()[0],torch.__version__,torch.version.cuda)"; \
  $PY -c "import transformers;print('transformers',transformers.__version__)"; echo "LD_PRELOAD=${LD_PRELOAD:-}"; nproc; } >>"$LOG" 2>&1
export TIMESHARE_PIN_PREFAULT=${TIMESHARE_PIN_PREFAULT:-touch}
rl() {  # rl NAME POLICY MODE
  step "$1" 75 env CUDA_VISIBLE_DEVICES=0 $PY -m torch.distributed.run --standalone --nproc-per-node=1 bench/gpu/rl_step.py \
    --steps 3 --policy "$2" --mode "$3" --new-tokens "$NT" --out "$W/$1"
}
MODES=${MODES:-sequential overlapped streamed}
if on rl_auto; then for m in $MODES; do rl "rl_auto_$m" auto "$m"; done; fi
on steady && step steady 150 env CUDA_VISIBLE_DEVICES=0 $PY bench/gpu/steady_profile.py --skip-baseline --cycles 3 \
  --cache-modes shared,keep,private --out "$W/steady"
if on rl_dd; then for m in $MODES; do rl "rl_dd_$m" DESTROY_DEFERRED "$m"; done; fi
on peers && step peers 150 env CUDA_VISIBLE_DEVICES=0 $PY -m refimpl bench offload --model qwen2-0.85b --cycles 2 --out "$W/peers"
if on rl_live; then for m in $MODES; do rl "rl_live_$m" PAUSED_LIVE "$m"; done; fi
$PY bench/gpu/switch_summary.py "$W" >"$W/summary.txt" 2>&1
echo "total $(elapsed)s" >>"$W/summary.txt"
cat "$W/summary.txt"
cp "$W/summary.txt" "$OUT/summary.txt"
find "$W" -name "*.json" ! -name "*trace*" -exec sh -c 'cp "$1" "$2/records/$(echo "${1#$3/}" | tr / _)"' _ {} "$OUT" "$W" \;
tar -C "$W" --exclude="*trace*" -czf "$OUT/switch.tgz" .
echo "wrote $OUT/switch.tgz, $OUT/records and $OUT/summary.txt"
