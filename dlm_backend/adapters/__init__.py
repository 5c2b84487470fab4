"""Framework adapters, registered through the ``register_adapters`` hook and imported on use.

Each adapter module imports its framework, so it is importable only with its extra installed
(``pip install "dlm_backend[langchain]"`` ...). LiteLLM routes model strings through its global
provider table: ``import dlm_backend.adapters.litellm`` registers ``dlm/<model>`` there.
"""

from __future__ import annotations

import importlib

from dlm_backend.errors import DLMError
from dlm_backend.hookspecs import hookimpl

BUILTIN_ADAPTERS = {
    "langchain": ("dlm_backend.adapters.langchain", "langchain"),
    "llamaindex": ("dlm_backend.adapters.llamaindex", "llamaindex"),
    "litellm": ("dlm_backend.adapters.litellm", "litellm"),
    "openai-server": ("dlm_backend.server", "server"),
}


@hookimpl
def register_adapters(register):
    for name, (module, _) in BUILTIN_ADAPTERS.items():
        register(name, module)


def load_adapter(name: str):
    """Import adapter ``name``; a missing framework is a DLMError naming the extra to install."""
    from dlm_backend.plugins import registered_adapters

    table = registered_adapters()
    if name not in table:
        raise DLMError(f"Unknown adapter {name!r}; registered: {', '.join(sorted(table))}.")
    try:
        return importlib.import_module(table[name])
    except ImportError as exc:
        extra = BUILTIN_ADAPTERS.get(name, (None, name))[1]
        raise DLMError(f"The {name} adapter needs its framework: pip install \"dlm_backend[{extra}]\" "
                       f"({exc}).") from exc
