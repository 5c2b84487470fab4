"""What the framework adapters share: the lazily created engine and the diffusion knobs."""

from __future__ import annotations

from dlm_backend.engine.llm import LLM
from dlm_backend.engine.params import SamplingParams

#: SamplingParams fields a framework call may pass as extra keyword arguments (``kv_cache`` = ``cache``).
KNOBS = ("kv_cache", "sampler", "steps", "block_length", "threshold", "factor", "gamma", "cache", "remasking", "alg",
         "alg_temp", "cfg_scale", "top_p", "top_k", "seed", "temperature", "max_tokens", "stop", "ignore_eos")


def sampling_params(defaults: dict, overrides: dict) -> SamplingParams:
    """SamplingParams from adapter fields (``defaults``) and per-call keyword arguments."""
    values = _knobs(defaults)
    values.update(_knobs(overrides))
    if "gen_length" in overrides:          # LLaDA's name for the canvas size
        values["max_tokens"] = overrides["gen_length"]
    if isinstance(values.get("stop"), str):
        values["stop"] = [values["stop"]]
    return SamplingParams(**values)


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
