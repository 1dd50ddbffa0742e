"""Time of ``import aiservices``, next to the floor any pydantic-based library pays.

Run by hand: ``python benchmarks/bench_import.py [runs] [--cached]``. Each run is a fresh
interpreter with ``-X importtime``; the runs of ``import aiservices`` alternate with runs
that import pydantic and define one model (the floor: messages are pydantic models), so
that load on the machine spoils both alike. Prints the median, minimum and maximum of each
in milliseconds, the ratio of the medians, and checks that no provider SDK, database
driver, tiktoken or asyncio was imported. ``--cached`` lets Python write and use ``.pyc`` files (in
a temporary directory, leaving the checkout as it was), as an installed package has them;
without it, the environment decides (with ``PYTHONDONTWRITEBYTECODE=1`` and no
``__pycache__`` in the checkout, every run compiles aiservices from source).
"""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
import tempfile

FLOOR = """
from pydantic import BaseModel, ConfigDict
class M(BaseModel):
    model_config = ConfigDict(frozen=True, defer_build=True)
    a: int
"""

HEAVY = ("openai", "anthropic", "httpx", "redis", "psycopg", "sqlite3", "tiktoken", "asyncio")


def _top_level(code: str) -> dict[str, int]:
    """Cumulative microseconds of each top-level import in a fresh interpreter."""
    out = subprocess.run(
        [sys.executable, "-X", "importtime", "-c", code],
        capture_output=True,
        text=True,
        check=True,
        env=ENV,
    ).stderr
    found: dict[str, int] = {}
    for line in out.splitlines():
        if line.startswith("import time:") and "|" in line:
            _, cumulative, name = line.split("|")
            # A name indented by more than the column's one space was imported by another.
            if not name.startswith("  ") and cumulative.strip().isdigit():
                found[name.strip()] = int(cumulative)
    return found


ENV = dict(os.environ)
if "--cached" in sys.argv:
    ENV.pop("PYTHONDONTWRITEBYTECODE", None)
    CACHE = tempfile.TemporaryDirectory(prefix="bench-import-")  # removed at exit
    ENV["PYTHONPYCACHEPREFIX"] = CACHE.name
STARTUP = set(_top_level("pass"))  # what the interpreter imports before running anything


def import_ms(code: str) -> float:
    """Milliseconds that ``code`` spends importing, interpreter start-up excluded."""
    return sum(t for name, t in _top_level(code).items() if name not in STARTUP) / 1000


def main() -> None:
    numbers = [a for a in sys.argv[1:] if a.isdigit()]
    runs = int(numbers[0]) if numbers else 21
    import_ms("import aiservices")  # with --cached, these write the .pyc files
    import_ms(FLOOR)
    loaded = subprocess.run(
        [sys.executable, "-c", "import aiservices, sys; print(' '.join(sys.modules))"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    found = [m for m in loaded if m.split(".")[0] in HEAVY]
    ours: list[float] = []
    floor: list[float] = []
    for _ in range(runs):
        ours.append(import_ms("import aiservices"))
        floor.append(import_ms(FLOOR))
    for name, samples in (("import aiservices", ours), ("pydantic + one model", floor)):
        print(
            f"{name:<22} median {statistics.median(samples):6.1f} ms   "
            f"min {min(samples):6.1f} ms   max {max(samples):6.1f} ms"
        )
    print(f"ratio of medians {statistics.median(ours) / statistics.median(floor):.2f}")
    print("heavy modules loaded:", ", ".join(found) if found else "none")


if __name__ == "__main__":
    main()
