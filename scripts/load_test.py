#!/usr/bin/env python
"""Load a running mlxcel server: N concurrent clients x M chat requests, then check /health.

Only loopback addresses; bounded in count and time. Exit 0 when every request succeeded.
"""

from __future__ import annotations

import argparse
import json
import sys
import threading
import time
import urllib.request


def post(url: str, body: dict, timeout: float) -> dict:
    req = urllib.request.Request(url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=timeout) as resp:
        return json.loads(resp.read())


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--url", default="http://127.0.0.1:8080")
    ap.add_argument("--clients", type=int, default=8)
    ap.add_argument("--requests", type=int, default=5)
    ap.add_argument("--max-tokens", type=int, default=8)
    ap.add_argument("--timeout", type=float, default=300)
    args = ap.parse_args()
    if not args.url.startswith(("http://127.", "http://localhost", "http://[::1]")):
        sys.exit("load_test only targets loopback addresses")
    errors: list[str] = []
    done = []

    def client(i: int) -> None:
        for j in range(args.requests):
            try:
                r = post(
                    f"{args.url}/v1/chat/completions",
                    {
                        "messages": [
                            {"role": "user", "content": f"Client {i} request {j}: repeat 'alpha beta gamma'."}
                        ],
                        "max_tokens": args.max_tokens,
                        "temperature": 0,
                    },
                    args.timeout,
                )
                assert r["choices"][0]["message"]["content"] is not None
                done.append(1)
            except Exception as exc:  # report every failure
                errors.append(f"client {i} request {j}: {exc}")

    start = time.time()
    threads = [threading.Thread(target=client, args=(i,)) for i in range(args.clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    with urllib.request.urlopen(f"{args.url}/health", timeout=30) as resp:
        health = json.loads(resp.read())
    print(f"{len(done)} ok, {len(errors)} errors in {time.time() - start:.1f}s; /health: {health['status']}")
    for e in errors:
        print(e, file=sys.stderr)
    return 0 if not errors and health["status"] == "ok" else 1


if __name__ == "__main__":
    sys.exit(main())
