"""The engine: admits requests, schedules denoising passes, turns committed tokens into output.

It never touches tensors; the :class:`ModelRunner` does. ``step()`` advances every scheduled
request by one pass and reports what each one newly committed.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch

from dlm_backend.engine.loader import default_dtype, load_model, read_config, resolve_checkpoint
from dlm_backend.engine.metrics import EngineStats
from dlm_backend.engine.models.base import token_ids
from dlm_backend.engine.outputs import GenerationOutput, StreamChunk
from dlm_backend.engine.params import SamplingParams, checkpoint_defaults
from dlm_backend.engine.runner import ModelRunner
from dlm_backend.engine.samplers.base import Sampler, TokenInfo
from dlm_backend.engine.scheduler import Scheduler
from dlm_backend.engine.sequence import Sequence
from dlm_backend.engine.tokenizer import Tokenizer
from dlm_backend.errors import (CheckpointError, ContextLengthError, DLMError, QueueFullError, SamplingParamsError,
                                TokenizerError)

DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}


def check_dtype(dtype: str) -> None:
    """A DLMError for a dtype name the engine cannot load in."""
    if dtype != "auto" and dtype not in DTYPES:
        raise DLMError(f"dtype {dtype!r} is not supported; use 'auto' or one of {', '.join(DTYPES)}.")


def check_device(device: str) -> None:
    """A DLMError for a device name torch does not know or this machine does not have."""
    try:
        kind = torch.device(device).type
    except (RuntimeError, TypeError):
        raise DLMError(f"device {device!r} is not a device name; use 'cpu', 'cuda' or 'cuda:N'.") from None
    if kind == "cuda" and not torch.cuda.is_available():
        raise DLMError(f"device {device!r}: this machine has no CUDA GPU torch can use; use 'cpu' (or omit "
                       "--device for the best available).")


@dataclass
class EngineConfig:
    """How to build an engine. ``device``/``dtype`` default to CUDA+bf16 when present, else CPU+fp32."""

    model: str
    device: str | None = None
    dtype: str = "auto"
    revision: str | None = None
    max_num_seqs: int = 64
    max_num_batched_tokens: int = 32768
    max_model_len: int | None = None
    max_waiting: int = 1024          # queued (not yet running) requests; beyond it add_request refuses

    def __post_init__(self):
        check_dtype(self.dtype)
        if self.device is not None:
            check_device(self.device)
        if min(self.max_num_seqs, self.max_num_batched_tokens, self.max_waiting) < 1:
            raise DLMError("max_num_seqs, max_num_batched_tokens and max_waiting must be >= 1.")


class LLMEngine:
    """Synchronous engine: ``add_request`` then ``step`` until ``has_unfinished`` is False."""

    def __init__(self, config: EngineConfig):
        from dlm_backend.plugins import registered_samplers

        self.config = config
        self.device = torch.device(config.device or ("cuda" if torch.cuda.is_available() else "cpu"))
        self.dtype = default_dtype(self.device) if config.dtype == "auto" else DTYPES[config.dtype]
        self.folder = resolve_checkpoint(config.model, config.revision)
        self.hf_config = read_config(self.folder)
        #: Decoding knobs the checkpoint names for itself (``generation_config.json``); front ends
        #: start from them, before the weights load so a bad file fails fast.
        self.sampling_defaults = checkpoint_defaults(self.hf_config.get("_generation_config", {}),
                                                     str(self.folder / "generation_config.json"))
        model = load_model(self.folder, self.hf_config, self.device, self.dtype)
        self.model_args = model.args
        self.architecture = type(model).__name__
        # No tokenizer.json: token ids only. One that is there but broken is an error, not "absent".
        has_tokenizer = (self.folder / "tokenizer.json").is_file()
        self.tokenizer: Tokenizer | None = Tokenizer(self.folder) if has_tokenizer else None
        self.tokens = self._token_info()
        self.max_model_len = min(config.max_model_len or model.args.max_positions, model.args.max_positions)
        self.runner = ModelRunner(model, self.device, self.dtype, self.tokens)
        self.scheduler = Scheduler(config.max_num_seqs, config.max_num_batched_tokens, model.logits_shift)
        self.samplers: dict[str, Sampler] = {name: cls() for name, cls in registered_samplers().items()}
        if self.sampling_defaults.get("sampler", "threshold") not in self.samplers:
            raise SamplingParamsError(
                f"{self.folder / 'generation_config.json'}: 'dlm_sampling' names sampler "
                f"{self.sampling_defaults['sampler']!r}, which is not registered. Registered samplers: "
                f"{', '.join(sorted(self.samplers))}.")
        self._texts: dict[int, str] = {}     # seq_id -> text already emitted
        self.stats = EngineStats()

    def _token_info(self) -> TokenInfo:
        a, gen = self.model_args, self.hf_config.get("_generation_config", {})
        eos = set(a.eos_token_ids)
        eos.update(token_ids(gen.get("eos_token_id")))
        eot: list[int] = []
        if self.tokenizer is not None:
            tok_eos = self.tokenizer.token_id(self.tokenizer.special_tokens.get("eos_token"))
            if tok_eos is not None:
                eos.add(tok_eos)
            eot = [i for i in self.tokenizer.end_of_turn_ids() if i not in eos]
        bad = [f"{name} {i}" for name, ids in (("mask_token_id", [a.mask_token_id]), ("eos_token_id", eos))
               for i in ids if not 0 <= i < a.vocab_size]
        if bad:     # else every request fails inside the engine with an IndexError
            raise CheckpointError(f"{', '.join(bad)} is outside the vocabulary (size {a.vocab_size}); fix "
                                  "config.json / generation_config.json.")
        return TokenInfo(mask_id=a.mask_token_id, eos_ids=tuple(sorted(eos)), eot_ids=tuple(eot))

    # -- requests ---------------------------------------------------------------------------

    def sampler(self, name: str) -> Sampler:
        if name not in self.samplers:
            raise SamplingParamsError(f"Unknown sampler {name!r}. Registered samplers: "
                                      f"{', '.join(sorted(self.samplers))}.")
        return self.samplers[name]

    def add_request(self, prompt_token_ids: list[int], params: SamplingParams,
                    request_id: str | None = None,
                    response_template: list[int | None] | None = None) -> Sequence:
        """Validate and queue one request; raises a DLMError (and queues nothing) on bad input.

        ``response_template`` fixes output tokens in advance (``None`` = a slot to denoise); it must
        fit in ``max_tokens``.
        """
        if self.is_full:
            self.stats.record_rejected()
            raise QueueFullError(f"The engine's queue is full ({self.config.max_waiting} requests waiting). "
                                 "Retry shortly, or raise max_waiting.")
        sampler = self.check(prompt_token_ids, params, response_template)
        seq = Sequence(prompt_token_ids, params, sampler, self.tokens, request_id, response_template)
        self.scheduler.add(seq)
        return seq

    def check(self, prompt_token_ids: list[int], params: SamplingParams,
              response_template: list[int | None] | None = None) -> Sampler:
        """The DLMError ``add_request`` would raise for this request, without queueing it; else its
        sampler. A server calls it before a streamed response's 200 goes out."""
        if not prompt_token_ids:
            raise DLMError("The prompt is empty. Pass at least one token (a diffusion model needs "
                           "context to condition on).")
        vocab = self.model_args.vocab_size
        if any(not isinstance(t, int) or t < 0 or t >= vocab for t in prompt_token_ids):
            raise DLMError(f"Prompt token ids must be integers in [0, {vocab}) for this model.")
        total = len(prompt_token_ids) + params.max_tokens
        if total > self.max_model_len:
            raise ContextLengthError(
                f"Prompt ({len(prompt_token_ids)} tokens) plus max_tokens ({params.max_tokens}) is {total} "
                f"tokens, over the model's context of {self.max_model_len}. Shorten the prompt or lower "
                "max_tokens.")
        if params.stop and self.tokenizer is None:
            raise TokenizerError("Stop strings need the checkpoint's tokenizer.json to decode text. "
                                 "Remove 'stop' or add the tokenizer.")
        if response_template is not None:
            if len(response_template) > params.max_tokens:
                raise SamplingParamsError(f"The response template has {len(response_template)} tokens but "
                                          f"max_tokens is {params.max_tokens}; raise max_tokens.")
            if any(t is not None and (not isinstance(t, int) or not 0 <= t < vocab) for t in response_template):
                raise DLMError(f"Response template tokens must be None or integers in [0, {vocab}).")
        sampler = self.sampler(params.sampler)
        sampler.validate(params)
        return sampler

    def abort(self, request_id: str) -> StreamChunk | None:
        """Cancel a request now, freeing its slot and cache; returns its final chunk (None if unknown)."""
        seq = self.scheduler.find(request_id)
        if seq is None:
            return None
        seq.finish("abort")
        chunk = self._chunk(seq)
        self.stats.record_finish("abort")
        self.scheduler.remove_finished()
        self.runner.free(seq)
        self._texts.pop(seq.seq_id, None)
        return chunk

    @property
    def has_unfinished(self) -> bool:
        return self.scheduler.num_unfinished > 0

    @property
    def is_full(self) -> bool:
        """No room for another request: every slot taken and ``max_waiting`` already queued.

        Requests that arrived since the last step count against free slots first, so a burst into an
        idle engine is never refused.
        """
        free_slots = max(0, self.scheduler.max_num_seqs - len(self.scheduler.running))
        return len(self.scheduler.waiting) >= self.config.max_waiting + free_slots

    @property
    def num_waiting(self) -> int:
        return len(self.scheduler.waiting)

    @property
    def num_running(self) -> int:
        return len(self.scheduler.running)

    # -- stepping ---------------------------------------------------------------------------

    def step(self) -> list[StreamChunk]:
        """One denoising pass for the scheduled requests; chunks for those that committed output."""
        # Requests finished before their first pass (a template fixing every slot) report at once.
        chunks = [self._chunk(seq) for seq in self.scheduler.remove_finished()]
        batch = self.scheduler.schedule()
        if batch:
            self._run_isolated(batch)
        for seq in batch:
            chunk = self._chunk(seq)
            if chunk.delta_token_ids or chunk.delta_text or chunk.finished:
                chunks.append(chunk)
        if batch:
            self.stats.record_step(len(batch), sum(len(c.delta_token_ids) for c in chunks))
        for chunk in chunks:
            if chunk.finished:
                self.stats.record_finish("error" if chunk.error else chunk.finish_reason)
        for seq in self.scheduler.remove_finished():
            self.runner.free(seq)
            self._texts.pop(seq.seq_id, None)
        return chunks

    def _run_isolated(self, batch: list[Sequence]) -> None:
        """Run one pass; if it fails, retry the requests one by one so only the culprit fails."""
        passes = {s.seq_id: s.num_forward_passes for s in batch}
        try:
            self.runner.step(batch)
            return
        except Exception as exc:  # noqa: BLE001 - any failure must stay inside its request
            if len(batch) == 1:
                batch[0].fail(exc)
                return
        for seq in batch:
            if seq.num_forward_passes == passes[seq.seq_id] and not seq.is_finished:
                try:
                    self.runner.step([seq])
                except Exception as exc:  # noqa: BLE001
                    seq.fail(exc)

    def _chunk(self, seq: Sequence) -> StreamChunk:
        """What ``seq`` newly committed since the last chunk; applies stop strings."""
        now = time.monotonic()
        tokens = seq.committed_token_ids
        if tokens and seq.first_token_time is None:
            seq.first_token_time = now
        delta_text = ""
        if self.tokenizer is not None:
            text = self.tokenizer.decode(tokens)
            emitted = self._texts.get(seq.seq_id, "")
            # Stop strings, like stop tokens, count only past a response template: its fixed text
            # (a forced call's '<tool_call>\n{"name": ...', a JSON skeleton's quotes) was not generated,
            # and a stop of '"' or '\n' there emptied the answer it was meant to shape.
            n_template = seq.template_end - seq.prompt_len
            stops = seq.params.stop if len(tokens) >= n_template else ()
            free_from = len(self.tokenizer.decode(tokens[:n_template])) if stops and n_template else 0
            for stop in stops:
                at = text.find(stop, max(free_from, len(emitted) - len(stop)))
                if at != -1:
                    # One pass may commit a block past the stop string: the output (and the usage
                    # count) ends at the token that completes it, as a one-token-a-step engine's would.
                    n = next(n for n in range(seq.num_emitted, len(tokens) + 1)
                             if len(self.tokenizer.decode(tokens[:n])) >= at + len(stop))
                    seq.finish("stop", stop_reason=stop, output_end=seq.prompt_len + n)
                    tokens, text = tokens[:n], text[:at]
            visible = text if seq.is_finished else _hold_back(text, seq.params.stop)
            delta_text = visible[len(emitted):]
            self._texts[seq.seq_id] = emitted + delta_text
        delta_ids = tokens[seq.num_emitted:]
        seq.num_emitted = len(tokens)
        output = None
        if seq.is_finished:
            output = GenerationOutput(
                request_id=seq.request_id, prompt_token_ids=seq.prompt_token_ids, token_ids=tokens,
                text=self._texts.get(seq.seq_id) if self.tokenizer else None,
                finish_reason=seq.finish_reason, stop_reason=seq.stop_reason,
                num_forward_passes=seq.num_forward_passes,
                metrics={"latency_s": now - seq.arrival_time,
                         "ttft_s": (seq.first_token_time or now) - seq.arrival_time})
        return StreamChunk(seq.request_id, delta_ids, delta_text, seq.is_finished, seq.finish_reason,
                           output, error=seq.error)


def _hold_back(text: str, stops: list[str]) -> str:
    """Text safe to stream: drop an unfinished UTF-8 character and any tail that may start a stop string."""
    if text.endswith("\ufffd"):
        text = text.rstrip("\ufffd")
    cut = 0
    for stop in stops:
        for n in range(min(len(stop) - 1, len(text)), 0, -1):
            if text.endswith(stop[:n]):
                cut = max(cut, n)
                break
    return text[:len(text) - cut] if cut else text
