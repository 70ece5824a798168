"""
docs/ARCHITECTURE.md stays true: it is short, every path it names exists, every name it places in a module is there,
and its picture of the layers is the import graph: no module imports from a row above its own.

A name is placed in a module by writing it right after the module's path, ```haystack_state/x.py` `Name```; a
``Class.method`` written anywhere on the page must be found on a class placed that way somewhere on it.
"""

import ast
import fnmatch
import importlib
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "haystack_state"
PAGE = ROOT / "docs" / "ARCHITECTURE.md"
TEXT = PAGE.read_text(encoding="utf-8")
MAX_LINES = 150

PATH = re.compile(r"`([\w./*-]+(?:\.py|/))`")
PLACED = re.compile(r"`([\w./-]+\.py)`\s+`([A-Za-z_][\w.]*)`")
DOTTED = re.compile(r"`([A-Z]\w*)\.(\w+)`")
PICTURE = re.compile(r"^## The layers\n.*?^```text\n(.*?)^```", re.MULTILINE | re.DOTALL)
ROW_TOKEN = re.compile(r"[\w*]+(?:\.py|/)")
#: Files that sit by their role rather than their folder (the page says so): both are in the top row.
BY_ROLE = ("__init__.py", "store/_cli.py")


def _module(path: str) -> str:
    return path.removesuffix(".py").removesuffix("/__init__").replace("/", ".")


def _lookup(path: str, name: str) -> object:
    found: object = importlib.import_module(_module(path))
    for part in name.split("."):
        found = getattr(found, part)
    return found


def test_the_page_is_short() -> None:
    lines = TEXT.count("\n")
    assert lines <= MAX_LINES, f"docs/ARCHITECTURE.md has {lines} lines; it is a map: {MAX_LINES} at most"


def test_every_path_it_names_exists() -> None:
    paths = set(PATH.findall(TEXT))
    assert len(paths) > 40
    assert sorted(path for path in paths if not (ROOT / path).exists()) == []


@pytest.mark.parametrize(("path", "name"), sorted(set(PLACED.findall(TEXT))))
def test_every_name_it_places_is_in_its_module(path: str, name: str) -> None:
    _lookup(path, name)


def test_every_class_method_it_writes_is_on_a_class_it_places() -> None:
    classes = {name: path for path, name in PLACED.findall(TEXT) if "." not in name and name[0].isupper()}
    classes.update({name.split(".")[0]: path for path, name in PLACED.findall(TEXT) if "." in name})
    unplaced, missing = set(), set()
    for cls, attribute in DOTTED.findall(TEXT):
        if cls not in classes:
            unplaced.add(cls)
        elif not hasattr(_lookup(classes[cls], cls), attribute):
            missing.add(f"{cls}.{attribute}")
    assert (sorted(unplaced), sorted(missing)) == ([], [])


def _rows() -> list[list[str]]:
    """The picture's rows, top first, each as the paths it names."""
    (picture,) = PICTURE.findall(TEXT)
    rows: list[list[str]] = [[]]
    for line in picture.splitlines():
        if "───" in line:
            rows.append([])
        else:
            rows[-1].extend(ROW_TOKEN.findall(line))
    return rows


def _row_of(relative: str, rows: list[list[str]]) -> int | None:
    """The row of a module (0 for the top one), by the most specific path of the picture that covers it."""
    if relative in BY_ROLE:
        return 0
    best: tuple[int, int] | None = None
    for index, tokens in enumerate(rows):
        for token in tokens:
            covers = relative.startswith(token) if token.endswith("/") else fnmatch.fnmatch(relative, token)
            if covers and (best is None or len(token) > best[1]):
                best = (index, len(token))
    return best[0] if best is not None else None


def test_every_path_of_the_picture_exists() -> None:
    rows = _rows()
    assert len(rows) >= 6
    for tokens in rows:
        folders = [PACKAGE / token for token in tokens if token.endswith("/")]
        for token in tokens:
            places = [ROOT, PACKAGE, *folders]
            assert any(list(place.glob(token.rstrip("/"))) for place in places), f"{token} of the picture"


def _imports(path: Path) -> list[tuple[int, str]]:
    """Every haystack_state module a file imports (lazy imports and TYPE_CHECKING ones included), by line."""
    package = ["haystack_state", *path.relative_to(PACKAGE).parent.parts]
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom):
            base = package[: len(package) - node.level + 1] if node.level else []
            found.append((node.lineno, ".".join([*base, *([node.module] if node.module else [])])))
        elif isinstance(node, ast.Import):
            found.extend((node.lineno, alias.name) for alias in node.names)
    return [(line, name) for line, name in found if name.split(".")[0] == "haystack_state"]


def _relative(module: str) -> str:
    path = PACKAGE.joinpath(*module.split(".")[1:])
    return (path / "__init__.py" if path.is_dir() else path.with_suffix(".py")).relative_to(PACKAGE).as_posix()


def test_the_picture_is_the_import_graph() -> None:
    rows = _rows()
    modules = sorted(path.relative_to(PACKAGE).as_posix() for path in PACKAGE.rglob("*.py"))
    assert [module for module in modules if _row_of(module, rows) is None] == [], "missing from the picture"
    upward = []
    for module in modules:
        row = _row_of(module, rows)
        for line, imported in _imports(PACKAGE / module):
            target = _row_of(_relative(imported), rows)
            if target is None or row is None or target < row:
                upward.append(f"haystack_state/{module}:{line} imports {imported}")
    assert upward == []
