"""The fixtures of the Hayhooks tests: a pipelines folder and a ``hayhooks run`` process on it (see
hayhooks_processes.py)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from hayhooks_processes import INSTALL, Server, hayhooks_executable, start, stop, write_pipelines


@pytest.fixture(scope="module")
def pipelines_folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    if hayhooks_executable() is None:
        pytest.skip(f"Hayhooks is not installed: {INSTALL}, or set HAYSTACK_STATE_HAYHOOKS to a hayhooks executable")
    folder = tmp_path_factory.mktemp("hayhooks")
    write_pipelines(folder)
    return folder


@pytest.fixture(scope="module")
def hayhooks(pipelines_folder: Path) -> Iterator[Server]:
    """``hayhooks run`` with both wrappers deployed."""
    server = start(pipelines_folder, "run", wanted="research_sync")
    try:
        yield server
    finally:
        stop(server)
