"""How long one piece of outside text (a name, path, module path or message from a trace, a model or the
command line) may be where opscope keeps and shows it: a run's files keep up to MAX_TEXT_CHARS of it,
the renderers show up to DISPLAY_TEXT_CHARS. Nothing downstream then costs more than linear time in a
bounded length, whatever an input holds (a 50 MiB op name took minutes and gigabytes in the console)."""

from __future__ import annotations

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
