"""Images in requests: every API family's image forms, read into one shape, and their prompts.

The request schemas turn OpenAI's `image_url` parts, the Responses API's `input_image`, Anthropic's
`image` blocks (in a message or inside a `tool_result`) and llama-server's `multimodal_data` into
one content part, `{"type": "image", "url": ...}` (a data: URL, http(s) where `serve
--image-url-fetch` allows it, to public addresses only (server/addresses.py) unless
`--image-url-allow` names the host, or file:// inside `serve --media-path DIR`, llama-server's), in its
place among the turn's text parts. Here each is fetched or
decoded and checked (vision.images: size, pixels, truncation, SVG) and the conversation becomes
token ids through the vision model's processor (vision.prompts), which only prepares: the vision
tower runs on the model's thread when the prompt is first fed. A bad image is a 400 naming the
part; an image sent to a text model is a 400 that says so.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from itertools import groupby
from pathlib import Path
from typing import Any

from ..errors import MlxcelError
from ..vision import images as vimages
from .http import ApiError

FETCH_SECONDS = 10.0  # a remote image's whole download (--image-url-fetch)
MAX_REDIRECTS = 3
MEDIA_MARKER = "<__media__>"  # llama-server's place for each multimodal_data item in a prompt string


@dataclass(frozen=True)
class ImageSources:
    """Where a request's image URLs may come from besides data: URLs (serve's flags)."""

    fetch: bool = False  # --image-url-fetch: http(s) URLs of public addresses are downloaded
    media_path: Path | None = None  # --media-path: file:// URLs name files inside this folder
    allow: tuple[str, ...] = ()  # --image-url-allow: hosts fetched though not public (a LAN, loopback)


def has_images(turns: list[dict]) -> bool:
    return any(
        isinstance(t.get("content"), list) and any(p.get("type") == "image" for p in t["content"]) for t in turns
    )


def text_of(content: Any) -> str:
    """A turn's text (its image parts left out), for size checks and text-only paths."""
    if isinstance(content, list):
        return "".join(p.get("text") or "" for p in content if p.get("type") == "text")
    return content or ""


def decode(part: dict, sources: ImageSources):
    """The PIL image a part names."""
    url, where = part["url"], part.get("where", "image")
    try:
        if url.startswith("data:"):
            return vimages.open_image(vimages.data_url_bytes(url, where), where)
        if url.startswith(("http://", "https://")):
            if not sources.fetch:
                raise ApiError(
                    f"{where}: this server does not fetch remote images (start it with --image-url-fetch); "
                    "send the image as a data: URL"
                )
            return vimages.open_image(_fetch(url, where, sources.allow), where)
        if url.startswith("file://"):
            return vimages.open_image(_local(url, where, sources.media_path), where)
        raise ApiError(
            f"{where}: an image URL must be a data: URL (or http(s) under --image-url-fetch, "
            "file:// under --media-path)"
        )
    except MlxcelError as exc:
        raise ApiError(exc.message) from None


def _local(url: str, where: str, root: Path | None) -> bytes:
    """A file:// URL's bytes: a path relative to --media-path (extra slashes are one), never a
    file outside that folder (`..`, links out of it), as llama-server's --media-path."""
    if root is None:
        raise ApiError(f"{where}: this server reads no local files (start it with --media-path DIR)")
    rel = "/".join(p for p in url[len("file://") :].split("/") if p)
    try:  # a NUL byte, a name too long, an unreadable file: the request's fault, one line
        base = root.resolve()
        path = (base / rel).resolve()
        if not rel or not path.is_relative_to(base):
            raise ApiError(f"{where}: {url[:200]} is not a file inside the --media-path folder")
        if not path.is_file():
            raise ApiError(f"{where}: {url[:200]}: no such file in the --media-path folder")
        if path.stat().st_size > vimages.MAX_BYTES:
            raise ApiError(f"{where}: the image has more than {vimages.MAX_BYTES} bytes (the limit)")
        return path.read_bytes()
    except (OSError, ValueError) as exc:
        raise ApiError(f"{where}: cannot read {url[:200]!r} in the --media-path folder ({str(exc)[:80]})") from None


def _fetch(url: str, where: str, allowed: tuple[str, ...]) -> bytes:
    """An image URL's bytes under the address policy (server/addresses.py: public addresses
    only, `--image-url-allow` hosts beside them), connecting to the address checked; a redirect
    is followed only to a URL the policy lets through too (MAX_REDIRECTS at most)."""
    import time
    from urllib.parse import urljoin

    import httpx

    from . import addresses

    # every message of the policy starts with `where`, as this function's own do
    policy = addresses.Policy.of(
        allowed, who=f"{where}: this server", url=f"{where}: the image URL", flag="--image-url-allow"
    )
    deadline = time.monotonic() + FETCH_SECONDS
    try:
        with httpx.Client(follow_redirects=False, trust_env=False, timeout=FETCH_SECONDS) as client:
            for _ in range(MAX_REDIRECTS + 1):
                target = addresses.parse(url, policy)
                address = addresses.address_of_now(target, policy)
                extensions = {"sni_hostname": target.host} if target.scheme == "https" else {}
                request = client.build_request(
                    "GET", target.url_at(address), headers={"Host": target.authority}, extensions=extensions
                )
                resp = client.send(request, stream=True)
                try:
                    if resp.is_redirect and "location" in resp.headers:
                        url = urljoin(url, resp.headers["location"])
                        continue
                    if resp.status_code >= 400:
                        raise ApiError(f"{where}: cannot fetch the image (HTTP {resp.status_code})")
                    return _read_limited(resp, where, deadline)
                finally:
                    resp.close()
            raise ApiError(f"{where}: the image URL redirects more than {MAX_REDIRECTS} times")
    except ApiError:
        raise
    except Exception as exc:  # timeouts, refused connections, TLS failures: the request's fault
        raise ApiError(f"{where}: cannot fetch the image ({type(exc).__name__}: {str(exc)[:120]})") from None


def _read_limited(resp, where: str, deadline: float) -> bytes:
    import time

    size = resp.headers.get("Content-Length")
    if size is not None and size.isdigit() and int(size) > vimages.MAX_BYTES:
        raise ApiError(f"{where}: the image has {size} bytes, more than the limit ({vimages.MAX_BYTES})")
    chunks, total = [], 0
    for chunk in resp.iter_bytes(1 << 16):
        total += len(chunk)
        if total > vimages.MAX_BYTES:
            raise ApiError(f"{where}: the image has more than {vimages.MAX_BYTES} bytes (the limit)")
        if time.monotonic() > deadline:
            raise ApiError(f"{where}: the image took longer than {FETCH_SECONDS:.0f} s to download")
        chunks.append(chunk)
    return b"".join(chunks)


def prompt_ids(vision: Any, tokenizer: Any, turns: list[dict], *, sources: ImageSources, **render: Any) -> list[int]:
    """Token ids of turns holding image parts (`render`: the chat template's options)."""
    if vision is None:
        raise ApiError(
            "this model takes text only: image parts need a vision-language model (one whose config.json "
            "declares a vision tower)"
        )
    decoded = [  # each image part's picture in its place, for vision.prompts
        {
            **t,
            "content": [
                {"type": "image", "image": decode(p, sources)} if p["type"] == "image" else p for p in t["content"]
            ],
        }
        if isinstance(t["content"], list)
        else t
        for t in turns
    ]
    try:
        return vision.conversation_ids(tokenizer, decoded, **render)
    except MlxcelError as exc:
        raise ApiError(exc.message) from None


def prompt_text(tokenizer: Any, ids: list[int], vision: Any) -> str:
    """A prompt as text (llama-server echoes it): each image's positions as the image's
    placeholder (`<__media__>` where there is no vision model to name one)."""
    if not ids or min(ids) >= 0:
        return tokenizer.decode(ids)
    slot = vision.placeholder if vision is not None else MEDIA_MARKER
    return "".join(slot if image else tokenizer.decode(list(run)) for image, run in groupby(ids, key=lambda t: t < 0))


IMAGE_DATA_MARKER = re.compile(r"\[img-(\d+)\]")


def image_data_ids(vision: Any, prompt: Any, items: Any) -> list[int]:
    """llama-server's older form: `image_data: [{"data": base64, "id": N}]`, each image where the
    prompt string says `[img-N]` (without markers the images go first, in order)."""
    where = "'image_data'"
    if vision is None:
        raise ApiError(f"{where}: this model takes text only (no vision tower)")
    if not isinstance(prompt, str):
        raise ApiError(f"{where} needs 'prompt' to be a string (with [img-N] markers)")
    if not isinstance(items, list) or not items:
        raise ApiError(f"{where} must be a non-empty list of {{'data': base64, 'id': N}}")
    by_id = {}
    for i, item in enumerate(items):
        name = f"{where}[{i}]"
        if not isinstance(item, dict) or not isinstance(item.get("data"), str) or not isinstance(item.get("id"), int):
            raise ApiError(f"{name} must be {{'data': base64 string, 'id': integer}}")
        try:
            by_id[item["id"]] = vimages.open_image(vimages.b64_bytes(item["data"], name), name)
        except MlxcelError as exc:
            raise ApiError(exc.message) from None
    marks = [int(m.group(1)) for m in IMAGE_DATA_MARKER.finditer(prompt)]
    if not marks:
        return _encode(vision, vision.placeholder * len(by_id) + prompt, list(by_id.values()))
    if missing := sorted({m for m in marks if m not in by_id}):
        raise ApiError(f"'prompt': [img-{missing[0]}] names no image_data entry")
    return _encode(vision, IMAGE_DATA_MARKER.sub(vision.placeholder, prompt), [by_id[m] for m in marks])


def _encode(vision: Any, text: str, images: list) -> list[int]:
    try:
        return vision.encode(text, images)
    except MlxcelError as exc:
        raise ApiError(exc.message) from None


def raw_prompt_ids(vision: Any, prompt: str, data: list[str]) -> list[int]:
    """llama-server's `{"prompt_string", "multimodal_data"}`: each `<__media__>` in the string
    takes the next item (base64, or a data: URL); without markers the images go first."""
    if vision is None:
        raise ApiError("'prompt.multimodal_data': this model takes text only (no vision tower)")
    where = "'prompt.multimodal_data'"
    images = []
    for i, item in enumerate(data):
        name = f"{where}[{i}]"
        try:
            raw = vimages.data_url_bytes(item, name) if item.startswith("data:") else vimages.b64_bytes(item, name)
            images.append(vimages.open_image(raw, name))
        except MlxcelError as exc:
            raise ApiError(exc.message) from None
    marks = prompt.count(MEDIA_MARKER)
    if marks and marks != len(images):
        raise ApiError(f"{where}: the prompt has {marks} {MEDIA_MARKER} markers for {len(images)} images")
    slot = vision.placeholder
    return _encode(vision, prompt.replace(MEDIA_MARKER, slot) if marks else slot * len(images) + prompt, images)
