#!/usr/bin/env bash
# The multi-GPU run in one call: the multigpu benchmark record, then the multigpu tests.
#
# Before it (docs/gpu.md): calls that each carry one part of the compressed NCCL 2.32.3 library
# (.nccl/pNN) to /root/ncclparts/. This script installs the carried wheels (.whl), assembles
# libnccl.so.2, preloads it, and writes under $OUT one archive multigpu_results.tgz with
# env.log, bench.log, the JSON record and tests.log.   Usage: bash bench/gpu/run_multigpu.sh [bench] [tests]
set -uo pipefail
cd "$(dirname "$0")/../.."
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
REAL_OUT=${OUT:-bench/results}; mkdir -p "$REAL_OUT"
export OUT=/tmp/multigpu_results; rm -rf "$OUT"; mkdir -p "$OUT"
WHAT=" ${*:-bench tests} "
N=$(python3 -c 'import torch; print(torch.cuda.device_count())')
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
export PYTHONPATH="/tmp/site:$PWD"
NCCL=/root/ncclparts/libnccl.so.2
[ -d /root/ncclparts ] && python3 bench/gpu/nccl_assemble.py /root/ncclparts
PRE=""; [ -f "$NCCL" ] && PRE="$NCCL"
{ date -u; nvidia-smi; nvidia-smi topo -m; python3 -c 'import torch, transformers; print("torch", torch.__version__, "cuda", torch.version.cuda, "gpus", torch.cuda.device_count(), "transformers", transformers.__version__)'; echo "LD_PRELOAD=$PRE"; } > "$OUT/env.log" 2>&1
rc=0; t0=$(date +%s)
stamp() { echo "=== [$(( $(date +%s) - t0 )) s] $*"; }
if [[ "$WHAT" == *" bench "* ]]; then
  stamp "bench/gpu/multigpu.py on $N GPUs"
  LD_PRELOAD="$PRE" timeout ${BENCH_TIMEOUT:-260} torchrun --nproc-per-node="$N" bench/gpu/multigpu.py ${BENCH_ARGS:-} > "$OUT/bench.log" 2>&1 || rc=1
  grep -v "^W1\|Warning\|warnings.warn" "$OUT/bench.log" | tail -40
fi
if [[ "$WHAT" == *" tests "* ]]; then
  stamp "pytest tests/multigpu on $N GPUs"
  LD_PRELOAD="$PRE" timeout ${TESTS_TIMEOUT:-280} python3 -m pytest -v -p no:cacheprovider -rs tests/multigpu "tests/runtime/test_torch_runtime_cuda.py::test_a_span_ends_when_its_device_work_ends_and_an_error_does_not_wait" > "$OUT/tests.log" 2>&1 || rc=1
  tail -30 "$OUT/tests.log"
fi
stamp "done rc=$rc"
tar czf "$REAL_OUT/multigpu_results.tgz" -C "$OUT" .
exit $rc
