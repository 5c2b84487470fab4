"""OpenAI-compatible HTTP server: ``dlm serve [MODEL]``."""

from dlm_backend.server.app import create_app

__all__ = ["create_app"]
