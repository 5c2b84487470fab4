"""Plugin manager: built-ins load as default plugins, third-party ones through entry points.

``DLM_DISABLE_PLUGIN_AUTOLOAD=1`` skips entry-point plugins (built-ins still load);
``DLM_LOAD_PLUGINS=a,b`` loads only the named entry points.
"""

from __future__ import annotations

import importlib
import importlib.metadata
import os
import threading

import pluggy

from dlm_backend import hookspecs
from dlm_backend.errors import PluginError

ENTRY_POINT_GROUP = "dlm_backend"
DEFAULT_PLUGINS = (
    "dlm_backend.engine.models",
    "dlm_backend.engine.samplers",
    "dlm_backend.engine.requests",
    "dlm_backend.adapters",
)

pm = pluggy.PluginManager("dlm_backend")
pm.add_hookspecs(hookspecs)

_loaded = False
_lock = threading.Lock()


def load_plugins() -> pluggy.PluginManager:
    """Register built-in and entry-point plugins once; later calls are no-ops."""
    global _loaded
    with _lock:
        if _loaded:
            return pm
        if not os.environ.get("DLM_DISABLE_PLUGIN_AUTOLOAD"):
            allow = os.environ.get("DLM_LOAD_PLUGINS")
            names = ({ep.name for ep in importlib.metadata.entry_points(group=ENTRY_POINT_GROUP)} if allow is None
                     else set(filter(None, (n.strip() for n in allow.split(",")))))
            for name in sorted(names):        # one at a time, so a broken one is named
                try:
                    pm.load_setuptools_entrypoints(ENTRY_POINT_GROUP, name=name)
                except Exception as exc:  # noqa: BLE001 - whatever a third-party import raises
                    raise PluginError(f"The dlm_backend plugin {name!r} failed to load ({type(exc).__name__}: "
                                      f"{exc}). {_SKIP}") from exc
        for module_name in DEFAULT_PLUGINS:
            if pm.get_plugin(module_name) is None:
                pm.register(importlib.import_module(module_name), name=module_name)
        try:
            pm.check_pending()
        except pluggy.PluginValidationError as exc:
            raise PluginError(f"The dlm_backend plugin {pm.get_name(exc.plugin)!r} implements a hook this version "
                              f"does not have: {exc}. {_SKIP}") from exc
        _loaded = True
    return pm


_SKIP = ("Upgrade or uninstall it, or skip entry-point plugins with DLM_DISABLE_PLUGIN_AUTOLOAD=1 "
         "(or name the ones to load in DLM_LOAD_PLUGINS=a,b).")


def _collect(hook_name: str) -> dict:
    load_plugins()
    table: dict = {}

    def register(name, value):
        table[name] = value

    getattr(pm.hook, hook_name)(register=register)
    return table


def registered_models() -> dict[str, str]:
    """Architecture string -> ``"module:Class"`` for every registered model family."""
    return _collect("register_models")


def registered_samplers() -> dict[str, type]:
    """Sampler name -> class for every registered decoding strategy."""
    return _collect("register_samplers")


def registered_knobs() -> dict:
    """Knob name -> ``Knob`` for the knobs registered samplers declare (``Sampler.knobs``): the knob
    table's plugin part (engine/params.py holds the built-in one). One name declared two ways, by two
    samplers, is a PluginError naming both: a knob has one declaration."""
    table: dict = {}
    owner: dict[str, str] = {}
    for sampler, cls in registered_samplers().items():
        for name, spec in getattr(cls, "knobs", {}).items():
            if table.setdefault(name, spec) != spec:
                raise PluginError(f"The samplers {owner[name]!r} and {sampler!r} declare the knob {name!r} "
                                  "differently. A knob has one declaration: share one Knob, or rename one.")
            owner.setdefault(name, sampler)
    return table


def registered_schedules() -> dict[str, type]:
    """Schedule name -> ``Sequence`` subclass: how a family's requests are decoded pass by pass
    (a family names its own with ``DiffusionLM.schedule``)."""
    return _collect("register_schedules")


def registered_adapters() -> dict[str, str]:
    """Adapter name -> module path for every registered framework adapter."""
    return _collect("register_adapters")


def plugin_listing() -> list[dict]:
    """One entry per loaded plugin: its name, hooks and distribution (None for built-ins)."""
    load_plugins()
    dists = {id(plugin): dist for plugin, dist in pm.list_plugin_distinfo()}
    rows = []
    for name, plugin in pm.list_name_plugin():
        dist = dists.get(id(plugin))
        rows.append({
            "name": name,
            "hooks": sorted(h.name for h in pm.get_hookcallers(plugin) or []),
            "distribution": f"{dist.project_name} {dist.version}" if dist else None,
        })
    return rows
