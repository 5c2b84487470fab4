"""The `dlm` command, run as a user runs it."""

import json
import subprocess
import sys

from tests.helpers import PARITY


def dlm(*args, stdin=None):
    return subprocess.run([sys.executable, "-m", "dlm_backend.cli", *args], input=stdin,
                          capture_output=True, text=True, timeout=300)


def test_models_lists_architectures():
    result = dlm("models")
    assert result.returncode == 0
    assert "LLaDAModelLM" in result.stdout and "DreamModel" in result.stdout


def test_plugins_lists_builtins_and_samplers():
    data = json.loads(dlm("plugins").stdout)
    assert "llada" in data["samplers"]
    assert any(p["name"] == "dlm_backend.engine.samplers" for p in data["plugins"])


def test_generate_streams_text_with_stats(dream_chat):
    result = dlm("generate", str(dream_chat), "Name three prime numbers.", "--max-tokens", "16",
                 "--block-length", "8", "--stats")
    assert result.returncode == 0, result.stderr
    stats = json.loads(result.stderr.strip().splitlines()[-1])
    assert stats["forward_passes"] >= 1 and stats["finish_reason"] in ("stop", "length")


def test_chat_reads_turns_from_stdin(dream_chat):
    result = dlm("chat", str(dream_chat), "--max-tokens", "8", "--block-length", "8",
                 stdin="hello\nand again\n/exit\n")
    assert result.returncode == 0, result.stderr
    assert len(result.stdout.strip().splitlines()) >= 1


def test_errors_are_one_clear_line():
    result = dlm("generate", str(PARITY / "llada-tiny"), "hi")
    assert result.returncode == 2
    assert result.stderr.startswith("error: ") and "tokenizer.json" in result.stderr
    assert "Traceback" not in result.stderr


def test_a_reader_that_leaves_early_gets_no_traceback(tmp_path):
    """`dlm generate ... | head -c1`: a BrokenPipeError traceback once the reader was gone."""
    err = tmp_path / "stderr"
    cmd = (f"'{sys.executable}' -m dlm_backend.cli generate 'Name three colors.' --max-tokens 128 "
           f"2>'{err}' | head -c1")
    out = subprocess.run(["bash", "-c", cmd], capture_output=True, text=True, timeout=300)
    assert len(out.stdout) == 1 and "Traceback" not in err.read_text(), err.read_text()


def test_input_that_is_not_utf8_is_read(tmp_path):
    out = subprocess.run([sys.executable, "-m", "dlm_backend.cli", "chat"], input=b"hi\xff there\n/exit\n",
                         capture_output=True, timeout=300)
    assert out.returncode == 0 and b"Traceback" not in out.stderr, out.stderr.decode(errors="replace")


def test_every_knob_is_a_flag_and_the_server_limits_come_from_the_engine():
    from dlm_backend.cli import build_parser
    from dlm_backend.engine.engine_config import EngineLimits
    from dlm_backend.engine.params import KNOBS

    parser = build_parser()
    generate = parser.parse_args(["generate", "hi"])
    assert all(hasattr(generate, name) and getattr(generate, name) is None for name in KNOBS)
    serve = parser.parse_args(["serve"])                  # a limit left out keeps the engine's own
    assert all(getattr(serve, name) is None for name in vars(EngineLimits()))
    bad = dlm("generate", "hi", "--thresold", "0.5")
    assert bad.returncode == 2 and "--threshold" in bad.stderr          # argparse names the near flag
    assert dlm("generate", "hi", "--cache", "paged").returncode == 2
