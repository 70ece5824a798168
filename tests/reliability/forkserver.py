"""
A fork server for the crash and load tests: one process imports haystack once, then forks a worker per request.

Starting a Python process that imports haystack costs about a second of CPU; a hundred crash runs on two cores would
spend most of their time importing. The server (``python -m reliability.forkserver``, with ``tests/`` as the working
directory) imports everything first, while it is still single-threaded, and then ``fork()``s a child per ``spawn``
request. Each child is a real, separate process: it opens its own database connections, runs one worker entry point
with its own arguments, and can be SIGKILLed at any moment like any other process.

The parent (:class:`ForkServer`) talks to the server over its stdin/stdout, one JSON object per line:

- ``{"op": "spawn", "entry": "crash" | "load", "args": [...], "log": PATH}`` -> ``{"pid": PID}``: fork a child that
  runs the entry point with the arguments, its stdout and stderr going to the log file;
- ``{"op": "poll", "pid": PID}`` -> ``{"status": CODE | null}``: whether the child has exited (and reap it);
- ``{"op": "kill", "pid": PID}`` -> ``{"status": CODE}``: SIGKILL the child (if it still runs) and reap it;
- ``{"op": "wait", "pid": PID, "timeout": SECONDS}`` -> ``{"status": CODE}``: wait for the child (SIGKILLed after the
  timeout, then ``"timed_out": true``).

Exit codes are those of ``subprocess``: negative for a signal (``-9`` for SIGKILL). Only the server reaps its children,
so a pid stays reserved until the parent has heard its status: a kill never hits another process. When its stdin
closes (the parent is done, or died), the server SIGKILLs the children it still has and exits.
"""

from __future__ import annotations

import contextlib
import json
import os
import select
import signal
import subprocess
import sys
import threading
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

TESTS_DIR = Path(__file__).resolve().parent.parent
#: How long the parent waits for any one answer of the server.
ANSWER_TIMEOUT = 60.0


# --- the server --------------------------------------------------------------------------------------------------


def _entries() -> dict[str, Callable[[list[str]], int]]:
    from reliability import crash_worker, load_worker

    return {"crash": crash_worker.main, "load": load_worker.main}


def _child(entry: Callable[[list[str]], int], args: list[str], log: str) -> None:
    """In the forked child: run the entry point with its output in ``log``, then leave without cleanup."""
    code = 70
    try:
        fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        os.dup2(fd, 1)
        os.dup2(fd, 2)
        os.dup2(os.open(os.devnull, os.O_RDONLY), 0)  # the protocol pipe is the server's, never the child's
        code = entry(args)
    except SystemExit as stop:
        code = stop.code if isinstance(stop.code, int) else 1
    except BaseException:
        traceback.print_exc()
        code = 1
    finally:
        with contextlib.suppress(Exception):
            sys.stdout.flush()
            sys.stderr.flush()
        os._exit(code)


def _status(pid: int, block: bool) -> int | None:
    found, status = os.waitpid(pid, 0 if block else os.WNOHANG)
    return os.waitstatus_to_exitcode(status) if found else None


def serve() -> int:
    """Answer requests until stdin closes."""
    entries = _entries()
    children: dict[int, int | None] = {}  # pid -> exit code once reaped
    print(json.dumps({"ready": os.getpid()}), flush=True)
    try:
        for line in sys.stdin:
            request = json.loads(line)
            op = request["op"]
            answer: dict[str, Any]
            if op == "spawn":
                entry = entries[request["entry"]]
                sys.stdout.flush()
                pid = os.fork()
                if pid == 0:
                    _child(entry, list(request["args"]), request["log"])
                children[pid] = None
                answer = {"pid": pid}
            else:
                pid = int(request["pid"])
                if children.get(pid) is None:
                    if op == "kill":
                        os.kill(pid, signal.SIGKILL)  # not reaped yet: the pid is still this child's
                        children[pid] = _status(pid, block=True)
                    elif op == "wait":
                        deadline = time.monotonic() + float(request["timeout"])
                        while (code := _status(pid, block=False)) is None and time.monotonic() < deadline:
                            time.sleep(0.01)
                        if code is None:
                            os.kill(pid, signal.SIGKILL)
                            children[pid] = _status(pid, block=True)
                            answer = {"status": children[pid], "timed_out": True}
                            print(json.dumps(answer), flush=True)
                            continue
                        children[pid] = code
                    else:
                        children[pid] = _status(pid, block=False)
                answer = {"status": children[pid]}
            print(json.dumps(answer), flush=True)
    finally:
        for pid, code in children.items():
            if code is None:
                with contextlib.suppress(OSError):
                    os.kill(pid, signal.SIGKILL)
                    os.waitpid(pid, 0)
    return 0


# --- the parent's handle ------------------------------------------------------------------------------------------


class ForkServer:
    """
    A running fork server; thread-safe (one request at a time). Use it as a context manager: on exit the server and
    every child it still has are killed.

    :param log: Where the server's own stderr goes.
    """

    def __init__(self, log: Path) -> None:
        env = {
            **os.environ,
            "HAYSTACK_TELEMETRY_ENABLED": "False",
            "PYTHONPATH": os.pathsep.join([str(TESTS_DIR), str(TESTS_DIR.parent)]),
        }
        self._stderr = open(log, "w")  # noqa: SIM115 - closed in close()
        self._lock = threading.Lock()
        self.process = subprocess.Popen(
            [sys.executable, "-m", "reliability.forkserver"],
            cwd=TESTS_DIR,
            env=env,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self._stderr,
            text=True,
            bufsize=1,
        )
        self.log = log
        ready = self._read()
        assert "ready" in ready, ready

    def _read(self) -> dict[str, Any]:
        assert self.process.stdout is not None
        readable, _, _ = select.select([self.process.stdout], [], [], ANSWER_TIMEOUT)
        line = self.process.stdout.readline() if readable else ""
        if not line:
            self.close()
            raise RuntimeError(f"the fork server did not answer; its log:\n{self.log.read_text()}")
        answer: dict[str, Any] = json.loads(line)
        return answer

    def request(self, **request: Any) -> dict[str, Any]:
        """Send one request and return the answer."""
        with self._lock:
            assert self.process.stdin is not None
            self.process.stdin.write(json.dumps(request) + "\n")
            self.process.stdin.flush()
            return self._read()

    def spawn(self, entry: str, args: list[str], log: Path) -> int:
        """Fork a worker running ``entry`` with ``args``; returns its pid."""
        return int(self.request(op="spawn", entry=entry, args=args, log=str(log))["pid"])

    def poll(self, pid: int) -> int | None:
        """The worker's exit code, or None while it runs."""
        status: int | None = self.request(op="poll", pid=pid)["status"]
        return status

    def kill(self, pid: int) -> int:
        """SIGKILL the worker (unless it has exited) and return its exit code."""
        return int(self.request(op="kill", pid=pid)["status"])

    def wait(self, pid: int, timeout: float) -> int:
        """Wait for the worker to exit (it is SIGKILLed after ``timeout`` seconds, and AssertionError raised)."""
        answer = self.request(op="wait", pid=pid, timeout=timeout)
        assert not answer.get("timed_out"), f"worker {pid} did not finish within {timeout}s"
        return int(answer["status"])

    def close(self) -> None:
        """Stop the server; it kills the children it still has."""
        if self.process.stdin is not None and not self.process.stdin.closed:
            with contextlib.suppress(OSError):
                self.process.stdin.close()
        try:
            self.process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait(timeout=30)
        if self.process.stdout is not None:
            self.process.stdout.close()
        self._stderr.close()

    def __enter__(self) -> ForkServer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def wait_for_file(server: ForkServer, pid: int, path: Path, log: Path, timeout: float = 60.0) -> None:
    """
    Wait until the worker writes ``path``.

    :raises AssertionError: If the worker exits first (its log is shown) or the timeout passes.
    """
    deadline = time.monotonic() + timeout
    while not path.exists():
        status = server.poll(pid)
        if status is not None:
            if path.exists():
                return
            raise AssertionError(f"worker {pid} exited ({status}) before writing {path.name}:\n{log.read_text()}")
        if time.monotonic() > deadline:
            raise AssertionError(f"worker {pid} did not write {path.name} within {timeout}s:\n{log.read_text()}")
        time.sleep(0.005)


if __name__ == "__main__":
    sys.exit(serve())
