"""Repository-wide pytest setup: the Hypothesis profile (``HYPOTHESIS_PROFILE``: ci, dev, nightly).

See :mod:`tests._hypothesis` for what each profile bounds. A failing Hypothesis test gets one more
report section: the command that replays it (same profile, same node id; the ``ci`` profile is
derandomized and every profile keeps failing examples in ``.hypothesis/``, so the command reruns the
failing example first; the ``@reproduce_failure`` blob printed above pins it exactly).
"""
from __future__ import annotations

import shlex

import pytest

from tests import _hypothesis

BUDGET = _hypothesis.load()


def pytest_report_header(config):
    return (f"hypothesis profile: {BUDGET.profile} (max_ranks={BUDGET.max_ranks}, max_steps={BUDGET.max_steps}, "
            f"max_faults={BUDGET.max_faults}, chooser_depth={BUDGET.chooser_depth}, x{BUDGET.example_scale:g} examples)")


def _is_hypothesis(item) -> bool:
    """A ``@given`` test, or the TestCase of a Hypothesis RuleBasedStateMachine."""
    if getattr(getattr(item, "obj", None), "is_hypothesis_test", False):
        return True
    cls = getattr(item, "cls", None)
    return cls is not None and any(b.__module__ == "hypothesis.stateful" for b in cls.__mro__)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    if report.when != "call" or not report.failed:
        return
    if not _is_hypothesis(item):
        return
    cmd = (f"HYPOTHESIS_PROFILE={BUDGET.profile} python -m pytest -n 0 -p no:cacheprovider "
           f"{shlex.quote(item.nodeid)}")
    report.sections.append(("hypothesis replay", f"replay this failure with:\n    {cmd}\n"
                            "(or paste the @reproduce_failure(...) decorator printed above onto the test)"))



#: test modules named ``test_ray_*.py`` start a local Ray cluster each (``tests/worker``); under ``-n N``
#: they run on one worker, one module after the other, instead of one cluster per module per worker
RAY_MODULE_PREFIX = "test_ray_"


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config, log):
    """``--dist load`` (what ``-n N`` gives), except that the ``test_ray_*`` modules form one unit of work."""
    if config.getvalue("dist") != "load":
        return None
    from xdist.scheduler import LoadScopeScheduling

    class RayModulesTogether(LoadScopeScheduling):
        """Every test its own unit (as ``load``), the Ray modules' tests one unit together."""

        def _split_scope(self, nodeid: str) -> str:
            path = nodeid.split("::", 1)[0]
            return "ray-modules" if path.rsplit("/", 1)[-1].startswith(RAY_MODULE_PREFIX) else nodeid

    return RayModulesTogether(config, log)
