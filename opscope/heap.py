"""How opscope's own processes (the CLI, its worker processes) ask glibc's malloc to keep large blocks
apart, so that analyzing a large trace does not pile up freed memory that the process keeps.

glibc serves a request above its mmap threshold (128 KiB at start) from a mapping of its own, returned to
the system when freed, and grown in place (mremap). But each time such a block is freed it raises the
threshold to that block's size, up to 32 MiB: after the first large list is freed, a table's columns
(lists and typed arrays of a few MiB) come from the heap instead, where each growth copies the block and
leaves its old place free, and what is freed stays with the process. On the 20x scaling trace
(benchmarks/analyze_scaling.py) that took the peak from about 330 to 390 MiB, and 1x's from 85 to 97.
Fixing the threshold at its starting value keeps the first behaviour. Library code never calls this: a
notebook's process is its user's.
"""

from __future__ import annotations

import ctypes
import sys

M_MMAP_THRESHOLD = -3  # mallopt's parameter number (malloc.h)
MMAP_THRESHOLD = 128 << 10  # glibc's own starting value, kept from here on


def keep_large_blocks_apart() -> bool:
    """Fixes glibc's mmap threshold at 128 KiB for this process; True where it did (Linux with glibc), False
    elsewhere (another C library, another system: nothing to do)."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        mallopt = ctypes.CDLL(None).mallopt  # the process's own symbols: its C library's
    except (OSError, AttributeError):  # musl and others: no mallopt
        return False
    mallopt.argtypes = (ctypes.c_int, ctypes.c_int)
    mallopt.restype = ctypes.c_int
    return bool(mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD))
