"""pluggy hook specifications. Built-ins implement these exactly as third-party plugins do.

A plugin is a module (or object) with functions decorated by :data:`dlm_backend.hookimpl`, exposed
through the ``dlm_backend`` entry-point group::

    [project.entry-points.dlm_backend]
    my_plugin = "my_package.dlm_plugin"
"""

from __future__ import annotations

import pluggy

hookspec = pluggy.HookspecMarker("dlm_backend")
hookimpl = pluggy.HookimplMarker("dlm_backend")


@hookspec
def register_models(register):
    """Register model families: ``register("ArchitecturesString", "package.module:ClassName")``."""


@hookspec
def register_samplers(register):
    """Register decoding strategies: ``register("name", SamplerClass)``."""


@hookspec
def register_schedules(register):
    """Register request schedules: ``register("name", SequenceClass)``, a subclass of
    ``dlm_backend.engine.requests.sequence.Sequence`` that decodes one request pass by pass. A model
    family picks one by name (``DiffusionLM.schedule``); the built-ins are ``full``, ``block`` and
    ``uniform``."""


@hookspec
def register_adapters(register):
    """Register framework adapters: ``register("name", "package.module")``, imported on use."""


@hookspec
def register_commands(subparsers):
    """Add sub-commands to the ``dlm`` CLI (an ``argparse`` sub-parsers object)."""
