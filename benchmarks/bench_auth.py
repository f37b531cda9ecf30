"""Basic auth under a bcrypt flood: how long a correct, uncached login takes while attackers
send wrong passwords (issue #13, item 2).

``python3 -m benchmarks.bench_auth [--attackers 200] [--logins 30] [--cost 10] [--out FILE]``

dra-exporter runs as a child process (``serve --simulate`` with a web config of bcrypt
hashes of ``--cost``, default 10: Go's and htpasswd's usual cost and exporter-toolkit's
dummy hash). The attackers are threads in other processes, each on its own loopback address
(127.0.x.y: all of 127/8 is the loopback, so each looks like its own client), each sending
GET /metrics as fast as answers come, on a kept-alive connection, with the known user
``prometheus`` and a new wrong password every time (so no remembered failure spares a
bcrypt), ignoring ``Retry-After``. The measuring client logs in from 127.0.0.1 as a user it
has not used yet, so every login is a real bcrypt (never a remembered success).

Baseline: the same logins, same server, same run, before the attack starts. The figure is
the slowest login under attack (target: under 1 s, every time) and its ratio to the baseline.
"""

from __future__ import annotations

import argparse
import base64
import http.client
import json
import multiprocessing
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import bcrypt

from .common import (
    REPO,
    Check,
    Result,
    child_env,
    free_port,
    machine,
    ms,
    percentile,
    python_command,
    wait_http_ok,
)

LOGIN_TARGET_S = 1.0
WARMUP_S = 3.0
#: Seconds between two measured logins (Prometheus logs in once per scrape interval at most).
LOGIN_PAUSE_S = 0.2


def _basic(user: str, password: str) -> dict[str, str]:
    return {"Authorization": "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()}


def _attacker(port: int, first: int, count: int, seconds: float, spread: int = 1) -> dict[str, int]:
    """``count`` attacker threads for ``seconds``; the statuses they got. Thread ``n`` sends from
    ``spread`` addresses (``(first + n) * spread``..) in turn, a new connection for each request when
    ``spread`` > 1 (else one connection kept alive)."""
    import threading

    statuses: dict[str, int] = {}
    lock = threading.Lock()

    def attack(n: int) -> None:
        sources = [f"127.0.{2 + a // 250}.{1 + a % 250}" for a in range(n * spread, (n + 1) * spread)]
        deadline = time.monotonic() + seconds
        conn: http.client.HTTPConnection | None = None
        guess = 0
        while time.monotonic() < deadline:
            try:
                if conn is None:
                    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10,
                                                      source_address=(sources[guess % spread], 0))
                guess += 1
                conn.request("GET", "/metrics", headers=_basic("prometheus", f"guess-{n}-{guess}"))
                response = conn.getresponse()
                response.read()
                key = str(response.status)
                if response.will_close or spread > 1:
                    conn.close()
                    conn = None
            except (OSError, http.client.HTTPException) as e:
                key = type(e).__name__
                if conn is not None:
                    conn.close()
                conn = None
            with lock:
                statuses[key] = statuses.get(key, 0) + 1
        if conn is not None:
            conn.close()

    threads = [threading.Thread(target=attack, args=(first + i,), daemon=True) for i in range(count)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return statuses


def _login(port: int, user: str, password: str) -> tuple[float, int | str]:
    """Seconds to the end of the answer, and its status (or the error that ended it)."""
    started = time.perf_counter()
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30, source_address=("127.0.0.1", 0))
    try:
        conn.request("GET", "/metrics", headers=_basic(user, password))
        response = conn.getresponse()
        response.read()
        return time.perf_counter() - started, response.status
    except (OSError, http.client.HTTPException) as e:  # e.g. cut at the server's request deadline
        return time.perf_counter() - started, type(e).__name__
    finally:
        conn.close()


def _summary(times: list[float]) -> dict[str, float]:
    return {"p50_ms": ms(percentile(times, 50)), "p99_ms": ms(percentile(times, 99)), "max_ms": ms(max(times))}


def run(attackers: int = 200, logins: int = 30, cost: int = 10, processes: int = 4, tree: Path = REPO,
        spread: int = 1) -> Result:
    """The flood against the exporter of ``tree`` (this checkout, or another for a before/after run);
    each attacker sends from ``spread`` addresses in turn, a new connection each time (more attackers
    than the server's 256 connections would hold them all and refuse good logins at connect: a
    connection flood, not a bcrypt one)."""
    users = [(f"login-{i}", f"secret-{i}") for i in range(2 * logins)]
    with tempfile.TemporaryDirectory() as folder:
        config = Path(folder) / "web.yml"
        lines = [f"  prometheus: {bcrypt.hashpw(b'the real one', bcrypt.gensalt(cost)).decode()}"]
        lines += [f"  {u}: {bcrypt.hashpw(p.encode(), bcrypt.gensalt(cost)).decode()}" for u, p in users]
        config.write_text("basic_auth_users:\n" + "\n".join(lines) + "\n")
        port = free_port()
        server = subprocess.Popen(python_command("-m", "dra_exporter.cli", "serve", "--simulate", "--listen",
                                                 f"127.0.0.1:{port}", "--web-config", str(config)),
                                  cwd=tree, env=child_env(tree), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        try:
            wait_http_ok(f"http://127.0.0.1:{port}/readyz", alive=lambda: server.poll() is None)
            baseline = [_login(port, u, p) for u, p in users[:logins]]
            attack_s = WARMUP_S + logins * (LOGIN_PAUSE_S + 2 * LOGIN_TARGET_S) + 5
            per_process = -(-attackers // processes)
            with multiprocessing.get_context("spawn").Pool(processes) as pool:
                flood = [pool.apply_async(_attacker, (port, p * per_process,
                                                      min(per_process, attackers - p * per_process), attack_s,
                                                      spread))
                         for p in range(processes) if p * per_process < attackers]
                time.sleep(WARMUP_S)
                measured = []
                for u, p in users[logins:]:
                    measured.append(_login(port, u, p))
                    time.sleep(LOGIN_PAUSE_S)
                counts: dict[str, int] = {}
                for job in flood:
                    for key, n in job.get(timeout=attack_s + 60).items():
                        counts[key] = counts.get(key, 0) + n
        finally:
            server.terminate()
            server.communicate(timeout=30)
    base_times = [t for t, _ in baseline]
    attack_times = [t for t, _ in measured]
    slowest = max(attack_times)
    result = Result(
        description=f"a correct, uncached basic-auth login (bcrypt cost {cost}) while {attackers} attackers, "
                    f"each on {spread} address(es) of its own, send wrong passwords as fast as they are answered",
        baseline="the same logins on the same server before the attack, same run",
        rows=[{"phase": "no attack", "logins": logins, **_summary(base_times),
               "not_200": sum(s != 200 for _, s in baseline)},
              {"phase": f"{attackers} attackers", "logins": logins, **_summary(attack_times),
               "not_200": sum(s != 200 for _, s in measured),
               "statuses": ",".join(sorted({str(s) for _, s in measured})),
               "over_1s": sum(t > LOGIN_TARGET_S for t in attack_times),
               "slowest_vs_baseline_p50": round(slowest / percentile(base_times, 50), 1)}],
        checks=[Check("slowest correct login under the bcrypt flood", round(slowest, 3), LOGIN_TARGET_S, "s")],
        notes=[f"attacker answers: {dict(sorted(counts.items()))} (401: a bcrypt ran; 429: refused without one)"],
    )
    if any(s != 200 for _, s in measured):
        result.checks.append(Check("correct logins refused under the flood", sum(s != 200 for _, s in measured),
                                   0, "logins"))
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python3 -m benchmarks.bench_auth", description=__doc__.splitlines()[0])
    parser.add_argument("--attackers", type=int, default=200)
    parser.add_argument("--logins", type=int, default=30, help="measured logins (and as many for the baseline)")
    parser.add_argument("--cost", type=int, default=10, help="bcrypt cost of the hashes (default 10)")
    parser.add_argument("--processes", type=int, default=4, help="processes the attackers' threads run in")
    parser.add_argument("--out", type=Path, help="also write the result as JSON here")
    ns = parser.parse_args(argv)
    if ns.attackers < 1 or ns.logins < 1 or not 4 <= ns.cost <= 31 or ns.processes < 1:
        parser.error("--attackers, --logins and --processes must be positive, --cost within 4-31")
    result = run(ns.attackers, ns.logins, ns.cost, ns.processes)
    doc: dict[str, Any] = {"command": "python3 -m benchmarks.bench_auth " + " ".join(argv or sys.argv[1:]),
                           "machine": machine(), **result.as_dict()}
    print(json.dumps(doc, indent=1))
    if ns.out:
        ns.out.write_text(json.dumps(doc, indent=1) + "\n")
    return 0 if all(c.met for c in result.checks) else 1


if __name__ == "__main__":
    sys.exit(main())
