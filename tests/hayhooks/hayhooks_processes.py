"""
Real Hayhooks processes for the tests of ``haystack_state.hayhooks``: ``hayhooks run`` (and ``hayhooks mcp run``) on a
pipelines folder in a temporary directory, holding the wrapper of docs/hayhooks.md (the demo's research agent, a
scripted model, on a SQLite file of that directory; ``examples/hayhooks/research``) and a second one served through
the sync methods.

Hayhooks is found next to the Python that runs the tests, or at the path in ``HAYSTACK_STATE_HAYHOOKS`` (the
``hayhooks`` executable of another environment, which must have haystack-state installed: Hayhooks 2.1's ``mcp``
extra wants ``mcp<2``). Without it the tests are skipped.
"""

from __future__ import annotations

import dataclasses
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples" / "hayhooks"
WRAPPER = EXAMPLES / "research" / "pipeline_wrapper.py"
INSTALL = 'pip install -e ".[hayhooks]"'
STARTUP_TIMEOUT = 90.0


def hayhooks_executable() -> str | None:
    """The ``hayhooks`` command to run: ``HAYSTACK_STATE_HAYHOOKS``, or the one beside this Python."""
    given = os.environ.get("HAYSTACK_STATE_HAYHOOKS")
    if given:
        return str(Path(given).resolve()) if os.sep in given else shutil.which(given) or given
    beside = Path(sys.executable).parent / "hayhooks"
    if beside.exists():
        return str(beside)
    return shutil.which("hayhooks")


def hayhooks_python(executable: str) -> str:
    """The Python that runs a ``hayhooks`` console script (from its ``#!`` line)."""
    try:
        first = Path(executable).read_text(errors="replace").split("\n", 1)[0]
    except OSError:
        return sys.executable
    return first[2:].strip() if first.startswith("#!") and "python" in first else sys.executable


def mcp_server_problem(executable: str) -> str | None:
    """
    Why ``hayhooks mcp run`` cannot serve in the environment of ``executable``, or None: Hayhooks 2.1's MCP server is
    written for ``mcp`` 1 (``hayhooks[mcp]`` wants ``mcp<2``), and the dev extra's ``mcp`` is 2.
    """
    probe = "import importlib.metadata as m; print(m.version('mcp'))"
    done = subprocess.run([hayhooks_python(executable), "-c", probe], capture_output=True, text=True, timeout=60)
    version = done.stdout.strip()
    if done.returncode != 0 or not version:
        return f"Hayhooks' MCP server needs the mcp package: pip install 'hayhooks[mcp]' ({executable})"
    if int(version.split(".")[0]) >= 2:
        return (
            f"Hayhooks 2.1's MCP server needs mcp<2 (hayhooks[mcp]); the environment of {executable} has mcp "
            f"{version}: set HAYSTACK_STATE_HAYHOOKS to the hayhooks of an environment with hayhooks[mcp]"
        )
    return None


def wrapper_source() -> str:
    """The ``pipeline_wrapper.py`` of the three commands (README.md, docs/hayhooks.md): the demo's deployment."""
    return WRAPPER.read_text()


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def write_pipelines(folder: Path) -> Path:
    """
    A pipelines folder: ``research`` (docs/hayhooks.md's wrapper, its threads in ``research.db`` of ``folder``, the
    server's working directory) and ``research_sync`` (the same agent through ``SyncAgentWrapper``, in
    ``research_sync.db``).
    """
    pipelines = folder / "pipelines"
    (pipelines / "research").mkdir(parents=True)
    (pipelines / "research" / "pipeline_wrapper.py").write_text(wrapper_source())
    sync = wrapper_source().replace(
        'SQLiteCheckpointer("research.db")))', 'SQLiteCheckpointer("research_sync.db")), sync=True)'
    )
    assert "sync=True" in sync, "examples/hayhooks/research/pipeline_wrapper.py changed: update write_pipelines"
    (pipelines / "research_sync").mkdir()
    (pipelines / "research_sync" / "pipeline_wrapper.py").write_text(sync)
    return pipelines


@dataclasses.dataclass
class Server:
    """A running Hayhooks process."""

    process: subprocess.Popen[bytes]
    port: int
    folder: Path
    log: Path

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def db(self, name: str = "research") -> Path:
        return self.folder / f"{name}.db"

    def output(self) -> str:
        return self.log.read_text(errors="replace")


def _environment(extra: dict[str, str] | None = None) -> dict[str, str]:
    env = {key: value for key, value in os.environ.items() if not key.startswith("HAYHOOKS_")}
    env["HAYSTACK_TELEMETRY_ENABLED"] = "False"
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    env["HAYHOOKS_SHOW_TRACEBACKS"] = "true"
    env.update(extra or {})
    return env


def start(
    folder: Path, *arguments: str, ready: str = "/status", wanted: str = "", env: dict[str, str] | None = None
) -> Server:
    """
    Start ``hayhooks ARGUMENTS --host 127.0.0.1 --port PORT --pipelines-dir FOLDER/pipelines`` in ``folder`` and wait
    until ``GET ready`` answers 200 with ``wanted`` in its body.
    """
    executable = hayhooks_executable()
    assert executable is not None
    port = free_port()
    log = folder / f"hayhooks-{port}.log"
    command = [executable, *arguments, "--host", "127.0.0.1", "--port", str(port)]
    command += ["--pipelines-dir", str(folder / "pipelines")]
    with log.open("wb") as sink:
        process = subprocess.Popen(
            command, cwd=folder, env=_environment(env), stdout=sink, stderr=subprocess.STDOUT, start_new_session=True
        )
    server = Server(process, port, folder, log)
    deadline = time.monotonic() + STARTUP_TIMEOUT
    while True:
        if process.poll() is not None:
            raise AssertionError(f"hayhooks exited with {process.returncode}:\n{server.output()[-4000:]}")
        try:
            answer = httpx.get(server.url + ready, timeout=2)
            if answer.status_code == 200 and wanted in answer.text:
                return server
        except httpx.HTTPError:
            pass
        if time.monotonic() > deadline:
            stop(server)
            raise AssertionError(f"hayhooks did not answer {ready} in {STARTUP_TIMEOUT} s:\n{server.output()[-4000:]}")
        time.sleep(0.2)


def stop(server: Server) -> None:
    if server.process.poll() is None:
        os.killpg(server.process.pid, signal.SIGTERM)
        try:
            server.process.wait(timeout=15)
        except subprocess.TimeoutExpired:
            os.killpg(server.process.pid, signal.SIGKILL)
            server.process.wait(timeout=15)
