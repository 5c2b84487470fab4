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


def test_serve_with_a_kv_cache_under_the_minimum_is_one_error_line(tmp_path):
    """`dlm serve --kv-cache-memory 786432` ended in a traceback (the load failed as a 503 meant for a
    request); a folder that is no checkpoint too."""
    for args in (("--kv-cache-memory", "786432"), ("--lazy", "--kv-cache-memory", "786432"), (str(tmp_path),)):
        result = dlm("serve", *args, "--port", "1")
        assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr
        assert result.stderr.startswith("error: ") and len(result.stderr.strip().splitlines()) == 1
        assert "--kv-cache-memory" in result.stderr or args == (str(tmp_path),)


def _serve(argv, monkeypatch):
    """``dlm serve ARGV`` up to the point it would start listening: its ServerConfig, or its exit status."""
    import uvicorn

    from dlm_backend.cli import main

    started = []
    monkeypatch.setattr(uvicorn, "run", lambda app, **kw: started.append(app.state.config))
    status = main(["serve", *argv])
    return started[0] if started else status


def test_the_api_key_comes_from_the_environment_or_a_file_and_warns_on_the_command_line(
        dream_chat, tmp_path, monkeypatch, caplog):
    """`--api-key sk-...` shows in `ps` to every user of the machine: it still works, with a warning."""
    monkeypatch.delenv("DLM_API_KEY", raising=False)
    base = [str(dream_chat), "--lazy"]
    assert _serve([*base, "--api-key", "sk-flag"], monkeypatch).api_key == "sk-flag"
    assert "--api-key puts the key on the command line" in caplog.text and "DLM_API_KEY" in caplog.text
    caplog.clear()
    (tmp_path / "key").write_text("sk-file\n")
    (tmp_path / "metrics").write_text("sk-scraper\n")
    config = _serve([*base, "--api-key-file", str(tmp_path / "key"), "--metrics-key-file", str(tmp_path / "metrics")],
                    monkeypatch)
    assert (config.api_key, config.metrics_key) == ("sk-file", "sk-scraper")
    monkeypatch.setenv("DLM_API_KEY", "sk-env")
    monkeypatch.setenv("DLM_METRICS_KEY", "sk-env-scraper")
    config = _serve(base, monkeypatch)
    assert (config.api_key, config.metrics_key, caplog.text) == ("sk-env", "sk-env-scraper", "")
    assert _serve([*base, "--api-key", "a", "--api-key-file", str(tmp_path / "key")], monkeypatch) == 2
    assert _serve([*base, "--api-key-file", str(tmp_path / "missing")], monkeypatch) == 2
    (tmp_path / "empty").write_text("\n")
    assert _serve([*base, "--api-key-file", str(tmp_path / "empty")], monkeypatch) == 2


def test_serving_unauthenticated_beyond_loopback_warns(dream_chat, monkeypatch, caplog):
    monkeypatch.delenv("DLM_API_KEY", raising=False)
    config = _serve([str(dream_chat), "--lazy", "--host", "0.0.0.0", "--allow-unauthenticated"], monkeypatch)
    assert config.api_key is None and config.allowed_hosts is None
    assert "without an API key; anyone who can reach this port can use the model" in caplog.text


def test_every_command_that_builds_an_engine_takes_quantization_from_the_methods_table():
    """generate, chat and serve build engines; each takes --quantization, whose choices are the
    methods table's (a method added there is a flag value with no edit to the CLI)."""
    from dlm_backend.cli import _llm, build_parser
    from dlm_backend.engine.quant.methods import METHODS

    parser = build_parser()
    for argv in (["generate", "hi"], ["chat"], ["serve"]):
        assert parser.parse_args(argv).quantization is None
        assert parser.parse_args([*argv, "--quantization", "int8"]).quantization == "int8"
    sub = next(a for a in parser._subparsers._group_actions).choices
    for command in ("generate", "chat", "serve"):
        flag = next(a for a in sub[command]._actions if "--quantization" in a.option_strings)
        assert flag.choices == list(METHODS)
    args = parser.parse_args(["generate", "--quantization", "int8", "hi"])
    args.model = None                                       # as cmd_generate reads it off [MODEL] PROMPT
    with _llm(args) as llm:
        assert llm.config.quantization == "int8" and llm.engine.memory.quantized
    bad = dlm("generate", "hi", "--quantization", "int3")
    assert bad.returncode == 2 and "Traceback" not in bad.stderr
    assert "invalid choice: 'int3'" in bad.stderr and all(repr(name) in bad.stderr for name in METHODS)


def test_serve_quantizes_and_reports_where_the_memory_went_at_start(monkeypatch, capsys):
    """`dlm serve --quantization int4` loads int4 weights before listening and says so in one line,
    sizes in units that fit (dlm-tiny's weights read "0.00 GiB" before)."""
    import uvicorn

    from dlm_backend.cli import main

    apps = []
    monkeypatch.setattr(uvicorn, "run", lambda app, **kw: apps.append(app))
    assert main(["serve", "--quantization", "int4", "--served-model-name", "tiny"]) == 0
    served = apps[0].state.served
    try:
        assert apps[0].state.config.quantization == "int4"
        engine = served.loaded.engine
        assert engine.config.quantization == "int4" and engine.memory.quantized
        line = capsys.readouterr().err.strip().splitlines()[-1]
        assert line.startswith(f"dlm serve: tiny loaded on {engine.device} (quantization int4): weights ")
        assert str(engine.memory) in line and " MiB (" in line and "0.00 GiB" not in line
    finally:
        served.close()
