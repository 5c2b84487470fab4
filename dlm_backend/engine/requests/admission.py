"""Admission: the checks a request passes before it is queued, each failure a DLMError saying what to
change, and the one :class:`Sequence` it is decoded as, built here and returned to be queued."""

from __future__ import annotations

from dlm_backend.engine.params import SamplingParams
from dlm_backend.engine.requests.sequence import Sequence
from dlm_backend.engine.samplers.base import Sampler
from dlm_backend.errors import ContextLengthError, DLMError, SamplingParamsError, TokenizerError


def find_sampler(samplers: dict[str, Sampler], name: str) -> Sampler:
    if name not in samplers:
        raise SamplingParamsError(f"Unknown sampler {name!r}. Registered samplers: {', '.join(sorted(samplers))}.")
    return samplers[name]


def admit(engine, prompt_token_ids: list[int], params: SamplingParams, request_id: str | None = None,
          response_template: list[int | None] | None = None) -> Sequence:
    """The request's :class:`Sequence`, built once and checked against ``engine`` (its model, limits
    and KV pool), or the DLMError that keeps it out of the queue. Nothing is queued here."""
    if not isinstance(params, SamplingParams):
        raise SamplingParamsError(f"sampling_params must be a SamplingParams, not {type(params).__name__}.")
    if not prompt_token_ids and not engine.model_args.block_size:
        # A block-diffusion model starts from a block of masks (unconditional generation); a
        # full-sequence model has nothing to condition the canvas on.
        raise DLMError("The prompt is empty. Pass at least one token (a diffusion model needs context to "
                       "condition on).")
    vocab = engine.model_args.vocab_size
    if any(not isinstance(t, int) or isinstance(t, bool) or not 0 <= t < vocab for t in prompt_token_ids):
        raise DLMError(f"Prompt token ids must be integers in [0, {vocab}) for this model.")
    total = len(prompt_token_ids) + params.max_tokens
    if total > engine.max_model_len:
        raise ContextLengthError(
            f"Prompt ({len(prompt_token_ids)} tokens) plus max_tokens ({params.max_tokens}) is {total} tokens, "
            f"over the model's context of {engine.max_model_len}. Shorten the prompt or lower max_tokens.")
    if params.stop and engine.tokenizer is None:
        raise TokenizerError("Stop strings need the checkpoint's tokenizer.json to decode text. Remove 'stop' "
                             "or add the tokenizer.")
    if response_template is not None:
        if len(response_template) > params.max_tokens:
            raise SamplingParamsError(f"The response template has {len(response_template)} tokens but "
                                      f"max_tokens is {params.max_tokens}; raise max_tokens.")
        if any(t is not None and (not isinstance(t, int) or not 0 <= t < vocab) for t in response_template):
            raise DLMError(f"Response template tokens must be None or integers in [0, {vocab}).")
    sampler = find_sampler(engine.samplers, params.sampler)
    noise = engine.checkpoint.model.noise
    if sampler.noise != noise:
        fitting = sorted(n for n, s in engine.samplers.items() if s.noise == noise)
        raise SamplingParamsError(
            f"Sampler {params.sampler!r} decodes {sampler.noise}-noise canvases and {engine.architecture} starts "
            f"from {noise} noise{' (random tokens, no mask token)' if noise == 'uniform' else ''}. Use one of: "
            f"{', '.join(fitting)}.", param="sampler")
    sampler.validate(params)
    if not params.block_length and engine.model_args.block_size:
        params = params.replace(block_length=engine.model_args.block_size)    # a block family decodes in its own blocks
    seq = engine.sequence_class(prompt_token_ids, params, sampler, engine.tokens, request_id, response_template,
                                engine.tokenizer)
    if seq.length > engine.max_model_len:      # a block family's canvas ends at a block boundary
        raise ContextLengthError(
            f"The canvas ({seq.length} positions: prompt {len(prompt_token_ids)}, max_tokens {params.max_tokens}, "
            f"up to the end of its last block) is over the model's context of {engine.max_model_len}. Shorten "
            "the prompt or lower max_tokens.")
    pages = engine.allocator.pages_for(seq.kv_positions)
    if pages > engine.allocator.num_pages:
        raise ContextLengthError(
            f"The request needs {pages} KV pages and the whole cache holds {engine.allocator.num_pages}. Lower "
            "max_tokens or the prompt, or give the engine a larger KV cache (kv_cache_memory; dlm serve "
            "--kv-cache-memory).")
    return seq
