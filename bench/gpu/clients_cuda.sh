#!/usr/bin/env bash
# The client tests on one CUDA GPU with NCCL: torch DDP, the autograd-identity test and Megatron-core
# (one rank: the world one GPU allows), no device shim. Prints pytest's summary and writes a record.
#
#   bash bench/gpu/clients_cuda.sh [MEGATRON_WHEEL]
#
# MEGATRON_WHEEL: a megatron-core wheel to install first (Python 3.12 takes 0.19.x; its dependencies
# must already be there). The record goes to $OUT (default bench/results) as clients-cuda-<date>.txt.
set -euo pipefail
cd "$(dirname "$0")/../.."
if [ "${1:-}" != "" ]; then
  python -m pip install -q --no-deps "$1"
fi
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
out="${OUT:-bench/results}"
mkdir -p "$out"
rec="$out/clients-cuda-$(date -u +%Y-%m-%d).txt"
{
  echo "# client tests on CUDA with NCCL, one rank"
  echo "# command: bash bench/gpu/clients_cuda.sh ${1:+$(basename "$1")}"
  python - <<'PY'
import platform, torch
print(f"# python {platform.python_version()}, torch {torch.__version__}, cuda {torch.version.cuda}, "
      f"nccl {'.'.join(map(str, torch.cuda.nccl.version()))}, gpu {torch.cuda.get_device_name(0)}")
try:
    import megatron.core
    print(f"# megatron-core {megatron.core.__version__}")
except ImportError as e:
    print(f"# megatron-core not importable: {e}")
PY
  python -m pytest -q -p no:xdist -p no:cacheprovider -rs \
    tests/store/test_store_autograd.py tests/store/test_clients_cuda.py 2>&1
} | tee "$rec"
echo "record: $rec"
