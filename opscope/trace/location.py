"""Where a trace is: a local path, or a URL read through fsspec (s3://, gs://, https://, memory://, ...).

A URL stays text (`Url`): `Path` would fold its "//". It is opened as a stream, so the reader inflates
and decodes it as it arrives, never holding the compressed file whole. What opscope shows of a URL
(`Url.shown`, `redact`) drops its user name, password, query and fragment: a pre-signed URL carries its
credentials there, and no line opscope prints or writes may repeat them.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlsplit

from opscope.errors import TraceError
from opscope.limits import bounded

_SCHEME = re.compile(r"^([A-Za-z][A-Za-z0-9+.\-]*)://")
# URLs inside other text (an fsspec or HTTP library's error message): redacted before it is shown
_URL_IN_TEXT = re.compile(r"\b[A-Za-z][A-Za-z0-9+.\-]*://[^\s'\"<>]+")
# what a user installs for a scheme fsspec cannot open by itself
_SCHEME_PACKAGES = {"s3": "s3fs", "s3a": "s3fs", "gs": "gcsfs", "gcs": "gcsfs", "az": "adlfs", "abfs": "adlfs",
                    "abfss": "adlfs", "http": "aiohttp", "https": "aiohttp", "hf": "huggingface_hub"}


class Url(str):
    """A trace (or folder of traces) given as a URL."""

    @property
    def scheme(self) -> str:
        m = _SCHEME.match(self)
        return m.group(1).lower() if m else ""

    @property
    def name(self) -> str:
        """The last segment of its path, as Path.name gives for a file."""
        return unquote(urlsplit(self).path.rstrip("/").rsplit("/", 1)[-1])

    @property
    def shown(self) -> str:
        """The URL without credentials, query or fragment: what messages and run files record."""
        return redact_url(self)

    def joinpath(self, name: str) -> Url:
        return Url(self.rstrip("/") + "/" + name)


def url_of(text: str) -> Url | None:
    """`text` as a Url when it is one (a scheme followed by "://"), else None. file:// URLs are not
    Urls: `local_path` turns them into paths."""
    m = _SCHEME.match(text)
    if m is None or m.group(1).lower() == "file":
        return None
    return Url(text)


def local_path(text: str) -> str:
    """A file:// URL as the local path it names (percent-escapes decoded); other text as it is. A file
    URL of another host is refused: opscope reads that host's files through its own file system URL."""
    m = _SCHEME.match(text)
    if m is None or m.group(1).lower() != "file":
        return text
    parts = urlsplit(text)
    if parts.netloc not in ("", "localhost"):
        raise TraceError(f"{redact_url(text)}: a file:// URL of another host ({bounded(parts.netloc, 40)!r}); "
                         "give a path on this machine")
    return unquote(parts.path) or "/"


def redact_url(url: str) -> str:
    """scheme://host[:port]/path: the URL without user, password, query or fragment."""
    try:
        parts = urlsplit(url)
    except ValueError:
        return bounded(url.split("?", 1)[0].split("#", 1)[0], 200)
    host = parts.hostname or ""
    if parts.port is not None:
        host += f":{parts.port}"
    cut = " (query left out)" if parts.query else ""
    return bounded(f"{parts.scheme}://{host}{parts.path}", 200) + cut


def redact(text: str) -> str:
    """`text` with every URL in it redacted (redact_url)."""
    return _URL_IN_TEXT.sub(lambda m: redact_url(m.group(0)), text)


def _filesystem(url: Url) -> tuple[Any, str]:
    """fsspec's file system for the URL's scheme, and the path within it; one line when fsspec, or the
    package behind the scheme, is missing."""
    try:
        from fsspec.core import url_to_fs
    except ImportError:
        raise TraceError(f"{url.shown}: reading traces from URLs needs fsspec: pip install 'opscope[url]'") from None
    try:
        return url_to_fs(str(url))
    except ImportError as exc:
        package = _SCHEME_PACKAGES.get(url.scheme)
        if package is None:
            raise TraceError(f"{url.shown}: {bounded(redact(str(exc)), 200)}") from None
        raise TraceError(f"{url.shown}: fsspec needs {package} for {url.scheme}:// URLs: pip install {package}") from None
    except ValueError as exc:  # an unknown protocol
        raise TraceError(f"{url.shown}: {bounded(redact(str(exc)), 200)}") from None


def _failure(url: Url, exc: BaseException) -> TraceError:
    if isinstance(exc, FileNotFoundError):
        return TraceError(f"no such trace file: {url.shown}")
    if isinstance(exc, IsADirectoryError):
        return TraceError(f"{url.shown} is a directory, not a trace file")
    message = bounded(redact(str(exc)), 200) or type(exc).__name__
    return TraceError(f"cannot read {url.shown}: {message}")


def url_info(url: Url) -> tuple[str, int | None]:
    """("file" or "directory", size in bytes when known) of what the URL names."""
    fs, path = _filesystem(url)
    try:
        info = fs.info(path)
    except Exception as exc:  # noqa: BLE001 (each file system raises its own; all mean "cannot read")
        raise _failure(url, exc) from None
    kind = "directory" if info.get("type") == "directory" else "file"
    size = info.get("size")
    return kind, size if isinstance(size, int) and kind == "file" else None


def list_url_folder(url: Url) -> list[tuple[Url, bool]]:
    """The entries of a folder URL: (URL, whether it is itself a folder), sorted by name."""
    fs, path = _filesystem(url)
    try:
        entries = fs.ls(path, detail=True)
    except Exception as exc:  # noqa: BLE001
        raise _failure(url, exc) from None
    out = []
    base = url.rstrip("/")
    for entry in entries:
        full = str(entry.get("name", "")).rstrip("/")
        if full == path.rstrip("/"):
            continue  # some file systems list a folder's own entry
        out.append((Url(f"{base}/{full.rsplit('/', 1)[-1]}"), entry.get("type") == "directory"))
    return sorted(out)


@contextmanager
def open_url(url: Url) -> Iterator[Stream]:
    """The URL's bytes as a stream (read in blocks as the reader asks; nothing is fetched whole)."""
    fs, path = _filesystem(url)
    try:
        f = fs.open(path, "rb")
    except Exception as exc:  # noqa: BLE001
        raise _failure(url, exc) from None
    try:
        yield Stream(f, url)
    finally:
        with suppress(Exception):  # closing a read stream: nothing to lose
            f.close()


class Stream:
    """A stream whose read errors are one TraceError line (redacted), as a local file's OSError is."""

    def __init__(self, f: Any, url: Url) -> None:
        self._f = f
        self._url = url

    def read(self, n: int = -1) -> bytes:
        try:
            data = self._f.read(n)
        except Exception as exc:  # noqa: BLE001
            raise _failure(self._url, exc) from None
        return bytes(data)


def display(location: Path | Url) -> str:
    """What messages and run files say for a trace's location."""
    return location.shown if isinstance(location, Url) else str(location)
