"""train.sh, the from-scratch recipe, run against a `dlm` that checks instead of trains.

The stand-in parses each stage's command line with the real `dlm train` parser (the `dlm` CLI with
this recipe's entry-point plugin loaded) and refuses it as `dlm train` would before training
(unknown flags, bad values, an unknown family, a missing --init-from checkpoint), then writes the
stage's model folder. So a typo in the recipe fails here in seconds, not two hours in.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from dlm_tiny.train import parse_weights

SCRIPT = Path(__file__).resolve().parents[1] / "train.sh"

STAND_IN = r"""
import json, sys
from dataclasses import asdict, fields
from pathlib import Path
from dlm_backend.cli import build_parser
from dlm_tiny.checks import check_flags, check_weights
from dlm_tiny.corpus import FAMILIES
from dlm_tiny.train import TrainConfig, parse_weights

args = build_parser().parse_args(sys.argv[1:])
cfg = TrainConfig(**{f.name: getattr(args, f.name) for f in fields(TrainConfig) if getattr(args, f.name) is not None})
check_weights(parse_weights(cfg.family_weights), FAMILIES)
if cfg.precision not in ("float32", "bf16"):
    sys.exit(f"bad precision {cfg.precision}")
logged, cfg.precision = cfg.precision, "float32"   # any CPU checks the flags; the recipe's precision is logged
check_flags(cfg)
model = Path(cfg.out_dir) / "model"
model.mkdir(parents=True, exist_ok=True)            # an interrupted stage leaves its folder behind
(model / "config.json").write_text("{}")
(model / "model.safetensors").write_text("")
with open(sys.argv[0] + ".log", "a") as f:
    f.write(json.dumps({**asdict(cfg), "precision": logged}) + "\n")
"""


def run_recipe(tmp_path: Path, script: Path = SCRIPT, **env) -> tuple[subprocess.CompletedProcess, list[dict]]:
    """Run the recipe with DLM pointing at the stand-in; returns the process and each stage's flags."""
    stand_in = tmp_path / "stand_in.py"
    stand_in.write_text(STAND_IN)
    dlm = tmp_path / "dlm"                  # the script runs "$DLM" train ...: one executable
    dlm.write_text(f'#!/bin/sh\nexec "{sys.executable}" "{stand_in}" "$@"\n')
    dlm.chmod(0o755)
    # `dlm train` comes from the recipe's entry point: load it, and only it, in the stand-in
    base = {k: v for k, v in os.environ.items() if k != "DLM_DISABLE_PLUGIN_AUTOLOAD"}
    done = subprocess.run(["bash", str(script), str(tmp_path / "run")], capture_output=True, text=True, cwd=tmp_path,
                          env={**base, "DLM": str(dlm), "DLM_LOAD_PLUGINS": "dlm_tiny", **env})
    log = Path(f"{stand_in}.log")
    stages = [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []
    log.unlink(missing_ok=True)
    return done, stages


def test_the_recipe_is_four_valid_stages_each_from_the_last(tmp_path):
    done, stages = run_recipe(tmp_path)
    assert done.returncode == 0, done.stderr
    assert [s["out_dir"] for s in stages] == [str(tmp_path / f"run{n}") for n in (1, 2, 3, 4)]
    assert stages[0]["init_from"] == ""
    for n in (1, 2, 3):
        assert stages[n]["init_from"] == str(tmp_path / f"run{n}" / "model")
    assert len({s["seed"] for s in stages}) == 4                     # each stage draws its own corpus
    assert [s["max_extra_pad"] for s in stages] == [40, 160, 256, 256]   # canvases up to the adapters' 256
    assert [(s["precision"], s["device"], s["compile"]) for s in stages] == [("bf16", "cpu", True)] * 4
    assert sum(s["steps"] for s in stages) == 7700                   # the step count the notes time
    # one family mix in stages 1-3, hard QA from the first step (binding forms late in stage 1);
    # stage 4 gives tool calls 0.35 and copy practice 0.05, and writes some QA as the frameworks do
    assert len({(s["family_weights"], s["qa_hard"]) for s in stages[:3]}) == 1 and stages[0]["qa_hard"] == 0.7
    mix4 = parse_weights(stages[3]["family_weights"])
    assert (mix4["tool_call"], mix4["copy"], stages[3]["qa_hard"]) == (0.35, 0.05, 0.7)
    assert [s["unanswerable"] for s in stages] == [0.2, 0.2, 0.35, 0.35]
    assert [s["rag_templates"] for s in stages] == [0.0, 0.0, 0.0, 0.3]
    assert done.stdout.strip().endswith(f"model: {tmp_path / 'run'}4/model")


def test_a_rerun_skips_finished_stages_and_takes_precision_device_and_compile(tmp_path):
    run_recipe(tmp_path)
    (tmp_path / "run3" / "model" / "model.safetensors").unlink()    # stage 3 interrupted: its folder stays
    (tmp_path / "run4").rename(tmp_path / "gone")                   # and stage 4 never started
    done, stages = run_recipe(tmp_path, PRECISION="float32", DEVICE="cpu:0", COMPILE="0")
    assert done.returncode == 0, done.stderr
    assert "stage 1: done" in done.stdout and "stage 2: done" in done.stdout
    assert [(s["out_dir"], s["init_from"]) for s in stages] == [
        (str(tmp_path / "run3"), str(tmp_path / "run2" / "model")), (str(tmp_path / "run4"), str(tmp_path / "run3" / "model"))]
    assert {(s["precision"], s["device"], s["compile"]) for s in stages} == {("float32", "cpu:0", False)}


@pytest.mark.parametrize("broken", ["--steps many", "--qa-hard 2", "--family-weights toolcall=0.2"])
def test_a_stage_dlm_train_would_refuse_stops_the_recipe(tmp_path, broken):
    script = tmp_path / "recipe.sh"
    script.write_text(SCRIPT.read_text().replace("--seed 1 ", f"--seed 1 {broken} "))
    done, stages = run_recipe(tmp_path, script)
    assert done.returncode != 0
    assert [s["out_dir"] for s in stages] == [str(tmp_path / "run1")]     # stages 2-4 never ran


def test_block_recipe_is_stages_1_3_4_in_the_block_layout(tmp_path):
    done, stages = run_recipe(tmp_path, BLOCK="8")
    assert done.returncode == 0, done.stderr
    assert [s["out_dir"] for s in stages] == [str(tmp_path / f"run{n}") for n in (1, 3, 4)]
    assert [s["init_from"] for s in stages] == ["", str(tmp_path / "run1" / "model"), str(tmp_path / "run3" / "model")]
    # the layout's flags override each stage's own: no autoregressive start, short EOS runs
    assert {(s["block_size"], s["prompt_mask_prob"], s["ar_until"], s["max_extra_pad"]) for s in stages} == {(8, 0.0, 0.0, 8)}
    assert [s["steps"] for s in stages] == [5200, 1200, 600]
    assert [s["unanswerable"] for s in stages] == [0.2, 0.35, 0.35]
    assert "stage 2: not in the block layout" in done.stdout
