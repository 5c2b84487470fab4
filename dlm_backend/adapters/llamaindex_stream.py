"""The LlamaIndex adapter's streaming and error pieces: streamed deltas as LlamaIndex responses
(partial tool calls included) and the context-overflow error that names LlamaIndex's tokenizer."""

from __future__ import annotations

from llama_index.core.base.llms.types import ChatMessage, ChatResponse, LogProb, MessageRole
from llama_index.core.llms.utils import parse_partial_json

from dlm_backend import chat
from dlm_backend.adapters.common import display_name
from dlm_backend.errors import ContextLengthError


class Accumulator:
    """Streamed deltas as LlamaIndex responses: the text so far plus the new piece. A forced call
    streamed as its arguments are written arrives as partial calls in ``additional_kwargs`` (as
    LlamaIndex's OpenAI LLM streams them), so ``stream_structured_predict`` yields growing partial
    objects; the final response carries the whole calls and usage."""

    def __init__(self, respond):
        self.respond = respond                # the adapter's whole-answer response builder
        self.text = ""
        self.calls: dict[int, dict] = {}

    def __call__(self, delta: chat.ChatDelta) -> ChatResponse | None:
        if delta.result is not None:
            final = self.respond(delta.result)
            return ChatResponse(message=final.message, delta="", raw=final.raw, logprobs=final.logprobs)
        if delta.tool_call is not None:
            call = self.calls.setdefault(delta.index, {"id": delta.tool_call.get("id"), "type": "function",
                                                       "function": {"name": None, "arguments": ""}})
            fn = delta.tool_call["function"]
            call["function"]["name"] = fn.get("name") or call["function"]["name"]
            call["function"]["arguments"] += fn["arguments"]
            message = ChatMessage(role=MessageRole.ASSISTANT, content=self.text,
                                  additional_kwargs={"tool_calls": [self.calls[i] for i in sorted(self.calls)]})
            return ChatResponse(message=message, delta="")
        if delta.canvas and not delta.content:      # stream_canvas: the frames, nothing new to read
            return ChatResponse(message=ChatMessage(role=MessageRole.ASSISTANT, content=self.text), delta="",
                                additional_kwargs={"dlm_canvas": delta.canvas})
        if not delta.content:
            return None
        self.text += delta.content
        return ChatResponse(message=ChatMessage(role=MessageRole.ASSISTANT, content=self.text), delta=delta.content,
                            logprobs=llama_logprobs(delta.logprobs))


def llama_logprobs(entries: list[dict] | None) -> list[list[LogProb]] | None:
    """OpenAI logprob entries as LlamaIndex's ``ChatResponse.logprobs``: per token, its alternatives
    as its OpenAI LLM gives them (``top_logprobs``; with none asked, the token itself)."""
    if entries is None:
        return None
    return [[LogProb(token=t["token"], logprob=t["logprob"], bytes=t["bytes"]) for t in e["top_logprobs"] or [e]]
            for e in entries]


def overflow(exc: ContextLengthError, llm) -> ContextLengthError:
    """A prompt over the window, saying why when LlamaIndex packed it counting with another tokenizer
    (tiktoken unless told): its splitters and prompt helper read only the global tokenizer."""
    import llama_index.core

    counter = llama_index.core.global_tokenizer
    owner = getattr(counter, "__self__", None)
    if counter is None or (isinstance(owner, type(llm)) and display_name(owner.model) == display_name(llm.model)):
        return exc
    func = getattr(counter, "func", counter)                 # tiktoken's is a functools.partial
    name = f"{getattr(func, '__module__', '')}.{getattr(func, '__qualname__', type(func).__name__)}".lstrip(".")
    return ContextLengthError(
        f"{exc} LlamaIndex sized this prompt with Settings.tokenizer ({name}), not this model's tokenizer, so "
        "its counts fall short of the model's. Count with the model: `Settings.tokenizer = llm.tokenizer`, set "
        "before Settings.chunk_size and before building the index.", param=exc.param)


def partial_kwargs(arguments: str) -> dict:
    """A streamed call's arguments so far, read as LlamaIndex's OpenAI LLM reads them (an unreadable
    prefix is no arguments yet)."""
    try:
        kwargs = parse_partial_json(arguments or "{}")
    except ValueError:
        return {}
    return kwargs if isinstance(kwargs, dict) else {}
