"""An HTTP server in a process group of its own on 127.0.0.1: started with a timeout, stopped whole.

``ServerProcess`` starts a command (its output to a log file), waits until ``ready_path``
answers 200, and ``close`` ends the whole group (a server's workers, such as vLLM's engine core,
are its children): SIGTERM, then SIGKILL for whatever is left, each wait bounded. A server that
exits or never answers while starting is an error that quotes its log's tail, and is stopped.

    with ServerProcess(command, port, "/health", "our server") as server:
        ...  # server.url answers
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import tempfile
import time
from pathlib import Path

import httpx
import psutil

from prefillviz.engine.errors import PrefillVizError

STOP_TIMEOUT_S = 20.0


class ServerStartError(PrefillVizError):
    """The server exited or never answered while it started (it was stopped)."""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class ServerProcess:
    """``command`` serving on 127.0.0.1:``port`` as a context manager; ``url`` is where it answers."""

    error = ServerStartError  # what a failed start raises (a subclass names its own)

    def __init__(
        self, command: list[str], port: int, ready_path: str, name: str, start_timeout_s: float,
        env: dict[str, str] | None = None, cwd: str | Path | None = None,
    ) -> None:
        self.name, self.port = name, port
        self.final_output: str | None = None  # everything it printed, once closed
        self.url = f"http://127.0.0.1:{port}"
        slug = name.replace(" ", "-")
        self.log = tempfile.NamedTemporaryFile("w+", prefix=f"prefillviz-{slug}-", suffix=".log", delete=False)
        self.process = subprocess.Popen(
            command, stdout=self.log, stderr=subprocess.STDOUT, env=env, cwd=cwd, start_new_session=True
        )
        try:
            self._wait_ready(ready_path, start_timeout_s)
        except BaseException:  # Ctrl-C while it starts, too: nothing is left running
            self.close()
            raise

    def _wait_ready(self, ready_path: str, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise self.error(
                    f"{self.name} exited (status {self.process.returncode}) while starting.\n{self.log_tail()}"
                )
            try:
                if httpx.get(f"{self.url}{ready_path}", timeout=2.0).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.5)
        raise self.error(f"{self.name} did not answer within {timeout_s:.0f} s; it was stopped.\n{self.log_tail()}")

    def output(self) -> str:
        """Everything the server printed so far."""
        if self.log.closed:
            return self.final_output or ""
        self.log.flush()
        return Path(self.log.name).read_text(errors="replace")

    def log_tail(self, num_lines: int = 15) -> str:
        lines = self.output().splitlines()[-num_lines:]
        return "\n".join([*lines, f"(the whole log: {self.log.name})"])

    def _children(self) -> list[psutil.Process]:
        try:
            return psutil.Process(self.process.pid).children(recursive=True)
        except psutil.NoSuchProcess:
            return []

    def _group_members(self) -> list[psutil.Process]:
        """The processes of the server's group, the leader's orphans included."""
        members = []
        for process in psutil.process_iter():
            try:
                if os.getpgid(process.pid) == self.process.pid:
                    members.append(process)
            except (ProcessLookupError, psutil.NoSuchProcess):
                continue
        return members

    def cpu_s(self) -> float:
        """CPU seconds the server's process and its children have used so far (0 once it has exited)."""
        try:
            processes = [psutil.Process(self.process.pid), *self._children()]
        except psutil.NoSuchProcess:
            return 0.0
        total = 0.0
        for process in processes:
            try:
                times = process.cpu_times()
            except psutil.NoSuchProcess:
                continue
            total += times.user + times.system
        return total

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        """Stop the server and its children (SIGTERM to the group, then SIGKILL); nothing is left running.
        The log is kept when the server did not end on the SIGTERM (its tail says why)."""
        members = self._group_members()
        if self.process.poll() is None:
            try:
                os.killpg(self.process.pid, signal.SIGTERM)
                self.process.wait(timeout=STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                pass
        try:
            os.killpg(self.process.pid, signal.SIGKILL)  # whatever of the group is left
        except ProcessLookupError:
            pass
        if self.process.poll() is None:
            self.process.wait(timeout=STOP_TIMEOUT_S)
        psutil.wait_procs(members, timeout=STOP_TIMEOUT_S)  # a killed child (vLLM's engine core) takes a moment
        self.final_output = self.output()
        self.log.close()
        if self.process.returncode in (0, -signal.SIGTERM):
            Path(self.log.name).unlink(missing_ok=True)
