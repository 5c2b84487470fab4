"""LlamaIndex LLM: ``Settings.llm = DLM()`` (``from dlm_backend.adapters.llamaindex import DLM``).

Install with ``pip install "dlm_backend[llamaindex]"``. A ``FunctionCallingLLM``, so query engines,
chat engines and ``FunctionAgent`` use it directly; the engine loads on first use and ``close()``
gives it back. Constructing a ``DLM`` changes no LlamaIndex setting. Its context window is in its
own tokens, so count with them: ``Settings.tokenizer = llm.tokenizer`` (LlamaIndex reads token
counts from that global only; a prompt it packed with other counts and overflows is an error that
says so).
"""

from __future__ import annotations

import contextlib
import json
from typing import Any, Callable, Sequence

from llama_index.core.base.llms.types import (ChatMessage, ChatResponse, ChatResponseAsyncGen, ChatResponseGen,
                                              CompletionResponse, CompletionResponseAsyncGen, CompletionResponseGen,
                                              LLMMetadata, MessageRole, TextBlock, ToolCallBlock)
from llama_index.core.bridge.pydantic import Field, PrivateAttr, create_model, model_validator
from llama_index.core.llms.callbacks import llm_chat_callback, llm_completion_callback
from llama_index.core.llms.function_calling import FunctionCallingLLM
from llama_index.core.llms.llm import ToolSelection

from dlm_backend import chat
from dlm_backend.adapters.common import (KNOB_FIELDS, LOGPROBS_DOC, QUANTIZATION_DOC, Handles, check_knob_values,
                                         constructor_args, display_name, knob_fields, logprobs_layer, model_tokenizer,
                                         off_loop, refuse_unserved)
from dlm_backend.adapters.llamaindex_stream import Accumulator, llama_logprobs, overflow, partial_kwargs
from dlm_backend.engine.checkpoint.folder import context_length, default_model
from dlm_backend.engine.params import DEFAULTS, FRAMEWORK_TAKEN
from dlm_backend.engine.quant.methods import check_quantization
from dlm_backend.errors import ContextLengthError, DLMError

#: Keyword arguments LlamaIndex passes besides knobs (chat_with_tools, structured_predict).
CALL_ARGS = ("tools", "tool_choice", "response_format")


class DLM(create_model("_DLMKnobs", __base__=FunctionCallingLLM, **knob_fields(Field))):
    """A diffusion language model as a LlamaIndex function-calling LLM.

    Every diffusion knob of the knob table is a field (``sampler``, ``threshold``, ``block_length``,
    ``steps``, ``kv_cache``, ...); left ``None`` it takes the checkpoint's default, else the table's.
    A misspelled or out-of-range argument is a DLMError at construction. ``quantization`` quantizes a
    full-precision checkpoint's weights as they load; models asking for different methods hold
    different engines.

    LlamaIndex's splitters and prompt packing count tokens with ``Settings.tokenizer`` (tiktoken
    unless set), but ``metadata.context_window`` is in this model's tokens: dlm-tiny's vocabulary is
    4096 pieces, so a README of 3,733 tiktoken tokens is 8,714 of its own and a default query engine
    packed 2.3x too much context. ``Settings.tokenizer = llm.tokenizer`` counts with the model's own
    (set it before ``Settings.chunk_size``, whose splitter keeps the tokenizer it was made with).
    ``timeout`` (seconds) aborts a call that runs past it with a ``TimeoutError`` (RequestTimeoutError).
    """

    model: str | None = Field(default=None, description="checkpoint folder or hub id (default: dlm-tiny)")
    device: str | None = Field(default=None)
    quantization: str | None = Field(default=None, description=QUANTIZATION_DOC)
    additional_kwargs: dict[str, Any] = Field(default_factory=dict, description="more knobs, by name")
    timeout: float | None = Field(default=None, description="seconds a call may take, its first load included")
    logprobs: bool | None = Field(default=None, description=LOGPROBS_DOC)
    _context_window: int | None = PrivateAttr(default=None)
    _handles: Handles = PrivateAttr(default_factory=Handles)

    @model_validator(mode="before")
    @classmethod
    def _known_arguments(cls, data: Any) -> Any:
        if isinstance(data, dict) and "count_tokens_with_model" in data:
            raise DLMError("DLM: count_tokens_with_model is gone (constructing a DLM no longer changes LlamaIndex's "
                           "global tokenizer); set Settings.tokenizer = llm.tokenizer instead.",
                           param="count_tokens_with_model")
        return constructor_args(cls, data, "DLM")

    @model_validator(mode="after")
    def _knobs_in_range(self) -> "DLM":
        check_knob_values({name: getattr(self, name) for name in KNOB_FIELDS}, "DLM")
        check_knob_values(self.additional_kwargs, "DLM additional_kwargs")
        check_quantization(self.quantization)           # at construction, like a knob, not at the first call
        logprobs_layer({"logprobs": self.logprobs, "top_logprobs": self.top_logprobs}, {})   # OpenAI's pairing
        return self

    @property
    def tokenizer(self) -> Callable[[str], list[int]]:
        """Text -> this model's token ids, for ``Settings.tokenizer`` (only the tokenizer is read,
        not the weights: LlamaIndex counts on the event loop)."""
        return self._count_tokens

    def _count_tokens(self, text: str) -> list[int]:
        return model_tokenizer(self.model, self._handles, self.device, self.quantization).encode(text)

    def close(self) -> None:
        """Give this model's engine handle back; the last handle on an engine frees its weights."""
        self._handles.close()

    @classmethod
    def class_name(cls) -> str:
        return "DLM"

    @property
    def _llm(self):
        return self._handles.get(self.model, self.device, self.quantization)

    @property
    def metadata(self) -> LLMMetadata:
        # The whole window, input and output: LlamaIndex's PromptHelper subtracts num_output itself.
        if self._context_window is None:     # from config.json: metadata never loads the weights
            self._context_window = context_length(self.model or default_model())
        return LLMMetadata(context_window=self._context_window, num_output=self.max_tokens or DEFAULTS.max_tokens,
                           is_chat_model=True, is_function_calling_model=True,
                           model_name=display_name(self.model))

    # -- request building ---------------------------------------------------------------------

    def _request(self, messages: Sequence[ChatMessage], kwargs: dict) -> chat.Plan:
        # The first call loads the weights and planning tokenizes: async calls run this off the loop.
        call = {k: kwargs.pop(k) for k in CALL_ARGS if k in kwargs}
        logprobs = logprobs_layer({"logprobs": self.logprobs, "top_logprobs": self.top_logprobs}, kwargs)
        refuse_unserved(kwargs)
        fields = {name: getattr(self, name) for name in KNOB_FIELDS}
        llm = self._llm
        params = chat.request_params(llm, fields, self.additional_kwargs, kwargs, logprobs, taken=FRAMEWORK_TAKEN,
                                     where="DLM call")
        request = chat.ChatRequest.from_call([to_openai(m) for m in messages], params, call)
        with self._explained():
            return chat.Plan(llm, request)

    @contextlib.contextmanager
    def _explained(self):
        """A prompt over the window says so, and why when LlamaIndex packed it (see :func:`_overflow`)."""
        try:
            yield
        except ContextLengthError as exc:
            raise overflow(exc, self) from None

    def _deadline(self, kwargs: dict) -> chat.Deadline:
        return chat.Deadline(kwargs.pop("timeout", self.timeout))

    @llm_chat_callback()
    def chat(self, messages: Sequence[ChatMessage], **kwargs: Any) -> ChatResponse:
        deadline = self._deadline(kwargs)
        plan = self._request(messages, kwargs)
        with self._explained():
            return chat_response(chat.complete(plan.llm, plan.request, plan, timeout=deadline))

    @llm_chat_callback()
    async def achat(self, messages: Sequence[ChatMessage], **kwargs: Any) -> ChatResponse:
        deadline = self._deadline(kwargs)
        plan = await off_loop(deadline, self._request, messages, kwargs)
        with self._explained():
            return chat_response(await chat.acomplete(plan.llm, plan.request, plan, timeout=deadline))

    @llm_chat_callback()
    def stream_chat(self, messages: Sequence[ChatMessage], **kwargs: Any) -> ChatResponseGen:
        deadline = self._deadline(kwargs)
        plan = self._request(messages, kwargs)

        def gen() -> ChatResponseGen:
            accumulate = Accumulator(chat_response)
            with self._explained():
                for delta in chat.stream(plan.llm, plan.request, plan, timeout=deadline):
                    if (response := accumulate(delta)) is not None:
                        yield response
        return gen()

    @llm_chat_callback()
    async def astream_chat(self, messages: Sequence[ChatMessage], **kwargs: Any) -> ChatResponseAsyncGen:
        deadline = self._deadline(kwargs)
        plan = await off_loop(deadline, self._request, messages, kwargs)

        async def gen() -> ChatResponseAsyncGen:
            accumulate = Accumulator(chat_response)
            with self._explained():
                async for delta in chat.astream(plan.llm, plan.request, plan, timeout=deadline):
                    if (response := accumulate(delta)) is not None:
                        yield response
        return gen()

    # Completion goes through the chat template too: instruct checkpoints answer in chat form.
    @llm_completion_callback()
    def complete(self, prompt: str, formatted: bool = False, **kwargs: Any) -> CompletionResponse:
        r = self.chat([ChatMessage(role=MessageRole.USER, content=prompt)], **kwargs)
        return CompletionResponse(text=r.message.content or "", raw=r.raw)

    @llm_completion_callback()
    async def acomplete(self, prompt: str, formatted: bool = False, **kwargs: Any) -> CompletionResponse:
        r = await self.achat([ChatMessage(role=MessageRole.USER, content=prompt)], **kwargs)
        return CompletionResponse(text=r.message.content or "", raw=r.raw)

    @llm_completion_callback()
    def stream_complete(self, prompt: str, formatted: bool = False, **kwargs: Any) -> CompletionResponseGen:
        def gen() -> CompletionResponseGen:
            for r in self.stream_chat([ChatMessage(role=MessageRole.USER, content=prompt)], **kwargs):
                yield CompletionResponse(text=r.message.content or "", delta=r.delta, raw=r.raw)
        return gen()

    @llm_completion_callback()
    async def astream_complete(self, prompt: str, formatted: bool = False, **kwargs: Any) -> CompletionResponseAsyncGen:
        async def gen() -> CompletionResponseAsyncGen:
            async for r in await self.astream_chat([ChatMessage(role=MessageRole.USER, content=prompt)], **kwargs):
                yield CompletionResponse(text=r.message.content or "", delta=r.delta, raw=r.raw)
        return gen()

    # -- structured output -----------------------------------------------------------------------

    def _structured_stream_call(self, output_cls, prompt, llm_kwargs=None, **prompt_args):
        """Streamed structured prediction forces its one tool, as ``structured_predict`` does (LlamaIndex's
        stream path leaves the choice to the model): the call's arguments are then written a value at a
        time and each value streams, so the partial objects are real and the last is the whole answer."""
        return self._forced_program(output_cls, prompt).stream_call(llm_kwargs=llm_kwargs, **prompt_args)

    async def _structured_astream_call(self, output_cls, prompt, llm_kwargs=None, **prompt_args):
        return await self._forced_program(output_cls, prompt).astream_call(llm_kwargs=llm_kwargs, **prompt_args)

    def _forced_program(self, output_cls, prompt):
        from llama_index.core.program.function_program import FunctionCallingProgram, get_function_tool

        name = get_function_tool(output_cls).metadata.name
        return FunctionCallingProgram.from_defaults(output_cls=output_cls, llm=self, prompt=prompt,
                                                    tool_choice={"type": "function", "function": {"name": name}})

    # -- tools -------------------------------------------------------------------------------

    def _prepare_chat_with_tools(self, tools: Sequence[Any], user_msg: str | ChatMessage | None = None,
                                 chat_history: list[ChatMessage] | None = None, verbose: bool = False,
                                 allow_parallel_tool_calls: bool = False, tool_required: bool = False,
                                 **kwargs: Any) -> dict[str, Any]:
        messages = list(chat_history or [])
        if user_msg is not None:
            messages.append(ChatMessage(role=MessageRole.USER, content=user_msg)
                            if isinstance(user_msg, str) else user_msg)
        specs = [t.metadata.to_openai_tool(skip_length_check=True) for t in tools]
        choice = kwargs.pop("tool_choice", None) or ("required" if tool_required else None)
        return {"messages": messages, "tools": specs or None, "tool_choice": choice, **kwargs}

    def _validate_chat_with_tools_response(self, response: ChatResponse, tools: Sequence[Any],
                                           allow_parallel_tool_calls: bool = False, **kwargs: Any) -> ChatResponse:
        if not allow_parallel_tool_calls:
            blocks = response.message.blocks
            calls = [b for b in blocks if isinstance(b, ToolCallBlock)]
            if len(calls) > 1:
                response.message.blocks = [b for b in blocks if not isinstance(b, ToolCallBlock)] + calls[:1]
        return response

    def get_tool_calls_from_response(self, response: ChatResponse, error_on_no_tool_call: bool = True,
                                     **kwargs: Any) -> list[ToolSelection]:
        calls = [ToolSelection(tool_id=b.tool_call_id or "", tool_name=b.tool_name,
                               tool_kwargs=b.tool_kwargs if isinstance(b.tool_kwargs, dict) else json.loads(b.tool_kwargs))
                 for b in response.message.blocks if isinstance(b, ToolCallBlock)]
        if not calls:                         # a streamed response: partial calls, arguments still being written
            calls = [ToolSelection(tool_id=c["id"] or "", tool_name=c["function"]["name"] or "",
                                   tool_kwargs=partial_kwargs(c["function"]["arguments"]))
                     for c in response.message.additional_kwargs.get("tool_calls") or []
                     if isinstance(c, dict) and "function" in c]
        if not calls and error_on_no_tool_call:
            raise ValueError(f"Expected at least one tool call, got: {response.message.content!r}")
        return calls


def chat_response(result: chat.ChatResult) -> ChatResponse:
    """A whole answer as LlamaIndex's ChatResponse: text and tool-call blocks, usage in ``raw``."""
    blocks: list = [TextBlock(text=result.content)] if result.content else []
    blocks += [ToolCallBlock(tool_call_id=c["id"], tool_name=c["function"]["name"],
                             tool_kwargs=json.loads(c["function"]["arguments"])) for c in result.tool_calls]
    # The calls also go in additional_kwargs, where LlamaIndex's streaming structured output
    # (program.utils.process_streaming_objects) looks for them, as OpenAI's LLM puts them.
    extra = {"tool_calls": result.tool_calls} if result.tool_calls else {}
    message = ChatMessage(role=MessageRole.ASSISTANT, blocks=blocks or [TextBlock(text="")], additional_kwargs=extra)
    raw = {"usage": result.usage, "finish_reason": result.finish_reason,
           "num_forward_passes": result.num_forward_passes}
    return ChatResponse(message=message, raw=raw, logprobs=llama_logprobs(result.logprobs))


def to_openai(message: ChatMessage) -> dict:
    """A LlamaIndex message as an OpenAI-shaped one (its calls once, from the blocks or the legacy list)."""
    role = message.role.value if hasattr(message.role, "value") else str(message.role)
    out: dict = {"role": role, "content": message.content or ""}
    # One message may carry its calls both ways (ours do): the blocks win, the legacy list is a fallback.
    calls = [b for b in message.blocks if isinstance(b, ToolCallBlock)]
    calls = calls or [_legacy_call(c) for c in message.additional_kwargs.get("tool_calls", []) or []]
    if calls:
        out["tool_calls"] = [c if isinstance(c, dict) else
                             {"id": c.tool_call_id, "type": "function",
                              "function": {"name": c.tool_name, "arguments": c.tool_kwargs}} for c in calls]
    if role == "tool":
        out["tool_call_id"] = message.additional_kwargs.get("tool_call_id")
    return out


def _legacy_call(call) -> dict:
    if isinstance(call, dict):
        return call
    fn = getattr(call, "function", None)
    return {"id": getattr(call, "id", None), "type": "function",
            "function": {"name": fn.name, "arguments": fn.arguments}}
