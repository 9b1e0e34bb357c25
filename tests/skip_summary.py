"""A one-line count of skipped tests by reason at the end of every run (pytest prints the
reasons themselves only with ``-rs``): ``skipped: 240 needs a CUDA GPU, 12 needs DGL``."""

from collections import Counter


def _reason(report) -> str:
    longrepr = report.longrepr
    if isinstance(longrepr, tuple) and len(longrepr) == 3:
        reason = str(longrepr[2])
    else:
        reason = str(longrepr)
    return reason[len("Skipped: "):] if reason.startswith("Skipped: ") else reason


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    skipped = terminalreporter.stats.get("skipped", [])
    if not skipped:
        return
    counts = Counter(_reason(r) for r in skipped)
    parts = [f"{n} {reason}" for reason, n in counts.most_common()]
    terminalreporter.write_line("skipped: " + ", ".join(parts) + "  (pytest -rs lists them)")
