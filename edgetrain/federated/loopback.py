"""A federation on one machine with Flower's Deployment Engine: one ``flower-superlink`` and N
``flower-supernode`` processes bound to 127.0.0.1, then ``flwr run`` of the app; no Ray, no Flower import here.

Telemetry and update checks are off, runtime dependency installation is disabled, ``FLWR_HOME`` is a folder of
the federation's own (Flower's config and installed app bundles stay there). ``flwr run`` returns before the run
ends and its exit code does not tell how it ended, so ``wait`` polls ``flwr list`` for the run's final status.
"""
from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import psutil

from .. import atomic
from ..errors import EdgetrainError

HOST = "127.0.0.1"
QUIET = {"FLWR_TELEMETRY_ENABLED": "0", "FLWR_DISABLE_UPDATE_CHECK": "1", "PYTHONUNBUFFERED": "1"}


class FederationError(EdgetrainError):
    """A Flower process failed to start, or a run ended other than completed."""


def _free_ports(n: int) -> list[int]:
    socks = []
    try:
        for _ in range(n):
            s = socket.socket()
            s.bind((HOST, 0))
            socks.append(s)
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def _tool(name: str) -> str:
    """A Flower executable beside this Python (a venv's bin), else on PATH."""
    here = Path(sys.executable).with_name(name)
    found = str(here) if here.exists() else shutil.which(name)
    if found is None:
        raise FederationError(f"'{name}' not found: install Flower with `pip install edgetrain[federated]`")
    return found


def require_flower() -> None:
    """Fail early, naming the extra, where Flower's executables are missing."""
    for name in ("flower-superlink", "flower-supernode", "flwr"):
        _tool(name)


def _toml_value(value) -> str:
    return json.dumps(value) if isinstance(value, str) else ("true" if value is True else "false"
                                                           if value is False else repr(value))


def config_arg(config: dict) -> str:
    """``key=value`` pairs as Flower's --node-config and --run-config take them (TOML values)."""
    return " ".join(f"{k}={_toml_value(v)}" for k, v in config.items())


def _signal_tree(proc: subprocess.Popen, sig: int) -> list[psutil.Process]:
    """Send ``sig`` to ``proc`` and all its descendants (children first listed, then signalled together)."""
    try:
        root = psutil.Process(proc.pid)
        tree = [root, *root.children(recursive=True)]
    except psutil.NoSuchProcess:
        return []
    for q in tree:
        try:
            q.send_signal(sig)
        except psutil.NoSuchProcess:
            pass
    if sig == signal.SIGKILL:
        proc.wait()
    return tree


class Federation:
    """``with Federation(folder, node_configs) as fed: run = fed.run(app, run_config); fed.wait(run)``.

    ``node_configs`` holds one dict per SuperNode (its ``--node-config``). Processes write their logs to
    ``folder/logs``; leaving the block stops every process it started (and their children)."""

    def __init__(self, folder, node_configs: list[dict]):
        self.folder = Path(folder)
        self.logs = self.folder / "logs"
        self.node_configs = node_configs
        self.procs: dict[str, subprocess.Popen] = {}
        # the SuperLink and SuperNodes start flower-superexec and flwr-clientapp by name: this Python's first
        bin_dir = str(Path(sys.executable).parent)
        self.env = {**os.environ, **QUIET, "FLWR_HOME": str(self.folder / "flwr-home"),
                    "PATH": os.pathsep.join([bin_dir, os.environ.get("PATH", "")])}

    # -- processes ----------------------------------------------------------------------------------------
    def _spawn(self, name: str, argv: list[str]) -> subprocess.Popen:
        self.logs.mkdir(parents=True, exist_ok=True)
        log = self.logs / f"{name}.log"
        if not log.exists():
            atomic.write_atomic(log, b"")
        # a log is a stream the process appends to: the file is made by the atomic writer, opened without O_CREAT
        fd = os.open(log, os.O_WRONLY | os.O_APPEND)
        try:
            proc = subprocess.Popen(argv, stdout=fd, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                    env=self.env, cwd=self.folder, start_new_session=True)
        finally:
            os.close(fd)
        self.procs[name] = proc
        return proc

    def start(self) -> Federation:
        # Flower 1.41's SuperLink serves its Fleet, Control and Runtime APIs on one HTTP port (--host/--port)
        link, *node_ports = _free_ports(1 + len(self.node_configs))
        self.control = f"{HOST}:{link}"
        home = self.folder / "flwr-home"
        home.mkdir(parents=True, exist_ok=True)
        atomic.write_text(home / "config.toml", f'[superlink]\ndefault = "loopback"\n\n[superlink.loopback]\n'
                                                f'address = "{self.control}"\ninsecure = true\n')
        self._spawn("superlink", [_tool("flower-superlink"), "--insecure", "--disable-runtime-dependency-installation",
                                  "--host", HOST, "--port", str(link)])
        for i, (config, port) in enumerate(zip(self.node_configs, node_ports)):
            self._spawn(f"supernode-{i}", [_tool("flower-supernode"), "--insecure", "--superlink", self.control,
                                           "--host", HOST, "--port", str(port), "--node-config", config_arg(config)])
        return self

    def kill_node(self, i: int) -> None:
        """SIGKILL SuperNode ``i`` and everything it started (its SuperExec and ClientApp processes)."""
        _signal_tree(self.procs[f"supernode-{i}"], signal.SIGKILL)

    def stop(self) -> None:
        """SIGTERM every process tree started here (Flower starts SuperExecs in sessions of their own, so a
        process group does not reach them), SIGKILL what is left after 10 s."""
        trees = [_signal_tree(p, signal.SIGTERM) for p in self.procs.values()]
        _, alive = psutil.wait_procs([q for tree in trees for q in tree], timeout=10)
        for q in alive:
            try:
                q.kill()
            except psutil.NoSuchProcess:
                pass
        for proc in self.procs.values():
            proc.wait()

    def __enter__(self) -> Federation:
        try:
            return self.start()
        except BaseException:
            self.stop()
            raise

    def __exit__(self, *exc) -> None:
        self.stop()

    # -- runs ---------------------------------------------------------------------------------------------
    def _flwr(self, *args: str, timeout: float = 120) -> subprocess.CompletedProcess:
        return subprocess.run([_tool("flwr"), *args], env=self.env, cwd=self.folder, capture_output=True, text=True,
                              timeout=timeout, stdin=subprocess.DEVNULL, check=False)

    def _dead(self) -> list[str]:
        return [n for n, p in self.procs.items() if n == "superlink" and p.poll() is not None]

    def run(self, app, run_config: dict, start_timeout: float = 60) -> int:
        """Submit ``app`` (a folder with a Flower pyproject) and return the run id. Retries while the SuperLink
        is still coming up."""
        deadline = time.monotonic() + start_timeout
        while True:
            done = self._flwr("run", str(app), "loopback", "--run-config", config_arg(run_config), "--format", "json")
            try:
                answer = json.loads(done.stdout)
            except json.JSONDecodeError:
                answer = {}
            if answer.get("success") and "run-id" in answer:
                return int(answer["run-id"])
            if self._dead() or time.monotonic() > deadline:
                raise FederationError(f"flwr run failed: {done.stdout.strip()} {done.stderr.strip()} "
                                      f"(logs in {self.logs})")
            time.sleep(0.5)

    def status(self, run_id: int) -> str:
        done = self._flwr("list", "--run-id", str(run_id), "--format", "json")
        try:
            runs = json.loads(done.stdout).get("runs", [])
        except json.JSONDecodeError:
            return ""
        return runs[0].get("status", "") if runs else ""

    def wait(self, run_id: int, timeout: float = 600, poll: float = 1.0) -> str:
        """Block until the run is finished; return its status (``finished:completed`` when all went well)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            status = self.status(run_id)
            if status.startswith("finished"):
                return status
            if self._dead():
                raise FederationError(f"the SuperLink exited (logs in {self.logs})")
            time.sleep(poll)
        raise FederationError(f"run {run_id} did not finish within {timeout:.0f} s (logs in {self.logs})")

    def log(self, run_id: int) -> str:
        return self._flwr("log", str(run_id), "--show").stdout
