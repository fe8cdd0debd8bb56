"""Oversubscription (issue 23, item 24): a tiny Llama's step time on a loaded machine, with opscope's
default thread choice and with `--threads 1`.

One busy loop per core (`python -c "while 1: pass"`) runs throughout; `opscope profile` then profiles a
LlamaForCausalLM built from a tiny config (no download) twice, once with default threads (opscope
measures the cores other processes use and picks its thread count) and once with `--threads 1`. The step
times are read from the runs' summary.json; the loops are killed at the end, whatever happens.

    python benchmarks/threads_under_load.py [--loops N] [--steps N]

Done when: the default-thread step is within 2x of the --threads 1 one.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

LLAMA = """
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    def get_model():
        torch.manual_seed(0)
        config = LlamaConfig(vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                             num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64)
        return LlamaForCausalLM(config).eval()

    def get_inputs():
        return [torch.randint(0, 256, (2, 32))]
"""


def profile(model: Path, out: Path, extra: list[str], steps: int) -> dict:
    env = dict(os.environ, PYTHONPATH=str(ROOT), COLUMNS="160")
    proc = subprocess.run([sys.executable, "-m", "opscope", "profile", str(model), "--steps", str(steps),
                           "--out", str(out), *extra], env=env, capture_output=True, text=True, timeout=900)
    if proc.returncode != 0:
        raise SystemExit(f"opscope profile failed ({proc.returncode}):\n{proc.stderr}")
    summary = json.loads((out / "summary.json").read_text())
    meta = json.loads((out / "meta.json").read_text())
    notes = [line for line in proc.stderr.splitlines() if line.startswith("opscope:")]
    return {"step_ms": summary["step_time_us"] / 1e3, "threads": meta.get("threads"),
            "noise": (summary.get("noise") or {}).get("verdict"), "notes": notes}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--loops", type=int, default=os.cpu_count() or 2, help="busy loops (default: one per core)")
    parser.add_argument("--steps", type=int, default=10)
    args = parser.parse_args()
    loops = [subprocess.Popen([sys.executable, "-c", "while 1: pass"]) for _ in range(args.loops)]
    try:
        with tempfile.TemporaryDirectory(prefix="opscope-bench-") as tmp:
            folder = Path(tmp)
            model = folder / "tiny_llama.py"
            model.write_text(textwrap.dedent(LLAMA).lstrip())
            default = profile(model, folder / "default", [], args.steps)
            one = profile(model, folder / "one", ["--threads", "1"], args.steps)
    finally:
        for p in loops:
            p.kill()
        for p in loops:
            p.wait()
    print(f"{args.loops} busy loops on {os.cpu_count()} cores, tiny LlamaForCausalLM, {args.steps} steps")
    for label, r in (("default threads", default), ("--threads 1", one)):
        print(f"  {label:16} {r['step_ms']:8.2f} ms per step  ({r['threads']} threads, noise {r['noise']})")
        for note in r["notes"]:
            print(f"      {note}")
    ratio = default["step_ms"] / one["step_ms"]
    print(f"  ratio default / --threads 1: {ratio:.2f}x ({'within' if ratio <= 2 else 'NOT within'} 2x)")


if __name__ == "__main__":
    main()
