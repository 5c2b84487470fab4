"""docs/architecture.md's import directions are the code's: every module of dlm_backend sits in one
room of the table, imports only its own row's rooms and the rooms its row lists (each of them listed
in an earlier row: nothing imports back up), and the table lists no import the code does not make."""

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "dlm_backend"


def _rows() -> list[tuple[list[str], list[str]]]:
    """The table: each row's rooms and the rooms they import, bottom of the picture first."""
    text = (ROOT / "docs" / "architecture.md").read_text().split("## Import directions")[1].split("\n## ")[0]
    rows = []
    for line in text.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) == 2 and cells[0].startswith("`"):
            rows.append((re.findall(r"`([^`]+)`", cells[0]), re.findall(r"`([^`]+)`", cells[1])))
    return rows


def _module_file(dotted: str) -> str | None:
    """``dlm_backend.a.b`` -> ``a/b.py`` (or ``a/b/__init__.py``), relative to the package."""
    path = PACKAGE.joinpath(*dotted.split(".")[1:])
    for candidate in (path.with_suffix(".py"), path / "__init__.py"):
        if candidate.is_file():
            return str(candidate.relative_to(PACKAGE))
    return None


def _imports(file: Path) -> set[str]:
    """Package modules ``file`` imports (at the top or inside a function), as package-relative paths."""
    out = set()
    for node in ast.walk(ast.parse(file.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] == "dlm_backend":
            for alias in node.names:           # `from dlm_backend import hookspecs` imports the module
                out.add(_module_file(f"{node.module}.{alias.name}") or _module_file(node.module))
        elif isinstance(node, ast.Import):
            out |= {_module_file(a.name) for a in node.names if a.name.split(".")[0] == "dlm_backend"}
    return out - {None}


def _room(path: str, rows) -> str:
    rooms = [r for row, _ in rows for r in row if path == r or (r.endswith("/") and path.startswith(r))]
    assert rooms, f"dlm_backend/{path} is in no room of docs/architecture.md's import directions"
    return max(rooms, key=len)


def test_every_import_runs_down_the_documented_rooms_and_every_documented_one_is_made():
    rows = _rows()
    row_of = {room: i for i, (row, _) in enumerate(rows) for room in row}
    for i, (row, allowed) in enumerate(rows):
        assert all(row_of.get(r, len(rows)) < i for r in allowed), (row, [r for r in allowed if row_of.get(r, 99) >= i])
    used = {i: set() for i in range(len(rows))}
    for file in sorted(PACKAGE.rglob("*.py")):
        path = str(file.relative_to(PACKAGE))
        mine = row_of[_room(path, rows)]
        for target in _imports(file):
            room = _room(target, rows)
            if row_of[room] == mine:
                continue
            assert room in rows[mine][1], f"dlm_backend/{path} imports {target} ({room}), which its row does not list"
            used[mine].add(room)
    for i, (row, allowed) in enumerate(rows):
        assert set(allowed) == used[i], (row, "listed but not imported:", set(allowed) - used[i])


def test_adapters_and_the_server_never_import_each_other():
    for a, b in (("adapters", "server"), ("server", "adapters")):
        for file in (PACKAGE / a).rglob("*.py"):
            assert not any(t.startswith(b + "/") for t in _imports(file)), file
