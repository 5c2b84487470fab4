"""A front door's call arguments in engine terms: sampling parameters, and the OpenAI fields refused."""

from __future__ import annotations

from dlm_backend.engine.params import SamplingParams, knob_values
from dlm_backend.errors import DLMError


def request_params(llm, *layers: dict, taken: tuple[str, ...] = (), where: str = "request") -> SamplingParams:
    """SamplingParams for one front-door call: each layer of knobs in turn (an adapter's fields, then
    the call's own arguments), later layers winning, over the checkpoint's decoding defaults
    (``llm.sampling_params``, the one place they are layered; dropped when the call picks another
    sampler); the knob table's defaults fill the rest.

    Names are the knob table's (``kv_cache`` for ``cache`` where the framework owns ``cache``:
    pass it in ``taken``); an unknown or misspelled knob is a DLMError naming the nearest one.
    """
    values: dict = {}
    for layer in layers:
        values.update(knob_values(layer, taken, where))
    return llm.sampling_params(**values)


#: OpenAI request fields a diffusion engine does not serve: field -> (values that ask for nothing, why).
#: A diffusion model commits tokens out of order, so it has no left-to-right per-token
#: log-probabilities; ``n`` > 1 is n requests (the engine batches them).
UNSUPPORTED: dict[str, tuple[tuple, str]] = {
    "n": ((None, 1), "one choice per request here; send the requests separately (they run batched)"),
    "best_of": ((None, 1), "one choice per request here; send the requests separately"),
    "logprobs": ((None, False), "a diffusion model does not decode left to right, so it has no per-token "
                                "log-probabilities to return"),
    "top_logprobs": ((None, 0), "a diffusion model has no per-token log-probabilities to return"),
    "echo": ((None, False), "the prompt is not returned; prepend it yourself"),
    "suffix": ((None, ""), "insertion after a suffix is not served; put the text in the prompt"),
    "presence_penalty": ((None, 0), "repetition penalties are not applied by diffusion samplers"),
    "frequency_penalty": ((None, 0), "repetition penalties are not applied by diffusion samplers"),
    "repetition_penalty": ((None, 1), "repetition penalties are not applied by diffusion samplers"),
    "logit_bias": ((None, {}), "logit biases are not applied by diffusion samplers"),
    "functions": ((None,), "this is OpenAI's deprecated tool API; pass tools (and tool_choice)"),
    "function_call": ((None,), "this is OpenAI's deprecated tool API; pass tools (and tool_choice)"),
    "audio": ((None,), "this model reads and writes text only"),
    "modalities": ((None, ["text"]), "this model reads and writes text only"),
    "prediction": ((None,), "predicted outputs are not served"),
}


def refuse_unsupported(fields: dict) -> None:
    """A DLMError (with ``param`` naming the field) for an OpenAI field this backend does not serve,
    instead of dropping it; neutral values (``n=1``, ``presence_penalty=0``) pass."""
    for name, (neutral, why) in UNSUPPORTED.items():
        value = fields.get(name)
        if name in fields and not any(value == v and isinstance(value, bool) == isinstance(v, bool) for v in neutral):
            raise DLMError(f"{name}={value!r:.60} is not supported: {why}. Drop {name}.", param=name)
