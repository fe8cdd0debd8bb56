"""How long one piece of outside text (a name, path, module path or message from a trace, a model or the
command line) may be where opscope keeps and shows it: a run's files keep up to MAX_TEXT_CHARS of it,
the renderers show up to DISPLAY_TEXT_CHARS. Nothing downstream then costs more than linear time in a
bounded length, whatever an input holds (a 50 MiB op name took minutes and gigabytes in the console)."""

from __future__ import annotations

import os

# The most of one text a run keeps: far above any real name (the longest CUDA kernel names, templated
# CUTLASS ones, are a few KiB) and below the 131,072 characters Python's csv module reads in one field.
MAX_TEXT_CHARS = 65_536
# The most of one text a renderer shows (console, HTML): longer than any message opscope writes.
DISPLAY_TEXT_CHARS = 2_000


def bounded(text: str, limit: int = MAX_TEXT_CHARS) -> str:
    """`text`, or when longer than `limit` its start and end around a marker that gives its full length
    (both ends: an op's namespace and a location's line number stay readable). At most `limit`
    characters (`limit` >= 40)."""
    if len(text) <= limit:
        return text
    marker = f"…[cut from {len(text):,} characters]…"
    keep = limit - len(marker)
    head = keep - keep // 3
    return text[:head] + marker + text[len(text) - (keep - head):]


# What the OS accepts of a path (Linux, macOS): a longer name or path is ENAMETOOLONG wherever it is used
# (stat, open, mkdir), so paths from the user are checked once where they enter (opscope.cli).
NAME_MAX_BYTES = 255
PATH_MAX_BYTES = 4095


def path_problem(path: str | os.PathLike[str]) -> str | None:
    """Why the OS would refuse `path`, or None: one of its names is over NAME_MAX_BYTES, or it is over
    PATH_MAX_BYTES made absolute."""
    raw = os.fsencode(path)
    longest = max(raw.split(b"/"), key=len)
    if len(longest) > NAME_MAX_BYTES:
        name = bounded(os.fsdecode(longest), 40)
        return f"a name in it ({name}) is {len(longest):,} bytes long, over the {NAME_MAX_BYTES} bytes file systems allow"
    size = len(os.fsencode(os.path.abspath(raw)))
    if size > PATH_MAX_BYTES:
        return f"it is {size:,} bytes long made absolute, over the {PATH_MAX_BYTES:,} bytes the OS allows"
    return None
