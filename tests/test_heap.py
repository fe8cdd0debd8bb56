"""opscope.heap: the CLI's and its workers' processes keep large blocks apart, so that freed columns go
back to the system (glibc's own rule keeps them in the heap once a large block has been freed)."""

from __future__ import annotations

import platform
import subprocess
import sys
import textwrap

import pytest

from opscope.heap import keep_large_blocks_apart

GLIBC = sys.platform.startswith("linux") and platform.libc_ver()[0] == "glibc"

# A fresh process: frees a 16 MiB block (glibc then serves blocks up to that size from its heap), then
# allocates six 4 MiB blocks, each followed by a small one that stays, and frees the large ones.
PROBE = textwrap.dedent("""
    import sys
    def rss_mib():
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * 4096 / 2**20
    if sys.argv[1] == "apart":
        from opscope.heap import keep_large_blocks_apart
        assert keep_large_blocks_apart()
    first = bytearray(16 << 20)
    del first
    before = rss_mib()
    blocks = []
    for _ in range(6):
        blocks.append(bytearray(4 << 20))
        blocks[-1][::4096] = b"x" * (1 << 10)  # touched: resident
        blocks.append(bytearray(200 << 10))
    del blocks[0::2]
    print(rss_mib() - before)
""")


def _kept_mib(mode: str) -> float:
    out = subprocess.run([sys.executable, "-c", PROBE, mode], capture_output=True, text=True, check=True)
    return float(out.stdout)


@pytest.mark.skipif(not GLIBC, reason="glibc's malloc only")
def test_freed_large_blocks_go_back_to_the_system():
    assert _kept_mib("apart") < 6  # of 24 MiB freed: the small blocks (1.2 MiB) and slack stay
    assert _kept_mib("default") > 18  # the rule it changes: glibc alone keeps them


def test_elsewhere_it_does_nothing_and_says_so():
    assert keep_large_blocks_apart() is GLIBC
