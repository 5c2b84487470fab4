"""dlm_backend: diffusion language models on a fast local engine, behind the interfaces LLM apps use."""

from dlm_backend.engine.outputs import GenerationOutput, StreamChunk
from dlm_backend.engine.params import SamplingParams
from dlm_backend.errors import DLMError
from dlm_backend.hookspecs import hookimpl
from dlm_backend.llm import LLM

__version__ = "0.1.0"
__all__ = ["LLM", "SamplingParams", "GenerationOutput", "StreamChunk", "DLMError", "hookimpl"]
