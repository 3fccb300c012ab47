"""Soak a live `mlxcel serve` with valid and hostile traffic; report what it served and its health.

    python scripts/soak.py --clients 8 --minutes 2 [--restart-every 60] [-m MODEL] [--json out.json]

Starts `mlxcel serve -np 4 --draft-kind prompt-lookup` (the default model unless -m), then runs
N client threads for M minutes. Each picks at random: a chat request (streamed or not), a text
completion, a plain-decoding request, or a hostile one (malformed JSON, wrong types, extreme
sampling values, a 1 MiB body, a wrong content type, headers that never finish, a hang-up
mid-upload, a hang-up mid-stream; and #47's: a JSON schema whose `$ref`s chain 1,000 deep, a
4,000-rule GBNF chain, a 998-rule one within the limits that takes seconds to compile, 70 K
characters of `logit_bias` text keys, a cross-site text/plain POST from another origin). Every
`--restart-every` seconds the server gets SIGTERM and is started again (clients see refused
connections meanwhile). Every 5 s the server's RSS and open file descriptors are sampled, and a
probe asks `/health` every 0.5 s: a reply slower than 1 s is a stall another client would feel.
The report: requests by outcome (HTTP status, or the client's own failure), restarts, RSS /
descriptors over time (first, max, last per server run), and the probe's slowest replies. Not part
of the test suite (it runs for minutes); its figures are in docs/bench/soak.md.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections import Counter
from urllib.parse import urlparse

LINE = re.compile(r"listening on (http://[\d.]+:\d+)")


def start(args) -> tuple[subprocess.Popen, str]:
    cmd = [sys.executable, "-m", "mlxcel_py", "serve", "--port", "0", "-np", "4", "--draft-kind", "prompt-lookup"]
    cmd += ["-m", args.model] if args.model else []
    env = dict(os.environ, HF_HUB_OFFLINE="1", MLXCEL_HEADER_TIMEOUT="5", MLXCEL_BODY_TIMEOUT="5")
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=env)
    for line in proc.stderr:
        m = LINE.search(line)
        if m:
            threading.Thread(target=lambda: [None for _ in proc.stderr], daemon=True).start()  # keep draining
            return proc, m.group(1)
    raise SystemExit("the server did not start")


def request(url: str, path: str, body, *, ctype="application/json", stream=False, timeout=60, origin=None) -> str:
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    headers = {"Content-Type": ctype} | ({"Origin": origin} if origin else {})
    req = urllib.request.Request(url + path, data=data, headers=headers)
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            if stream:
                for _ in r:
                    pass
            else:
                r.read()
            return str(r.status)
    except urllib.error.HTTPError as e:
        return str(e.code)
    except urllib.error.URLError as e:  # the server is down (a restart): its reason's name
        return type(e.reason).__name__ if isinstance(e.reason, BaseException) else "URLError"
    except (ConnectionError, OSError) as e:
        return type(e).__name__


def raw(url: str, payload: bytes, hang_after: float | None = None) -> str:
    u = urlparse(url)
    try:
        s = socket.create_connection((u.hostname, u.port), timeout=30)
    except OSError as e:
        return type(e).__name__
    try:
        s.sendall(payload)
        if hang_after is not None:
            time.sleep(hang_after)
            return "hung-up"
        got = s.recv(64)
        return "closed" if not got else got.split(b" ", 2)[1].decode(errors="replace")
    except OSError as e:
        return type(e).__name__
    finally:
        s.close()


CHAT = "/v1/chat/completions"
PROMPTS = [
    "Fix the spelling: teh cat sat on teh mat.",
    "Repeat exactly: alpha beta gamma delta epsilon.",
    "Write two sentences about the sea.",
]


def chain_schema(n: int) -> dict:
    defs = {f"d{i}": {"type": "object", "properties": {"a": {"$ref": f"#/$defs/d{i + 1}"}}} for i in range(n)}
    return {"$defs": {**defs, f"d{n}": {"type": "string"}}, "$ref": "#/$defs/d0"}


def chain_gbnf(n: int) -> str:
    return "root ::= r0\n" + "".join(f'r{i} ::= "a" r{i + 1}\n' for i in range(n)) + f'r{n} ::= "b"\n'


HOSTILE_47 = {  # #47's requests: each a 4xx (or, the slow one within the limits, a 200)
    "schema-chain": ("/completion", {"prompt": "hi", "n_predict": 2, "json_schema": chain_schema(1000)}),
    "gbnf-chain": ("/completion", {"prompt": "hi", "n_predict": 2, "grammar": chain_gbnf(4000)}),
    "gbnf-slow": ("/completion", {"prompt": "hi", "n_predict": 2, "grammar": chain_gbnf(998)}),
    "bias-text": (CHAT, {"messages": [{"role": "user", "content": "hi"}], "logit_bias": [["x" * 70_000, 1]]}),
}


def one(url: str) -> tuple[str, str]:
    msgs = [{"role": "user", "content": random.choice(PROMPTS)}]
    kind = random.choice(
        ["chat", "chat-stream", "completion", "plain", "malformed", "types", "extreme", "big", "ctype",
         "slow-headers", "upload-hangup", "stream-hangup", "cross-site", *HOSTILE_47]
    )  # fmt: skip
    if kind in HOSTILE_47:
        path, body = HOSTILE_47[kind]
        return kind, request(url, path, json.dumps(body).encode(), ctype="text/plain")
    if kind == "cross-site":
        return kind, request(url, CHAT, {"messages": msgs}, ctype="text/plain", origin="https://evil.example")
    if kind == "chat":
        return kind, request(url, CHAT, {"messages": msgs, "max_tokens": 24})
    if kind == "chat-stream":
        return kind, request(url, CHAT, {"messages": msgs, "max_tokens": 24, "stream": True}, stream=True)
    if kind == "completion":
        return kind, request(url, "/v1/completions", {"prompt": msgs[0]["content"], "max_tokens": 16})
    if kind == "plain":
        return kind, request(url, CHAT, {"messages": msgs, "max_tokens": 16, "speculative.n_max": 0})
    if kind == "malformed":
        return kind, request(url, CHAT, random.choice([b"{", b'{"messages": NaN}', b"[]", b"\xff\xfe"]))
    if kind == "types":
        return kind, request(url, CHAT, {"messages": "hi", "max_tokens": "x", "n": 1.0})
    if kind == "extreme":
        field, value = random.choice([("temperature", 1e308), ("temperature", 1e-300), ("top_p", 1e-300)])
        return kind, request(url, CHAT, {"messages": msgs, "max_tokens": 8, field: value})
    if kind == "big":
        return kind, request(url, CHAT, {"messages": [{"role": "user", "content": "x" * (1 << 20)}], "max_tokens": 1})
    if kind == "ctype":
        return kind, request(url, CHAT, {"messages": msgs}, ctype="text/plain")
    if kind == "slow-headers":
        return kind, raw(url, b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: ")
    if kind == "upload-hangup":
        head = b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
        return kind, raw(url, head + b'Content-Length: 9000\r\n\r\n{"mess', hang_after=0.2)
    body = json.dumps({"messages": msgs, "max_tokens": 200, "stream": True}).encode()
    head = b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
    return kind, raw(url, head + f"Content-Length: {len(body)}\r\n\r\n".encode() + body, hang_after=0.3)


def _get(url: str) -> str:
    try:
        with urllib.request.urlopen(url, timeout=30) as r:
            r.read()
            return str(r.status)
    except urllib.error.HTTPError as e:
        return str(e.code)
    except OSError as e:
        return type(e).__name__


def sample(pid: int) -> tuple[float, int]:
    rss = 0.0
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                rss = int(line.split()[1]) / 1024
    return rss, len(os.listdir(f"/proc/{pid}/fd"))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--clients", type=int, default=8)
    ap.add_argument("--minutes", type=float, default=2.0)
    ap.add_argument("--restart-every", type=float, default=60.0, help="seconds between restarts (0: never)")
    ap.add_argument("-m", "--model")
    ap.add_argument("--json")
    a = ap.parse_args()
    state = {"url": None}
    outcomes: Counter = Counter()
    lock = threading.Lock()
    stop = time.time() + a.minutes * 60
    runs: list[list[tuple[float, float, int]]] = []
    proc, state["url"] = start(a)
    runs.append([])
    t0 = time.time()

    def client() -> None:
        while time.time() < stop:
            kind, result = one(state["url"])
            with lock:
                outcomes[(kind, result)] += 1
            if result in ("ConnectionRefusedError", "ConnectionResetError"):
                time.sleep(0.2)  # the server is restarting: do not count thousands of refusals

    probes: list[tuple[float, float]] = []  # (seconds into the run, /health latency)

    def probe() -> None:
        while time.time() < stop:
            start = time.perf_counter()
            result = _get(state["url"] + "/health")
            if result == "200":
                probes.append((round(time.time() - t0, 1), time.perf_counter() - start))
            time.sleep(0.5)

    threads = [threading.Thread(target=client, daemon=True) for _ in range(a.clients)]
    threads.append(threading.Thread(target=probe, daemon=True))
    for t in threads:
        t.start()
    restarts, last_restart = 0, time.time()
    while time.time() < stop:
        time.sleep(5)
        try:
            rss, fds = sample(proc.pid)
            runs[-1].append((round(time.time() - t0), rss, fds))
            print(
                f"t={time.time() - t0:.0f}s rss={rss:.0f} MiB fds={fds} requests={sum(outcomes.values())}",
                file=sys.stderr,
            )
        except OSError:
            pass
        if a.restart_every and time.time() - last_restart > a.restart_every and time.time() + 20 < stop:
            proc.send_signal(signal.SIGTERM)
            proc.wait(timeout=60)
            proc, state["url"] = start(a)
            runs.append([])
            restarts += 1
            last_restart = time.time()
    for t in threads:
        t.join(timeout=90)
    proc.send_signal(signal.SIGTERM)
    code = proc.wait(timeout=60)
    by_status: Counter = Counter()
    for (_, result), n in outcomes.items():
        by_status[result] += n
    print("| outcome | requests |\n|---|---|")
    for k, n in sorted(by_status.items(), key=lambda kv: -kv[1]):
        print(f"| {k} | {n} |")
    print("\n| server run | samples | RSS first / max / last (MiB) | fds first / max / last |\n|---|---|---|---|")
    for i, r in enumerate(runs):
        if r:
            rs, fs = [x[1] for x in r], [x[2] for x in r]
            print(
                f"| {i + 1} | {len(r)} | {rs[0]:.0f} / {max(rs):.0f} / {rs[-1]:.0f} | {fs[0]} / {max(fs)} / {fs[-1]} |"
            )
    slow = sorted((lat for _, lat in probes), reverse=True)
    print(
        f"\n/health probe: {len(probes)} replies, slowest {', '.join(f'{s * 1000:.0f}' for s in slow[:3])} ms, "
        f"{sum(s > 1.0 for s in slow)} over 1 s"
    )
    print(
        f"\n{sum(by_status.values())} requests from {a.clients} clients in {a.minutes:g} min, {restarts} restart(s); "
        f"last server exit code {code}; 5xx: {sum(n for k, n in by_status.items() if k.startswith('5') and k != '503')}"
    )
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"outcomes": {f"{k} {r}": n for (k, r), n in outcomes.items()}, "runs": runs,
                       "restarts": restarts, "exit_code": code, "health_probe": probes}, f, indent=2)  # fmt: skip


if __name__ == "__main__":
    main()
