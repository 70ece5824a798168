"""
README.md's "Deploy on Hayhooks" runs as written: its three commands (the install, ``hayhooks run`` on
``examples/hayhooks``, a curl chat completion) are read from the README, and the last two are run, the server in a
working directory of its own and on a free port; the thread they leave is read back from ``research.db``.
"""

from __future__ import annotations

import json
import re
import shlex
import subprocess
import time
from pathlib import Path

import httpx
import pytest
from hayhooks_processes import INSTALL, ROOT, Server, _environment, free_port, hayhooks_executable, stop

from haystack_state import SQLiteCheckpointer
from haystack_state.demo import research_agent

pytestmark = pytest.mark.slow

README = ROOT / "README.md"
DEFAULT_ADDRESS = "localhost:1416"


def readme_commands() -> list[str]:
    """The commands of the README's Hayhooks block, a backslash-continued line joined."""
    section = README.read_text(encoding="utf-8").split("## Deploy on Hayhooks", 1)[1]
    block = re.search(r"```bash\n(.*?)```", section, re.S)
    assert block is not None, "README.md's Deploy on Hayhooks section lost its bash block"
    return [line.strip() for line in block.group(1).replace("\\\n", " ").splitlines() if line.strip()]


def test_the_readme_deploys_the_demo_in_three_commands(tmp_path: Path) -> None:
    executable = hayhooks_executable()
    if executable is None:
        pytest.skip(f"Hayhooks is not installed: {INSTALL}, or set HAYSTACK_STATE_HAYHOOKS to a hayhooks executable")
    install, run, ask = readme_commands()
    assert install == INSTALL  # this environment was made with it (.ci/run's Hayhooks step)

    arguments = shlex.split(run)
    assert arguments[:2] == ["hayhooks", "run"] and "--pipelines-dir" in arguments
    folder = arguments[arguments.index("--pipelines-dir") + 1]
    arguments[arguments.index("--pipelines-dir") + 1] = str(ROOT / folder)  # the clone's folder, from elsewhere
    port = free_port()
    log = tmp_path / "hayhooks.log"
    with log.open("wb") as sink:
        process = subprocess.Popen(
            [executable, *arguments[1:], "--host", "127.0.0.1", "--port", str(port)],
            cwd=tmp_path,
            env=_environment(),
            stdout=sink,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    server = Server(process, port, tmp_path, log)
    try:
        deadline = time.monotonic() + 90
        while "research" not in _status(server):
            assert process.poll() is None, f"hayhooks exited:\n{server.output()[-4000:]}"
            assert time.monotonic() < deadline, f"hayhooks did not deploy research:\n{server.output()[-4000:]}"
            time.sleep(0.2)

        assert ask.startswith("curl ") and DEFAULT_ADDRESS in ask
        words = shlex.split(ask)
        (question,) = [m["content"] for m in json.loads(words[words.index("-d") + 1])["messages"]]
        done = subprocess.run(
            ["bash", "-c", ask.replace(DEFAULT_ADDRESS, f"127.0.0.1:{port}")],
            cwd=tmp_path,
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert done.returncode == 0, done.stderr
        completion = json.loads(done.stdout)
        answer = completion["choices"][0]["message"]["content"]
        assert completion["choices"][0]["finish_reason"] == "stop"
        assert answer.startswith("Here is what I found: Honeybees") and answer.endswith("[bees-3]")
    finally:
        stop(server)

    with SQLiteCheckpointer(tmp_path / "research.db") as checkpointer:
        state = research_agent(checkpointer).get_state("bees")
    messages = state.values["messages"]
    assert [m.text for m in messages if m.is_from("user")] == [question]
    assert any(m.tool_calls for m in messages) and any(m.tool_call_results for m in messages)
    assert [note[-8:] for note in state.values["notes"]] == ["[bees-3]"]  # the take_note call, kept by the thread


def _status(server: Server) -> str:
    try:
        return httpx.get(server.url + "/status", timeout=2).text
    except httpx.HTTPError:
        return ""
