"""A front door's call arguments in engine terms: sampling parameters, and the OpenAI fields refused."""

from __future__ import annotations

from dlm_backend.engine.params import MAX_TOP_LOGPROBS, SamplingParams, knob_values
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
#: ``n`` > 1 is n requests (the engine batches them).
UNSUPPORTED: dict[str, tuple[tuple, str]] = {
    "n": ((None, 1), "one choice per request here; send the requests separately (they run batched)"),
    "best_of": ((None, 1), "one choice per request here; send the requests separately"),
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


def logprobs_knob(logprobs, top_logprobs, legacy: bool = False) -> int | None:
    """OpenAI's ``logprobs`` / ``top_logprobs`` as the engine's ``logprobs`` knob (alternatives per
    token; None: none asked). Chat: ``logprobs`` true, with 0 to 20 ``top_logprobs``; the legacy
    completions API: ``logprobs`` an integer 0 to 5. Each token's log-probability is the one at the
    diffusion pass that committed it (docs/sampling.md)."""
    if legacy:
        if logprobs is None:
            return None
        if isinstance(logprobs, bool) or not isinstance(logprobs, int) or not 0 <= logprobs <= 5:
            raise DLMError(f"logprobs must be an integer from 0 to 5 here, got {logprobs!r:.40}.", param="logprobs")
        return logprobs
    if top_logprobs is not None and (isinstance(top_logprobs, bool) or not isinstance(top_logprobs, int)
                                     or not 0 <= top_logprobs <= MAX_TOP_LOGPROBS):
        raise DLMError(f"top_logprobs must be an integer from 0 to {MAX_TOP_LOGPROBS}, got {top_logprobs!r:.40}.",
                       param="top_logprobs")
    if logprobs is not None and not isinstance(logprobs, bool):
        raise DLMError(f"logprobs must be true or false, got {logprobs!r:.40}; top_logprobs says how many "
                       "alternatives.", param="logprobs")
    if not logprobs:
        if top_logprobs:
            raise DLMError("top_logprobs needs logprobs=true.", param="top_logprobs")
        return None
    return top_logprobs or 0


def refuse_unsupported(fields: dict) -> None:
    """A DLMError (with ``param`` naming the field) for an OpenAI field this backend does not serve,
    instead of dropping it; neutral values (``n=1``, ``presence_penalty=0``) pass."""
    for name, (neutral, why) in UNSUPPORTED.items():
        value = fields.get(name)
        if name in fields and not any(value == v and isinstance(value, bool) == isinstance(v, bool) for v in neutral):
            raise DLMError(f"{name}={value!r:.60} is not supported: {why}. Drop {name}.", param=name)
