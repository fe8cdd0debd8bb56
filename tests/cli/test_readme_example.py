"""The README's example is what `opscope analyze` prints: every line of its console block but the elisions
(`…`) and the run directory's name comes out of the command at the block's width."""

from __future__ import annotations

import os
import subprocess
import sys

from conftest import REPO


def test_the_readme_example_is_the_commands_output(tmp_path):
    text = (REPO / "README.md").read_text()
    start = text.index("```console\n") + len("```console\n")
    block = text[start:text.index("```", start)].splitlines()
    command = block[0].removeprefix("$ ").split()
    assert command[:2] == ["opscope", "analyze"]
    width = max(len(line) for line in block)
    env = {**os.environ, "COLUMNS": str(width)}
    proc = subprocess.run([sys.executable, "-m", "opscope", *command[1:], "--out", str(tmp_path / "run")],
                          cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    printed = {line.rstrip() for line in proc.stdout.splitlines()}
    shown = [line.rstrip() for line in block[1:] if line.strip() != "…" and not line.startswith("run directory:")]
    missing = [line for line in shown if line not in printed]
    assert not missing, "README.md's example no longer matches the output:\n" + "\n".join(missing)
