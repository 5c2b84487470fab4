"""Messages <-> prompt, tool calls and structured output: the one implementation behind every
front door (LangChain, LlamaIndex, LiteLLM, the OpenAI-compatible server).

Front doors translate their framework's call into a :class:`ChatRequest` (OpenAI-style messages,
tools, tool_choice, response_format, sampling parameters) and get back a :class:`ChatResult`, or
:class:`ChatDelta` events while streaming. ``messages`` holds those types (and builds every front
door's request: :meth:`ChatRequest.from_call`), ``prompt`` the one prompt builder, ``plan`` turns a
request into the generations it takes, ``run`` runs them, ``options`` reads a front door's arguments, ``observed`` shapes token logprobs
and canvas frames for them.
"""

from dlm_backend.chat.messages import ChatDelta, ChatRequest, ChatResult, normalize_messages
from dlm_backend.chat.observed import canvas_frame, completion_logprobs, openai_logprobs
from dlm_backend.chat.options import UNSUPPORTED, logprobs_knob, refuse_unsupported, request_params
from dlm_backend.chat.plan import Plan
from dlm_backend.chat.prompt import count_prompt_tokens
from dlm_backend.chat.run import Deadline, acomplete, astream, complete, stream

__all__ = ["ChatDelta", "ChatRequest", "ChatResult", "Deadline", "Plan", "acomplete", "astream", "canvas_frame",
           "complete", "completion_logprobs", "count_prompt_tokens", "logprobs_knob", "normalize_messages",
           "openai_logprobs", "refuse_unsupported", "request_params", "stream", "UNSUPPORTED"]
