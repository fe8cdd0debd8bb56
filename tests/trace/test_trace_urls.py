"""Traces by URL (opscope.trace.location): streamed through fsspec, the same run as the local file, one
redacted line on failure."""

from __future__ import annotations

import gzip
import uuid
from pathlib import Path

import fsspec
import pytest

import opscope
from opscope.errors import TraceError
from opscope.trace.location import Url, local_path, redact, url_of
from opscope.trace.reader import read_bytes
from tests.conftest import TRACES, run_cli

BERT = TRACES / "h100_bert-small_bf16.json.gz"
# meta.json's creation time differs between any two runs; its target says where the trace was read from
_VARYING = ("created", "target")


def _same_run(a: Path, b: Path) -> None:
    names = sorted(p.name for p in a.iterdir())
    assert names == sorted(p.name for p in b.iterdir())
    for name in names:
        if name == "meta.json":
            ma, mb = opscope.load(a).meta, opscope.load(b).meta
            assert {k: v for k, v in ma.items() if k not in _VARYING} == \
                   {k: v for k, v in mb.items() if k not in _VARYING}
        elif name == "trace.json.gz":
            assert gzip.decompress((a / name).read_bytes()) == gzip.decompress((b / name).read_bytes())
        else:
            assert (a / name).read_bytes() == (b / name).read_bytes(), name


@pytest.fixture
def memory_url():
    """A fresh folder on fsspec's in-memory file system; removed afterwards."""
    fs = fsspec.filesystem("memory")
    root = f"/opscope-test-{uuid.uuid4().hex}"
    yield fs, root
    fs.rm(root, recursive=True)


def test_a_memory_url_gives_the_run_of_the_local_file(tmp_path, memory_url):
    fs, root = memory_url
    fs.pipe(f"{root}/bert.json.gz", BERT.read_bytes())
    local = opscope.analyze(BERT, out=tmp_path / "local")
    remote = opscope.analyze(f"memory://{root}/bert.json.gz", out=tmp_path / "remote")
    assert remote.meta["target"] == f"memory://{root}/bert.json.gz"
    assert remote.summary == local.summary
    _same_run(tmp_path / "local", tmp_path / "remote")
    # the run keeps the bytes as they were fetched (read once, not fetched again)
    assert (tmp_path / "remote" / "trace.json.gz").read_bytes() == BERT.read_bytes()


def test_an_uncompressed_trace_by_url(tmp_path, memory_url):
    fs, root = memory_url
    fs.pipe(f"{root}/bert.json", gzip.decompress(BERT.read_bytes()))
    local = opscope.analyze(BERT, out=tmp_path / "local")
    remote = opscope.analyze(f"memory://{root}/bert.json", out=tmp_path / "remote")
    assert remote.summary == local.summary


def test_a_file_url_gives_the_same_run_as_the_path(tmp_path):
    path = tmp_path / "my traces" / "bert.json.gz"  # a space: percent-escaped in the URL
    path.parent.mkdir()
    path.write_bytes(BERT.read_bytes())
    url = "file://" + str(path).replace(" ", "%20")
    by_path = run_cli("analyze", str(path), "--out", str(tmp_path / "by_path"), "--json")
    by_url = run_cli("analyze", url, "--out", str(tmp_path / "by_url"), "--json")
    assert by_path.returncode == 0 and by_url.returncode == 0, by_url.stderr
    assert opscope.load(tmp_path / "by_url").meta["target"] == str(path)
    _same_run(tmp_path / "by_path", tmp_path / "by_url")


def test_fsspecs_local_file_system(tmp_path):
    """local:// is fsspec's own local file system: the stream path, not the path shortcut of file://."""
    run = opscope.analyze(f"local://{BERT}", out=tmp_path / "run")
    assert run.meta["target"] == f"local://{BERT}"
    assert run.summary == opscope.analyze(BERT, out=tmp_path / "local").summary


def test_a_missing_url_is_one_line(tmp_path):
    proc = run_cli("analyze", f"local://{tmp_path}/missing.json.gz", "--out", str(tmp_path / "run"))
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == [f"opscope: error: no such trace file: local://{tmp_path}/missing.json.gz"]
    assert not (tmp_path / "run").exists()


def test_credentials_are_never_shown(tmp_path):
    url = "https://alice:hunter2@127.0.0.1:9/job/trace.json.gz?X-Amz-Signature=SECRETSIG&X-Amz-Credential=AKIDX"
    proc = run_cli("analyze", url, "--out", str(tmp_path / "run"))
    assert proc.returncode == 2
    assert len(proc.stderr.strip().splitlines()) == 1
    for secret in ("alice", "hunter2", "SECRETSIG", "AKIDX"):
        assert secret not in proc.stderr + proc.stdout
    assert "https://127.0.0.1:9/job/trace.json.gz" in proc.stderr


def test_redaction():
    text = "GET https://bob:pw@h.example/a/b.json?sig=s3cr3t#frag failed; see s3://bucket/k?versionId=1"
    shown = redact(text)
    assert "pw" not in shown and "s3cr3t" not in shown and "bob" not in shown and "versionId" not in shown
    assert "https://h.example/a/b.json" in shown and "s3://bucket/k" in shown
    assert Url("s3://bucket/run/rank0.json.gz").name == "rank0.json.gz"
    assert url_of("file:///tmp/x") is None and url_of("/tmp/x") is None and url_of("gs://b/x") == "gs://b/x"
    assert local_path("file:///tmp/a%20b.json") == "/tmp/a b.json"
    with pytest.raises(TraceError, match="another host"):
        local_path("file://otherhost/tmp/x.json")


def test_the_size_guards_hold_for_urls(memory_url):
    fs, root = memory_url
    fs.pipe(f"{root}/big.json", b'{"traceEvents": [' + b" " * 5000 + b"]}")
    with pytest.raises(TraceError, match="over the 1e-06 GB limit"):
        read_bytes(Url(f"memory://{root}/big.json"), max_bytes=1000)
    # a gzip stream is inflated as it arrives, and refused once it passes the limit
    fs.pipe(f"{root}/big.json.gz", gzip.compress(b'{"traceEvents": [' + b"0," * 50_000 + b"0]}"))
    with pytest.raises(TraceError, match="decompresses to more than"):
        read_bytes(Url(f"memory://{root}/big.json.gz"), max_bytes=10_000)


def test_options_for_local_files_are_refused_for_urls_in_one_line(memory_url):
    fs, root = memory_url
    fs.pipe(f"{root}/job/rank0.json.gz", BERT.read_bytes())
    with pytest.raises(opscope.OpscopeError, match="local trace"):
        opscope.analyze(f"memory://{root}/job/rank0.json.gz", torch_trace=BERT)
    with pytest.raises(opscope.OpscopeError, match="folder of ranks"):
        opscope.analyze(f"memory://{root}/job/rank0.json.gz", workers=2)
    with pytest.raises(opscope.OpscopeError, match="not supported"):
        opscope.load(f"memory://{root}/job")


def test_a_url_read_twice_keeps_one_copy(tmp_path, memory_url):
    """Text that needs repairs is read again, whole: the run's copy of the trace is still the trace once."""
    fs, root = memory_url
    text = gzip.decompress(BERT.read_bytes()).replace(b'"dur": ', b'"dur": NaN, "x": ', 1)
    fs.pipe(f"{root}/nan.json", text)
    run = opscope.analyze(f"memory://{root}/nan.json", out=tmp_path / "run")
    assert any("NaN" in w for w in run.warnings)
    assert gzip.decompress((tmp_path / "run" / "trace.json.gz").read_bytes()) == text
