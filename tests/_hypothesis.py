"""Hypothesis budgets: the ``ci``, ``dev`` and ``nightly`` profiles and the sizes that scale with them.

The profile is chosen by the ``HYPOTHESIS_PROFILE`` environment variable (default ``ci``) and loaded by
the repository's ``conftest.py``::

    python -m pytest -n 2 -q                                   # ci: bounded, derandomized, replayable
    HYPOTHESIS_PROFILE=dev python -m pytest property_tests     # 10x examples, bigger meshes and plans
    HYPOTHESIS_PROFILE=nightly python -m pytest property_tests # thousands of examples, up to 64 ranks

A profile scales more than ``max_examples``: :data:`BUDGET` also bounds the meshes (``max_ranks``),
schedule lengths (``max_steps``), faults per plan (``max_faults``), how many tie-breaking draws a
:class:`sim.HypothesisChooser` makes before falling back to FIFO (``chooser_depth``) and the steps of a
stateful test (``stateful_steps``). Tests take their sizes from :data:`BUDGET` and their example counts
from :meth:`Budget.examples`, so an explicit ``@settings(max_examples=...)`` never pins a test to the
CI budget.

Every profile prints the failing example's ``@reproduce_failure`` blob; ``conftest.py`` adds the one
command that replays a failure (profile, node id).
"""
from __future__ import annotations

import dataclasses
import os

from hypothesis import HealthCheck, settings

PROFILE_ENV = "HYPOTHESIS_PROFILE"
PROFILES = ("ci", "dev", "nightly")


@dataclasses.dataclass(frozen=True)
class Budget:
    """Sizes of generated cases under one profile (see the module docstring)."""

    profile: str
    example_scale: float
    max_ranks: int
    max_steps: int
    max_faults: int
    chooser_depth: int
    stateful_steps: int

    def examples(self, ci_examples: int) -> int:
        """The example count for a test that runs ``ci_examples`` under the ``ci`` profile."""
        return max(1, int(round(ci_examples * self.example_scale)))

    def settings(self, ci_examples: int, **kw) -> settings:
        """``hypothesis.settings`` for such a test: scaled examples, no deadline, slow generation allowed."""
        kw.setdefault("deadline", None)
        kw.setdefault("suppress_health_check", [HealthCheck.too_slow, HealthCheck.data_too_large])
        return settings(max_examples=self.examples(ci_examples), **kw)


_BUDGETS = {
    # ci: the whole `python -m pytest -n 2 -q` within 10 minutes on 2 cores; derandomized so the printed
    # command replays a failure exactly (the same examples every run)
    "ci": Budget("ci", 1.0, max_ranks=8, max_steps=8, max_faults=1, chooser_depth=50, stateful_steps=12),
    "dev": Budget("dev", 10.0, max_ranks=16, max_steps=16, max_faults=2, chooser_depth=1_000, stateful_steps=30),
    # nightly: thousands of examples, meshes up to 64 ranks, several faults, full chooser depth
    "nightly": Budget("nightly", 100.0, max_ranks=64, max_steps=32, max_faults=4, chooser_depth=1_000_000,
                      stateful_steps=60),
}

_COMMON = dict(deadline=None, print_blob=True,
               suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
settings.register_profile("ci", derandomize=True, **_COMMON)
settings.register_profile("dev", **_COMMON)
settings.register_profile("nightly", **_COMMON)


def profile_name() -> str:
    """The profile named by ``HYPOTHESIS_PROFILE`` (default ``ci``); an unknown name is an error."""
    name = os.environ.get(PROFILE_ENV, "ci") or "ci"
    if name not in _BUDGETS:
        raise ValueError(f"{PROFILE_ENV}={name!r} is not a profile; use one of {', '.join(PROFILES)}")
    return name


BUDGET: Budget = _BUDGETS[profile_name()]


def load() -> Budget:
    """Load the chosen profile into Hypothesis; returns its :class:`Budget`."""
    settings.load_profile(BUDGET.profile)
    return BUDGET


__all__ = ["BUDGET", "Budget", "PROFILES", "PROFILE_ENV", "load", "profile_name"]
