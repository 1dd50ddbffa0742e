"""Run one benchmark's scenarios in several processes at once, round by round.

Each contender is a worker process: this checkout, another git ref of it (exported to a
temporary directory and put first on the worker's ``sys.path``), or a peer library. The
parent asks each worker in turn for one round of one scenario, so a change in the
machine's load spoils every contender alike; each keeps its best round. Compare the
ratios this prints, never lone absolute times.

A benchmark module using this defines ``scenarios(contender) -> dict[name, call] | None``
and calls :func:`main` from its ``__main__`` block.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
Scenarios = dict[str, Callable[[int], Any]]


def measure(call: Callable[[int], Any], n: int) -> tuple[float, float]:
    """Median and p90 of per-call microseconds over ``n`` calls (after a warm-up)."""
    for i in range(min(n, 200)):
        call(i)
    samples: list[float] = []
    gc.collect()
    gc.disable()
    try:
        clock = time.perf_counter_ns
        for i in range(n):
            start = clock()
            call(i)
            samples.append((clock() - start) / 1000)
    finally:
        gc.enable()
    samples.sort()
    return statistics.median(samples), samples[int(len(samples) * 0.9)]


def export(ref: str, into: Path) -> Path:
    """The ``aiservices`` package of ``ref``, written under ``into``."""
    archive = subprocess.run(
        ["git", "-C", str(ROOT), "archive", "--format=tar", ref, "aiservices"],
        check=True,
        capture_output=True,
    ).stdout
    target = into / ref.replace("/", "_")
    target.mkdir(parents=True)
    with tempfile.TemporaryFile() as raw:
        raw.write(archive)
        raw.seek(0)
        with tarfile.open(fileobj=raw) as tar:
            tar.extractall(target, filter="data")
    return target


class Worker:
    """One contender's process, answering "scenario n" lines with a JSON measurement."""

    def __init__(self, script: Path, label: str, contender: str, path: Path | None) -> None:
        self.label = label
        env = dict(os.environ)
        if path is not None:
            env["PYTHONPATH"] = os.pathsep.join([str(path), env.get("PYTHONPATH", "")])
        self.process = subprocess.Popen(
            [sys.executable, str(script), "--worker", contender],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            env=env,
        )
        self.names: list[str] = json.loads(self._read())  # the worker's first line

    def _read(self) -> str:
        assert self.process.stdout is not None
        answer = self.process.stdout.readline()
        if not answer:
            raise RuntimeError(f"{self.label}: the worker ended")
        return answer

    def _ask(self, line: str) -> str:
        assert self.process.stdin is not None
        self.process.stdin.write(line + "\n")
        self.process.stdin.flush()
        return self._read()

    def measure(self, scenario: str, n: int) -> tuple[float, ...]:
        """The worker's figures for one round of ``scenario``, in the order it gives them."""
        return tuple(json.loads(self._ask(f"{scenario} {n}")))

    def close(self) -> None:
        if self.process.stdin is not None:
            self.process.stdin.close()
        self.process.wait(10)


def serve(scenarios: Callable[[str], Scenarios | None], contender: str) -> None:
    """The worker's side: build the contender's scenarios, then measure on request."""
    table = scenarios(contender) or {}
    out = sys.stdout
    out.write(json.dumps(sorted(table)) + "\n")
    out.flush()
    for line in sys.stdin:
        name, n = line.split()
        out.write(json.dumps(measure(table[name], int(n))) + "\n")
        out.flush()


def main(
    script: str,
    scenarios: Callable[[str], Scenarios | None],
    *,
    names: Sequence[str],
    peers: Sequence[str] = (),
    slow: Sequence[str] = (),
    rounds: int = 7,
    default_n: int = 2000,
) -> dict[str, dict[str, tuple[float, ...]]]:
    """Parse the command line and run, or serve as a worker; return the best rounds.

    ``peers`` are contenders measured beside this checkout with ``--peers``; ``slow`` ones
    run two rounds of a tenth of the calls.
    """
    parser = argparse.ArgumentParser(description=sys.modules["__main__"].__doc__)
    parser.add_argument("n", nargs="?", type=int, default=default_n, help="calls per round")
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    parser.add_argument(
        "--against", action="append", default=[], metavar="REF", help="a git ref to compare"
    )
    parser.add_argument("--peers", action="store_true", help="also measure the peer libraries")
    parser.add_argument("--rounds", type=int, default=rounds, help="interleaved rounds")
    args = parser.parse_args()
    if args.worker is not None:
        serve(scenarios, args.worker)
        return {}
    with tempfile.TemporaryDirectory() as temporary:
        contenders: list[tuple[str, str, Path | None]] = [("this", "aiservices", ROOT)]
        contenders += [(ref, "aiservices", export(ref, Path(temporary))) for ref in args.against]
        if args.peers:
            contenders += [(peer, peer, None) for peer in peers]
        workers = [Worker(Path(script).resolve(), *c) for c in contenders]
        results: dict[str, dict[str, tuple[float, ...]]] = {}
        try:
            for worker in workers:
                if not worker.names:
                    print(f"{worker.label}: not installed, skipped")
            for scenario in names:
                for round_ in range(args.rounds):
                    for worker in workers:
                        is_slow = worker.label in slow
                        if scenario not in worker.names or (is_slow and round_ >= 2):
                            continue
                        found = worker.measure(
                            scenario, max(200, args.n // 10) if is_slow else args.n
                        )
                        best = results.setdefault(worker.label, {}).get(scenario)
                        if best is None or found[0] < best[0]:
                            results[worker.label][scenario] = found
        finally:
            for worker in workers:
                worker.close()
    _report(results, names)
    return results


def _report(results: dict[str, dict[str, tuple[float, ...]]], names: Sequence[str]) -> None:
    mine = results.get("this", {})
    print(f"\n{'scenario':<8} {'contender':<18} {'median us':>10} {'p90 us':>10} {'this / it':>10}")
    for scenario in names:
        for label, table in results.items():
            if scenario not in table:
                continue
            median, p90 = table[scenario]
            ratio = "" if label == "this" else f"{mine[scenario][0] / median:.3f}"
            print(f"{scenario:<8} {label:<18} {median:>10.2f} {p90:>10.2f} {ratio:>10}")
