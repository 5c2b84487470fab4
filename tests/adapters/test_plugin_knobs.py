"""A plugin sampler's own knob at the front doors that take any knob by name: LiteLLM's keyword
arguments (through ``chat.request_params``) reach the sampler, and a misspelled one is refused there
with the nearest name, as a built-in knob is."""

import os

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
def widest():
    plugins.load_plugins()
    plugins.pm.register(Plugin(), name="widest-plugin")
    Widest.seen.clear()
    yield Widest
    plugins.pm.unregister(name="widest-plugin")


def test_litellm_passes_a_plugin_knob_to_the_sampler_and_refuses_it_misspelled(dream_chat, widest):
    model, messages = f"dlm/{dream_chat}", [{"role": "user", "content": "hi"}]
    knobs = {"max_tokens": 8, "block_length": 8, "sampler": "widest", "ignore_eos": True}
    litellm.completion(model=model, messages=messages, width=4, **knobs)
    assert widest.seen == [4, 4]                              # 8 slots, 4 a pass
    widest.seen.clear()
    litellm.completion(model=model, messages=messages, **knobs)
    assert widest.seen == [1] * 8                             # unset: its declared default
    with pytest.raises(litellm.BadRequestError, match="Did you mean 'width'"):
        litellm.completion(model=model, messages=messages, widht=4, **knobs)
