"""The user docs say what the code does: every knob in sampling.md, the plugin examples run."""

import importlib
import json
import re
import shutil
import sys
from pathlib import Path

import pytest
from tests.helpers import PARITY

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


PLUGINS_MD = (DOCS / "plugins.md").read_text()


@pytest.fixture
def doc_module(tmp_path, monkeypatch):
    """Installs the plugins.md code block headed ``# my_package/<file>`` as that module and imports it."""
    (tmp_path / "my_package").mkdir()
    (tmp_path / "my_package" / "__init__.py").touch()
    monkeypatch.syspath_prepend(str(tmp_path))

    def install(file: str):
        code = re.search(rf"```python\n(# my_package/{re.escape(file)}\n.*?)```", PLUGINS_MD, re.S).group(1)
        (tmp_path / "my_package" / file).write_text(code)
        return importlib.import_module(f"my_package.{file.removesuffix('.py')}")

    yield install
    for name in [n for n in sys.modules if n.split(".")[0] == "my_package"]:
        del sys.modules[name]


#: The LLaDA parity checkpoint's tensors under the Llama names the example family uses.
LLAMA_BLOCK = {"attn_norm": "input_layernorm", "q_proj": "self_attn.q_proj", "k_proj": "self_attn.k_proj",
               "v_proj": "self_attn.v_proj", "attn_out": "self_attn.o_proj", "ff_norm": "post_attention_layernorm",
               "ff_proj": "mlp.gate_proj", "up_proj": "mlp.up_proj", "ff_out": "mlp.down_proj"}
LLAMA_TOP = {"wte": "model.embed_tokens", "ln_f": "model.norm", "ff_out": "lm_head"}


def _llama_layout_checkpoint(dest: Path, drop: str | None = None, arch: str = "MyModelForDiffusion") -> Path:
    """llada-tiny's weights and shapes written as an ``arch`` checkpoint (Llama layout)."""
    from safetensors.torch import load_file, save_file

    tensors = {}
    for name, t in load_file(PARITY / "llada-tiny" / "model.safetensors").items():
        part = name.split(".")          # model.transformer.blocks.0.q_proj.weight / model.transformer.wte.weight
        new = (f"model.layers.{part[3]}.{LLAMA_BLOCK[part[4]]}.weight" if part[2] == "blocks"
               else f"{LLAMA_TOP[part[2]]}.weight")
        if new != drop:
            tensors[new] = t
    c = json.loads((PARITY / "llada-tiny" / "config.json").read_text())
    config = {"architectures": [arch], "vocab_size": c["vocab_size"], "hidden_size": c["d_model"],
              "num_attention_heads": c["n_heads"], "num_key_value_heads": c["n_kv_heads"],
              "num_hidden_layers": c["n_layers"], "intermediate_size": c["mlp_hidden_size"],
              "max_position_embeddings": c["max_sequence_length"], "rope_theta": c["rope_theta"],
              "rms_norm_eps": c["rms_norm_eps"], "mask_token_id": c["mask_token_id"], "eos_token_id": c["eos_token_id"]}
    dest.mkdir()
    save_file(tensors, str(dest / "model.safetensors"))
    (dest / "config.json").write_text(json.dumps(config))
    return dest


def test_the_model_family_example_in_plugins_md_loads_and_decodes_like_the_same_weights_as_llada(
        tmp_path, doc_module, capsys):
    from dlm_backend.cli import main
    from dlm_backend.errors import CheckpointError, UnknownArchitectureError
    from dlm_backend.plugins import load_plugins

    folder = _llama_layout_checkpoint(tmp_path / "mine")
    with pytest.raises(UnknownArchitectureError, match="MyModelForDiffusion"):       # not registered yet
        LLM(str(folder))
    module = doc_module("my_model.py")
    pm = load_plugins()
    pm.register(module, name="doc-model")
    try:
        assert main(["models"]) == 0 and "MyModelForDiffusion" in capsys.readouterr().out
        params = dict(max_tokens=8, block_length=4, ignore_eos=True)
        with LLM(str(folder)) as mine, LLM(str(shutil.copytree(PARITY / "llada-tiny", tmp_path / "ref"))) as ref:
            assert type(mine.engine.runner.model) is module.MyModel
            defaults = mine.sampling_params()
            assert (defaults.sampler, defaults.block_length) == ("llada", 32)         # the family's set-up
            got = mine.generate(prompt_token_ids=[[5, 6, 7]], sampling_params=mine.sampling_params(**params))[0]
            want = ref.generate(prompt_token_ids=[[5, 6, 7]],
                                sampling_params=SamplingParams(sampler="llada", **params))[0]
        assert got.token_ids == want.token_ids and got.num_forward_passes == want.num_forward_passes == 8
        with pytest.raises(CheckpointError, match="lm_head.weight"):                 # a tensor it lacks
            LLM(str(_llama_layout_checkpoint(tmp_path / "short", drop="lm_head.weight")))
    finally:
        pm.unregister(name="doc-model")


def test_the_sampler_knob_example_in_plugins_md_joins_the_knob_table_and_reaches_the_sampler(
        tmp_path, doc_module, capsys):
    from dlm_backend.chat import request_params
    from dlm_backend.cli import main
    from dlm_backend.engine.params import knob_values
    from dlm_backend.errors import SamplingParamsError
    from dlm_backend.plugins import load_plugins

    with pytest.raises(SamplingParamsError, match="Unknown SamplingParams field 'per_pass'"):
        SamplingParams(per_pass=4)                                                  # not registered yet
    module = doc_module("my_sampler.py")
    pm = load_plugins()
    pm.register(module, name="doc-sampler")
    try:
        assert main(["plugins"]) == 0
        knobs = json.loads(capsys.readouterr().out)["knobs"]            # the built-ins' own knobs besides
        assert knobs["per_pass"] == "confident_k: slots committed per pass" and "draft_threshold" in knobs
        assert SamplingParams(sampler="confident_k").get("per_pass") == 2                   # its declared default
        assert SamplingParams(sampler="confident_k", per_pass=4).get("per_pass") == 4
        with pytest.raises(SamplingParamsError, match="Did you mean 'per_pass'"):
            SamplingParams(sampler="confident_k", per_pas=4)
        with pytest.raises(SamplingParamsError, match="Did you mean 'per_pass'"):
            knob_values({"per_pas": 4})                                             # a front door's knobs
        with pytest.raises(SamplingParamsError, match=r"per_pass must be in \[1, 64\]"):
            SamplingParams(sampler="confident_k", per_pass=0)
        with pytest.raises(SamplingParamsError, match="Did you mean 'temperature'"):
            SamplingParams(temprature=0.5)                                           # built-ins as before
        base = dict(max_tokens=8, block_length=8, ignore_eos=True)
        with LLM(str(shutil.copytree(PARITY / "llada-tiny", tmp_path / "m"))) as llm:
            def run(params):
                return llm.generate(prompt_token_ids=[[5, 6, 7]], sampling_params=params)[0]

            two = run(SamplingParams(sampler="confident_k", **base))
            four = run(llm.sampling_params(sampler="confident_k", per_pass=4, **base))
            chat = run(request_params(llm, {"sampler": "confident_k", **base}, {"per_pass": 8}))
            sampled = [run(SamplingParams(sampler="confident_k", per_pass=4, temperature=1.0, seed=s, **base))
                       for s in (3, 3)]
        assert (two.num_forward_passes, four.num_forward_passes, chat.num_forward_passes) == (4, 2, 1)
        assert len(two.token_ids) == len(four.token_ids) == len(chat.token_ids) == 8
        assert sampled[0].token_ids == sampled[1].token_ids            # drawn through the request's seeded random
    finally:
        pm.unregister(name="doc-sampler")
    with pytest.raises(SamplingParamsError, match="Unknown SamplingParams field 'per_pass'"):
        SamplingParams(per_pass=4)                                                  # gone with its sampler


def test_the_schedule_example_in_plugins_md_decodes_block_after_block_through_the_engine(
        tmp_path, doc_module, monkeypatch):
    from dlm_backend.errors import PluginError
    from dlm_backend.plugins import load_plugins, registered_schedules

    base = doc_module("my_model.py")
    module = doc_module("my_schedule.py")
    pm = load_plugins()
    pm.register(base, name="doc-model")
    pm.register(module, name="doc-schedule")
    fed, plan = [], module.GrowingCanvas.plan

    def recorded(self, shift):              # where each planned pass's fed positions end
        step = plan(self, shift)
        fed.append(step.end)
        return step

    monkeypatch.setattr(module.GrowingCanvas, "plan", recorded)
    try:
        assert registered_schedules()["growing"] is module.GrowingCanvas
        growing = _llama_layout_checkpoint(tmp_path / "growing", arch="MyGrowingModelForDiffusion")
        full = _llama_layout_checkpoint(tmp_path / "full")
        prompt, knobs = [5, 6, 7], dict(block_length=4, ignore_eos=True)
        with LLM(str(growing)) as mine, LLM(str(full)) as ref:
            assert mine.engine.sequence_class is module.GrowingCanvas and mine.engine.runner.model.schedule == "growing"
            assert ref.engine.runner.model.schedule == "full"
            params = mine.sampling_params(max_tokens=8, **knobs)
            got = mine.generate(prompt_token_ids=[prompt], sampling_params=params)[0]

            def alone(ids):             # one block on a canvas that ends with it: the full schedule, no cache
                params = ref.sampling_params(max_tokens=4, cache="none", **knobs)
                return ref.generate(prompt_token_ids=[ids], sampling_params=params)[0].token_ids

            first = alone(prompt)
            second = alone(prompt + first)
        assert got.token_ids == first + second and got.num_forward_passes == 8
        assert set(fed) == {len(prompt) + 4, len(prompt) + 8} and fed[0] == len(prompt) + 4     # never the masks after
        monkeypatch.setattr(module.MyGrowingModel, "schedule", "nowhere")
        with pytest.raises(PluginError, match=r"'nowhere' is not registered. Registered schedules: block, "
                                              r"(\w+, )*full, growing, uniform"):
            LLM(str(growing))
    finally:
        pm.unregister(name="doc-schedule")
        pm.unregister(name="doc-model")


def test_the_adapter_example_in_plugins_md_is_listed_and_answers_as_the_chat_layer_does(
        tmp_path, doc_module, dream_chat, capsys):
    from dlm_backend import chat
    from dlm_backend.adapters import load_adapter
    from dlm_backend.cli import main
    from dlm_backend.engine import shared_engines as shared
    from dlm_backend.errors import DLMError
    from dlm_backend.plugins import load_plugins, registered_adapters

    module = doc_module("my_adapter.py")
    pm = load_plugins()
    pm.register(module, name="doc-adapter")
    try:
        assert registered_adapters()["callable"] == "my_package.my_adapter"
        assert main(["plugins"]) == 0
        listing = json.loads(capsys.readouterr().out)
        assert listing["adapters"]["callable"] == "my_package.my_adapter"
        assert "doc-adapter" in [p["name"] for p in listing["plugins"]]
        assert load_adapter("callable") is module
        with pytest.raises(DLMError, match="Did you mean 'threshold'"):
            module.DLMCallable(thresold=0.5)                                          # checked, nothing loaded
        path = str(shutil.copytree(dream_chat, tmp_path / "m"))
        model = module.DLMCallable(model=path, max_tokens=8, block_length=8)
        messages = [{"role": "user", "content": "Name three prime numbers."}]
        reply = model(messages)
        with LLM(path) as llm:
            want = chat.complete(llm, chat.ChatRequest(messages, llm.sampling_params(max_tokens=8, block_length=8)))
            short = chat.complete(llm, chat.ChatRequest(messages, llm.sampling_params(max_tokens=2, block_length=8)))
        assert reply == {"role": "assistant", "content": want.content, "tool_calls": []} and want.content
        assert "".join(model.stream(messages)) == want.content
        assert model(messages, max_tokens=2)["content"] == short.content                # the call's knobs win
        assert "".join(model.stream(messages, max_tokens=2)) == short.content
        model.close()
        assert not any(path in str(key[0]) for key in shared.loaded())               # the engine was given back
    finally:
        pm.unregister(name="doc-adapter")


def test_the_readme_layout_names_every_module_and_architecture_md_every_folder():
    root = DOCS.parent
    section = (root / "README.md").read_text().split("## Layout")[1].split("\n## ")[0]
    named: dict[str, set] = {}
    for bullet in re.split(r"\n- ", section)[1:]:
        folder = re.match(r"`(dlm_backend/[\w/]*)`", bullet)
        if folder:
            named[folder.group(1)] = set(re.findall(r"`([\w.]+\.py)`", bullet))
    package = root / "dlm_backend"
    folders = {str(d.relative_to(root)) + "/" for d in [package, *package.rglob("*")]
               if d.is_dir() and any(d.glob("*.py"))}
    assert set(named) == folders, set(named) ^ folders
    for folder, files in named.items():
        modules = {p.name for p in (root / folder).glob("*.py")} - {"__init__.py"}
        assert files - {"__init__.py"} == modules, (folder, files ^ modules)
    table = (DOCS / "architecture.md").read_text().split("## What lives where")[1]
    rows = set(re.findall(r"^\| `(dlm_backend/[\w/]*)` \|", table, re.MULTILINE))
    assert folders <= rows, folders - rows


def test_quantization_md_lists_every_method_and_every_format_read():
    """One declaration each: the methods table (quant/methods.py) and the formats table (quant/formats)."""
    from dlm_backend.engine.quant.formats import FORMATS
    from dlm_backend.engine.quant.methods import METHODS

    text = (DOCS / "quantization.md").read_text()
    methods = text.split("## Quantizing at load")[1].split("\n## ")[0]
    rows = dict(re.findall(r"^\| `(\w+)` \| (.+) \|$", methods, re.MULTILINE))
    assert rows == METHODS
    formats = text.split("## What loads")[1].split("\n## ")[0]
    assert set(FORMATS) <= set(re.findall(r"\| `([\w-]+)` \|", formats))
