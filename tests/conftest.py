"""Test-wide settings: hypothesis profiles, and skipped tests summed up by reason."""

from __future__ import annotations

import os
import re
from collections import Counter

import pytest
from hypothesis import HealthCheck, settings

settings.register_profile(
    "ci",
    derandomize=True,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
settings.register_profile("dev", deadline=None)
settings.load_profile("ci" if os.environ.get("CI") else "dev")


# -- skipped tests: one line per reason ---------------------------------------------------
# Without Redis and PostgreSQL some hundred store tests are skipped for the same two reasons;
# pytest's own list gives each test location a line of its own. Unless `-rs` (or `-ra`)
# asks for that list, the run ends with one line per reason instead.


def _lists_skips(config: pytest.Config) -> bool:
    chars = str(config.getoption("reportchars", ""))
    chars = chars.rsplit("N", 1)[-1]  # "N" resets what came before it
    return any(c in chars for c in "sSaA")


def _reason(report: pytest.TestReport) -> str:
    longrepr = report.longrepr
    if isinstance(longrepr, tuple) and len(longrepr) == 3:
        return str(longrepr[2]).removeprefix("Skipped: ")
    return str(longrepr)


def _fit(reason: str, width: int) -> str:
    """The reason on one line; details in parentheses dropped while it is wider than ``width``.

    The rest is kept whole: it says what is missing and how to get it.
    """
    reason = " ".join(reason.split())
    while len(reason) > width:
        shorter = re.sub(r" ?\((?:[^()]|\([^()]*\))*\)", "", reason, count=1)
        if shorter == reason:
            break
        reason = shorter
    return reason


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    config = terminalreporter.config
    skipped = [r for r in terminalreporter.stats.get("skipped", []) if r.skipped]
    if not skipped or _lists_skips(config):
        return
    counts = Counter(_reason(r) for r in skipped)
    width = config.get_terminal_writer().fullwidth
    terminalreporter.write_sep("-", f"{len(skipped)} skipped, by reason (-rs lists each test)")
    for reason, count in counts.most_common():
        terminalreporter.write_line(f"{count:5}  {_fit(reason, width - 7)}")
