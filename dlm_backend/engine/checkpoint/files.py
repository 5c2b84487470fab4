"""Files read from a checkpoint folder, confined to it: inside, regular, and of a bounded size.

A checkpoint folder is input like any other. ``config.json`` as a symlink to ``/etc/passwd`` was
followed, one to a FIFO blocked the load forever, and a 10 GB ``tokenizer.json`` would have been
read into memory whole. Every file the engine reads from a folder goes through :func:`checkpoint_file`
(weights, which are memory-mapped, not read) or :func:`read_checkpoint_file` (everything else).
"""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path

from dlm_backend.errors import CheckpointError

#: config.json, generation_config.json, tokenizer_config.json, model.safetensors.index.json: the
#: largest real ones are indexes of 1T-parameter MoEs, ~10 MB.
MAX_JSON_BYTES = 32 << 20
#: tokenizer.json: 7 MB (Qwen) to 33 MB (Gemma 3) for real vocabularies; parsing takes several times this.
MAX_TOKENIZER_BYTES = 128 << 20
#: chat_template.jinja: the largest real templates are under 20 KB (the sandbox takes 64K characters).
MAX_TEMPLATE_BYTES = 1 << 20
_KINDS = {stat.S_IFDIR: "folder", stat.S_IFIFO: "named pipe (FIFO)", stat.S_IFSOCK: "socket",
          stat.S_IFCHR: "character device", stat.S_IFBLK: "block device"}


def checkpoint_root(folder: Path) -> Path:
    """What the files of ``folder`` may lead into: the folder itself or, for a Hugging Face cache
    snapshot (``models--org--name/snapshots/<revision>``, whose files link to ``../../blobs``), its
    repository's cache folder."""
    if folder.parent.name == "snapshots" and folder.parents[1].name.startswith(("models--", "datasets--")):
        return folder.parents[1].resolve()
    return folder.resolve()


def inside(folder: Path, name: str, where: str | None = None) -> Path:
    """``folder / name`` resolved, refused when the name or a symlink on the way leads outside the
    checkpoint (``where``: the file that named it, such as a shard index)."""
    path = folder / name
    resolved = path.resolve()
    if Path(name).is_absolute() or not resolved.is_relative_to(checkpoint_root(folder)):
        what = f"{where} names {name!r:.100}, which" if where else str(path)
        raise CheckpointError(f"{what} leads outside the checkpoint folder {folder} (to {str(resolved)!r:.100}); "
                              "a checkpoint's files must be inside it. Replace the link with the file itself, or "
                              "re-download the checkpoint.")
    return resolved


def checkpoint_file(folder: Path, name: str, where: str | None = None) -> Path | None:
    """``folder / name`` resolved, or None when there is no such entry; a CheckpointError when it
    leads outside the checkpoint, to nothing, or to something other than a regular file (reading a
    FIFO blocks until someone writes to it, a character device never ends)."""
    path, resolved = folder / name, inside(folder, name, where)
    if not os.path.lexists(path):
        return None
    try:
        mode = os.stat(resolved).st_mode
    except OSError as exc:
        raise CheckpointError(f"{path} cannot be read ({exc.strerror}: a link to a missing file?). Re-download "
                              "the checkpoint.") from None
    if not stat.S_ISREG(mode):
        raise CheckpointError(f"{path} is a {_KINDS.get(stat.S_IFMT(mode), 'special file')}, not a regular file. "
                              "Replace it with the file itself, or re-download the checkpoint.")
    return resolved


def read_checkpoint_file(folder: Path, name: str, limit: int) -> bytes | None:
    """The bytes of ``folder / name`` (at most ``limit``), or None when there is no such entry."""
    resolved = checkpoint_file(folder, name)
    if resolved is None:
        return None
    # O_NONBLOCK: were the file swapped for a FIFO since the check, the open must not wait for a writer;
    # fstat then checks the file actually opened.
    flags = os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_NOFOLLOW", 0)
    try:
        fd = os.open(resolved, flags)
    except OSError as exc:
        raise CheckpointError(f"{folder / name} cannot be read ({exc.strerror}). Check its permissions or "
                              "re-download the checkpoint.") from None
    with os.fdopen(fd, "rb") as f:
        info = os.fstat(f.fileno())
        if not stat.S_ISREG(info.st_mode):
            raise CheckpointError(f"{folder / name} changed into a special file while being read. Re-download "
                                  "the checkpoint.")
        if info.st_size > limit:
            raise _too_big(folder / name, info.st_size, limit)
        data = f.read(limit + 1)
    if len(data) > limit:                   # it grew since the fstat
        raise _too_big(folder / name, len(data), limit)
    return data


def _too_big(path: Path, size: int, limit: int) -> CheckpointError:
    return CheckpointError(f"{path} is {size} bytes, over the {limit >> 20} MiB this engine reads for it (real "
                           "ones are far smaller); it is not a checkpoint file. Re-download the checkpoint.")


def read_json(folder: Path, name: str) -> dict | None:
    """A checkpoint's JSON file (None when absent), read confined to the folder and bounded in size;
    a truncated or hand-broken one is a CheckpointError naming it."""
    data, path = read_checkpoint_file(folder, name, MAX_JSON_BYTES), folder / name
    if data is None:
        return None
    try:
        value = json.loads(data)
    except (ValueError, UnicodeDecodeError, RecursionError) as exc:   # RecursionError: [[[[... 10**5 deep
        raise CheckpointError(f"{path} is not valid JSON ({str(exc)[:200]}). Re-download the checkpoint or fix "
                              "the file.") from None
    if not isinstance(value, dict):
        raise CheckpointError(f"{path} must hold a JSON object. Re-download the checkpoint or fix the file.")
    return value
