"""What the framework adapters share: the lazily created engine and the diffusion knobs."""

from __future__ import annotations

from dlm_backend.engine.llm import LLM
from dlm_backend.engine.params import SamplingParams, layered
from dlm_backend.errors import DLMError

#: SamplingParams fields a framework call may pass as extra keyword arguments (``kv_cache`` = ``cache``).
KNOBS = ("kv_cache", "sampler", "steps", "block_length", "threshold", "factor", "gamma", "cache", "remasking", "alg",
         "alg_temp", "cfg_scale", "top_p", "top_k", "seed", "temperature", "max_tokens", "stop", "ignore_eos")


#: What the adapters and the server decode with when neither the caller nor the checkpoint says:
#: a 256-token canvas (chat replies and tool calls fit), Fast-dLLM's block of 32 and its dual cache.
SERVING_DEFAULTS = {"max_tokens": 256, "block_length": 32, "cache": "dual"}


def sampling_params(llm: LLM, fields: dict, overrides: dict, serving: dict = SERVING_DEFAULTS) -> SamplingParams:
    """SamplingParams for one framework call.

    Later layers win: ``serving`` (:data:`SERVING_DEFAULTS`), the checkpoint's own decoding defaults
    (its ``generation_config.json``; dropped when the call picks another sampler), the adapter's
    fields (``fields``, ``None`` = not set), then the call's keyword arguments (``overrides``).
    """
    values = _knobs(fields)
    values.update(_knobs(overrides))
    if "gen_length" in overrides:          # LLaDA's name for the canvas size
        values["max_tokens"] = overrides["gen_length"]
    if isinstance(values.get("stop"), str):
        values["stop"] = [values["stop"]]
    return SamplingParams(**layered(llm.engine.sampling_defaults, values, serving))


def refuse_unsupported(fields: dict) -> None:
    """A DLMError for an OpenAI request field this backend does not serve, instead of dropping it.

    A diffusion model commits tokens out of order, so it has no left-to-right per-token
    log-probabilities to return; ``n`` > 1 is n requests (the engine batches them)."""
    n = fields.get("n")
    if n not in (None, 1):
        raise DLMError(f"n={n!r}: one choice per request here; send {n} requests instead (they run batched).")
    logprobs = fields.get("logprobs")         # completions' logprobs=0 still asks for the sampled token's
    asked = {"logprobs": logprobs is not None and logprobs is not False,
             "top_logprobs": bool(fields.get("top_logprobs")), "echo": bool(fields.get("echo"))}
    refused = next((name for name, yes in asked.items() if yes), None)
    if refused:
        raise DLMError(f"{refused} is not supported (a diffusion model does not decode left to right, so it "
                       f"has no per-token log-probabilities to return); drop {refused}.")
    for name in ("functions", "function_call"):
        if fields.get(name) is not None:
            raise DLMError(f"{name} is OpenAI's deprecated tool API; pass tools (and tool_choice) instead.")


def _knobs(given: dict) -> dict:
    # Frameworks own a `cache` argument (LangChain's and LiteLLM's response caches), so the KV cache
    # mode travels as `kv_cache`; a bare `cache` string still works where nothing else claims it.
    values = {k: v for k, v in given.items() if k in KNOBS and v is not None}
    if "kv_cache" in values:
        values["cache"] = values.pop("kv_cache")
    return values


def engine(model: str | None, device: str | None = None) -> LLM:
    """The shared engine for (model, device); weights load on first use, once per process."""
    return LLM(model, device=device)
