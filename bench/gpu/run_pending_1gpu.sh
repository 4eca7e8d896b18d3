#!/usr/bin/env bash
# What is written but not yet run on one H200, in one call (under 10 minutes), from the repository root, carrying
# .whl (the transformers and megatron-core wheels, as run_switch.sh):
#   bash bench/gpu/run_pending_1gpu.sh
# in the order of what matters most if the call is cut short:
#   1. the content digest's cost and its parts, per kind of row sums (python3 bench/gpu/digest_variants.py),
#   2. the one-GPU RL step of the records (--offload-in-backward --sync-first, streamed, DESTROY_DEFERRED) with the
#      defaults, without the N-GPU mechanism (base), then the ablations while the budget lasts
#      (bench/gpu/run_rl_ngpu.sh with NPROC=1 PARTS="$RL_PARTS", default "ngpu base ablate"),
#   3. the whole CUDA suite in one process (the way docs/gpu.md says), then the four CUDA tests of the store's
#      safety checks by name and the fused digest's test (docs/gpu.md, "The store's safety checks on the GPU").
# Timeouts: DIGEST_TIMEOUT (120), RL_BUDGET_S (300), TESTS_TIMEOUT (200), NAMED_TIMEOUT (90; 0 skips the named tests).
# Writes into $OUT: digest_variants.log, summary.txt, rl_ngpu.tgz, cuda_tests.log and named_tests.log.
set -u
cd "$(dirname "$0")/../.."
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0
OUT=${OUT:-/tmp/pending}
mkdir -p "$OUT"
if ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
fi
export PYTHONPATH="/tmp/site:$PWD"
echo "$(date -u +%FT%TZ) $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader)" | tee "$OUT/device.txt"
timeout -k 5 "${DIGEST_TIMEOUT:-120}" python3 bench/gpu/digest_variants.py >"$OUT/digest_variants.log" 2>&1
echo "digest variants rc=$?"; cat "$OUT/digest_variants.log"
OUT="$OUT/rl" NPROC=1 PARTS="${RL_PARTS:-ngpu base ablate}" BUDGET_S="${RL_BUDGET_S:-300}" PYTHON=python3 bash bench/gpu/run_rl_ngpu.sh | tail -n 20
cp "$OUT/rl/summary.txt" "$OUT/rl/rl_ngpu.tgz" "$OUT/" 2>/dev/null
rm -rf "$OUT/rl"
timeout -k 5 "${TESTS_TIMEOUT:-200}" python3 -m pytest -q -p no:cacheprovider -m cuda tests -rs >"$OUT/cuda_tests.log" 2>&1
echo "cuda suite rc=$?"; tail -n 4 "$OUT/cuda_tests.log"
[ "${NAMED_TIMEOUT:-90}" != 0 ] && timeout -k 5 "${NAMED_TIMEOUT:-90}" python3 -m pytest -q -p no:cacheprovider -rs \
  "tests/store/moves/test_store_early_copies.py::test_a_fused_adamw_step_after_copy_early_is_copied_again_on_the_gpu" \
  "tests/store/test_store_cuda.py::test_gpu_memory_is_really_returned_and_host_memory_really_pinned" \
  "tests/store/state/test_store_guard.py::test_views_and_reshapes_of_an_offloaded_tensor_raise_and_nothing_aliases_the_placeholder[cuda]" \
  "tests/store/state/test_store_guard.py::test_as_subclass_make_subclass_and_the_legacy_constructor_of_an_offloaded_tensor_raise[cuda]" \
  tests/store/backends/test_digest_fused.py \
  >"$OUT/named_tests.log" 2>&1
echo "named tests rc=$?"; tail -n 3 "$OUT/named_tests.log"
