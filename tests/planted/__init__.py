"""Planted bugs: small, named breaks of the code that the test suite must catch.

Each :class:`Break` names one module file, an exact source snippet in it and its
replacement, and the test selection that should fail once the snippet is
replaced. :func:`apply_break` edits a *copy* of the repository (never the
working tree); ``python -m tests.planted`` (see :mod:`tests.planted.__main__`)
applies every break in turn to a temporary copy, runs its selection and reports
break -> failing tests. ``tests/test_planted.py`` checks in CI that every
snippet is still found exactly once (so a refactor that moves or rewrites the
code shows up as drift, naming the break to re-point) and runs a fast subset.

Snippets are located by text, not by line number, because the code moves; a
snippet found zero or several times is an error (:class:`BreakDriftError`),
never a silent skip.
"""
from __future__ import annotations

import dataclasses
import os
import shutil
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
#: records under bench/results larger than this are not copied (none is today; the largest is an NCCL log archive of 0.75 MB)
RECORD_MAX_BYTES = 2_000_000


class BreakDriftError(RuntimeError):
    """A break's snippet is not found exactly once in its file: the code moved; re-point the break."""


@dataclasses.dataclass(frozen=True)
class Break:
    """One planted bug: replace ``snippet`` (found exactly once in ``path``) with ``replacement``.

    ``tests`` is the pytest selection (paths or node ids, relative to the repository root) that must
    fail with the break applied; ``ci_tests``, when given, is a narrower selection (seconds) that CI runs
    on every build (``tests/test_planted.py``).
    """

    name: str
    path: str
    snippet: str
    replacement: str
    tests: tuple[str, ...]
    what: str
    ci_tests: tuple[str, ...] = ()

    @property
    def ci(self) -> bool:
        """True for the breaks checked on every CI run."""
        return bool(self.ci_tests)

    def locate(self, root: Path = REPO) -> str:
        """The file's text; raises :class:`BreakDriftError` unless the snippet occurs exactly once."""
        file = root / self.path
        if not file.is_file():
            raise BreakDriftError(f"break {self.name!r}: {self.path} does not exist (moved?); re-point the break "
                                  "in tests/planted/__init__.py to the module that now holds this code")
        text = file.read_text()
        count = text.count(self.snippet)
        if count != 1:
            raise BreakDriftError(
                f"break {self.name!r}: snippet found {count} times in {self.path}, expected exactly once; "
                f"the code changed: re-point the snippet in tests/planted/__init__.py. Snippet:\n{self.snippet}")
        return text


def apply_break(brk: Break, root: Path) -> str:
    """Apply ``brk`` to the copy at ``root``; returns the original text (for :func:`revert_break`)."""
    if root.resolve() == REPO:
        raise ValueError("planted breaks are applied to a copy of the repository, never to the working tree")
    text = brk.locate(root)
    (root / brk.path).write_text(text.replace(brk.snippet, brk.replacement, 1))
    return text


def revert_break(brk: Break, root: Path, original: str) -> None:
    """Put the file of ``brk`` back as :func:`apply_break` found it."""
    (root / brk.path).write_text(original)


def copy_repo(dest: Path, src: Path = REPO) -> Path:
    """Copy the tracked and untracked-but-not-ignored files of ``src`` to ``dest`` (no .git, no caches)."""
    try:
        listed = subprocess.run(["git", "ls-files", "-co", "--exclude-standard", "-z"], cwd=src, check=True,
                                capture_output=True).stdout.decode().split("\0")
        files = [f for f in listed if f and (src / f).is_file()]
    except (OSError, subprocess.CalledProcessError):  # not a git checkout: every file but caches
        files = [str(p.relative_to(src)) for p in src.rglob("*")
                 if p.is_file() and ".git" not in p.parts and "__pycache__" not in p.parts]
    for f in files:
        if f.startswith("bench/results/"):
            continue  # records, not code (copied below, the small ones)
        out = dest / f
        out.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(src / f, out)
    results = src / "bench" / "results"
    if results.is_dir():  # tests read the records (JSON, NCCL logs and their archives): every small file
        for p in results.rglob("*"):
            if p.is_file() and p.stat().st_size < RECORD_MAX_BYTES:
                out = dest / p.relative_to(src)
                out.parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(p, out)
    return dest


def run_selection(root: Path, tests: tuple[str, ...], *, timeout_s: float = 600.0, maxfail: int = 3,
                  extra_env: dict[str, str] | None = None) -> tuple[str, list[str], str]:
    """Run ``pytest tests`` in ``root``; returns (status, failing node ids, output tail).

    status: ``"failed"`` (some test failed: the break was caught), ``"passed"``, ``"timeout"``
    or ``"error"`` (pytest could not run the selection, e.g. a collection error: counted as caught
    only when it names a failing test).
    """
    env = dict(os.environ, PYTHONPATH=str(root), HYPOTHESIS_PROFILE=os.environ.get("HYPOTHESIS_PROFILE", "ci"),
               PYTHONDONTWRITEBYTECODE="1", **(extra_env or {}))
    cmd = [sys.executable, "-m", "pytest", "-q", "-n", "0", "-p", "no:cacheprovider", "-rfE", f"--maxfail={maxfail}",
           "-W", "ignore", *tests]
    try:
        proc = subprocess.run(cmd, cwd=root, env=env, capture_output=True, text=True, timeout=timeout_s)
    except subprocess.TimeoutExpired as exc:
        out = (exc.stdout or b"")
        out = out.decode(errors="replace") if isinstance(out, bytes) else out
        return "timeout", [], out[-2000:]
    out = proc.stdout + proc.stderr
    failed = []  # from the short test summary (-rfE): "FAILED path::test - message"; not log lines
    for line in out.splitlines():
        head, _, rest = line.partition(" ")
        node = rest.split(" - ")[0].strip()
        if head in ("FAILED", "ERROR") and ("::" in node or node.endswith(".py")):
            failed.append(node)
    if proc.returncode == 0:
        return "passed", [], out[-2000:]
    if proc.returncode == 1 and failed:
        return "failed", failed, out[-2000:]
    return ("failed" if failed else "error"), failed, out[-2000:]


B = Break
BREAKS: tuple[Break, ...] = (
    B("agreement_does_not_reduce", "refimpl/comm/agreement.py",
      "await rt.all_reduce(t, ReduceOp.MIN, self.name, timeout_s=wait_s)",
      "await rt.all_reduce(t.clone(), ReduceOp.MIN, self.name, timeout_s=wait_s)",
      ("tests/comm/test_lifecycle_sim.py",),
      "the control group's all_reduce(MIN) runs on a copy: every rank keeps its own vote",
      ci_tests=("tests/comm/test_lifecycle_sim.py::test_two_phase_enabling_then_suspend_every_step",)),
    B("agreement_takes_max", "refimpl/comm/agreement.py",
      "await rt.all_reduce(t, ReduceOp.MIN, self.name, timeout_s=wait_s)",
      "await rt.all_reduce(t, ReduceOp.MAX, self.name, timeout_s=wait_s)",
      ("tests/comm/test_lifecycle_sim.py",),
      "agreement reduces with MAX: one rank's 'yes' outvotes a peer's failure"),
    B("canary_failure_keeps_preservation", "refimpl/comm/lifecycle.py",
      'self._disable("canary failed: " + ("; ".join(problems) or "on another rank"))',
      'log.error("canary failed: " + ("; ".join(problems) or "on another rank"))',
      ("tests/comm/test_lifecycle_sim.py", "tests/comm/test_lifecycle_gloo.py"),
      "a failed canary is logged but group preservation stays on"),
    B("no_cooldown_wait", "refimpl/comm/cooldown.py",
      "await rt.sleep(left)", "await rt.sleep(0.0)",
      ("tests/comm/test_cooldown.py", "tests/comm/test_lifecycle_sim.py"),
      "a rebuild does not wait for the ports' TIME_WAIT cooldown",
      ci_tests=("tests/comm/test_cooldown.py::test_wait_sleeps_only_for_the_remainder_on_the_runtime_clock",)),
    B("dedup_reload_without_all_gather", "refimpl/store/backends/dedup_gather.py",
      "        try:\n            await self.rt.all_gather_into_tensor(out, inp, group.name)\n",
      "        try:\n            pass\n",
      ("tests/store/backends/test_dedup_backend_sim.py", "property_tests/test_dedup_sim.py"),
      "local_dedup reloads its own slice but never all-gathers the others' (one-piece and pipelined paths)"),
    B("slice_off_by_one", "refimpl/store/backends/dedup_config.py",
      "return min((self.index + 1) * self.chunk, self.numel)",
      "return min((self.index + 1) * self.chunk, self.numel - 1)",
      ("tests/store/backends/test_dedup_slices.py",),
      "the last member's slice stops one element short of the layout",
      ci_tests=("tests/store/backends/test_dedup_slices.py::test_slice_overlap_maps_tensor_ranges_into_the_slice",)),
    B("chooser_ignores_draws", "sim/kernel/engine.py",
      "return self._data.draw(self._st.integers(0, n - 1))",
      "return self._data.draw(self._st.integers(0, n - 1)) * 0",
      ("tests/sim/kernel/test_engine.py",),
      "HypothesisChooser draws an index but always runs the first tied event (FIFO)",
      ci_tests=("tests/sim/kernel/test_engine.py::test_hypothesis_chooser_is_not_fifo_and_shrinks_toward_fifo",)),
    B("deadlock_detection_off", "sim/world.py",
      "deadlock = find_deadlock(self)", "deadlock = None",
      ("tests/sim/test_deadlock.py",),
      "the world never looks for a waits-for cycle after the engine stops"),
    B("collective_matching_off", "sim/rendezvous.py",
      "elif p.signature != signature or p.op != op:", "elif False:",
      ("tests/sim/test_mismatch.py",),
      "collectives at the same sequence number are combined even when op or arguments differ",
      ci_tests=("tests/sim/test_mismatch.py::test_all_gather_against_all_reduce",)),
    B("release_before_copy_completes", "refimpl/store/moves/release.py",
      "            if not completion.done():\n                await completion\n", "",
      ("tests/store/test_store_sim.py",),
      "early release frees a storage without waiting for the D2H copy that reads it"),
    B("repoint_wrong_offset", "refimpl/store/state/layout.py",
      "t.set_(st, at + r.offset, r.size, r.stride)",
      "t.set_(st, at + r.offset + (1 if r.offset else 0), r.size, r.stride)",
      ("tests/store/test_store_offload.py",),
      "after reload a tensor at a non-zero offset is re-pointed one element too far into the flat buffer"),
    B("checkpoint_not_verified", "refimpl/torch_runtime/dcp_checksums.py",
      "        n = verify_plan(reader, plan)\n", "        n = 0\n",
      ("tests/store/test_checkpoint_integrity.py",),
      "a load reads the checkpoint without comparing its bytes with the CRC-32 written at save",
      ci_tests=("tests/store/test_checkpoint_integrity.py::test_a_flipped_bit_fails_the_load_naming_tensor_and_file",)),
    B("load_not_staged", "refimpl/torch_runtime/dcp_staging.py",
      "        return torch.empty_like(value)  # a DTensor stays", "        return value  # a DTensor stays",
      ("tests/store/test_checkpoint_integrity.py",),
      "a load goes straight into the target: a failure halfway leaves the model half-written"),
    B("gap_timed_in_reload", "bench/offload.py",
      "            if not b2b:\n                _other_role(rt, phase_gap_s, other_role_bytes)\n            t2 = rt.now()\n",
      "            t2 = rt.now()\n            if not b2b:\n                _other_role(rt, phase_gap_s, other_role_bytes)\n",
      ("tests/store/test_store_bench.py::test_measure_waits_the_gap_between_offload_and_reload_and_times_neither_with_it",),
      "the offload benchmark starts the reload clock before the phase gap, so the gap counts as reload time"),
    B("pinned_buffer_reused_at_wrong_size", "refimpl/store/backends/pool.py",
      "old.dtype == dtype and old.segment_numels == sizes",
      "old.dtype == dtype and len(old.segment_numels) == len(sizes)",
      ("tests/store/backends/test_store_pool.py",),
      "the pool hands back an old pinned buffer whose segment sizes differ from the request"),
    B("suspend_walk_skips_a_group", "refimpl/comm/role_groups.py",
      "            if self.member(name):\n                await self.rt.suspend_group(name)",
      "            if self.member(name) and not (self.rt.rank == 0 and name == min(filter(self.member, self.names))):\n"
      "                await self.rt.suspend_group(name)",
      ("tests/comm/test_lifecycle_sim.py",),
      "rank 0 leaves its first role group out of the suspend walk"),
    B("stale_generation_on_rebuild", "sim/runtime.py",
      "new = self.world.groups.next_generation(rg.spec)",
      "new = rg.spec",
      ("tests/sim/test_simruntime.py",),
      "a recreated group reuses the destroyed generation (stale store prefix)"),
    B("replica_group_from_wrong_mesh_dim", "refimpl/store/backends/replica.py",
      "group = self._over_dims(mesh, rank, replicate_dims(placements), None)",
      "group = self._over_dims(mesh, rank, tuple((d + 1) % mesh.mesh.dim() for d in replicate_dims(placements)), None)",
      ("tests/store/backends/test_replica.py", "property_tests/test_dedup_sim.py"),
      "a DTensor's replica group is built over the next mesh dim, not its Replicate dim"),
    B("host_bytes_counted_twice", "refimpl/store/backends/dedup.py",
      "return self._local.host_bytes() + sum(h.nbytes for h in self._held.values() if h is not None)",
      "return self._local.host_bytes() + 2 * sum(h.nbytes for h in self._held.values() if h is not None)",
      ("tests/store/backends/test_dedup_backend_sim.py",),
      "local_dedup counts each replicated slice's host bytes twice"),
    B("resume_preflight_ignores_memory", "refimpl/comm/role_groups.py",
      "            if need > free:\n", "            if need > free and False:\n",
      ("tests/comm/test_lifecycle_sim.py",),
      "resume enters NCCL's barriers without checking that the device has the memory"),
    B("two_phase_skipped", "refimpl/comm/decisions.py",
      "return preservation.ready or not two_phase", "return True",
      ("tests/comm/test_decisions.py",),
      "a rank votes to keep the groups before a weight sync proved them healthy"),
    B("torch_min_is_max", "refimpl/torch_runtime/runtime.py",
      "ReduceOp.MIN: dist.ReduceOp.MIN", "ReduceOp.MIN: dist.ReduceOp.MAX",
      ("tests/runtime/test_contract_torch.py",),
      "TorchRuntime maps ReduceOp.MIN to torch's MAX (real Gloo ranks)"),
    B("canary_checks_nothing", "refimpl/comm/role_groups.py",
      "if not math.isclose(got, want, rel_tol=0, abs_tol=1e-3):",
      "if False:",
      ("tests/comm/test_lifecycle_sim.py",),
      "the canary all-reduce runs but its sum is never compared with the group size"),
    B("dedup_outcome_ignores_peers", "refimpl/store/backends/dedup_outcome.py",
      "        if verdict.agreed:\n            return\n", "        if verdict.complete:\n            return\n",
      ("tests/store/backends/test_dedup_outcome_sim.py", "property_tests/test_store_outcome_stateful.py"),
      "local_dedup reads a vote's verdict but not the failures or points in it: an offload one rank rolled back "
      "commits on its peers",
      ci_tests=("tests/store/backends/test_dedup_outcome_sim.py::test_ranks_at_different_operations_get_an_operation_"
                "mismatch_on_every_rank",)),
    B("dedup_rebuilds_only_its_own_view", "refimpl/store/backends/dedup.py",
      "        await self._rebuild(sorted(verdict.marks))\n",
      "        await self._rebuild(sorted(verdict.marks & destroyed))\n",
      ("tests/store/backends/test_dedup_outcome_sim.py",),
      "a reload rebuilds only the replica groups this rank saw destroyed, not the union every rank agreed on"),
    B("offload_commits_without_settling", "refimpl/store/moves/offload.py",
      "        try:\n            await self.backend.settle_offload(None)\n",
      "        try:\n            pass\n",
      ("property_tests/test_store_outcome_stateful.py", "tests/store/backends/test_dedup_outcome_sim.py"),
      "the store releases an offload's device memory without the backend settling its outcome"),
    B("repoint_loses_autograd_identity", "refimpl/store/state/repoint.py",
      "    if t.requires_grad:\n        carrier = torch.empty(0, dtype=t.dtype, device=t.device)",
      "    if False:\n        carrier = torch.empty(0, dtype=t.dtype, device=t.device)",
      ("tests/store/state/test_store_autograd.py", "tests/store/clients/test_clients_ddp.py"),
      "re-pointing a parameter with set_ gives it a new gradient accumulator: DDP's and Megatron's hooks stop firing",
      ci_tests=("tests/store/state/test_store_autograd.py::test_hooks_fire_after_offload_and_reload",)),
    B("adopted_group_attribute_not_repointed", "refimpl/torch_runtime/foreign_groups.py",
      'elif kind == "attr" and vars(holder).get(key) is old:',
      'elif False and kind == "attr" and vars(holder).get(key) is old:',
      ("tests/runtime/test_adopt_group_gloo.py",),
      "a rebuilt adopted group leaves instance attributes (Megatron's layers, buffers) on the destroyed group"),
    B("vote_space_not_about_anything", "refimpl/runtime/votes.py",
      '    return f"{kind}.{zlib.crc32(about.encode()):08x}.{n}"', '    return f"{kind}.{n}"',
      ("tests/runtime/test_contract_sim.py",),
      "vote spaces numbered by creation order only: two stores (roles) made in different orders pair their votes"),
)


from tests.planted.comm_sim import COMM_SIM_BREAKS  # noqa: E402 - it needs Break, defined above
from tests.planted.store import STORE_BREAKS  # noqa: E402 - it needs Break, defined above
from tests.planted.worker import WORKER_BREAKS  # noqa: E402 - it needs Break, defined above
from tests.planted.bench_rl import BENCH_RL_BREAKS  # noqa: E402 - it needs Break, defined above

BREAKS = BREAKS + COMM_SIM_BREAKS + STORE_BREAKS + WORKER_BREAKS + BENCH_RL_BREAKS


def by_name(names: list[str] | None = None) -> list[Break]:
    """The breaks called ``names`` (all when None); an unknown name is an error listing the known ones."""
    if not names:
        return list(BREAKS)
    known = {b.name: b for b in BREAKS}
    unknown = [n for n in names if n not in known]
    if unknown:
        raise KeyError(f"unknown break(s) {unknown}; known: {sorted(known)}")
    return [known[n] for n in names]


__all__ = ["BREAKS", "Break", "BreakDriftError", "apply_break", "by_name", "copy_repo", "revert_break",
           "run_selection"]
