"""`POST /models` (llama-server's router): a GGUF model downloaded from the Hugging Face hub into
the cache (hub_cache), in a process of its own (`python -m mlxcel_py.server.router.downloads
SPEC`), so `DELETE /models` cancels it by killing that process and the router's event loop never
waits on the network. It uses huggingface_hub (HF_ENDPOINT, HF_TOKEN); the router runs it without
HF_HUB_OFFLINE, since a download asked for is wanted even under `--offline`, as llama-server's is.

It prints JSON lines:
- first `{"files": [...]}`: what `OWNER/NAME[:QUANT]` stands for on the hub (the tag's model file,
  every shard of a split one, a projector of the repo), which the router waits for before it
  answers 200; or `{"result": "download_failed", "error"}` (a missing repo, no such quant, no
  network), its 400;
- then `{"url", "downloaded", "total"}` as each file arrives (at most ten a second);
- last `{"result": "download_finished"}` or `{"result": "download_failed", "error"}`.
"""

from __future__ import annotations

import json
import os
import sys
import time

from ...models import hub, hub_cache


def check(spec: str) -> list[str]:
    """The repo files `spec` names on the hub (ValueError with the reason when there are none)."""
    repo, tag = hub_cache.split_spec(spec)
    names = hub.gguf_files(hub.repo_files(repo), repo, tag)
    if not names:
        raise ValueError(f"{repo} has no GGUF model file on the Hugging Face hub")
    return names


def main(argv: list[str]) -> int:
    spec = argv[0]

    def say(item: dict) -> None:
        print(json.dumps(item), flush=True)

    try:
        from huggingface_hub import hf_hub_download, hf_hub_url
        from tqdm.auto import tqdm

        repo, _ = hub_cache.split_spec(spec)
        names = check(spec)
        say({"files": names})

        class Progress(tqdm):  # huggingface_hub's bar for one file, reported as JSON lines, not drawn
            url, last = "", 0.0

            def __init__(self, *args, **kwargs):
                super().__init__(*args, **{**kwargs, "disable": False, "file": quiet})
                say({"url": Progress.url, "downloaded": int(self.n), "total": int(self.total or 0)})

            def update(self, n=1):
                out = super().update(n)
                now = time.monotonic()
                if now - Progress.last >= 0.1 or (self.total and self.n >= self.total):
                    Progress.last = now
                    say({"url": Progress.url, "downloaded": int(self.n), "total": int(self.total or 0)})
                return out

        with open(os.devnull, "w") as quiet:
            for name in names:
                Progress.url = hf_hub_url(repo, name)
                hf_hub_download(repo, name, cache_dir=str(hub_cache.cache_root()), tqdm_class=Progress)
    except Exception as exc:  # noqa: BLE001 - reported to the router, which tells the clients
        say({"result": "download_failed", "error": (str(exc).strip() or type(exc).__name__)[:300]})
        return 1
    say({"result": "download_finished"})
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
