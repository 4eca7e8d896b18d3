#!/usr/bin/env bash
# The destroy-walk probe in one call (2 x H200, NCCL 2.32.3 parts carried to /root/ncclparts first,
# as docs/gpu.md says): SUSPEND_PLANNED and DESTROY_DEFERRED, each with the weight sync's collective on tp and
# without it, NCCL's own INIT/PROXY log lines timestamped to the microsecond beside each record, then the
# agreement probe on the same host.  Usage: bash bench/gpu/run_destroy_walk.sh [steps]   (records under $OUT)
set -uo pipefail
cd "$(dirname "$0")/../.."
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
OUT=${OUT:-bench/results}; mkdir -p "$OUT"; export OUT
STEPS=${1:-6}
N=$(python3 -c 'import torch; print(torch.cuda.device_count())'); [ "$N" -gt 0 ] || N=2
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
export PYTHONPATH="/tmp/site:$PWD"
NCCL=/root/ncclparts/libnccl.so.2
[ -d /root/ncclparts ] && python3 bench/gpu/nccl_assemble.py /root/ncclparts
PRE=""; [ -f "$NCCL" ] && PRE="$NCCL"
{ date -u; nvidia-smi -L; python3 -c 'import torch; print("torch", torch.__version__, "gpus", torch.cuda.device_count())'; echo "LD_PRELOAD=$PRE"; } > "$OUT/env.log" 2>&1
t0=$(date +%s); stamp() { echo "=== [$(( $(date +%s) - t0 )) s] $*"; }
for p in suspend_planned destroy_deferred; do for s in tp none; do
  d="$OUT/nccl-log-$p-$s"; mkdir -p "$d"
  stamp "destroy_walk_probe --policy $p --sync $s"
  LD_PRELOAD="$PRE" NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=INIT,PROXY NCCL_DEBUG_FILE="$d/nccl.%h.%p.log" \
    NCCL_DEBUG_TIMESTAMP_LEVELS=ALL NCCL_DEBUG_TIMESTAMP_FORMAT='[%s.%6f] ' \
    timeout 150 torchrun --nproc-per-node="$N" bench/gpu/destroy_walk_probe.py --policy $p --sync $s --steps "$STEPS" \
    2>&1 | grep -v "^W1\|Warning\|warnings.warn" | tail -6
  tar czf "$d.tgz" -C "$d" . && rm -rf "$d"
done; done
stamp "agreement probe"
LD_PRELOAD="$PRE" timeout 60 torchrun --nproc-per-node="$N" bench/agreement_probe.py --out "$OUT" 2>&1 | grep -v "^W1" | tail -4
stamp "sim.calibrate.destroy_walks"
python3 -m sim.calibrate.destroy_walks "$OUT"/destroy-walk-*.json 2>&1 | tail -60
stamp done
