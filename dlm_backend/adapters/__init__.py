"""Framework adapters, registered through the ``register_adapters`` hook and imported on use."""

from dlm_backend.hookspecs import hookimpl

BUILTIN_ADAPTERS: dict[str, str] = {}


@hookimpl
def register_adapters(register):
    for name, module in BUILTIN_ADAPTERS.items():
        register(name, module)
