"""The colocated RLVR pipeline with roles as Ray actors sharing one GPU: see :mod:`bench.ray_pipeline`.

    python bench/gpu/ray_pipeline.py --roles 3 --steps 2 --compare          # one H200, under 150 s; $OUT/ray_pipeline.json
    python bench/gpu/ray_pipeline.py --device cpu --roles 3 --steps 1       # CPU/Gloo, tiny sizes, a check

On CUDA the default model is a 1.34 B-parameter policy (vocab 32000, hidden 4096, 8 blocks; fp32): actor_train
holds 5.4 GB of params and 10.7 GB of AdamW state, the reference and the engine 5.4 GB each. The record has, per
role and method, the onload / offload seconds and GB/s against the line rate measured at start (``*_x_line``),
the allocator's peak per call (``memory/peak_gb``), the device memory in use after each phase (every role,
``cudaMemGetInfo``), the RPC time and its overhead beyond the slowest rank's time in the call, the phases' times
and, with ``--compare``, whether the losses, sequences and trained weights equal the no-offload run bitwise.
The weight sync hands the weights to the colocated engine as CUDA IPC handles (as verl and ROLL do for
colocated engines); the summary prints its time per step. Exit code 3 if they differ, 1 if the run failed (the record says why).
"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

try:
    import ray  # noqa: F401
except ImportError as e:  # the H200 machines: Ray's wheel and jsonschema's 4 packages are carried in
    raise SystemExit(f"ray_pipeline needs Ray ({e}); install the carried wheel: pip install ray-*.whl "
                     "jsonschema jsonschema-specifications referencing rpds-py")

from bench.ray_pipeline import main  # noqa: E402

if __name__ == "__main__":
    argv = sys.argv[1:]
    if "--out" not in argv and os.environ.get("OUT"):
        argv += ["--out", os.environ["OUT"]]
    raise SystemExit(main(argv))
