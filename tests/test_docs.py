"""
Every python example of README.md and of the guides in docs/ runs, and prints what its comments say; the README
stays a short front page that links every guide, and the links between the pages lead somewhere.

The examples are read from the markdown files themselves, so they cannot drift from what is tested. A block fenced
```` ```python ```` is executed, in a fresh namespace of its own (so each one is self-contained, imports included),
and each of its lines ``print(...)  # X`` (or ``# Output: X``) must print the line X, in order, and nothing else may
be printed. A block that must not run (it needs a server, say) is fenced ```` ```py ```` or ```` ```text ````.
"""

import contextlib
import importlib.metadata
import io
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
DOCS = ROOT / "docs"
GUIDES = sorted(DOCS.glob("*.md"))
PAGES = [README, *GUIDES]

#: The guides that have no python example: prose, tables and shell commands only.
PROSE_ONLY = {"ARCHITECTURE.md", "RELIABILITY.md", "benchmarks.md", "cli.md"}
MAX_README_LINES = 250

FENCE = re.compile(r"^```(\w*)\n(.*?)^```", re.MULTILINE | re.DOTALL)
PRINT_WITH_OUTPUT = re.compile(r"^\s*print\(.*\)\s*#\s*(?:Output:\s*)?(.+?)\s*$")
LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)\)")
HEADING = re.compile(r"^#{1,6} +(.+?) *$", re.MULTILINE)


def _name(page: Path) -> str:
    return page.relative_to(ROOT).as_posix()


def _without_code(text: str) -> str:
    """The page with its fenced blocks blanked out (their lines kept), so that `# comments` are not headings."""
    return FENCE.sub(lambda match: "\n" * match.group(0).count("\n"), text)


def _blocks(page: Path, language: str) -> list[tuple[int, str]]:
    text = page.read_text(encoding="utf-8")
    return [
        (text.count("\n", 0, match.start()) + 1, match.group(2))
        for match in FENCE.finditer(text)
        if match.group(1) == language
    ]


def _anchor(heading: str) -> str:
    """GitHub's anchor of a heading: lower case, punctuation dropped, spaces as hyphens."""
    text = re.sub(r"[`*_]|\[([^\]]*)\]\([^)]*\)", lambda m: m.group(1) or "", heading).strip().lower()
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def _anchors(page: Path) -> set[str]:
    return {_anchor(heading) for heading in HEADING.findall(_without_code(page.read_text(encoding="utf-8")))}


def _links(page: Path) -> list[str]:
    return LINK.findall(_without_code(page.read_text(encoding="utf-8")))


def _installed(distribution: str) -> bool:
    """Whether a distribution is installed, by its metadata (a `hayhooks` module would match tests/hayhooks)."""
    try:
        importlib.metadata.version(distribution)
    except importlib.metadata.PackageNotFoundError:
        return False
    return True


EXAMPLES = [(page, line, code) for page in PAGES for line, code in _blocks(page, "python")]


@pytest.mark.parametrize(
    ("page", "line", "code"), EXAMPLES, ids=[f"{_name(page)}:{line}" for page, line, _ in EXAMPLES]
)
def test_example(page: Path, line: int, code: str) -> None:
    if "haystack_state.hayhooks" in code and not _installed("hayhooks"):
        pytest.skip(
            'needs Hayhooks (pip install -e ".[hayhooks]"), which the dev extra leaves out; .ci/run runs this example '
            "in its Hayhooks environment"
        )
    output = io.StringIO()
    with contextlib.redirect_stdout(output):
        exec(compile(code, f"{_name(page)}:{line}", "exec"), {"__name__": f"docs_example_{page.stem}_{line}"})
    printed = output.getvalue().splitlines()
    expected = [m.group(1) for m in map(PRINT_WITH_OUTPUT.match, code.splitlines()) if m]
    assert printed == expected


def test_the_readme_is_a_short_front_page() -> None:
    lines = README.read_text(encoding="utf-8").splitlines()
    assert len(lines) <= MAX_README_LINES, f"README.md has {len(lines)} lines; move reference material to docs/"


def test_the_readme_gives_the_set_up_commands() -> None:
    (setup,) = [
        block for _, block in _blocks(README, "bash") if 'pip install -e ".[dev]" && haystack-state demo' in block
    ]
    commands = [line.split("#")[0].strip() for line in setup.splitlines() if line.strip()]
    assert commands == ['pip install -e ".[dev]" && haystack-state demo', "pytest"]


def test_the_readme_has_a_runnable_first_agent() -> None:
    assert any("SQLiteCheckpointer" in code and "thread_id=" in code for _, code in _blocks(README, "python"))


def test_the_readme_gives_the_agents_pipeline_type() -> None:
    from haystack_state import Agent
    from haystack_state.testing import ScriptedChatGenerator

    kind = Agent(ScriptedChatGenerator(script=["hi"])).to_dict()["type"]
    assert f"`type:` to `{kind}`" in README.read_text(encoding="utf-8")


@pytest.mark.parametrize("page", PAGES, ids=[_name(page) for page in PAGES])
def test_no_page_installs_the_package_from_a_registry(page: Path) -> None:
    """haystack-state is not on PyPI: it installs from a clone, a file:// requirement or a built wheel."""
    from_registry = re.compile(r"""pip install ["']?haystack-state(?:\[[\w,]*\])?(?! @)(?=["'`\s]|$)""")
    assert from_registry.findall(page.read_text(encoding="utf-8")) == []


def test_the_readme_links_every_guide_notebook_and_the_benchmarks() -> None:
    linked = {(README.parent / target.split("#")[0]).resolve() for target in _links(README)}
    wanted = [*GUIDES, *sorted((ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb")), ROOT / "benchmarks"]
    assert len(wanted) >= len(GUIDES) + 4 + 1
    assert [_name(path) for path in wanted if path.resolve() not in linked] == []


@pytest.mark.parametrize("guide", GUIDES, ids=[_name(guide) for guide in GUIDES])
def test_each_guide_has_a_title_an_intro_and_a_way_back(guide: Path) -> None:
    text = guide.read_text(encoding="utf-8")
    title, blank, intro = text.splitlines()[:3]
    assert title.startswith("# ") and not blank and intro
    assert "../README.md" in _links(guide)


@pytest.mark.parametrize("guide", GUIDES, ids=[_name(guide) for guide in GUIDES])
def test_each_guide_has_python_examples_unless_it_is_prose_only(guide: Path) -> None:
    assert bool(_blocks(guide, "python")) is (guide.name not in PROSE_ONLY)


@pytest.mark.parametrize("page", PAGES, ids=[_name(page) for page in PAGES])
def test_links_between_the_pages_lead_somewhere(page: Path) -> None:
    broken = []
    for target in _links(page):
        if re.match(r"[a-z]+:", target):  # https:, mailto:
            continue
        path, _, anchor = target.partition("#")
        destination = (page.parent / path).resolve() if path else page
        missing = not destination.exists()
        if missing or (anchor and destination.suffix == ".md" and anchor not in _anchors(destination)):
            broken.append(target)
    assert broken == []
