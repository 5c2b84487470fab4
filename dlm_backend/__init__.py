"""dlm_backend: masked-diffusion language models (LLaDA, Dream) on a fast local engine."""

from dlm_backend.engine.llm import LLM
from dlm_backend.engine.outputs import GenerationOutput, StreamChunk
from dlm_backend.engine.params import SamplingParams
from dlm_backend.errors import DLMError
from dlm_backend.hookspecs import hookimpl

from dlm_backend.adapters import install_litellm_hook

install_litellm_hook()

__version__ = "0.1.0"
__all__ = ["LLM", "SamplingParams", "GenerationOutput", "StreamChunk", "DLMError", "hookimpl"]
