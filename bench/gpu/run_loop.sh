#!/usr/bin/env bash
# The real loop on the device, one command, under 5 minutes on 2 GPUs. From the repo root:
#   export PYTHONPATH=/tmp/site:$PWD   # (LD_PRELOAD of NCCL already set)
#   bash bench/gpu/run_loop.sh
# Runs, each under its own timeout and each allowed to fail without stopping the rest:
#   1. bench/gpu/pin_probe.py     pinning 8 GiB per way (cudaHostAlloc, HostPinner none/touch/thp/populate, THP on threads)
#   2. bench/gpu/reload_probe.py  reload of 11 GiB right after another role frees 40 GB: driver / allocator / mempool, beside the line rate
#   3. bench/gpu/rl_step.py       the colocated RL step on 1 GPU and on 2 GPUs (torchrun), the roles sharing the
#                                 caching allocator (the default; docs/store.md compares it with freeing through the driver)
#   4. (if time is left) the RL step on 1 GPU freeing through the driver (--free driver), for comparison
#   5. (if time is left) the RL step on 1 GPU with the lifecycle keeping trainer.dp alive (--policy PAUSED_LIVE)
# PARTS="pin reload rl1 rl2 rl1_driver rl1_live" (the default) picks which parts run, e.g. PARTS="rl1 rl2";
# BUDGET_S (default 270) bounds when the optional parts 4-5 may start.
# Writes $OUT/loop.tgz (everything, with the log) and $OUT/summary.txt.
set -u
cd "$(dirname "$0")/../.."
# NVLink multicast off, as bench/gpu/run_multigpu.sh (docs/gpu.md)
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
OUT=${OUT:-/tmp/loop_out}
mkdir -p "$OUT"
W=$(mktemp -d)
LOG=$W/log.txt
T0=$(date +%s)
PY=${PYTHON:-python3}
if ! $PY -c "import transformers" 2>/dev/null && ls .whl/*.whl >/dev/null 2>&1; then  # carried wheels, as run_multigpu.sh
  $PY -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl >>"$LOG" 2>&1
  export PYTHONPATH="/tmp/site:${PYTHONPATH:-$PWD}"
fi
elapsed() { echo $(( $(date +%s) - T0 )); }
step() {  # step NAME TIMEOUT CMD...
  local name=$1 to=$2; shift 2
  echo "=== $name (timeout ${to}s, at $(elapsed)s)" | tee -a "$LOG"
  timeout -k 5 "$to" "$@" >>"$LOG" 2>&1
  local rc=$?
  echo "=== $name rc=$rc at $(elapsed)s" | tee -a "$LOG"
  if [ "$rc" != 0 ]; then grep -E "Error|error|Traceback" "$LOG" | tail -n 3; fi
}
{ nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader; $PY -c "import torch,sys;print(sys.version.split()[0],torch.__version__,torch.version.cuda)"; \
  $PY -c "import transformers;print('transformers',transformers.__version__)"; cat /sys/kernel/mm/transparent_hugepage/enabled; nproc; } >>"$LOG" 2>&1
export TIMESHARE_PIN_PREFAULT=${TIMESHARE_PIN_PREFAULT:-touch}
on() { case " ${PARTS:-pin reload rl1 rl2 rl1_driver rl1_live} " in *" $1 "*) return 0;; esac; echo "=== $1 not in PARTS" | tee -a "$LOG"; return 1; }
on pin && step pin 40 env CUDA_VISIBLE_DEVICES=0 $PY bench/gpu/pin_probe.py --gib 8 --threads 8 --out "$W/pin.json"
on reload && step reload 45 env CUDA_VISIBLE_DEVICES=0 $PY bench/gpu/reload_probe.py --state-gib 11 --other-gb 40 --repeat 3 --out "$W/reload.json"
on rl1 && step rl1 70 $PY -m torch.distributed.run --standalone --nproc-per-node=1 bench/gpu/rl_step.py --steps 3 --out "$W/rl1"
on rl2 && step rl2 75 $PY -m torch.distributed.run --standalone --nproc-per-node=2 bench/gpu/rl_step.py --steps 3 --out "$W/rl2"
optional() {  # optional NAME ARGS...: the RL step on 1 GPU with ARGS, if the budget (BUDGET_S, default 270 s) allows
  local name=$1; shift
  on "$name" || return 0
  local left=$(( ${BUDGET_S:-270} - $(elapsed) ))
  if [ "$left" -gt 25 ]; then
    step "$name" "$left" $PY -m torch.distributed.run --standalone --nproc-per-node=1 bench/gpu/rl_step.py --steps 3 "$@" --out "$W/$name"
  else
    echo "=== $name skipped (only ${left}s left)" | tee -a "$LOG"
  fi
}
optional rl1_driver --free driver
optional rl1_live --policy PAUSED_LIVE
# summary
$PY - "$W" >"$W/summary.txt" 2>&1 <<'PYEOF'
import json, os, sys
w = sys.argv[1]
def load(p):
    try:
        return json.load(open(os.path.join(w, p)))
    except Exception as e:
        return {"missing": f"{p}: {e}"}
pin = load("pin.json")
print("pin (GB/s for %.1f GiB, thp=%s): %s" % (pin.get("bytes", 0) / 2**30, pin.get("thp_mode"), pin.get("error") or pin.get("missing") or ""))
for k, v in pin.get("variants", {}).items():
    print(f"  {k:18s} " + (f"{v['gbps']:.2f}" if "gbps" in v else v.get("error", "?")[:120]))
rl = load("reload.json")
print("reload after %.0f GB freed; line %.2f GB/s: %s" % (rl.get("other_bytes", 0) / 1e9, rl.get("line_gbps", 0), rl.get("error") or rl.get("missing") or rl.get("line_error") or ""))
for k, v in rl.get("modes", {}).items():
    if "median_gbps" in v:
        print(f"  {k:10s} median {v['median_gbps']:.2f} GB/s = {v.get('median_x_line', 0):.3f} x line (best {v.get('best_x_line', 0):.3f})")
    else:
        print(f"  {k:10s} {v.get('error', v.get('skipped', '?'))[:160]}")
for d, world in (("rl1", 1), ("rl2", 2), ("rl1_driver", 1), ("rl1_live", 1)):
    r = load(f"{d}/rl_step_{world}.json")
    sm = r.get("summary")
    if not sm:
        print(f"{d}: {r.get('error') or r.get('missing')}")
        continue
    ph = " ".join(f"{k}={v:.3f}" for k, v in sm["phase_s"].items())
    print(f"{d}: {r['params']/1e9:.3f} B params, mesh {r.get('mesh')}, free={r['config']['free']}, policy={r['config'].get('lifecycle_policy')}: {ph} s; switch overhead "
          f"{sm['switch_overhead_s']:.3f} s vs copies at line {sm['copy_time_at_line_s']:.3f} s "
          f"(x{sm['overhead_x_copy_time']:.2f}); bitwise weights every sync: {sm['weights_bitwise_equal_every_sync']}; "
          f"kv {r['steps'][-1].get('kv_cache')} {r['steps'][-1].get('rollout_peak_extra_bytes', 0)/1e9:.2f} GB")
    br = sm.get("runtime_spans_by_phase") or {}
    print("   lifecycle spans: " + " ".join(f"{ph}:{n.split('.')[-1]}={v:.3f}" for ph in ("offload", "weight_sync", "reload")
                                          for n, v in br.get(ph, {}).items() if n in ("lifecycle.destroy", "lifecycle.rebuild", "lifecycle.cooldown")))
    try:
        sys.path.insert(0, os.getcwd())
        from sim.calibrate.colocated import compare
        c = compare(r)
        print("   sim vs measured: " + " ".join(f"{k}=x{v['ratio']:.2f}{'' if v['within'] else '!'}" for k, v in c["phases"].items()))
    except Exception as e:
        print(f"   sim comparison failed: {type(e).__name__}: {e}")
PYEOF
echo "total $(elapsed)s" >>"$W/summary.txt"
cat "$W/summary.txt"
cp "$W/summary.txt" "$OUT/summary.txt"
tar -C "$W" -czf "$OUT/loop.tgz" .
echo "wrote $OUT/loop.tgz and $OUT/summary.txt"
