"""Splits a JSON document's one large array (a Chrome trace's "traceEvents") into windows of whole
elements while its text streams in, so that a trace is decoded without holding its text whole.

No tokenizer runs in Python: a window is cut after a "}" that is followed by "," and "{" (where one
event ends and the next begins), and the cut is proved by decoding the window: a "}" inside a string or
a nested object leaves the window unbalanced, the decoder refuses it, and the cut moves back to the
previous candidate. Whatever this cannot split (text that is not valid JSON, an array of non-objects,
a key it cannot find) raises NotStreamable, and the caller reads the document whole instead (where its
repairs and its messages live).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Generator, Iterator
from typing import TypeVar

import msgspec

T = TypeVar("T")

WINDOW = 4 << 20  # bytes of elements decoded at a time: big enough to amortise a decode call
_MAX_HEAD = 64 << 20  # the most text that may come before the array (deviceProperties & co. are small)
_WHITESPACE = b" \t\r\n"
_BOM = b"\xef\xbb\xbf"
_NEXT_ELEMENT = re.compile(rb"[ \t\r\n]*,[ \t\r\n]*\{")
_LAST_ELEMENT_END = re.compile(rb"\}[ \t\r\n]*\]")


class NotStreamable(Exception):
    """The text cannot be split as it streams: read it whole."""


class _Text:
    """The text read so far that is not yet consumed, and the stream it comes from."""

    def __init__(self, chunks: Iterator[bytes | bytearray]) -> None:
        self.chunks = chunks
        self.buf = bytearray()
        self.pos = 0  # consumed up to here
        self.eof = False

    def more(self) -> bool:
        """Reads one more chunk; False at the end of the stream."""
        if self.eof:
            return False
        chunk = next(self.chunks, None)
        if chunk is None:
            self.eof = True
            return False
        self.buf += chunk  # in place: positions into the buffer stay valid until compact()
        return True

    def compact(self) -> None:
        """Drops the consumed text, so the buffer stays about a window long (positions shift)."""
        if self.pos > WINDOW:
            del self.buf[:self.pos]
            self.pos = 0

    def skip_whitespace(self) -> int:
        """Position of the next byte that is not whitespace (reading as needed); len(buf) at the end."""
        while True:
            n = len(self.buf)
            i = self.pos
            while i < n and self.buf[i] in _WHITESPACE:
                i += 1
            if i < n or not self.more():
                self.pos = i
                return i


def split_array(chunks: Iterator[bytes | bytearray], key: bytes, decode: Callable[[bytes], T],
                decode_top: Callable[[bytes], object]) -> Generator[T, None, bytes]:
    """Yields decode(b"[" + elements + b"]") for successive windows of the array under the top-level
    `key` (or of the document itself when it is an array), and returns the document with that array
    emptied (b"[]"), for `decode_top` to read its other keys. `decode` must raise msgspec.DecodeError
    for text that is not whole elements; `decode_top` is used to prove where the array starts."""
    text = _Text(chunks)
    head = _head(text, key, decode_top)
    yield from _elements(text, decode)
    while text.more():  # the rest of the document after the array
        pass
    tail = bytes(text.buf[text.pos:])
    if head == b"[":
        if tail.strip(_WHITESPACE):
            raise NotStreamable("text after the array")
        return b"[]"
    return head + b'"' + key + b'":[]' + tail


def _head(text: _Text, key: bytes, decode_top: Callable[[bytes], object]) -> bytes:
    """The document's text before the array's key (b"[" when the document is the array); leaves `text`
    at the array's first element."""
    start = text.skip_whitespace()
    if text.buf[start:start + 3] == _BOM:
        text.pos = start + 3
        start = text.skip_whitespace()
    if text.buf[start:start + 1] == b"[":
        text.pos = start + 1
        return b"["
    if text.buf[start:start + 1] != b"{":
        raise NotStreamable("not a JSON object or array")
    pattern = re.compile(rb'"' + re.escape(key) + rb'"[ \t\r\n]*:[ \t\r\n]*\[')
    searched = start
    while True:
        m = pattern.search(text.buf, searched)
        if m is None:
            if len(text.buf) > _MAX_HEAD or not text.more():
                raise NotStreamable(f"no {key.decode()!r} array near the start")
            searched = max(start, len(text.buf) - len(key) - 64)
            continue
        head = bytes(text.buf[start:m.start()])
        try:  # at the top level only if the text before it and an empty array make a document
            decode_top(head + b'"' + key + b'":[]}')
        except msgspec.DecodeError:
            searched = m.start() + 1
            continue
        text.pos = m.end()
        return head


def _elements(text: _Text, decode: Callable[[bytes], T]) -> Iterator[T]:
    """Windows of whole elements, decoded; leaves `text` just after the array's closing bracket."""
    first = True
    while True:
        text.compact()
        i = text.skip_whitespace()
        if not first:
            if text.buf[i:i + 1] == b",":
                text.pos = i + 1
                i = text.skip_whitespace()
            elif text.buf[i:i + 1] != b"]":
                raise NotStreamable("elements not separated by commas")
        first = False
        if text.buf[i:i + 1] == b"]":
            text.pos = i + 1
            return
        if i >= len(text.buf):
            raise NotStreamable("the text ends inside the array")
        while len(text.buf) - i < WINDOW and text.more():
            pass
        window = _cut(text, i, decode)
        if window is None:
            raise NotStreamable("no element boundary")
        yield window


def _cut(text: _Text, start: int, decode: Callable[[bytes], T]) -> T | None:
    """Decodes the longest run of whole elements from `start` within a window (growing the window for
    an element longer than one) and moves past it."""
    buf = text.buf
    end = min(len(buf), start + WINDOW)
    while True:
        at = buf.rfind(b"}", start, end)
        while at >= 0:
            if _NEXT_ELEMENT.match(buf, at + 1):
                try:
                    out = decode(b"[" + bytes(buf[start:at + 1]) + b"]")
                except msgspec.DecodeError:
                    at = buf.rfind(b"}", start, at)
                    continue
                text.pos = at + 1
                return out
            at = buf.rfind(b"}", start, at)
        # no boundary within the window: one element longer than it, or the array's last ones
        if end < len(buf) or text.more():
            end = min(len(buf), end + WINDOW)
            continue
        return _last(text, start, decode)


def _last(text: _Text, start: int, decode: Callable[[bytes], T]) -> T | None:
    """The array's last elements: up to a "}" followed by the closing "]"."""
    buf = text.buf
    m = _LAST_ELEMENT_END.search(buf, start)
    while m is not None:
        try:
            out = decode(b"[" + bytes(buf[start:m.start() + 1]) + b"]")
        except msgspec.DecodeError:
            m = _LAST_ELEMENT_END.search(buf, m.start() + 1)
            continue
        text.pos = m.start() + 1
        return out
    return None
