"""Messages <-> prompt, tool calls and structured output: the one implementation behind every
front door (LangChain, LlamaIndex, LiteLLM, the OpenAI-compatible server).

Front doors translate their framework's call into a :class:`ChatRequest` (OpenAI-style messages,
tools, tool_choice, response_format, sampling parameters) and get back a :class:`ChatResult`, or
:class:`ChatDelta` events while streaming. ``messages`` holds those types, ``prepared`` turns a
request into engine terms, ``run`` runs it.
"""

from dlm_backend.chat.messages import ChatDelta, ChatRequest, ChatResult, normalize_messages
from dlm_backend.chat.prepared import Prepared
from dlm_backend.chat.run import acomplete, astream, complete, stream

__all__ = ["ChatDelta", "ChatRequest", "ChatResult", "Prepared", "acomplete", "astream", "complete",
           "normalize_messages", "stream"]
