"""Replicas behind LiteLLM's router, with the deployment list and router settings of
docs/replicas.yaml: two real ``dlm serve`` processes take 64 concurrent clients through the router while
faulty clients (malformed, oversized, unauthorised, dropped streams) hit each replica directly, 0
requests lost and each output equal to its solo run; with one replica killed the retries carry every request to the other,
and LiteLLM's health check names the dead one."""

from __future__ import annotations

import asyncio
import os
import sys
from pathlib import Path

import pytest

yaml = pytest.importorskip("yaml")
litellm = pytest.importorskip("litellm")
httpx = pytest.importorskip("httpx")
os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")      # offline: no cost-map download

from dlm_backend.engine.checkpoint.folder import EMBEDDED_MODEL  # noqa: E402
ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))
from loadgen import FAULT_STATUSES, chat_once, faulty_clients, launch  # noqa: E402  (benchmarks/loadgen.py)

KEY = "sk-replicas"
PROMPTS = ["Hi!", "Who are you?", "What is 7 plus 5?", "Name 3 colors.", "Thanks!", "Hello", "Goodbye!",
           "What is your name?"]
CLIENTS = 64
SERVE = ("--api-key", KEY, "--max-body-bytes", "65536")     # the faulty clients' oversized body is 100 kB
KNOBS = {"max_tokens": 24, "temperature": 0}


def _router(urls: list[str]):
    """docs/replicas.yaml's router, pointed at the replicas launched here."""
    config = yaml.safe_load((ROOT / "docs" / "replicas.yaml").read_text())
    deployments = []
    for d, url in zip(config["model_list"], urls):
        params = {**d["litellm_params"], "api_base": url + "/v1", "api_key": KEY, "model": "openai/m"}
        deployments.append({"model_name": d["model_name"], "litellm_params": params})
    return litellm.Router(model_list=deployments, **config["router_settings"])


@pytest.fixture(scope="module")
def replicas(dream_chat):
    model = EMBEDDED_MODEL if (EMBEDDED_MODEL / "model.safetensors").exists() else dream_chat
    with launch(str(model), *SERVE) as a, launch(str(model), *SERVE) as b:
        yield a, b


async def _solo(url: str) -> dict[str, str]:
    async with httpx.AsyncClient(base_url=url, timeout=600, headers={"Authorization": f"Bearer {KEY}"}) as client:
        return {p: (await chat_once(client, p, stream=False, **KNOBS)).text for p in PROMPTS}


async def _load(router) -> list[tuple[str, str | None]]:
    async def one(prompt):
        try:
            r = await router.acompletion(model="dlm", messages=[{"role": "user", "content": prompt}], **KNOBS)
            return prompt, r.choices[0].message.content
        except Exception:  # noqa: BLE001 - a lost request, counted below
            return prompt, None
    return await asyncio.gather(*(one(PROMPTS[i % len(PROMPTS)]) for i in range(CLIENTS)))


async def test_the_router_spreads_a_load_over_two_replicas_and_loses_nothing(replicas):
    solo = await _solo(replicas[0])
    router = _router(list(replicas))
    got, bad = await asyncio.gather(_load(router), asyncio.gather(*(_faults(url) for url in replicas)))
    assert bad == [FAULT_STATUSES] * 2
    assert [text is not None for _, text in got] == [True] * CLIENTS, "0 lost"
    assert [text for _, text in got] == [solo[p] for p, _ in got]
    async with httpx.AsyncClient(headers={"Authorization": f"Bearer {KEY}"}) as client:
        generated = [_counter((await client.get(url + "/metrics")).text, "dlm_generated_tokens_total")
                     for url in replicas]
    assert generated[1] > 0 and generated[0] > sum(len(t) for t in solo.values()) // 8, generated   # both served


async def _faults(url: str) -> list[int]:
    async with httpx.AsyncClient(base_url=url, timeout=600, headers={"Authorization": f"Bearer {KEY}"}) as client:
        return await faulty_clients(client, rounds=1, **KNOBS)


def _counter(metrics: str, name: str) -> float:
    return next(float(line.rsplit(" ", 1)[1]) for line in metrics.splitlines() if line.startswith(name + " "))


async def test_with_one_replica_gone_retries_carry_every_request_and_the_health_check_says_which(dream_chat):
    model = EMBEDDED_MODEL if (EMBEDDED_MODEL / "model.safetensors").exists() else dream_chat
    with launch(str(model), "--api-key", KEY) as alive, launch(str(model), "--api-key", KEY) as doomed:
        solo = await _solo(alive)
    # Leaving the block stopped both: `doomed` stays down (its port refuses), one replica comes back up.
    with launch(str(model), "--api-key", KEY) as alive:
        router = _router([alive, doomed])
        got = await _load(router)
        assert [text for _, text in got] == [solo[p] for p, _ in got], "0 lost, every output its solo run"
        from litellm.proxy.health_check import perform_health_check

        healthy, unhealthy, *_ = await perform_health_check(router.model_list)
        assert [e["api_base"] for e in healthy] == [alive + "/v1"], unhealthy
        assert [e["api_base"] for e in unhealthy] == [doomed + "/v1"]
