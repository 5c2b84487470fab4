"""The user docs say what the code does: every knob in sampling.md, the plugin example runs."""

import re
from pathlib import Path

from helpers import PARITY

from dlm_backend import LLM, SamplingParams
from dlm_backend.engine.params import DEFAULTS, KNOBS

DOCS = Path(__file__).resolve().parents[1] / "docs"


def test_sampling_doc_lists_every_knob_with_its_default():
    section = (DOCS / "sampling.md").read_text().split("## Every knob")[1].split("\n## ")[0]
    rows = {m.group(1): m.group(2) for m in re.finditer(r"^\| `(\w+)`[^|]*\| ([^|]+) \|", section, re.MULTILINE)}
    assert set(KNOBS) <= set(rows), set(KNOBS) - set(rows)
    for name in KNOBS:
        default = getattr(DEFAULTS, name)
        if isinstance(default, (int, float)) and not isinstance(default, bool):
            assert str(default).rstrip("0").rstrip(".") in rows[name].replace(" ", ""), (name, rows[name])


def test_the_sampler_example_in_plugins_md_runs(tmp_path):
    import shutil

    code = re.search(r"```python\n(# my_package/dlm_plugin.py.*?)```", (DOCS / "plugins.md").read_text(), re.S).group(1)
    namespace: dict = {}
    exec(compile(code, "plugins.md", "exec"), namespace)
    from dlm_backend.plugins import load_plugins

    pm = load_plugins()
    plugin = type("DocPlugin", (), {"register_samplers": staticmethod(namespace["register_samplers"])})
    pm.register(plugin, name="doc-example")
    try:
        with LLM(str(shutil.copytree(PARITY / "llada-tiny", tmp_path / "m"))) as llm:    # a new engine
            out = llm.generate(prompt_token_ids=[[5, 6, 7]], sampling_params=SamplingParams(
                sampler="top_two", max_tokens=8, block_length=4, ignore_eos=True))[0]
        assert out.num_forward_passes == 4 and len(out.token_ids) == 8
    finally:
        pm.unregister(name="doc-example")
