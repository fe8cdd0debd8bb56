"""A gzip bomb against `opscope analyze`: a 4 GB stream of spaces (one gzip member, ~4 MB on disk) after
a valid start. It must be refused in one line (exit 2) before it costs memory: the reader counts the
compressed bytes its inflater actually took in (not its read-ahead), and whitespace-only streams trip
the check early (issue 23, item 2; the bound asked for is 600 MB peak RSS).

The bomb is built streamed (compressobj, 1 MB at a time) in a temporary folder; `opscope analyze`
runs in a subprocess, whose peak RSS is RUSAGE_CHILDREN's ru_maxrss.

    python benchmarks/hostile_trace_bomb.py [--gb 4] [--level 9]
"""

from __future__ import annotations

import argparse
import resource
import subprocess
import sys
import tempfile
import time
import zlib
from pathlib import Path


def write_bomb(path: Path, gb: float, level: int = 9) -> int:
    """`{"traceEvents": [` + `gb` GB of spaces + `]}`, gzipped as one member; returns its size on disk."""
    spaces = b" " * (1 << 20)
    deflate = zlib.compressobj(level, zlib.DEFLATED, 31)  # wbits 31: a gzip member
    with open(path, "wb") as f:
        f.write(deflate.compress(b'{"traceEvents": ['))
        for _ in range(int(gb * 1e9) >> 20):
            f.write(deflate.compress(spaces))
        f.write(deflate.compress(b"]}"))
        f.write(deflate.flush())
    return path.stat().st_size


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--gb", type=float, default=4.0, help="decompressed size of the bomb (default 4)")
    ap.add_argument("--level", type=int, default=9, choices=range(1, 10), metavar="1-9",
                    help="gzip level (default 9: ~1000x; 1 gives ~230x, under the ratio limit: the whitespace check "
                         "refuses it)")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="opscope-bomb-") as tmp:
        bomb = Path(tmp) / "bomb.json.gz"
        t = time.perf_counter()
        size = write_bomb(bomb, args.gb, args.level)
        print(f"bomb: {args.gb:g} GB of spaces in {size / 1e6:.1f} MB of gzip (built in {time.perf_counter() - t:.1f} s)")
        t = time.perf_counter()
        proc = subprocess.run([sys.executable, "-m", "opscope", "analyze", str(bomb), "--out", str(Path(tmp) / "run")],
                              capture_output=True, text=True)
        wall = time.perf_counter() - t
        rss_mb = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024  # Linux: KiB
        lines = proc.stderr.strip().splitlines()
        print(f"exit code: {proc.returncode}")
        print(f"stderr ({len(lines)} line{'s' if len(lines) != 1 else ''}): {lines[0] if lines else ''}")
        print(f"wall time: {wall:.2f} s")
        print(f"peak RSS: {rss_mb:.0f} MB (of the analyze subprocess)")
        print(f"run directory written: {(Path(tmp) / 'run').exists()}")


if __name__ == "__main__":
    main()
