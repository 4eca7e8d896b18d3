#!/usr/bin/env bash
# The client tests on one CUDA GPU with NCCL and no device shim: the autograd-identity test, torch DDP
# (both gradient_as_bucket_view modes) and Megatron-core (distributed optimizer and not, dense and MoE,
# local and local_dedup; its process groups destroyed and rebuilt through the lifecycle), one rank: the
# world one GPU allows. Writes the record to $OUT.
#
#   bash bench/gpu/clients_cuda.sh [MEGATRON_WHEEL]
#
# MEGATRON_WHEEL: a megatron-core wheel (0.19.x for Python 3.12), installed with --no-deps into
# /tmp/site (its dependencies, triton among them, must already be on the machine). Without it the
# Megatron test is skipped with its reason unless megatron-core is importable already.
set -uo pipefail
cd "$(dirname "$0")/../.."
PY=${PYTHON:-python3}
if [ -n "${1:-}" ]; then
  $PY -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site "$1"
  export PYTHONPATH="/tmp/site${PYTHONPATH:+:$PYTHONPATH}"
fi
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
out="${OUT:-bench/results}"
mkdir -p "$out"
rec="$out/clients-cuda-$(date -u +%Y-%m-%d).txt"
{
  echo "# the client tests on CUDA with NCCL, one rank, no device shim"
  echo "# command: bash bench/gpu/clients_cuda.sh${1:+ $(basename "$1")}"
  $PY - <<'PY'
import platform
import torch
print(f"# python {platform.python_version()}, torch {torch.__version__}, cuda {torch.version.cuda}, "
      f"nccl {'.'.join(map(str, torch.cuda.nccl.version()))}, gpu {torch.cuda.get_device_name(0)}")
try:
    import megatron.core
    print(f"# megatron-core {megatron.core.__version__}")
except Exception as e:  # noqa: BLE001 - the record says why
    print(f"# megatron-core not importable: {type(e).__name__}: {e}")
PY
} 2>&1 | tee "$rec"
start=$(date +%s)
$PY -m pytest -q -p no:xdist -p no:cacheprovider -rs \
  tests/store/state/test_store_autograd.py tests/store/clients/test_clients_cuda.py 2>&1 | tee -a "$rec"
rc=${PIPESTATUS[0]}
echo "# pytest exit code $rc, $(( $(date +%s) - start )) s" | tee -a "$rec"
echo "record: $rec"
exit "$rc"
