"""Bad command lines are one line on stderr with exit 2, like every other bad input."""

from __future__ import annotations

import pytest

from conftest import assert_clean_error, run_cli, write_model


@pytest.mark.parametrize("args,needles", [
    (("profile", "x.py", "--mode", "sideways"), ("--mode", "sideways")),
    (("profile", "x.py", "--threads", "99999999999"), ("--threads", "4096")),
    (("profile", "x.py", "--threads", "0"), ("--threads",)),
    (("calibrate", "--threads", "99999999999"), ("--threads",)),
    (("profile", "x.py", "--steps", "0"), ("--steps",)),
    (("profile", "x.py", "--warmup", "-1"), ("--warmup",)),
    (("profile", "x.py", "--compile", "fastest"), ("--compile", "'fastest' is not one of", "max-autotune")),
    (("profile", "x.py", "--bogus"), ("--bogus",)),
    (("analyze",), ("Missing argument",)),
    (("nosuch",), ("No such command",)),
    (("analyze", "t.json", "--peak-bw", "fast"), ("--peak-bw",)),
])
def test_usage_errors_are_one_line(tmp_path, args, needles):
    line = assert_clean_error(run_cli(*args, cwd=tmp_path), *needles)
    assert line.endswith("--help`)") and "opscope " in line


@pytest.mark.parametrize("extra,needle", [(("--script",), "not to a script"),
                                          (("--nproc-per-node", "2"), "does not apply to --nproc-per-node"),
                                          (("--try-swaps",), "cannot be combined with --compile")])
def test_compile_applies_to_a_model_file_in_one_process(tmp_path, extra, needle):
    model = write_model(tmp_path, """
        def get_model(): ...
        def get_inputs(): ...
    """)
    assert_clean_error(run_cli("profile", str(model), "--compile", "default", *extra, cwd=tmp_path), "--compile", needle)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model.py"]


def test_help_and_version_still_work(tmp_path):
    assert run_cli("--version", cwd=tmp_path).stdout.startswith("opscope ")
    help_text = run_cli("profile", "--help", cwd=tmp_path)
    assert help_text.returncode == 0 and "--threads" in help_text.stdout


def test_help_never_wraps_inside_a_word():
    """click breaks a word longer than the help column: `profile --help` printed "(to" / "rch.autograd…"."""
    import typer

    from opscope.cli.app import app

    command = typer.main.get_command(app)
    for name, sub in command.commands.items():
        for text in [sub.help or ""] + [getattr(p, "help", None) or "" for p in sub.params]:
            long_words = [w for w in text.split() if len(w) > 40]  # the help column is 44 wide at 80 columns
            assert not long_words, (name, long_words)
