"""What reaches the server before a route does: Host header, exposure without a key, half-open
connections, bodies that never arrive, the connection cap, and a model that cannot load."""

from __future__ import annotations

import socket
import threading
import time

import pytest

pytest.importorskip("fastapi", reason="install the [server] extra")
httpx = pytest.importorskip("httpx")
uvicorn = pytest.importorskip("uvicorn")

from dlm_backend.server import create_app  # noqa: E402
from dlm_backend.server.settings import ServerConfig  # noqa: E402
from dlm_backend.server.connections import GuardedH11Protocol  # noqa: E402
from tests.helpers import free_port, serve_in_thread  # noqa: E402


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
    monkeypatch.setattr(GuardedH11Protocol, "body_timeout_s", 0.5)
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
    """Whether the server closes ``sock`` within ``within`` s (what it still sends is read past)."""
    deadline = time.monotonic() + within
    try:
        while True:
            sock.settimeout(max(deadline - time.monotonic(), 0.001))
            if sock.recv(4096) == b"":
                return True
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
    time.sleep(0.05)
    extra = socket.create_connection(("127.0.0.1", port))
    assert _closed(held[0], 0.2) and not _closed(extra, 0.1)      # past the cap: the oldest stalled one goes
    for s in held + [slow, silent, extra]:
        s.close()
    time.sleep(0.2)
    assert httpx.get(f"http://127.0.0.1:{port}/health").status_code == 200  # whole requests still served


def test_bodies_that_never_arrive_are_closed_and_cannot_lock_clients_out(guarded_server):
    """A POST whose body never came was held 40 s; 1,030 of them locked every client out."""
    port = guarded_server
    head = (b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
            b"Content-Length: 1000\r\n\r\n")
    slow = []
    for _ in range(20):                                      # 2.5 times the cap of 8
        sock = socket.create_connection(("127.0.0.1", port))
        sock.sendall(head + b'{"model": ')                  # the head and a little of the body
        slow.append(sock)
    t = time.perf_counter()
    assert httpx.get(f"http://127.0.0.1:{port}/health", timeout=2).status_code == 200    # not locked out
    assert all(_closed(sock, 1.5) for sock in slow) and time.perf_counter() - t < 2.5   # body deadline 0.5 s
    with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=2) as client:   # a keep-alive connection
        assert client.get("/health").status_code == 200
        idle = socket.create_connection(("127.0.0.1", port))
        idle.sendall(b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
        assert idle.recv(1024).startswith(b"HTTP/1.1 200")
        assert _closed(idle, 1.5)                          # idle after its response: closed, no pinning
    for sock in slow + [idle]:
        sock.close()


def test_a_lazy_server_whose_model_is_missing_answers_503_without_its_path(tmp_path):
    missing = tmp_path / "secret-folder" / "model"
    app = create_app(config=ServerConfig(model=str(missing), served_name="m"))
    with serve_in_thread(app) as url:
        r = httpx.post(url + "/v1/chat/completions", json={"model": "m", "messages": [{"role": "user", "content": "hi"}]})
    assert r.status_code == 503 and "secret-folder" not in r.text and r.headers.get("retry-after")
