"""`dlm demo` end to end on the embedded model: four front doors answer, each with its passes per
token, and nothing leaves the machine (only loopback connections, for the in-process server)."""

import importlib.util
import re
import socket

import pytest

from dlm_backend import cli, demo
from dlm_backend.errors import DLMError

LOOPBACK = {"127.0.0.1", "::1", "localhost"}


@pytest.fixture
def offline(monkeypatch):
    """Refuses, and records, every connection and name lookup that is not loopback."""
    attempts = []
    connect, connect_ex, getaddrinfo = socket.socket.connect, socket.socket.connect_ex, socket.getaddrinfo

    def remote(address) -> bool:
        return isinstance(address, tuple) and address[0] not in LOOPBACK

    def guarded(real):
        def call(sock, address):
            if remote(address):
                attempts.append(address)
                raise OSError(f"network disabled in this test: {address}")
            return real(sock, address)
        return call

    def lookup(host, *args, **kwargs):
        if host not in LOOPBACK and host is not None:
            attempts.append(host)
            raise socket.gaierror(f"name lookup disabled in this test: {host}")
        return getaddrinfo(host, *args, **kwargs)

    monkeypatch.setattr(socket.socket, "connect", guarded(connect))
    monkeypatch.setattr(socket.socket, "connect_ex", guarded(connect_ex))
    monkeypatch.setattr(socket, "getaddrinfo", lookup)
    return attempts


def test_the_demo_answers_at_every_front_door_with_passes_per_token_and_no_network(offline, capsys):
    results = demo.main(progress=False)
    out = capsys.readouterr().out
    assert not offline, f"the demo reached for the network: {offline}"
    assert len(results) == len(demo.STEPS) == 4
    for step in results:
        assert step.answer.strip(), step
        assert step.tokens > 0 and step.passes > 0, step
    blocks = re.split(r"^\[\d/4\] ", out, flags=re.MULTILINE)[1:]
    assert len(blocks) == 4, out
    for block in blocks:                      # each step printed its answer and its passes per token
        assert re.search(r"^\s+answer: \S", block, re.MULTILINE), block
        assert re.search(r"\d+ tokens in \d+ forward passes .*: \d+\.\d\d passes per token, "
                         r"\d+\.\d+x fewer passes than one token per pass", block), block
    assert re.search(r"^total: \d+ tokens in \d+ forward passes", out, re.MULTILINE), out


def test_a_missing_framework_names_its_pip_extra(monkeypatch, capsys):
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name == "llama_index.core" else real(name, *a))
    with pytest.raises(DLMError, match=r'LlamaIndex .*dlm_backend\[llamaindex\].*dlm_backend\[demo\]'):
        demo.require_frameworks()
    assert cli.main(["demo"]) == 2                    # the command says so before loading anything
    assert "dlm_backend[llamaindex]" in capsys.readouterr().err


def test_dlm_demo_is_a_subcommand():
    assert cli.build_parser().parse_args(["demo"]).func is cli.cmd_demo
