"""Architecture string -> implementation, resolved lazily (vLLM-style explicit table)."""

from __future__ import annotations

import importlib

from dlm_backend.errors import CheckpointError, UnknownArchitectureError


def supported_architectures() -> dict[str, str]:
    """Every registered ``architectures`` string with its ``module:Class`` target."""
    from dlm_backend.plugins import registered_models

    return dict(sorted(registered_models().items()))


def from_config_json(build, config: dict):
    """``build(config)`` for a family's config reader (``cls.args_from_config`` or ``cls.from_config``):
    a field the family needs and config.json lacks (a KeyError out of it) is a CheckpointError naming it."""
    try:
        return build(config)
    except KeyError as exc:
        raise CheckpointError(f"config.json lacks {exc.args[0]!r}, which this architecture needs. Re-download "
                              "the checkpoint or add the field.") from None


def resolve_model_class(config: dict) -> type:
    """The model class for a checkpoint's config.json (first registered entry of ``architectures``)."""
    table = supported_architectures()
    archs = config.get("architectures") or []
    if isinstance(archs, str):          # a hand-written config: one name, not a list of them
        archs = [archs]
    if not isinstance(archs, list) or not all(isinstance(a, str) for a in archs):
        raise UnknownArchitectureError(f"config.json 'architectures' must be a list of names, got {archs!r:.80}. "
                                       f"Supported: {', '.join(table)}.")
    for arch in archs:
        if arch in table:
            module_name, _, class_name = table[arch].partition(":")
            try:
                return getattr(importlib.import_module(module_name), class_name)
            except (ImportError, AttributeError) as exc:
                raise UnknownArchitectureError(
                    f"Architecture {arch!r} is registered as {table[arch]!r} but failed to import: {exc}. "
                    "Reinstall the plugin that provides it.") from exc
    found = ", ".join(archs) if archs else "none (config.json has no 'architectures' list)"
    raise UnknownArchitectureError(
        f"Unsupported architecture: {found}. Supported: {', '.join(table)}. "
        "Use a checkpoint of a supported family, or install a plugin that registers this architecture "
        "through the 'register_models' hook.")
