"""scripts/train_dlm_tiny.sh, the from-scratch recipe, run against a `dlm` that checks instead of trains.

The stand-in parses each stage's command line with the real `dlm train` parser and refuses it as
`dlm train` would (check_flags: unknown flags, bad values, a missing --init-from checkpoint), then
writes the stage's model folder. So a typo in the recipe fails here in a second, not two hours in.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "train_dlm_tiny.sh"

STAND_IN = """#!{python}
import json, sys
from dataclasses import asdict, fields
from pathlib import Path
from dlm_backend.cli import build_parser
from dlm_backend.training.checks import check_flags
from dlm_backend.training.train import TrainConfig

args = build_parser().parse_args(sys.argv[1:])
cfg = TrainConfig(**{{f.name: getattr(args, f.name) for f in fields(TrainConfig) if getattr(args, f.name) is not None}})
cfg.precision = "float32"            # the stand-in checks flags on any CPU; the recipe's precision is logged
check_flags(cfg)
model = Path(cfg.out_dir) / "model"
model.mkdir(parents=True)
(model / "config.json").write_text("{{}}")
(model / "model.safetensors").write_text("")
with open({log!r}, "a") as f:
    f.write(json.dumps({{**asdict(cfg), "argv": sys.argv[1:]}}) + "\\n")
"""


def run_recipe(tmp_path: Path, script: Path = SCRIPT, **env) -> tuple[subprocess.CompletedProcess, list[dict]]:
    log = tmp_path / "stages.jsonl"
    stand_in = tmp_path / "dlm"
    stand_in.write_text(STAND_IN.format(python=sys.executable, log=str(log)))
    stand_in.chmod(0o755)
    done = subprocess.run(["bash", str(script), str(tmp_path / "run")], capture_output=True, text=True,
                          env={**os.environ, "DLM": str(stand_in), **env}, cwd=tmp_path)
    stages = [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []
    return done, stages


def test_the_recipe_is_three_valid_stages_each_from_the_last(tmp_path):
    done, stages = run_recipe(tmp_path)
    assert done.returncode == 0, done.stderr
    assert [s["out_dir"] for s in stages] == [str(tmp_path / f"run{n}") for n in (1, 2, 3)]
    assert stages[0]["init_from"] == ""
    assert stages[1]["init_from"] == str(tmp_path / "run1" / "model")
    assert stages[2]["init_from"] == str(tmp_path / "run2" / "model")
    assert len({s["seed"] for s in stages}) == 3                     # each stage draws its own corpus
    assert [s["max_extra_pad"] for s in stages] == [40, 160, 256]    # canvases up to the adapters' 256
    assert all("--precision" in s["argv"] and "bf16" in s["argv"] for s in stages)
    assert sum(s["steps"] for s in stages) == 5700                   # the step count the notes time
    assert done.stdout.strip().endswith(f"model: {tmp_path / 'run'}3/model")


def test_a_rerun_skips_finished_stages_and_precision_can_be_float32(tmp_path):
    run_recipe(tmp_path)
    (tmp_path / "stages.jsonl").unlink()
    shutil.rmtree(tmp_path / "run3")                                 # as if stage 3 was interrupted
    done, stages = run_recipe(tmp_path, PRECISION="float32")
    assert done.returncode == 0, done.stderr
    assert "stage 1: done" in done.stdout and "stage 2: done" in done.stdout
    assert [s["out_dir"] for s in stages] == [str(tmp_path / "run3")]
    assert "float32" in stages[0]["argv"]


@pytest.mark.parametrize("broken", ["--steps many", "--qa-hard 2"])
def test_a_stage_dlm_train_would_refuse_stops_the_recipe(tmp_path, broken):
    script = tmp_path / "recipe.sh"
    script.write_text(SCRIPT.read_text().replace("--seed 1 ", f"--seed 1 {broken} "))
    done, stages = run_recipe(tmp_path, script)
    assert done.returncode != 0
    assert [s["out_dir"] for s in stages] == [str(tmp_path / "run1")]     # stage 3 never ran
