"""The golden run files: every real trace and Nsight file in tests/fixtures analyzed, and each run file's
SHA-256 (meta.json without its creation time and target path). tests/run/test_golden.py checks the current
code against tests/fixtures/golden/run_files.json; `python tests/golden.py` rewrites that file, for a change
that is meant to change numbers (say so in the commit)."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

TESTS = Path(__file__).resolve().parent
FIXTURES = TESTS / "fixtures"
GOLDEN = FIXTURES / "golden" / "run_files.json"
TRACE_FOLDERS = ("traces", "cpu_traces", "compile", "distributed", "h200", "profile")
NCU_CSV = FIXTURES / "nsight" / "h100_bert-small_ncu_raw.csv"
BERT = FIXTURES / "traces" / "h100_bert-small_bf16.json.gz"
VOLATILE_META = ("created", "target")  # the time of the run and where its input was


def cases(work: Path) -> dict[str, list[str]]:
    """{case name: `opscope analyze` arguments (without --out)}; `work` holds the inputs built here."""
    out = {f"{folder}/{path.name.removesuffix('.json.gz')}": [str(path)]
           for folder in TRACE_FOLDERS for path in sorted((FIXTURES / folder).glob("*.json.gz"))}
    out["ranks"] = [str(FIXTURES / "distributed")]
    out["ncu-csv"] = [str(NCU_CSV)]
    out["bert-with-ncu"] = [str(BERT), "--ncu", str(NCU_CSV)]
    sys.path.insert(0, str(TESTS))
    from nsight_fixtures import build_nsys_sqlite

    out["nsys-export"] = [str(build_nsys_sqlite(work / "profile.sqlite"))]
    return out


def digest(run: Path) -> dict[str, str]:
    """{path inside the run: SHA-256} of every file of the run directory (ranks/<r>/ included)."""
    out = {}
    for path in sorted(p for p in run.rglob("*") if p.is_file()):
        data = path.read_bytes()
        if path.name == "meta.json":
            meta = json.loads(data)
            for key in VOLATILE_META:
                meta.pop(key, None)
            data = json.dumps(meta, indent=2).encode()
        out[path.relative_to(run).as_posix()] = hashlib.sha256(data).hexdigest()
    return out


def analyze(args: list[str], out: Path) -> subprocess.CompletedProcess[str]:
    """`opscope analyze ARGS --out OUT` with an empty cache of its own, as the goldens were written: no
    calibration, so CPU peaks are unknown (a calibration cached by an earlier test, which a quiet machine
    keeps, would change the CPU traces' run files)."""
    env = dict(os.environ, OPSCOPE_CACHE_DIR=str(out.parent / f"{out.name}.empty-cache"))
    return subprocess.run([sys.executable, "-m", "opscope", "analyze", *args, "--out", str(out)],
                          capture_output=True, text=True, env=env, timeout=600)


def main() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        golden = {}
        for name, args in cases(work).items():
            run = work / "runs" / name.replace("/", "_")
            proc = analyze(args, run)
            if proc.returncode != 0:
                raise SystemExit(f"{name}: {proc.stderr}")
            golden[name] = digest(run)
    GOLDEN.parent.mkdir(exist_ok=True)
    GOLDEN.write_text(json.dumps(golden, indent=1, sort_keys=True) + "\n")
    print(f"{GOLDEN}: {len(golden)} runs, {sum(map(len, golden.values()))} files")


if __name__ == "__main__":
    main()
