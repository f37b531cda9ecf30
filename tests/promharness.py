"""Helpers that drive the real Prometheus tools from tests.

``promtool_check_metrics`` lints an exposition with ``promtool check metrics``;
``start_prometheus`` runs ``/usr/bin/prometheus`` (Debian's package) against a throw-away
config and TSDB and returns a ``PromServer`` to query over the HTTP API. Nothing here knows
dra-exporter: the lead's end-to-end tests reuse it for the whole exporter.
"""

from __future__ import annotations

import json
import shutil
import socket
import subprocess
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from childproc import die_with_parent

PROMETHEUS_INSTALL_HINT = "apt-get install -y prometheus"
_READY_TIMEOUT = 60.0  # a cold start on a busy 2-core machine can take a while
_START_ATTEMPTS = 3


class PrometheusError(RuntimeError):
    """Prometheus did not start, or its API answered with an error."""


def find_tool(name: str) -> str | None:
    """Path of ``promtool``/``prometheus`` on PATH or in /usr/bin, else None."""
    found = shutil.which(name)
    if found:
        return found
    candidate = Path("/usr/bin") / name
    return str(candidate) if candidate.is_file() else None


def promtool_check_metrics(promtool: str, text: bytes) -> tuple[bool, str]:
    """Lint ``text`` with promtool; clean means exit 0 and no lint output at all."""
    proc = subprocess.run([promtool, "check", "metrics"], input=text, capture_output=True, timeout=60)
    output = (proc.stdout + proc.stderr).decode("utf-8", "replace").strip()
    return proc.returncode == 0 and not output, output


def free_port() -> int:
    """A port free right now on 127.0.0.1 (callers retry if someone takes it meanwhile)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _config(targets: list[str], scrape_interval: str, rule_files: Sequence[Path] = (),
            job: str = "dra-exporter") -> str:
    # JSON is valid YAML and needs no dependency or quoting rules of our own.
    return json.dumps({
        "global": {"scrape_interval": scrape_interval, "scrape_timeout": scrape_interval,
                   "evaluation_interval": scrape_interval},
        "rule_files": [str(p) for p in rule_files],
        "scrape_configs": [{"job_name": job, "static_configs": [{"targets": targets}]}],
    }, indent=2)


@dataclass
class PromServer:
    """A running Prometheus; ``stop()`` is idempotent."""

    url: str
    process: subprocess.Popen[bytes]
    log_path: Path
    _stopped: bool = field(default=False, repr=False)

    def api(self, path: str, **params: str) -> Any:
        """GET ``/api/v1/<path>`` and return ``data``; raises PrometheusError on an error status."""
        query = urllib.parse.urlencode(params)
        address = f"{self.url}/api/v1/{path}" + (f"?{query}" if query else "")
        try:
            with urllib.request.urlopen(address, timeout=10) as response:
                body = json.load(response)
        except urllib.error.HTTPError as exc:
            raise PrometheusError(f"{address}: HTTP {exc.code}: {exc.read()[:500]!r}") from exc
        if body.get("status") != "success":
            raise PrometheusError(f"{address}: {body.get('errorType')}: {body.get('error')}")
        return body["data"]

    def query(self, expr: str) -> list[dict[str, Any]]:
        """Instant query; returns ``data.result`` (for a vector: [{"metric": {...}, "value": [t, "v"]}])."""
        data = self.api("query", query=expr)
        result = data["result"]
        # Scalars and strings come back as one [t, "v"] pair; wrap so callers get a list.
        return result if data["resultType"] in ("vector", "matrix") else [{"metric": {}, "value": result}]

    def wait_for(self, expr: str, predicate: Callable[[list[dict[str, Any]]], bool] = bool,
                 timeout: float = 30.0) -> list[dict[str, Any]]:
        """Poll ``expr`` until ``predicate(result)`` holds; fail with what was last seen."""
        deadline = time.monotonic() + timeout
        result: list[dict[str, Any]] = []
        while True:
            result = self.query(expr)
            if predicate(result):
                return result
            if time.monotonic() > deadline:
                raise AssertionError(
                    f"{expr!r} did not satisfy the predicate within {timeout}s; last result: {result!r}; "
                    f"targets: {self.targets()!r}")
            time.sleep(0.2)

    def targets(self) -> list[dict[str, Any]]:
        """Active scrape targets, each with ``scrapeUrl``, ``health`` and ``lastError``."""
        return list(self.api("targets", state="active")["activeTargets"])

    def log_tail(self, limit: int = 4000) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-limit:]
        except OSError:
            return ""

    def stop(self) -> None:
        if self._stopped:
            return
        self._stopped = True
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(timeout=15)


def _wait_ready(server: PromServer, timeout: float) -> bool:
    """True once /-/ready answers 200; False if the process died first."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if server.process.poll() is not None:
            return False
        try:
            with urllib.request.urlopen(f"{server.url}/-/ready", timeout=2) as response:
                if response.status == 200:
                    return True
        except (urllib.error.URLError, OSError):
            pass
        time.sleep(0.2)
    raise PrometheusError(f"Prometheus at {server.url} not ready after {timeout}s; log:\n{server.log_tail()}")


def start_prometheus(binary: str, workdir: Path, targets: list[str],
                     scrape_interval: str = "1s", *, rule_files: Sequence[Path] = (),
                     tsdb: Path | None = None, extra_args: Sequence[str] = (),
                     job: str = "dra-exporter") -> PromServer:
    """Run Prometheus scraping ``targets`` (``host:port``, path /metrics) as ``job`` and wait until ready.

    ``rule_files`` are loaded (evaluated every ``scrape_interval`` unless a group sets its own);
    ``tsdb`` keeps the data in a given folder (e.g. backfilled blocks) instead of a fresh one.
    """
    workdir.mkdir(parents=True, exist_ok=True)
    config = workdir / "prometheus.yml"
    config.write_text(_config(targets, scrape_interval, rule_files, job))
    last_log = ""
    for attempt in range(_START_ATTEMPTS):
        port = free_port()
        log_path = workdir / f"prometheus-{attempt}.log"
        with log_path.open("wb") as log:
            process = subprocess.Popen(
                [binary, f"--config.file={config}", f"--storage.tsdb.path={tsdb or workdir / f'tsdb-{attempt}'}",
                 f"--web.listen-address=127.0.0.1:{port}", "--log.level=warn", *extra_args],
                stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, cwd=workdir,
                preexec_fn=die_with_parent)
        server = PromServer(f"http://127.0.0.1:{port}", process, log_path)
        try:
            if _wait_ready(server, _READY_TIMEOUT):
                return server
        except BaseException:
            server.stop()
            raise
        # The process exited: most likely the port was taken between free_port() and bind.
        last_log = server.log_tail()
        server.stop()
    raise PrometheusError(f"Prometheus exited during start-up {_START_ATTEMPTS} times; last log:\n{last_log}")
