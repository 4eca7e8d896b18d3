#!/usr/bin/env bash
# The RL step's switch on every visible GPU (one process a GPU, FSDP2 over all of them), one call, under 10 minutes.
# From the repo root (transformers installed, or its wheels carried in .whl/; NCCL to test preloaded, if any):
#   bash bench/gpu/run_rl_ngpu.sh
# Every run: torchrun --nproc-per-node=N bench/gpu/rl_step.py --steps 3 --new-tokens 16 --batch 32 --seq 1024
# --offload-in-backward --sync-first (the step of the one-GPU records), each under its own timeout and allowed to
# fail without stopping the rest, in this order while the budget lasts:
#   ngpu          the switch on N GPUs as the defaults have it (DESTROY_DEFERRED, streamed): the FSDP mesh on groups
#                 the lifecycle takes down, the resume ahead, the sync in the backward, the flat mesh
#   base          the same without any of it (--no-managed-mesh --no-flat-mesh --no-rebuild-ahead
#                 --no-sync-in-backward --no-gather-in-rollout-dtype): the step as measured before
#   ablate_*      the defaults less one: no_served (--no-forward-from-rollout), no_ahead, no_sync_bwd, no_managed,
#                 no_flat
#   overlap       the defaults with --overlap-reload and without, each twice, alternating (overlap_on_1, overlap_off_1,
#                 ...): the streamed reload in the step's order, running on into its backward, against it finished on
#                 the host before the first optimizer step
#   logprob       the defaults with --logprob-pass and without, each twice, alternating (logprob_on_1, ...): every
#                 training step starting with the old policy's log-prob pass, filled from the rollout's copy after a
#                 switch (the creation hides under it too), against the step without it
#   gil           the defaults with --overlap-reload and the interpreter's own switch interval
#                 (--pacer-switch-interval-us 0), twice (gil_off_1, gil_off_2): against overlap_on_*, what lowering it
#                 while the reload's windows are fed gives ([Note: the feeder's GIL])
#   threads       the defaults with the interpreter's own switch interval while the switch's background moves run
#                 (--thread-switch-interval-us 0), twice (threads_off_1, threads_off_2): against overlap_off_* or
#                 the ngpu run, what lowering it gives the offload beside the pause's walk and the resume ahead
#                 beside the next step ([Note: the GIL's switch interval])
#   gc            the defaults with --overlap-reload and the collector's setup left unfrozen (--no-gc-freeze), twice
#                 (gc_off_1, gc_off_2): against overlap_on_*, what freezing it gives ([Note: the collector in the
#                 switch] in bench/rl/gc_watch.py; the summary's last column counts the full collections)
#   both          the defaults with --overlap-reload --logprob-pass, twice (both_1, both_2): against logprob_on_*,
#                 the overlap with the pass
#   profile       the defaults with --overlap-reload, and with it and --logprob-pass, under torch.profiler
#                 (--profile): the last switch's tail with the step after it, and a plain step; the compute stream's
#                 longest gaps and what was launched after each (bench/gpu/trace_gaps.py; gaps.txt)
#   channels      (N > 1) the mesh's communicators with fewer channels: bench/gpu/channels_probe.py (each cap's
#                 creation, memory and collectives' bus bandwidth; channels.json, channels.txt), then the defaults
#                 with --nccl-max-ctas for each cap of CAPS (default "8 12"; rl_cap_8 ...), against the ngpu run
#   mode_*        the defaults in every mode (sequential overlapped streamed) under every policy of POLICIES
#                 (default "DESTROY_DEFERRED PAUSED_LIVE auto"; auto: what the loaded NCCL allows), but the ngpu run
#   nccllog       (N > 1) the ngpu run again with NCCL's INFO log: the creation of a communicator of N ranks split
#                 into its init call and its connection, and its channels (nccl_split.txt; nccl_log.tgz)
# PARTS (default "ngpu base nccllog ablate mode"; overlap, gil, threads, gc, logprob, both, profile and channels only when named) picks parts by prefix; BUDGET_S (default 540) bounds when a run may still
# start; RUN_S (default 100) is one run's timeout; STEP_ARGS replaces the step's flags above and EXTRA adds flags
# to every run; NPROC (default: every GPU). On a CPU, the logic in seconds: NPROC=2 PARTS="ngpu base"
# STEP_ARGS="--steps 2 --offload-in-backward --sync-first" EXTRA="--device cpu --tiny" bash bench/gpu/run_rl_ngpu.sh
# Writes $OUT/rl_ngpu.tgz (every record, PNG and the log) and $OUT/summary.txt (the tables of
# bench/gpu/switch_summary.py, the N-GPU terms among them).
set -u
cd "$(dirname "$0")/../.."
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
OUT=${OUT:-/tmp/rl_ngpu_out}
mkdir -p "$OUT"
W=$(mktemp -d)
LOG=$W/log.txt
T0=$(date +%s)
PY=${PYTHON:-python3}
BUDGET=${BUDGET_S:-540}
RUN_S=${RUN_S:-100}
if ! $PY -c "import transformers" 2>/dev/null && ls .whl/*.whl >/dev/null 2>&1; then  # carried wheels, as run_switch.sh
  $PY -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl >>"$LOG" 2>&1
  export PYTHONPATH="/tmp/site:${PYTHONPATH:-$PWD}"
fi
export PYTHONPATH="${PYTHONPATH:-$PWD}"
N=${NPROC:-$($PY -c 'import torch; print(max(1, torch.cuda.device_count()))')}
elapsed() { echo $(( $(date +%s) - T0 )); }
on() { case " ${PARTS:-ngpu base nccllog ablate mode} " in *" $1 "*) return 0;; esac; return 1; }
step() {  # step NAME CMD...: runs if the budget leaves at least 30 s, under min(RUN_S, what is left)
  local name=$1; shift
  local left=$(( BUDGET - $(elapsed) )) to=$RUN_S
  if [ "$left" -lt 30 ]; then echo "=== $name skipped (only ${left}s left)" | tee -a "$LOG"; return 0; fi
  [ "$to" -gt "$left" ] && to=$left
  echo "=== $name (timeout ${to}s, at $(elapsed)s)" | tee -a "$LOG"
  timeout -k 5 "$to" "$@" >>"$LOG" 2>&1
  local rc=$?
  echo "=== $name rc=$rc at $(elapsed)s" | tee -a "$LOG"
  if [ "$rc" != 0 ]; then grep -E "Error|error|Traceback" "$LOG" | tail -n 3; fi
}
{ nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader; nvidia-smi topo -m; \
  $PY -c "import torch,sys;print(sys.version.split()[0],torch.__version__,torch.version.cuda,torch.cuda.device_count())"; \
  $PY -c "import transformers;print('transformers',transformers.__version__)"; echo "LD_PRELOAD=${LD_PRELOAD:-} N=$N"; nproc; } >>"$LOG" 2>&1
export TIMESHARE_PIN_PREFAULT=${TIMESHARE_PIN_PREFAULT:-touch}
STEP="${STEP_ARGS:---steps 3 --new-tokens 16 --batch 32 --seq 1024 --offload-in-backward --sync-first} ${EXTRA:-}"
rl() {  # rl NAME POLICY MODE FLAGS...
  local name=$1 policy=$2 mode=$3; shift 3
  # shellcheck disable=SC2086
  step "rl_$name" $PY -m torch.distributed.run --standalone --nproc-per-node="$N" bench/gpu/rl_step.py \
    $STEP --policy "$policy" --mode "$mode" --out "$W/rl_$name" "$@"
}
on ngpu && rl ngpu DESTROY_DEFERRED streamed
on base && rl base DESTROY_DEFERRED streamed --no-managed-mesh --no-flat-mesh --no-rebuild-ahead \
  --no-sync-in-backward --no-gather-in-rollout-dtype
if on nccllog && [ "$N" -gt 1 ]; then  # the defaults again with NCCL's INFO log (timed lines): what a communicator of N
  # ranks costs to create, split into the init call and the connection (python -m sim.calibrate.nccl_init_log), and
  # its ring channels; logging slows NCCL, so this run is not the ngpu one
  mkdir -p "$W/nccl_log"
  NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=INIT,PROXY NCCL_DEBUG_FILE="$W/nccl_log/nccl.%h.%p.log" \
    NCCL_DEBUG_TIMESTAMP_LEVELS=ALL NCCL_DEBUG_TIMESTAMP_FORMAT='[%s.%6f] ' rl nccllog DESTROY_DEFERRED streamed
  { echo "== NCCL's log: communicator creation split and ring channels (sim.calibrate.nccl_init_log)"
    $PY -m sim.calibrate.nccl_init_log "$W"/nccl_log/*.log; } >"$W/nccl_split.txt" 2>&1
  tar -C "$W" -czf "$W/nccl_log.tgz" nccl_log && rm -rf "$W/nccl_log"
fi
if on ablate; then
  rl ablate_no_served DESTROY_DEFERRED streamed --no-forward-from-rollout
  rl ablate_no_ahead DESTROY_DEFERRED streamed --no-rebuild-ahead
  rl ablate_no_sync_bwd DESTROY_DEFERRED streamed --no-sync-in-backward
  rl ablate_no_managed DESTROY_DEFERRED streamed --no-managed-mesh
  rl ablate_no_flat DESTROY_DEFERRED streamed --no-flat-mesh
fi
if on overlap; then
  for i in 1 2; do
    rl "overlap_on_$i" DESTROY_DEFERRED streamed --overlap-reload
    rl "overlap_off_$i" DESTROY_DEFERRED streamed
  done
fi
if on gil; then
  for i in 1 2; do
    rl "gil_off_$i" DESTROY_DEFERRED streamed --overlap-reload --pacer-switch-interval-us 0
  done
fi
if on threads; then
  for i in 1 2; do
    rl "threads_off_$i" DESTROY_DEFERRED streamed --thread-switch-interval-us 0
  done
fi
if on gc; then
  for i in 1 2; do
    rl "gc_off_$i" DESTROY_DEFERRED streamed --overlap-reload --no-gc-freeze
  done
fi
if on logprob; then
  for i in 1 2; do
    rl "logprob_on_$i" DESTROY_DEFERRED streamed --logprob-pass
    rl "logprob_off_$i" DESTROY_DEFERRED streamed
  done
fi
if on both; then
  for i in 1 2; do
    rl "both_$i" DESTROY_DEFERRED streamed --overlap-reload --logprob-pass
  done
fi
if on profile; then
  rl profile_overlap DESTROY_DEFERRED streamed --overlap-reload --profile
  rl profile_both DESTROY_DEFERRED streamed --overlap-reload --logprob-pass --profile
  for d in "$W"/rl_profile_*; do
    [ -d "$d" ] || continue
    { echo "== $(basename "$d")"; $PY bench/gpu/trace_gaps.py "$d"/profile_switch_tail_*.json* --gaps 6; } \
      >>"$W/gaps.txt" 2>&1
  done
fi
if on channels && [ "$N" -gt 1 ]; then
  step channels_probe $PY -m torch.distributed.run --standalone --nproc-per-node="$N" bench/gpu/channels_probe.py \
    --caps "none,16,12,8,4" --rounds 4 --out "$W/channels.json"
  step channels_log $PY -m torch.distributed.run --standalone --nproc-per-node="$N" bench/gpu/channels_probe.py \
    --caps "none,8" --rounds 1 --mib 16 --iters 1 --nccl-log "$W/channels_log" --out "$W/channels_log.json"
  $PY -c "import json,sys; sys.path.insert(0,'bench/gpu'); from channels_probe import format_summary as f; \
r=json.load(open('$W/channels.json')); print(f(r['summary'], r['world_size'])); \
g=json.load(open('$W/channels_log.json')); print('channels logged (NCCL INFO), per cap:', \
{str(s['cap']): s['channels'] for s in g['summary']})" >"$W/channels.txt" 2>&1
  for cap in ${CAPS:-8 12}; do
    rl "cap_$cap" DESTROY_DEFERRED streamed --nccl-max-ctas "$cap"
  done
fi
if on mode; then
  for p in ${POLICIES:-DESTROY_DEFERRED PAUSED_LIVE auto}; do
    for m in sequential overlapped streamed; do
      [ "$p/$m" = "DESTROY_DEFERRED/streamed" ] && continue  # the ngpu run
      rl "mode_${m}_$p" "$p" "$m"
    done
  done
fi
$PY bench/gpu/switch_summary.py "$W" >"$W/summary.txt" 2>&1
[ -f "$W/nccl_split.txt" ] && cat "$W/nccl_split.txt" >>"$W/summary.txt"
[ -f "$W/gaps.txt" ] && { echo "== profiles (bench/gpu/trace_gaps.py)"; cat "$W/gaps.txt"; } >>"$W/summary.txt"
[ -f "$W/channels.txt" ] && { echo "== channels (bench/gpu/channels_probe.py)"; cat "$W/channels.txt"; } >>"$W/summary.txt"
echo "N=$N total $(elapsed)s" >>"$W/summary.txt"
cat "$W/summary.txt"
cp "$W/summary.txt" "$OUT/summary.txt"
tar -C "$W" --exclude="*trace*" -czf "$OUT/rl_ngpu.tgz" .
echo "wrote $OUT/rl_ngpu.tgz and $OUT/summary.txt"
