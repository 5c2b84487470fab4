"""A plugin sampler's own knob at the front doors that take any knob by name: LiteLLM's keyword
arguments, an adapter's extra knobs and the server's body reach the sampler, and a misspelled one is
refused there with the nearest name, as a built-in knob is."""

import os
import shutil

import pytest

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
litellm = pytest.importorskip("litellm", reason="install the [litellm] extra")

import dlm_backend.adapters.litellm  # noqa: E402,F401  (registers the dlm provider)
from dlm_backend import hookimpl, plugins  # noqa: E402
from dlm_backend.engine.params import Knob  # noqa: E402
from dlm_backend.engine.samplers import Commit, Sampler  # noqa: E402


class Widest(Sampler):
    """Commit the ``width`` leftmost masked slots with their argmax; records the widths it read."""

    name = "widest"
    knobs = {"width": Knob("widest: slots a pass", int, low=1, high=16, default=1)}
    seen: list = []

    def step(self, inp):
        width = inp.params.get("width")
        self.seen.append(width)
        chosen = list(range(min(width, len(inp.positions))))
        return Commit(chosen, inp.logits[chosen].argmax(dim=-1).tolist())


class Plugin:
    @hookimpl
    def register_samplers(self, register):
        register("widest", Widest)


@pytest.fixture
def fresh_chat(dream_chat, tmp_path):
    """A checkpoint no engine has loaded yet: an engine takes the samplers registered when it loads."""
    return shutil.copytree(dream_chat, tmp_path / "m")


@pytest.fixture
def widest():
    plugins.load_plugins()
    plugins.pm.register(Plugin(), name="widest-plugin")
    Widest.seen.clear()
    yield Widest
    plugins.pm.unregister(name="widest-plugin")


def test_litellm_passes_a_plugin_knob_to_the_sampler_and_refuses_it_misspelled(fresh_chat, widest):
    model, messages = f"dlm/{fresh_chat}", [{"role": "user", "content": "hi"}]
    knobs = {"max_tokens": 8, "block_length": 8, "sampler": "widest", "ignore_eos": True}
    litellm.completion(model=model, messages=messages, width=4, **knobs)
    assert widest.seen == [4, 4]                              # 8 slots, 4 a pass
    widest.seen.clear()
    litellm.completion(model=model, messages=messages, **knobs)
    assert widest.seen == [1] * 8                             # unset: its declared default
    with pytest.raises(litellm.BadRequestError, match="Did you mean 'width'"):
        litellm.completion(model=model, messages=messages, widht=4, **knobs)


def test_an_adapter_and_the_server_take_a_plugin_knob_and_refuse_it_misspelled(fresh_chat, widest):
    from dlm_backend.adapters.langchain import ChatDLM
    from dlm_backend.errors import SamplingParamsError
    from dlm_backend.server import create_app
    from dlm_backend.server.settings import ServerConfig
    import httpx
    from tests.helpers import serve_in_thread

    knobs = {"max_tokens": 8, "block_length": 8, "sampler": "widest", "ignore_eos": True}
    chat = ChatDLM(model=str(fresh_chat), **knobs)        # constructor fields: the built-in knobs
    chat.invoke("hi", width=2)                            # a call's knobs: any registered one
    assert widest.seen == [2] * 4
    with pytest.raises(SamplingParamsError, match="width must be in"):
        chat.invoke("hi", width=0)
    widest.seen.clear()
    body = {"model": "tiny", "messages": [{"role": "user", "content": "hi"}], **knobs}
    with serve_in_thread(create_app(config=ServerConfig(model=str(fresh_chat), served_name="tiny"))) as url:
        assert httpx.post(url + "/v1/chat/completions", json={**body, "width": 8}, timeout=60).status_code == 200
        bad = httpx.post(url + "/v1/chat/completions", json={**body, "widht": 8}, timeout=60)
    assert widest.seen == [8]
    assert bad.status_code == 400 and "Did you mean 'width'" in bad.json()["error"]["message"]
