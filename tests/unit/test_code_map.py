"""The Code map in docs/architecture.md names every module of ours, in the row of its package: a
module added without a line there fails here (the map had drifted: seven modules missing, among
them the transport's asyncio twin and the worker's outage handling)."""
from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SKIP = {"__init__.py", "__main__.py"}


def code_map_rows() -> list[tuple[str, str]]:
    """(where, the whole row) of each row of the Code map's table."""
    doc = (ROOT / "docs" / "architecture.md").read_text()
    section = doc[doc.index("## Code map"):]
    section = section[:section.index("\n## ", 1)]
    rows = []
    for line in section.splitlines():
        cells = line.split(" | ")
        if line.startswith("| ") and len(cells) >= 3 and not line.startswith("| layer"):
            rows.append((cells[1], line))
    return rows


def row_of(module: Path, rows: list[tuple[str, str]]) -> str | None:
    """The row whose 'where' names the module's top package folder (``scheduler/tier/``,
    ``workers/``) or the module itself (``scheduler/metrics.py``)."""
    rel = module.relative_to(ROOT).as_posix()
    parts = rel.split("/")
    top = f"{parts[0]}/" if parts[0] == "workers" or len(parts) == 2 else f"{parts[0]}/{parts[1]}/"
    for where, row in rows:
        if (f"`{rel}`" in where) or (len(parts) > 2 or parts[0] == "workers") and f"`{top}`" in where:
            return row
    return None


def test_every_module_is_in_its_packages_row_of_the_code_map() -> None:
    rows = code_map_rows()
    assert len(rows) >= 7, "the Code map table was not found"
    modules = [p for base in ("scheduler", "workers") for p in sorted((ROOT / base).rglob("*.py"))
               if p.name not in SKIP and "__pycache__" not in p.parts]
    assert len(modules) > 100
    missing = []
    for m in modules:
        row = row_of(m, rows)
        rel = m.relative_to(ROOT).as_posix()
        if row is None or (f"`{m.name}`" not in row and f"`{rel}`" not in row):
            missing.append(rel)
    assert not missing, f"modules missing from docs/architecture.md's Code map (in their package's row): {missing}"
