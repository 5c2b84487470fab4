"""Plugins: built-ins load as default plugins; a third-party entry point adds a sampler."""

import importlib
import json
import subprocess
import sys
import textwrap

import pytest

from tests.helpers import PARITY

from dlm_backend import plugins


def _install_plugin(site):
    """A real installed distribution exposing the entry point dlm_backend = greedy_left."""
    (site / "greedy_left_plugin.py").write_text(textwrap.dedent('''
        from dlm_backend import hookimpl
        from dlm_backend.engine.samplers import Commit, Sampler

        class LeftToRight(Sampler):
            """Commit the leftmost masked slot with its argmax: plain left-to-right decoding."""
            name = "left_to_right"

            def step(self, inp):
                return Commit([0], [int(inp.logits[0].argmax())])

        @hookimpl
        def register_samplers(register):
            register("left_to_right", LeftToRight)
    '''))
    dist = site / "greedy_left_plugin-0.1.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: greedy-left-plugin\nVersion: 0.1\n")
    (dist / "entry_points.txt").write_text("[dlm_backend]\ngreedy_left = greedy_left_plugin\n")


SCRIPT = """
import json, sys
from dlm_backend import LLM, SamplingParams
from dlm_backend.plugins import plugin_listing, registered_samplers
llm = LLM(sys.argv[1])
out = llm.generate(prompt_token_ids=[[5, 6, 7, 8]], sampling_params=SamplingParams(
    sampler="left_to_right", max_tokens=6, block_length=3, ignore_eos=True))[0]
print(json.dumps({"samplers": sorted(registered_samplers()), "passes": out.num_forward_passes,
                  "tokens": out.token_ids, "plugins": [p["name"] for p in plugin_listing()],
                  "dists": [p["distribution"] for p in plugin_listing()]}))
"""


def _run(site, env_extra):
    import os
    env = {**os.environ, "PYTHONPATH": f"{site}{os.pathsep}{os.environ.get('PYTHONPATH', '')}", **env_extra}
    env.pop("DLM_DISABLE_PLUGIN_AUTOLOAD", None)
    env.update(env_extra)
    return subprocess.run([sys.executable, "-c", SCRIPT, str(PARITY / "llada-tiny")], env=env,
                          capture_output=True, text=True)


def test_entry_point_plugin_adds_a_sampler(tmp_path):
    _install_plugin(tmp_path)
    result = _run(tmp_path, {})
    assert result.returncode == 0, result.stderr
    data = json.loads(result.stdout)
    assert "left_to_right" in data["samplers"] and "llada" in data["samplers"]
    assert data["passes"] == 6 and len(data["tokens"]) == 6      # one token per pass
    assert "greedy-left-plugin 0.1" in data["dists"]


def test_env_var_disables_entry_points(tmp_path):
    _install_plugin(tmp_path)
    result = _run(tmp_path, {"DLM_DISABLE_PLUGIN_AUTOLOAD": "1"})
    assert result.returncode != 0
    assert "Unknown sampler 'left_to_right'" in result.stderr


def test_builtins_are_registered_as_plugins():
    names = [p["name"] for p in plugins.plugin_listing()]
    assert "dlm_backend.engine.models" in names and "dlm_backend.engine.samplers" in names
    assert set(plugins.registered_models()) >= {"LLaDAModelLM", "DreamModel"}
    assert set(plugins.registered_samplers()) >= {"llada", "dream", "threshold", "factor", "entropy_bounded"}


def test_in_process_plugin_registration():
    module = importlib.import_module("dlm_backend.engine.samplers.threshold")

    class Plugin:
        @staticmethod
        @plugins.hookspecs.hookimpl
        def register_samplers(register):
            register("threshold_alias", module.ThresholdSampler)

    plugins.load_plugins()
    plugins.pm.register(Plugin, name="alias-plugin")
    try:
        assert plugins.registered_samplers()["threshold_alias"] is module.ThresholdSampler
    finally:
        plugins.pm.unregister(name="alias-plugin")
    assert "threshold_alias" not in plugins.registered_samplers()


def test_adapters_are_registered_through_the_hook_and_load_on_use():
    from dlm_backend import hookimpl
    from dlm_backend.adapters import load_adapter
    from dlm_backend.errors import DLMError

    assert plugins.registered_adapters() == {
        "langchain": "dlm_backend.adapters.langchain", "llamaindex": "dlm_backend.adapters.llamaindex",
        "litellm": "dlm_backend.adapters.litellm", "openai-server": "dlm_backend.server"}
    assert hasattr(load_adapter("langchain"), "ChatDLM") and hasattr(load_adapter("openai-server"), "create_app")

    class ThirdParty:
        @hookimpl
        def register_adapters(self, register):
            register("haystack", "haystack_dlm_missing")

    plugins.pm.register(ThirdParty(), name="third-party-adapter")
    try:
        assert plugins.registered_adapters()["haystack"] == "haystack_dlm_missing"
        with pytest.raises(DLMError, match=r'haystack adapter needs its framework: pip install "dlm_backend\[haystack\]"'):
            load_adapter("haystack")
    finally:
        plugins.pm.unregister(name="third-party-adapter")
    with pytest.raises(DLMError, match="Unknown adapter 'nope'; registered: langchain, litellm, llamaindex, openai-server"):
        load_adapter("nope")


@pytest.mark.parametrize("source,needle", [
    ("raise ImportError('needs numpy 3')", "failed to load (ImportError: needs numpy 3)"),
    ("from dlm_backend import hookimpl\n@hookimpl\ndef register_widgets(register):\n    pass\n",
     "implements a hook this version does not have"),
])
def test_a_broken_plugin_is_one_error_line_naming_it_and_the_way_around(tmp_path, source, needle):
    import os
    (tmp_path / "broken_plugin.py").write_text(source)
    dist = tmp_path / "broken_plugin-0.1.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: broken-plugin\nVersion: 0.1\n")
    (dist / "entry_points.txt").write_text("[dlm_backend]\nbroken = broken_plugin\n")
    env = {**os.environ, "PYTHONPATH": f"{tmp_path}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    env.pop("DLM_DISABLE_PLUGIN_AUTOLOAD", None)
    run = subprocess.run([sys.executable, "-m", "dlm_backend.cli", "plugins"], env=env, capture_output=True, text=True)
    assert run.returncode == 2 and "Traceback" not in run.stderr
    assert "'broken'" in run.stderr and needle in run.stderr and "DLM_DISABLE_PLUGIN_AUTOLOAD=1" in run.stderr
    env["DLM_DISABLE_PLUGIN_AUTOLOAD"] = "1"
    assert subprocess.run([sys.executable, "-m", "dlm_backend.cli", "plugins"], env=env,
                          capture_output=True, text=True).returncode == 0


def test_the_built_in_schedules_are_registered_by_a_default_plugin():
    from dlm_backend.engine.requests import BUILTIN_SCHEDULES

    assert "dlm_backend.engine.requests" in [p["name"] for p in plugins.plugin_listing()]
    assert plugins.registered_schedules() == BUILTIN_SCHEDULES
    assert set(BUILTIN_SCHEDULES) == {"full", "block", "uniform", "causal_block", "wedlm"}


def test_a_plugin_schedule_joins_the_table_and_leaves_with_its_plugin():
    from dlm_backend import hookimpl
    from dlm_backend.engine.requests import schedule_class
    from dlm_backend.engine.requests.canvas_sequence import CanvasSequence
    from dlm_backend.errors import PluginError

    class Mine(CanvasSequence):
        pass

    class Plugin:
        @hookimpl
        def register_schedules(self, register):
            register("mine", Mine)
            register("not_a_sequence", dict)

    plugins.pm.register(Plugin(), name="schedule-plugin")
    try:
        assert schedule_class("mine") is Mine
        with pytest.raises(PluginError, match="'not_a_sequence' is registered as <class 'dict'>, which is not a "
                                              "subclass of dlm_backend.engine.requests.sequence.Sequence"):
            schedule_class("not_a_sequence")
    finally:
        plugins.pm.unregister(name="schedule-plugin")
    with pytest.raises(PluginError, match="'mine' is not registered"):
        schedule_class("mine")


@pytest.mark.parametrize("knobs", [{"width": ("slots a pass", int)}, {"two words": "Knob"}])
def test_a_sampler_knob_that_is_not_a_knob_under_a_python_name_is_refused_where_it_is_declared(knobs):
    from dlm_backend.engine.samplers import Sampler
    from dlm_backend.errors import PluginError

    with pytest.raises(PluginError, match=r"Bad.knobs\[.*\] must be a dlm_backend.engine.params.Knob under a Python"):
        type("Bad", (Sampler,), {"name": "bad", "knobs": knobs, "step": lambda self, inp: None})


@pytest.mark.parametrize("name,spec,needle", [
    ("temperature", dict(doc="mine", kind=float), "declares the knob 'temperature', which the knob table already has"),
    ("max_new_tokens", dict(doc="mine", kind=int), "declares the knob 'max_new_tokens', which the knob table"),
    ("kv_cache", dict(doc="mine", kind=str), "declares the knob 'kv_cache'"),
    ("options", dict(doc="mine", kind=int), "declares the knob 'options'"),
    ("width", dict(doc="mine", kind=int, low=1, high=4, default=0), r"its default breaks its own rule.*\[1, 4\]"),
])
def test_a_sampler_knob_may_not_shadow_the_table_or_break_its_own_rule(name, spec, needle):
    from dlm_backend.engine.params import Knob
    from dlm_backend.engine.samplers import Sampler
    from dlm_backend.errors import PluginError

    with pytest.raises(PluginError, match=needle):
        type("Shadow", (Sampler,), {"name": "shadow", "knobs": {name: Knob(**spec)},
                                    "step": lambda self, inp: None})


def test_one_knob_name_declared_two_ways_by_two_samplers_is_refused_naming_both():
    from dlm_backend import SamplingParams, hookimpl
    from dlm_backend.engine.params import Knob
    from dlm_backend.engine.samplers import Sampler
    from dlm_backend.errors import PluginError

    shared = Knob("slots a pass", int, low=1, high=8, default=2)

    def sampler(name, knob):
        return type(name, (Sampler,), {"name": name, "knobs": {"width": knob}, "step": lambda self, inp: None})

    a, b, c = sampler("a", shared), sampler("b", shared), sampler("c", Knob("other", int, default=3))

    class Plugin:
        def __init__(self, *classes):
            self.classes = classes

        @hookimpl
        def register_samplers(self, register):
            for cls in self.classes:
                register(cls.name, cls)

    plugins.pm.register(Plugin(a, b), name="knob-plugin")
    try:
        assert plugins.registered_knobs()["width"] is shared                        # one declaration, shared
        assert SamplingParams(sampler="a", width=3).get("width") == 3
        plugins.pm.register(Plugin(c), name="knob-clash")
        try:
            with pytest.raises(PluginError, match="declare the knob 'width' differently"):
                SamplingParams(sampler="a", width=3)
        finally:
            plugins.pm.unregister(name="knob-clash")
    finally:
        plugins.pm.unregister(name="knob-plugin")
    assert "width" not in plugins.registered_knobs()
