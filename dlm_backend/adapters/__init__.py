"""Framework adapters, registered through the ``register_adapters`` hook and imported on use.

Each adapter module imports its framework, so it is importable only with its extra installed
(``pip install "dlm_backend[langchain]"`` ...). LiteLLM routes model strings through a global
provider table, so ``dlm/<model>`` strings are registered as soon as both ``dlm_backend`` and
``litellm`` are imported, in either order, without importing litellm (5 s) eagerly.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.util
import sys

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


class _LiteLLMHook(importlib.abc.MetaPathFinder):
    """Registers the dlm provider right after ``import litellm`` finishes."""

    def find_spec(self, fullname, path=None, target=None):
        if fullname != "litellm":
            return None
        sys.meta_path.remove(self)
        try:
            spec = importlib.util.find_spec(fullname)
        finally:
            sys.meta_path.insert(0, self)
        if spec is None or spec.loader is None:
            return None
        exec_module = spec.loader.exec_module

        def exec_and_register(module):
            exec_module(module)
            sys.meta_path[:] = [f for f in sys.meta_path if not isinstance(f, _LiteLLMHook)]
            importlib.import_module("dlm_backend.adapters.litellm")

        spec.loader.exec_module = exec_and_register
        return spec


def install_litellm_hook() -> None:
    """Make ``dlm/...`` model strings work in LiteLLM once it is imported (idempotent)."""
    if "litellm" in sys.modules:
        importlib.import_module("dlm_backend.adapters.litellm")
    elif not any(isinstance(f, _LiteLLMHook) for f in sys.meta_path):
        sys.meta_path.insert(0, _LiteLLMHook())
