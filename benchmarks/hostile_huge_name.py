"""A trace whose op name is huge (issue 23, item 1): what it costs to analyze and report.

Builds a small gzip trace from a real one (tests/fixtures/cpu_traces) whose first
`aten::threshold_backward` event (a leaf op: its row is in the top 15 by self time) is renamed to
`aten::` + a name of --mib MiB, then runs, each as a fresh `python -m opscope` process (for two such
traces: the name one letter repeated, about 100 KB gzipped, the issue's file, which expands more than
500x and so is refused as a gzip bomb (issue 23, item 2); and the name random letters, which gzip
cannot shrink much, so that the name reaches the run and its display):

- analyze:      `opscope analyze TRACE --out RUN` (console report to a pipe, COLUMNS=120);
- report:       `opscope report RUN`;
- report_html:  `opscope report RUN --html -o FILE`;

printing each one's wall time, peak RSS (from wait4), exit code and output size; then the same three
once more under a 1.5 GB address-space limit (RLIMIT_AS), printing the exit code and whether a Python
traceback appeared. Goal: each under 30 s and 1 GB RSS, and no traceback under the limit.

    python benchmarks/hostile_huge_name.py [--mib 50]
"""

from __future__ import annotations

import argparse
import gzip
import os
import re
import resource
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SOURCE = ROOT / "tests" / "fixtures" / "cpu_traces" / "avx2_channels_last_after_train.json.gz"
ADDRESS_SPACE_LIMIT = int(1.5 * (1 << 30))


LETTERS = bytes(range(97, 123))


def huge_name_trace(path: Path, mib: float, source: Path = SOURCE, random_letters: bool = False) -> None:
    """Writes `source` with its first `"name": "aten::threshold_backward"` replaced by a name of `mib` MiB
    (one letter repeated, or random letters), gzipped."""
    text = gzip.decompress(source.read_bytes()).decode()
    size = int(mib * (1 << 20))
    body = (bytes(LETTERS[b % 26] for b in os.urandom(size)).decode() if random_letters else "n" * size)
    huge = "aten::" + body
    text, n = re.subn(r'"name": "aten::threshold_backward"', lambda _m: f'"name": "{huge}"', text, count=1)
    assert n == 1, f"{source} has no aten::threshold_backward event"
    path.write_bytes(gzip.compress(text.encode(), compresslevel=1 if random_letters else 6))


def _limit_address_space() -> None:
    resource.setrlimit(resource.RLIMIT_AS, (ADDRESS_SPACE_LIMIT, ADDRESS_SPACE_LIMIT))


def run_opscope(args: list[str], preexec: Callable[[], None] | None = None) -> tuple[float, float, int, str, int]:
    """(wall seconds, peak RSS MiB, exit code, stderr, stdout bytes) of one `python -m opscope ARGS`."""
    env = {**os.environ, "COLUMNS": "120"}
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        start = time.perf_counter()
        proc = subprocess.Popen([sys.executable, "-m", "opscope", *args], stdout=out, stderr=err, env=env,
                                preexec_fn=preexec)
        _, status, usage = os.wait4(proc.pid, 0)
        wall = time.perf_counter() - start
        size = out.tell()
        err.seek(0)
        return wall, usage.ru_maxrss / 1024, os.waitstatus_to_exitcode(status), err.read().decode(errors="replace"), size


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--mib", type=float, default=50.0, help="size of the op name in MiB")
    parser.add_argument("--build", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--random", action="store_true", help=argparse.SUPPRESS)
    a = parser.parse_args()
    if a.build is not None:
        huge_name_trace(a.build, a.mib, random_letters=a.random)
        return
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        for kind in ("repeated", "random"):
            trace = work / f"huge_name_{kind}.json.gz"
            # built in a process of its own: a child's peak RSS (wait4) can include this process's pages
            subprocess.run([sys.executable, __file__, "--build", str(trace), "--mib", str(a.mib),
                            *(["--random"] if kind == "random" else [])], check=True)
            print(f"\n== trace: {trace.stat().st_size / 1e3:.0f} KB gzipped, one op name of {a.mib:g} MiB of "
                  f"{'random letters' if kind == 'random' else 'one letter repeated'}")
            run_all(trace, work / kind)


def run_all(trace: Path, work: Path) -> None:
    work.mkdir()
    for limited in (False, True):
        run, html = work / ("run_limited" if limited else "run"), work / ("limited.html" if limited else "r.html")
        commands = {"analyze": ["analyze", str(trace), "--out", str(run)], "report": ["report", str(run)],
                    "report_html": ["report", str(run), "--html", "-o", str(html)]}
        print("\nunder RLIMIT_AS 1.5 GB" if limited else "\nno limit")
        print(f"{'command':<12} {'wall s':>8} {'peak RSS MiB':>13} {'rc':>4} {'stdout KB':>10}  traceback")
        for label, args in commands.items():
            wall, rss, rc, err, size = run_opscope(args, _limit_address_space if limited else None)
            traceback = "Traceback" in err
            print(f"{label:<12} {wall:>8.1f} {rss:>13.0f} {rc:>4} {size / 1e3:>10.1f}  {'YES' if traceback else 'no'}")
            if rc != 0 or traceback:
                print("   stderr: " + err.strip()[-300:].replace("\n", "\n   "))


if __name__ == "__main__":
    main()
