"""`opscope swap --kernel bias_gelu` against a direct timing of the same swap, side by side.

The model is Linear(IN, HIDDEN) -> F.gelu(approximate="tanh") -> Linear(HIDDEN, IN) on a [ROWS, IN]
input, in inference mode. First `opscope swap MODEL --kernel bias_gelu --json` runs as a user would run
it (a subprocess) and its end-to-end speedup is read from swap.json. Then the same model is built here,
the same swap written out by hand (the up projection without its bias, then the bundled kernel, as the
swap does; no opscope machinery), and the forward is timed directly: original and swapped
alternate call by call, the order flipping each round, so load on the machine hits both alike, with
glibc keeping freed big blocks as in opscope's timing. The
direct speedup is original median / swapped median, as opscope's (the median of the per-round ratios
is printed too). Both run with the same thread count. opscope's figure should be within 15% of the
direct one.

    python benchmarks/bias_gelu_swap.py [--rows 4096] [--in-features 128] [--hidden 4096] [--threads 1] [--rounds 41]
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

os.environ.setdefault("KINETO_LOG_LEVEL", "6")  # as the CLI does: no kineto line per profiler start/stop

import torch  # noqa: E402

MODEL = """
    import torch
    import torch.nn as nn
    import torch.nn.functional as F

    class LinearGeluLinear(nn.Module):
        def __init__(self):
            super().__init__()
            self.up = nn.Linear({in_features}, {hidden})
            self.down = nn.Linear({hidden}, {in_features})

        def forward(self, x):
            return self.down(F.gelu(self.up(x), approximate="tanh"))

    def get_model():
        torch.manual_seed(0)
        return LinearGeluLinear()

    def get_inputs():
        torch.manual_seed(1)
        return [torch.randn({rows}, {in_features})]
"""


def opscope_speedup(model_file: Path, threads: int, repeats: int) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "run"
        cmd = [sys.executable, "-m", "opscope", "swap", str(model_file), "--kernel", "bias_gelu", "--threads",
               str(threads), "--repeats", str(repeats), "--out", str(out), "--json"]
        # the same opscope as this process imports (not whichever one the working directory holds)
        import opscope

        source = str(Path(opscope.__file__).resolve().parent.parent)
        env = {**os.environ, "PYTHONPATH": os.pathsep.join([source, os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep)}
        proc = subprocess.run(cmd, capture_output=True, text=True, check=False, cwd=tmp, env=env)
        if proc.returncode != 0:
            raise SystemExit(f"opscope swap failed (exit {proc.returncode}):\n{proc.stderr[-3000:]}")
        (result,) = json.loads(proc.stdout)["results"]
        if result["status"] != "passed":
            raise SystemExit(f"the swap did not pass: {result['message']}")
        return dict(result["end_to_end"])


def _keep_freed_blocks() -> None:
    """As opscope swap's timing does (glibc): freed big blocks stay in the process, so the page faults of
    each step's fresh 64 MiB intermediate do not set the times."""
    try:
        libc = ctypes.CDLL("libc.so.6")
        libc.mallopt(-4, 0)        # M_MMAP_MAX
        libc.mallopt(-1, 1 << 30)  # M_TRIM_THRESHOLD
    except (OSError, AttributeError):
        pass


def direct_speedup(model_file: Path, threads: int, rounds: int) -> tuple[float, float, float]:
    """(original median ms, swapped median ms, median of per-round ratios). The swap is written out by
    hand (the up projection without its bias, then the bundled kernel), not applied through opscope's
    swap machinery: an independent check of what opscope measures."""
    import reference_kernels
    from opscope.target.model_file import load_target

    torch.set_num_threads(threads)
    _keep_freed_blocks()
    target = load_target(model_file)
    model = target.model.eval()
    (x,) = target.args
    bias_gelu = reference_kernels.load("bias_gelu")
    up, down = model.up, model.down

    def original() -> None:
        with torch.inference_mode():
            model(x)

    def swapped() -> None:
        with torch.inference_mode():
            down(bias_gelu(torch.nn.functional.linear(x, up.weight), up.bias, "tanh"))

    with torch.inference_mode():
        want = model(x)
        got = down(bias_gelu(torch.nn.functional.linear(x, up.weight), up.bias, "tanh"))
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)

    for fn in (original, swapped, original, swapped, original, swapped):  # warm up
        fn()
    times: dict[str, list[float]] = {"original": [], "swapped": []}
    sides = {"original": original, "swapped": swapped}
    for r in range(rounds):
        for name in (["original", "swapped"] if r % 2 == 0 else ["swapped", "original"]):
            t0 = time.perf_counter()
            sides[name]()
            times[name].append(time.perf_counter() - t0)
    ratios = [o / s for o, s in zip(times["original"], times["swapped"], strict=True)]
    return (statistics.median(times["original"]) * 1e3, statistics.median(times["swapped"]) * 1e3,
            statistics.median(ratios))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", type=int, default=4096)
    ap.add_argument("--in-features", type=int, default=128)
    ap.add_argument("--hidden", type=int, default=4096)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--rounds", type=int, default=41,
                    help="interleaved rounds of each timing (opscope swap's --repeats, and the direct one's)")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        model_file = Path(tmp) / "linear_gelu_linear.py"
        model_file.write_text(textwrap.dedent(MODEL.format(rows=args.rows, in_features=args.in_features,
                                                           hidden=args.hidden)))
        print(f"torch {torch.__version__}, {args.threads} thread(s), {os.cpu_count()} CPUs; "
              f"x [{args.rows},{args.in_features}] -> Linear({args.in_features},{args.hidden}) -> gelu(tanh) "
              f"-> Linear({args.hidden},{args.in_features}), inference")
        e2e = opscope_speedup(model_file, args.threads, args.rounds)
        orig_ms, swapped_ms, direct = direct_speedup(model_file, args.threads, args.rounds)
    reported = e2e["speedup"]
    print(f"opscope swap end to end: {e2e['original']['median_ms']:.1f} ms -> {e2e['swapped']['median_ms']:.1f} ms, "
          f"{reported:.2f}x{' (noise)' if e2e['within_noise'] else ''} over {e2e['repeats']} rounds")
    same = orig_ms / swapped_ms  # opscope's estimator: original median / swapped median
    print(f"direct, alternating:     {orig_ms:.1f} ms -> {swapped_ms:.1f} ms, {same:.2f}x over {args.rounds} rounds "
          f"(median of the per-round ratios: {direct:.2f}x)")
    print(f"opscope / direct: {reported / same:.3f} ({100 * (reported / same - 1):+.1f}%); against the per-round "
          f"median: {reported / direct:.3f} ({100 * (reported / direct - 1):+.1f}%)")


if __name__ == "__main__":
    main()
