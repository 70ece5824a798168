"""Every python example of README.md runs, and prints what its comments say. The examples are read from the README
itself, so they cannot drift from what is tested."""

import contextlib
import io
import re
from pathlib import Path

import pytest

README = Path(__file__).resolve().parent.parent / "README.md"
FENCE = re.compile(r"^```(\w*)\n(.*?)^```", re.MULTILINE | re.DOTALL)
PRINT_WITH_OUTPUT = re.compile(r"^\s*print\(.*\)\s*#\s*(?:Output:\s*)?(.+?)\s*$")


def _blocks(language: str) -> list[tuple[int, str]]:
    text = README.read_text(encoding="utf-8")
    return [
        (text.count("\n", 0, match.start()) + 1, match.group(2))
        for match in FENCE.finditer(text)
        if match.group(1) == language
    ]


PYTHON_BLOCKS = _blocks("python")


def test_the_readme_has_python_examples() -> None:
    assert len(PYTHON_BLOCKS) >= 5


@pytest.mark.parametrize(("line", "code"), PYTHON_BLOCKS, ids=[f"README.md:{line}" for line, _ in PYTHON_BLOCKS])
def test_readme_example(line: int, code: str) -> None:
    output = io.StringIO()
    with contextlib.redirect_stdout(output):
        exec(compile(code, f"README.md:{line}", "exec"), {"__name__": f"readme_example_{line}"})
    printed = output.getvalue().splitlines()
    expected = [m.group(1) for m in map(PRINT_WITH_OUTPUT.match, code.splitlines()) if m]
    assert printed == expected


def test_readme_gives_the_install_and_test_commands() -> None:
    commands = [
        line.split("#")[0].strip() for _, block in _blocks("bash") for line in block.splitlines() if line.strip()
    ]
    assert 'pip install -e ".[dev]"' in commands
    assert "pytest" in commands
