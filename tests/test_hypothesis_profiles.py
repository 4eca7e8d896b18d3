"""The Hypothesis profiles scale what is generated, an unknown profile is refused, and a failure prints its replay."""
from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from tests import _hypothesis

REPO = Path(__file__).resolve().parents[1]


def test_profiles_scale_sizes_not_only_example_counts():
    ci, dev, nightly = (_hypothesis._BUDGETS[p] for p in ("ci", "dev", "nightly"))
    for field in ("max_ranks", "max_steps", "max_faults", "chooser_depth", "stateful_steps"):
        assert getattr(ci, field) < getattr(dev, field) < getattr(nightly, field), field
    assert ci.examples(40) == 40 and nightly.examples(40) >= 1000  # thousands of examples at night
    assert nightly.max_ranks == 64 and nightly.max_faults >= 2


def test_an_unknown_profile_is_refused_naming_the_choices(monkeypatch):
    monkeypatch.setenv("HYPOTHESIS_PROFILE", "fast")
    with pytest.raises(ValueError, match="HYPOTHESIS_PROFILE='fast' is not a profile; use one of ci, dev, nightly"):
        _hypothesis.profile_name()


def test_a_failing_property_prints_the_command_that_replays_it(tmp_path):
    (tmp_path / "conftest.py").write_text(textwrap.dedent(f"""
        import importlib.util
        spec = importlib.util.spec_from_file_location("repo_conftest", {str(REPO / "conftest.py")!r})
        repo_conftest = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(repo_conftest)
        pytest_runtest_makereport = repo_conftest.pytest_runtest_makereport
    """))
    (tmp_path / "test_probe.py").write_text(textwrap.dedent("""
        from hypothesis import given, strategies as st

        @given(st.integers())
        def test_small(x):
            assert x < 5
    """))
    env = dict(os.environ, PYTHONPATH=str(REPO), HYPOTHESIS_PROFILE="ci")
    out = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:xdist",
                          "test_probe.py"], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 1, out.stdout[-2000:]
    assert "@reproduce_failure(" in out.stdout
    assert "HYPOTHESIS_PROFILE=ci python -m pytest -n 0 -p no:cacheprovider test_probe.py::test_small" in out.stdout
