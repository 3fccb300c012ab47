"""A Hugging Face hub on a loopback port, for downloads without the network: the two routes
huggingface_hub's `list_repo_files` and `hf_hub_download` use (the repo tree; a file's HEAD and GET
under /resolve/, with the commit, ETag and size headers), over a real socket. Point HF_ENDPOINT at
`FakeHub.url`. `delay` slows each file's body (seconds per 64 KiB), so a download can be caught in
flight; `tree_delay` the file lists.
"""

from __future__ import annotations

import hashlib
import json
import re
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

COMMIT = "1234567890abcdef1234567890abcdef12345678"


class FakeHub:
    def __init__(self, repos: dict[str, dict[str, Path]], delay: float = 0.0):
        self.repos, self.delay = repos, delay
        self.tree_delay = 0.0  # seconds before a repo's file list is answered
        self.requests: list[str] = []
        hub = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):  # quiet
                pass

            def do_GET(self):
                hub._answer(self, body=True)

            def do_HEAD(self):
                hub._answer(self, body=False)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()

    def _answer(self, h: BaseHTTPRequestHandler, body: bool) -> None:
        path = h.path.split("?", 1)[0]
        self.requests.append(f"{h.command} {path}")
        tree = re.fullmatch(r"/api/models/([^/]+/[^/]+)/tree/[^/]+", path)
        if tree:
            time.sleep(self.tree_delay)
            files = self.repos.get(tree.group(1))
            if files is None:
                return self._error(h, 404, "RepoNotFound", "Repository not found")
            listing = [
                {"type": "file", "path": name, "size": p.stat().st_size, "oid": _oid(name)} for name, p in files.items()
            ]
            return self._send(h, 200, json.dumps(listing).encode(), {"Content-Type": "application/json"}, body)
        resolve = re.fullmatch(r"/([^/]+/[^/]+)/resolve/[^/]+/(.+)", path)
        files = self.repos.get(resolve.group(1)) if resolve else None
        if files is None or resolve.group(2) not in files:
            return self._error(h, 404, "EntryNotFound", "Entry not found")
        data = files[resolve.group(2)].read_bytes()
        etag = hashlib.sha256(data).hexdigest()
        headers = {"X-Repo-Commit": COMMIT, "ETag": f'"{etag}"', "Content-Type": "application/octet-stream"}
        self._send(h, 200, data, headers, body)

    def _error(self, h: BaseHTTPRequestHandler, status: int, code: str, message: str) -> None:
        payload = json.dumps({"error": message}).encode()
        self._send(h, status, payload, {"X-Error-Code": code, "Content-Type": "application/json"}, True)

    def _send(self, h: BaseHTTPRequestHandler, status: int, data: bytes, headers: dict, body: bool) -> None:
        h.send_response(status)
        for k, v in headers.items():
            h.send_header(k, v)
        h.send_header("Content-Length", str(len(data)))
        h.end_headers()
        if not body:
            return
        try:
            for i in range(0, len(data), 1 << 16):
                h.wfile.write(data[i : i + (1 << 16)])
                if self.delay:
                    time.sleep(self.delay)
        except (BrokenPipeError, ConnectionResetError):
            pass


def _oid(name: str) -> str:
    return hashlib.sha1(name.encode()).hexdigest()
