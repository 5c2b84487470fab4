"""User-facing errors. Every message names the problem and says how to fix it."""

from __future__ import annotations


class DLMError(Exception):
    """Base class of every error dlm_backend raises for bad input or configuration.

    ``param`` names the request field at fault when there is one (OpenAI's error ``param``).
    """

    def __init__(self, message: str = "", param: str | None = None):
        super().__init__(message)
        self.param = param


class UnknownArchitectureError(DLMError):
    """The checkpoint's `architectures` entry has no registered implementation."""


class CheckpointError(DLMError):
    """The checkpoint on disk is missing files or tensors, or holds tensors of the wrong shape."""


class UnsafeCheckpointError(CheckpointError):
    """Only pickle-based weights (.bin/.pt/.pth) were found; they are never loaded."""


class ModelNotFoundError(DLMError):
    """Neither a local folder nor a hub repository (or its cached snapshot) could be found."""


class TokenizerError(DLMError):
    """The checkpoint has no usable tokenizer or chat template for a text request."""


class ContextLengthError(DLMError):
    """The prompt plus the requested tokens do not fit the model's context window."""


class SamplingParamsError(DLMError):
    """Sampling parameters that cannot be satisfied (out of range, unknown sampler, bad combination)."""


class EngineError(DLMError):
    """A request failed inside the engine; other requests keep running."""


class ParallelWorkerError(EngineError):
    """A worker process of a tensor-parallel engine died or lost contact: the engine's requests fail
    and it takes no more until it is restarted (a server's /health answers 503)."""


class RequestTimeoutError(DLMError, TimeoutError):
    """A request ran past the ``timeout`` its caller gave and was aborted (its engine slot freed).
    A ``TimeoutError``, so ``except TimeoutError`` and retry policies keyed on it catch it."""


class QueueFullError(DLMError):
    """The engine's waiting queue is at its bound; the request was not queued (HTTP 429)."""


class PluginError(DLMError):
    """A third-party plugin failed to load or does not fit this version's hooks."""
