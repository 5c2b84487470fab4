"""Files read from a checkpoint (engine/checkpoint/files.py) are confined to its folder: inside it (or its hub
repository), regular files, and of a bounded size. Before, each case below was followed or read
whole: a valid file outside the folder loaded, a FIFO blocked the load forever (weights) or was taken
for "no such file", and 10 GB were read into memory."""

import os
import shutil
import time

import pytest
from tests.helpers import PARITY, copy_fixture, engine_for, make_chat_checkpoint

from dlm_backend import LLM
from dlm_backend.errors import CheckpointError


def _outside(tmp_path, ckpt, name: str, kind: str):
    """``ckpt / name`` replaced: a link to a valid copy outside the folder, a FIFO, a link to a FIFO
    outside, or a sparse 10 GB file."""
    out = tmp_path / "outside"
    out.mkdir(exist_ok=True)
    target, path = out / f"{kind}-{name}", ckpt / name
    if kind == "link":
        if path.exists():
            shutil.copy(path, target)
        else:
            target.write_text("{% for m in messages %}{{ m.content }}{% endfor %}")
    elif kind == "link-fifo":
        os.mkfifo(target)
    path.unlink(missing_ok=True)
    if kind == "fifo":
        os.mkfifo(path)
    elif kind == "10gb":
        with open(path, "wb") as f:
            f.truncate(10 << 30)        # sparse: no disk used
    else:
        os.symlink(target, path)


@pytest.mark.parametrize("name,kind,match", [
    ("config.json", "link", "leads outside the checkpoint folder"),
    ("config.json", "link-fifo", "leads outside"),
    ("config.json", "10gb", "10737418240 bytes, over the 32 MiB"),
    ("generation_config.json", "link", "leads outside"),
    ("generation_config.json", "fifo", r"named pipe \(FIFO\), not a regular file"),
    ("tokenizer.json", "link", "leads outside"),
    ("tokenizer.json", "fifo", "named pipe"),
    ("tokenizer.json", "10gb", "over the 128 MiB"),
    ("tokenizer_config.json", "link", "leads outside"),
    ("tokenizer_config.json", "10gb", "over the 32 MiB"),
    ("chat_template.jinja", "link", "leads outside"),
    ("chat_template.jinja", "fifo", "named pipe"),
    ("model.safetensors", "fifo", "named pipe"),
    ("model.safetensors.index.json", "10gb", "over the 32 MiB"),
])
def test_every_file_read_from_a_checkpoint_is_confined_to_it(tmp_path, name, kind, match):
    ckpt = make_chat_checkpoint(tmp_path / "chat", "dream")
    _outside(tmp_path, ckpt, name, kind)
    t = time.perf_counter()
    with pytest.raises(CheckpointError, match=match):
        LLM(str(ckpt), device="cpu")
    assert time.perf_counter() - t < 5


def test_links_may_stay_inside_the_folder_or_its_hub_repository_only(tmp_path):
    ckpt = copy_fixture(tmp_path)
    (ckpt / "config.json").rename(ckpt / "real-config.json")
    os.symlink("real-config.json", ckpt / "config.json")
    assert engine_for(ckpt).architecture == "LLaDAModelLM"
    hub = tmp_path / "hub"          # a hub snapshot's files link to its repository's ../../blobs
    for repo in ("models--org--tiny", "models--org--other"):
        (hub / repo / "blobs").mkdir(parents=True)
        (hub / repo / "snapshots" / "a").mkdir(parents=True)
        for f in (PARITY / "llada-tiny").iterdir():
            shutil.copy(f, hub / repo / "blobs" / f.name)
            os.symlink(f"../../blobs/{f.name}", hub / repo / "snapshots" / "a" / f.name)
    assert engine_for(hub / "models--org--tiny" / "snapshots" / "a").architecture == "LLaDAModelLM"
    config = hub / "models--org--other" / "snapshots" / "a" / "config.json"
    config.unlink()
    os.symlink("../../../models--org--tiny/blobs/config.json", config)      # another repository's blob
    with pytest.raises(CheckpointError, match="leads outside"):
        engine_for(config.parent)
