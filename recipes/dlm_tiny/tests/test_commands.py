"""`dlm train` and `dlm eval` reach the `dlm` command through the recipe's entry point, as any
third-party plugin's commands do, and only when entry-point plugins load."""

import os
import subprocess
import sys
from importlib.metadata import entry_points

import pytest


def _dlm(*args: str, **env: str) -> subprocess.CompletedProcess:
    base = {k: v for k, v in os.environ.items() if k not in ("DLM_DISABLE_PLUGIN_AUTOLOAD", "DLM_LOAD_PLUGINS")}
    return subprocess.run([sys.executable, "-m", "dlm_backend.cli", *args], capture_output=True, text=True,
                          env={**base, **env})


def test_the_entry_point_names_the_commands_module():
    (ep,) = [ep for ep in entry_points(group="dlm_backend") if ep.name == "dlm_tiny"]
    assert ep.value == "dlm_tiny.commands" and ep.dist.name == "dlm-tiny-recipe"


@pytest.mark.parametrize("env", [{}, {"DLM_LOAD_PLUGINS": "dlm_tiny"}])
def test_train_and_eval_are_dlm_commands_when_plugins_load(env):
    for command, needle in (("train", "--init-from"), ("eval", "--per-family")):
        done = _dlm(command, "--help", **env)
        assert done.returncode == 0 and needle in done.stdout, done.stderr


def test_without_entry_point_plugins_there_is_no_train_command():
    done = _dlm("train", "--help", DLM_DISABLE_PLUGIN_AUTOLOAD="1")
    assert done.returncode != 0 and "train" in done.stderr
