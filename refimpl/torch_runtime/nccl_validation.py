"""Refuse ``offload_nccl`` unless the NCCL in this process can really suspend communicators.

Run :func:`require_offload_nccl` when ``offload_nccl`` is on, before any model is
loaded (and before any NCCL communicator is created, since NCCL reads its
settings then). It checks, and reports *every* failure at once with its fix:

1. an NCCL library is loaded in this process and ``ncclGetVersion`` says it is
   >= 2.29.7 (the version torch was built with does not count);
2. it exports ``ncclCommSuspend`` and ``ncclCommResume`` (and
   ``ncclCommMemStats``, which sizes what a suspend frees);
3. cuMem allocation is not turned off: ``NCCL_CUMEM_ENABLE`` is not 0;
4. NCCL's memory manager is not turned off: ``NCCL_DISABLE_MEM_MANAGER`` is not 1.

Settings are read as NCCL reads them: the environment first, then the file named
by ``NCCL_CONF_FILE`` (or ``~/.nccl.conf``), then ``/etc/nccl.conf``. There is no
silent downgrade: a failed check raises :class:`NcclOffloadUnavailableError`.
"""
from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from typing import Mapping

from refimpl.torch_runtime.nccl_loader import MIN_SUSPEND_VERSION, NcclNotLoadedError, format_version


log = logging.getLogger(__name__)

DEPLOY_HINT = (
    "install an NCCL >= {min} for your CUDA major version on every node and load it in the worker "
    "processes, e.g. `pip install nvidia-nccl-cu13>=2.29.7` (or -cu12) and start workers with "
    "LD_PRELOAD=$(python -c 'import nvidia.nccl, os; print(os.path.join(nvidia.nccl.__path__[0], "
    "\"lib\", \"libnccl.so.2\"))'); see docs/comm.md"
)


@dataclass(frozen=True)
class NcclFacts:
    """What the process's NCCL library offers (``version is None``: no library loaded)."""

    version: tuple[int, int, int] | None
    path: str | None
    has_suspend_resume: bool
    has_mem_stats: bool

    @classmethod
    def probe(cls) -> "NcclFacts":
        """Facts about the NCCL library loaded in THIS process."""
        from refimpl.torch_runtime.nccl import NcclLibrary

        try:
            lib = NcclLibrary.load()
        except NcclNotLoadedError:
            return cls(version=None, path=None, has_suspend_resume=False, has_mem_stats=False)
        return cls(lib.version, lib.path, lib.has_suspend_resume, lib.has_mem_stats)


@dataclass(frozen=True)
class Problem:
    """One reason ``offload_nccl`` cannot work here, and what to do about it."""

    what: str
    fix: str

    def __str__(self) -> str:
        return f"{self.what} -> {self.fix}"


class NcclOffloadUnavailableError(RuntimeError):
    """``offload_nccl`` is on but this process cannot suspend NCCL communicators."""

    def __init__(self, problems: list[Problem]) -> None:
        self.problems = problems
        lines = "\n".join(f"  - {p}" for p in problems)
        super().__init__(
            "offload_nccl is enabled but NCCL communicator suspend/resume is unavailable:\n"
            f"{lines}\nEither fix the above or set offload_nccl to false."
        )


def parse_nccl_conf(text: str) -> dict[str, str]:
    """``KEY=VALUE`` lines of an ``nccl.conf`` (``#`` comments and blank lines ignored)."""
    out: dict[str, str] = {}
    for raw in text.splitlines():
        line = raw.split("#", 1)[0].strip()
        if "=" not in line:
            continue
        key, _, value = line.partition("=")
        out.setdefault(key.strip(), value.strip())
    return out


def _conf_files(env: Mapping[str, str]) -> list[str]:
    user = env.get("NCCL_CONF_FILE") or os.path.join(env.get("HOME", os.path.expanduser("~")), ".nccl.conf")
    return [user, "/etc/nccl.conf"]


def nccl_setting(
    name: str, env: Mapping[str, str], conf_files: list[str] | None = None
) -> tuple[str | None, str]:
    """The value NCCL will see for ``name`` and where it comes from (``"unset"`` if nowhere)."""
    if name in env:
        return env[name], "environment"
    for path in _conf_files(env) if conf_files is None else conf_files:
        try:
            with open(path, encoding="utf-8") as f:
                values = parse_nccl_conf(f.read())
        except OSError:
            continue
        if name in values:
            return values[name], path
    return None, "unset"


def _as_int(value: str | None) -> int | None:
    if value is None:
        return None
    try:
        return int(value.strip(), 0)
    except ValueError:
        return None


def offload_nccl_problems(
    facts: NcclFacts, env: Mapping[str, str], conf_files: list[str] | None = None
) -> list[Problem]:
    """Every reason NCCL suspend/resume cannot work with these facts and settings (empty: it can)."""
    problems: list[Problem] = []
    need = format_version(MIN_SUSPEND_VERSION)
    hint = DEPLOY_HINT.format(min=need)
    if facts.version is None:
        problems.append(Problem("no NCCL library is loaded in this process", hint))
    else:
        have = format_version(facts.version)
        if facts.version < MIN_SUSPEND_VERSION:
            problems.append(Problem(f"the loaded NCCL is {have} ({facts.path}); suspend/resume needs >= {need}", hint))
        if not facts.has_suspend_resume:
            problems.append(Problem(f"{facts.path} (NCCL {have}) does not export ncclCommSuspend/ncclCommResume", hint))
        if not facts.has_mem_stats:
            problems.append(Problem(f"{facts.path} (NCCL {have}) does not export ncclCommMemStats", hint))
    cumem, where = nccl_setting("NCCL_CUMEM_ENABLE", env, conf_files)
    if _as_int(cumem) == 0:
        problems.append(Problem(
            f"NCCL_CUMEM_ENABLE={cumem} (from {where}) turns off cuMem allocation, which suspend needs",
            "unset it or set NCCL_CUMEM_ENABLE=1 before any NCCL communicator is created",
        ))
    mm_off, where = nccl_setting("NCCL_DISABLE_MEM_MANAGER", env, conf_files)
    if _as_int(mm_off) == 1:
        problems.append(Problem(
            f"NCCL_DISABLE_MEM_MANAGER={mm_off} (from {where}) turns off NCCL's memory manager, which suspend needs",
            "unset it or set NCCL_DISABLE_MEM_MANAGER=0 before any NCCL communicator is created",
        ))
    return problems


def require_offload_nccl(
    *, facts: NcclFacts | None = None, env: Mapping[str, str] | None = None, conf_files: list[str] | None = None
) -> NcclFacts:
    """Raise :class:`NcclOffloadUnavailableError` unless NCCL suspend/resume works here.

    ``facts`` defaults to the library loaded in this process; ``env`` to ``os.environ``.
    Returns the facts on success (for logging).
    """
    facts = NcclFacts.probe() if facts is None else facts
    problems = offload_nccl_problems(facts, os.environ if env is None else env, conf_files)
    if problems:
        raise NcclOffloadUnavailableError(problems)
    log.info("offload_nccl: NCCL %s at %s supports suspend/resume", format_version(facts.version or ()), facts.path)
    return facts


def validate_offload_nccl(offload_nccl: bool, **kwargs) -> NcclFacts | None:
    """The worker-startup hook: check only when ``offload_nccl`` is on; never silently turn it off."""
    if not offload_nccl:
        return None
    return require_offload_nccl(**kwargs)


__all__ = [
    "NcclFacts",
    "NcclOffloadUnavailableError",
    "Problem",
    "nccl_setting",
    "offload_nccl_problems",
    "parse_nccl_conf",
    "require_offload_nccl",
    "validate_offload_nccl",
]
