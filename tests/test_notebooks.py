"""
The notebooks in ``notebooks/`` run, offline, as a newcomer would run them, and their committed outputs are what
the code produces today.

Each notebook is executed with nbclient in a fresh kernel of this interpreter, with ``OPENAI_API_KEY`` removed (so
the scripted model is used), in a temporary working directory. The kernel is started with ``sys.executable -m
ipykernel_launcher`` whatever kernel specs the machine has, so a user-level ``python3`` spec pointing at another
Python cannot take over. Each notebook also runs with ``OPENAI_API_KEY`` set, its OpenAI client pointed at a local
OpenAI-compatible server (``fake_openai``) playing the model: the cell that picks the generator takes haystack's
``OpenAIChatGenerator``, and the rest of the notebook must work with it unchanged.

Some cells plot with matplotlib (in the ``dev`` extra), in the kernel's inline backend: a plot is compared by what
the figure is (``<Figure size 800x350 with 1 Axes>``), never by its PNG bytes, which differ across matplotlib releases.

When a change in the library changes what a notebook shows, refresh the committed outputs with::

    HAYSTACK_TELEMETRY_ENABLED=False python tests/test_notebooks.py
"""

from __future__ import annotations

import json
import os
import re
import sys
import tempfile
from pathlib import Path
from typing import Any

import nbformat
import pytest
from fake_openai import FakeOpenAIServer
from jupyter_client.kernelspec import KernelSpec, KernelSpecManager
from jupyter_client.manager import AsyncKernelManager
from nbclient import NotebookClient

NOTEBOOKS_DIR = Path(__file__).resolve().parent.parent / "notebooks"
NOTEBOOKS = sorted(NOTEBOOKS_DIR.glob("*.ipynb"))
CELL_TIMEOUT = 60  # seconds per cell; the slowest cell takes well under one

# What each notebook must show as HTML: the State table, a diff, and (with threads) the history table.
TABLES = {
    "01_state_and_handlers": ["haystack-state", "haystack-state-diff"],
    "02_tools_and_the_invoker": ["haystack-state", "haystack-state-diff"],
    "03_agent_and_threads": ["haystack-state", "haystack-state-diff", "haystack-state-history"],
    "04_context_memory_events_and_interrupts": ["haystack-state", "haystack-state-diff", "haystack-state-history"],
}
# A field description of each notebook's schema, which the State table must show.
DESCRIPTIONS = {
    "01_state_and_handlers": "who is asking",
    "02_tools_and_the_invoker": "whose notes the tools may read",
    "03_agent_and_threads": "this run&#x27;s searches (reset every run)",
    "04_context_memory_events_and_interrupts": "who is talking (given to each run)",
}
# How many cells of each notebook show a plot (a PNG): state size per checkpoint; tokens sent and messages stored.
PLOTS = {
    "01_state_and_handlers": 0,
    "02_tools_and_the_invoker": 0,
    "03_agent_and_threads": 1,
    "04_context_memory_events_and_interrupts": 1,
}

# What differs from one execution to the next: checkpoint ids and times.
_VOLATILE = [
    (re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}"), "<id>"),
    (re.compile(r'title="<id>">[0-9a-f-]+</td>'), 'title="<id>"><short id></td>'),  # the history table's short ids
    (re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d+)?\+00:00"), "<time>"),
    (re.compile(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d UTC"), "<time>"),
    (re.compile(r"datetime\.datetime\([^)]*\)\)?"), "<time>"),
]


class _ThisPython(KernelSpecManager):
    """Kernel specs that always run ``python3`` as this interpreter's ipykernel."""

    def get_kernel_spec(self, kernel_name: str, *args: Any, **kwargs: Any) -> KernelSpec:
        return KernelSpec(
            argv=[sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"],
            display_name="Python 3 (ipykernel)",
            language="python",
            name="python3",
        )


def _load_matplotlib() -> None:
    """
    Import matplotlib, which the notebooks plot with, so that it builds its font cache here rather than in a kernel
    (where "Matplotlib is building the font cache" would be an output of its own).

    :raises ImportError: If matplotlib is not installed.
    """
    try:
        import matplotlib.font_manager  # noqa: F401
    except ImportError as exc:
        raise ImportError('The notebooks plot with matplotlib: install it with `pip install -e ".[dev]"`.') from exc


def execute(path: Path, workdir: Path, openai: dict[str, str] | None = None) -> Any:
    """
    Run a notebook top to bottom, offline, with ``workdir`` as the kernel's working directory.

    :param path: The notebook.
    :param workdir: The working directory (also holds IPython's profile).
    :param openai: Environment variables for OpenAI (``OPENAI_API_KEY``, ``OPENAI_BASE_URL``); without them the
        kernel has no ``OPENAI_API_KEY``.
    :returns: The executed notebook.
    :raises nbclient.exceptions.CellExecutionError: If a cell raises.
    :raises ImportError: If matplotlib is not installed.
    """
    _load_matplotlib()
    notebook = nbformat.read(path, as_version=4)
    for cell in notebook.cells:
        if cell.cell_type == "code":
            cell.outputs, cell.execution_count = [], None
    # Without MPLBACKEND, the kernel plots with its inline backend (a PNG per figure), whatever this shell uses.
    env = {key: value for key, value in os.environ.items() if key not in ("OPENAI_API_KEY", "MPLBACKEND")}
    env["HAYSTACK_TELEMETRY_ENABLED"] = "False"
    env["IPYTHONDIR"] = str(workdir / ".ipython")
    env.update(openai or {})
    manager = AsyncKernelManager(kernel_name="python3", kernel_spec_manager=_ThisPython())
    client = NotebookClient(
        notebook,
        km=manager,
        timeout=CELL_TIMEOUT,
        record_timing=False,
        resources={"metadata": {"path": str(workdir)}},
    )
    client.execute(cleanup_kc=True, env=env)  # we made the kernel manager, but nbclient must shut the kernel down
    return notebook


def _outputs(notebook: Any) -> list[list[tuple[str, str]]]:
    """
    Per code cell, its outputs as (kind, text), with ids and times replaced by placeholders, and consecutive stream
    outputs of one stream joined. A plot is ``("image/png", "<Figure size ... with N Axes>")``: not its bytes.
    """
    cells = []
    for cell in notebook.cells:
        if cell.cell_type != "code":
            continue
        shown = []
        for output in cell.outputs:
            if output.output_type == "stream":
                # A kernel may send one print as several stream messages (ipykernel releases differ): join them.
                if shown and shown[-1][0] == output.name:
                    shown[-1] = (output.name, shown[-1][1] + output.text)
                else:
                    shown.append((output.name, output.text))
            elif output.output_type in ("execute_result", "display_data") and "image/png" in output.data:
                shown.append(("image/png", output.data.get("text/plain", "")))
            elif output.output_type in ("execute_result", "display_data"):
                # What a reader sees: the HTML where there is one (its plain-text fallback is a repr of internals).
                mime = "text/html" if "text/html" in output.data else "text/plain"
                shown.append((mime, output.data.get(mime, "")))
            else:
                shown.append((output.output_type, f"{output.get('ename')}: {output.get('evalue')}"))
        for pattern, placeholder in _VOLATILE:
            shown = [(kind, pattern.sub(placeholder, text)) for kind, text in shown]
        cells.append(shown)
    return cells


def _plots(notebook: Any) -> int:
    """The number of code cells that show a plot."""
    return sum(any(kind == "image/png" for kind, _ in cell) for cell in _outputs(notebook))


def test_the_notebooks_are_there() -> None:
    assert [path.stem for path in NOTEBOOKS] == list(TABLES) == list(PLOTS)


@pytest.mark.slow
def test_the_committed_notebooks_show_their_plots() -> None:
    plots = {path.stem: _plots(nbformat.read(path, as_version=4)) for path in NOTEBOOKS}
    assert plots == PLOTS
    assert sum(plots.values()) >= 2
    for path in NOTEBOOKS:
        for cell in nbformat.read(path, as_version=4).cells:
            for output in cell.get("outputs", []):
                if "image/png" in output.get("data", {}):
                    assert output.data["image/png"].startswith("iVBORw0KGgo"), "not a PNG"  # b"\x89PNG" in base64


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda path: path.stem)
def test_committed_notebook_is_executed_and_clean(path: Path) -> None:
    notebook = nbformat.read(path, as_version=4)
    nbformat.validate(notebook)
    code = [cell for cell in notebook.cells if cell.cell_type == "code"]
    assert [cell.execution_count for cell in code] == list(range(1, len(code) + 1)), "run it top to bottom, once"
    assert notebook.metadata.kernelspec.name == "python3"
    for cell in code:
        for kind, text in (item for shown in _outputs(nbformat.from_dict({"cells": [cell]})) for item in shown):
            assert kind != "error", text
            for folder in ("/tmp/", "/home/", "/Users/", "/work/", str(Path.home()), tempfile.gettempdir()):
                assert folder not in text, f"an absolute path in an output of {path.name}: {text[:200]}"


@pytest.mark.slow
@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda path: path.stem)
def test_notebook_runs_offline_and_shows_its_state(path: Path, tmp_path: Path) -> None:
    before = sorted(p.name for p in NOTEBOOKS_DIR.iterdir())
    executed = execute(path, tmp_path)
    assert sorted(p.name for p in NOTEBOOKS_DIR.iterdir()) == before  # nothing written next to the notebooks

    fresh = _outputs(executed)
    html = "".join(text for cell in fresh for kind, text in cell if kind == "text/html")
    for table in TABLES[path.stem]:
        assert f'<table class="{table}">' in html, f"{path.name} shows no {table} table"
    assert f"<td>{DESCRIPTIONS[path.stem]}</td>" in html  # field descriptions appear in the State table
    assert _plots(executed) == PLOTS[path.stem], f"{path.name} shows {_plots(executed)} plots"
    streams = "".join(text for cell in fresh for kind, text in cell if kind in ("stdout", "stderr"))
    assert not re.search(r"\w+Warning:|Traceback", streams), streams

    committed = _outputs(nbformat.read(path, as_version=4))
    assert fresh == committed, (
        f"The committed outputs of {path.name} are stale: refresh them with "
        "`HAYSTACK_TELEMETRY_ENABLED=False python tests/test_notebooks.py`."
    )


def _model(body: dict[str, Any]) -> Any:
    """
    A model for the fake OpenAI server, replying in OpenAI's format to what the notebooks ask: save the preference
    stated, search for the last word of a question, note the first document found, answer from the note.
    """
    tools = {tool["function"]["name"] for tool in body.get("tools") or []}
    last = body["messages"][-1]
    content = last.get("content") or ""
    text = content if isinstance(content, str) else " ".join(part.get("text", "") for part in content)
    if last["role"] == "user":
        if "save_preference" in tools:
            return [("save_preference", {"topic": "language", "value": "French"})]
        return [("search", {"query": text.rstrip("?").split()[-1]})]
    try:
        result = json.loads(text)
    except ValueError:
        result = {}
    if isinstance(result, dict) and result.get("documents") and "take_note" in tools:
        return [("take_note", {"text": result["documents"][0]["text"]})]
    if isinstance(result, dict) and "note" in result:
        return f"Here is what I found: {result['note']}"
    return "Done."


@pytest.mark.slow
@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda path: path.stem)
def test_notebook_runs_with_openai_when_a_key_is_set(path: Path, tmp_path: Path) -> None:
    # OpenAI's API is out of reach in tests: the generator-picking cell takes OpenAIChatGenerator (the key is set),
    # and the openai client is pointed at a local OpenAI-compatible server playing the model.
    with FakeOpenAIServer(policy=_model) as server:
        executed = execute(path, tmp_path, openai={"OPENAI_API_KEY": "test-key", "OPENAI_BASE_URL": server.base_url})
    assert server.bodies, f"{path.name} never called OpenAI"
    assert all(body["model"] == "gpt-4o-mini" for body in server.bodies)
    html = "".join(text for cell in _outputs(executed) for kind, text in cell if kind == "text/html")
    for table in TABLES[path.stem]:
        assert f'<table class="{table}">' in html
    assert _plots(executed) == PLOTS[path.stem]


def main() -> None:
    """Execute every notebook and save it with its outputs (the committed form)."""
    for path in NOTEBOOKS:
        with tempfile.TemporaryDirectory() as folder:
            notebook = execute(path, Path(folder))
        info = notebook.metadata.get("language_info", {})
        notebook.metadata["language_info"] = {key: info[key] for key in ("name", "version") if key in info}
        nbformat.write(notebook, path)
        print(f"executed and saved {path.relative_to(NOTEBOOKS_DIR.parent)}")


if __name__ == "__main__":
    main()
