"""OpenAI-compatible HTTP server: ``dlm serve [MODEL]`` (needs the ``[server]`` extra)."""


def __getattr__(name):
    # Lazy, so that `dlm` and ServerConfig work without FastAPI installed.
    if name == "create_app":
        from dlm_backend.server.app import create_app

        return create_app
    raise AttributeError(name)


__all__ = ["create_app"]
