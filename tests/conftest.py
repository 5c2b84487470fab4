import os
from pathlib import Path

import pytest

# Third-party plugins installed on the machine must not change what the suite tests.
os.environ.setdefault("DLM_DISABLE_PLUGIN_AUTOLOAD", "1")

from tests.helpers import PARITY, make_chat_checkpoint  # noqa: E402


@pytest.fixture(scope="session")
def llada_dir() -> Path:
    return PARITY / "llada-tiny"


@pytest.fixture(scope="session")
def dream_dir() -> Path:
    return PARITY / "dream-tiny"


@pytest.fixture(scope="session")
def dream_chat(tmp_path_factory) -> Path:
    return make_chat_checkpoint(tmp_path_factory.mktemp("dream-chat"), "dream")


@pytest.fixture(scope="session")
def llada_chat(tmp_path_factory) -> Path:
    return make_chat_checkpoint(tmp_path_factory.mktemp("llada-chat"), "llada")
