"""``python -m tests.planted``: apply each planted bug to a temporary copy and report what caught it.

    python -m tests.planted                      # every break, its own selection
    python -m tests.planted --ci                 # only the CI breaks, with their narrow ci_tests selections
    python -m tests.planted --only slice_off_by_one no_cooldown_wait
    python -m tests.planted --out bench/results/planted.json --md bench/results/planted.md

The copy is made once (``git ls-files``: tracked and untracked-but-not-ignored files); each break is
applied to it, its selection run with ``HYPOTHESIS_PROFILE=ci`` (unless set), and the file restored.
A baseline run of all selections on the unbroken copy comes first (``--no-baseline`` skips it): a
selection that fails without a break would make its catch meaningless. Exit status 0 only when the
baseline passed and every break was caught.
"""
from __future__ import annotations

import argparse
import datetime as _dt
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from tests.planted import REPO, BreakDriftError, apply_break, by_name, copy_repo, revert_break, run_selection


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m tests.planted", description=__doc__.splitlines()[0])
    ap.add_argument("--only", nargs="+", help="break names (default: all)")
    ap.add_argument("--ci", action="store_true", help="only the breaks marked ci=True")
    ap.add_argument("--timeout", type=float, default=600.0, help="seconds per selection run (default 600)")
    ap.add_argument("--no-baseline", action="store_true", help="skip the run on the unbroken copy")
    ap.add_argument("--list", action="store_true", help="list the breaks and exit")
    ap.add_argument("--out", help="write the report as JSON here")
    ap.add_argument("--md", help="write the report as a Markdown table here")
    args = ap.parse_args(argv)
    try:
        breaks = by_name(args.only)
    except KeyError as exc:
        print(exc.args[0])
        return 2
    if args.ci:
        breaks = [b for b in breaks if b.ci]
    if args.list:
        for b in breaks:
            print(f"{b.name:<38} {b.path:<34} {' '.join(b.tests)}{'  [ci]' if b.ci else ''}\n    {b.what}")
        return 0
    started = time.time()
    report: dict = {
        "date": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "machine": f"{platform.node()} ({platform.machine()}, {os.cpu_count()} CPUs, Python {platform.python_version()})",
        "command": "python -m tests.planted " + " ".join(argv if argv is not None else sys.argv[1:]),
        "commit": _commit(),
        "hypothesis_profile": os.environ.get("HYPOTHESIS_PROFILE", "ci"),
        "breaks": [],
    }
    with tempfile.TemporaryDirectory(prefix="planted-") as tmp:
        root = copy_repo(Path(tmp))
        if not args.no_baseline:
            selection = tuple(dict.fromkeys(t for b in breaks for t in _selection(b, args.ci)))
            t0 = time.time()
            status, failed, tail = run_selection(root, selection, timeout_s=args.timeout * 2, maxfail=20)
            report["baseline"] = {"status": status, "failed": failed, "seconds": round(time.time() - t0, 1)}
            print(f"baseline ({len(selection)} files): {status} in {time.time() - t0:.0f} s", flush=True)
            if status != "passed":
                print(tail)
        for b in breaks:
            t0 = time.time()
            try:
                original = apply_break(b, root)
            except BreakDriftError as exc:
                report["breaks"].append({"name": b.name, "status": "drift", "error": str(exc)})
                print(f"DRIFT   {b.name}: {exc}", flush=True)
                continue
            try:
                status, failed, tail = run_selection(root, _selection(b, args.ci), timeout_s=args.timeout)
            finally:
                revert_break(b, root, original)
            caught = status == "failed"
            row = {"name": b.name, "path": b.path, "what": b.what, "tests": list(_selection(b, args.ci)), "ci": b.ci,
                   "status": "caught" if caught else status, "failed": failed,
                   "seconds": round(time.time() - t0, 1)}
            if not caught:
                row["tail"] = tail
            report["breaks"].append(row)
            print(f"{'CAUGHT' if caught else status.upper():<7} {b.name} ({row['seconds']} s): "
                  f"{', '.join(failed[:3]) or '-'}", flush=True)
    rows = report["breaks"]
    report["caught"] = sum(r["status"] == "caught" for r in rows)
    report["total"] = len(rows)
    report["seconds"] = round(time.time() - started, 1)
    print(f"{report['caught']}/{report['total']} breaks caught in {report['seconds']:.0f} s")
    if args.out:
        Path(args.out).write_text(json.dumps(report, indent=1) + "\n")
    if args.md:
        Path(args.md).write_text(to_markdown(report))
    ok = report["caught"] == report["total"] and report.get("baseline", {}).get("status", "passed") == "passed"
    return 0 if ok else 1


def _commit() -> str:
    """The checked-out commit, with "+changes" when the working tree differs from it."""
    try:
        head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, check=True,
                              cwd=REPO).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], capture_output=True,
                               text=True, check=True, cwd=REPO).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
    return head + ("+changes" if dirty else "")


def _selection(b, ci: bool) -> tuple[str, ...]:
    return b.ci_tests if ci and b.ci_tests else b.tests


def to_markdown(report: dict) -> str:
    """The report as a Markdown table: break, file, status, tests that failed."""
    lines = [f"# Planted-bug report, {report['date']}", "",
             f"- machine: {report['machine']}", f"- command: `{report['command']}`",
             f"- commit: {report.get('commit', 'unknown')}",
             f"- Hypothesis profile: {report['hypothesis_profile']}",
             f"- baseline: {report.get('baseline', {}).get('status', 'not run')}",
             f"- caught: {report['caught']}/{report['total']} in {report['seconds']:.0f} s (wall clock on a shared, "
             "loaded machine)", "",
             "| break | file | status | tests that failed (first 3) |", "|---|---|---|---|"]
    for r in report["breaks"]:
        failed = "<br>".join(f"`{f}`" for f in r.get("failed", [])[:3]) or "-"
        lines.append(f"| {r['name']} | {r.get('path', '')} | {r['status']} | {failed} |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    raise SystemExit(main())
