"""What reaches the server before a route does: Host header, exposure without a key, half-open
connections, the connection cap, and a model that cannot load."""

from __future__ import annotations

import socket
import threading
import time

import pytest

pytest.importorskip("fastapi", reason="install the [server] extra")
httpx = pytest.importorskip("httpx")
uvicorn = pytest.importorskip("uvicorn")

from dlm_backend.server import create_app  # noqa: E402
from dlm_backend.server.config import ServerConfig  # noqa: E402
from dlm_backend.server.connections import GuardedH11Protocol  # noqa: E402
from dlm_backend.server.loadgen import free_port  # noqa: E402
from helpers import serve_in_thread  # noqa: E402


def test_dns_rebinding_host_names_are_refused_without_a_key(dream_chat):
    with serve_in_thread(create_app(config=ServerConfig(model=str(dream_chat), served_name="m"))) as url:
        assert httpx.get(url + "/v1/models").status_code == 200                         # 127.0.0.1:port
        assert httpx.get(url + "/v1/models", headers={"Host": "localhost:8000"}).status_code == 200
        r = httpx.get(url + "/v1/models", headers={"Host": "attacker.example:8000"})
        assert r.status_code == 421 and "attacker.example" in r.json()["error"]["message"]
        assert httpx.get(url + "/health", headers={"Host": "attacker.example"}).status_code == 200
    keyed = ServerConfig(model=str(dream_chat), served_name="m", api_key="k")            # the key protects instead
    with serve_in_thread(create_app(config=keyed)) as url:
        r = httpx.get(url + "/v1/models", headers={"Host": "api.example.com", "Authorization": "Bearer k"})
        assert r.status_code == 200


def test_serving_beyond_loopback_without_a_key_needs_a_flag(dream_chat, capsys):
    from dlm_backend.cli import main

    assert main(["serve", str(dream_chat), "--lazy", "--host", "0.0.0.0"]) == 2
    assert "--allow-unauthenticated" in capsys.readouterr().err


@pytest.fixture
def guarded_server(dream_chat, monkeypatch):
    monkeypatch.setattr(GuardedH11Protocol, "header_timeout_s", 0.5)
    monkeypatch.setattr(GuardedH11Protocol, "max_connections", 8)
    port = free_port()
    app = create_app(config=ServerConfig(model=str(dream_chat), served_name="m"))
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning",
                                           http=GuardedH11Protocol))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    while not server.started:
        time.sleep(0.02)
    yield port
    server.should_exit = True
    thread.join(10)


def _closed(sock: socket.socket, within: float) -> bool:
    sock.settimeout(within)
    try:
        return sock.recv(1) == b""
    except TimeoutError:
        return False
    except ConnectionResetError:
        return True


def test_half_open_connections_are_closed_and_capped(guarded_server):
    port = guarded_server
    slow = socket.create_connection(("127.0.0.1", port))
    slow.sendall(b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\n")            # a request head never finished
    silent = socket.create_connection(("127.0.0.1", port))                   # nothing at all
    assert _closed(slow, 3) and _closed(silent, 3)
    held = [socket.create_connection(("127.0.0.1", port)) for _ in range(8)]
    extra = socket.create_connection(("127.0.0.1", port))
    assert _closed(extra, 1)                                                 # past the cap: closed at once
    for s in held + [slow, silent, extra]:
        s.close()
    time.sleep(0.2)
    assert httpx.get(f"http://127.0.0.1:{port}/health").status_code == 200  # whole requests still served


def test_a_lazy_server_whose_model_is_missing_answers_503_without_its_path(tmp_path):
    missing = tmp_path / "secret-folder" / "model"
    app = create_app(config=ServerConfig(model=str(missing), served_name="m"))
    with serve_in_thread(app) as url:
        r = httpx.post(url + "/v1/chat/completions", json={"model": "m", "messages": [{"role": "user", "content": "hi"}]})
    assert r.status_code == 503 and "secret-folder" not in r.text and r.headers.get("retry-after")
