"""Images a user sends, read and checked before any pixel reaches a model.

One reader for every door (`--image FILE`, chat's `/image FILE`, a data: URL or base64 block over
HTTP): the bytes are bounded, the header is read before the pixels (a 20,000 px image or a
decompression bomb is refused from its stated size, never decoded), SVG and other vector or
non-image files are named as such, and a truncated file fails here, not in the vision tower. Each
refusal is one ImageError line naming the input: exit 2 on the command line, 400 over HTTP.
"""

from __future__ import annotations

import base64
import binascii
import io
import re
from pathlib import Path

from ..errors import UsageError

MAX_BYTES = 32 * 2**20  # an image file or decoded data: URL
MAX_SIDE = 8192  # pixels on either side (vision processors resize far below this anyway)
MAX_PIXELS = 40_000_000  # width x height
_DATA_URL = re.compile(r"^data:(?P<mime>[\w.+/-]*)(?P<params>(;[^;,]*)*?)(?P<b64>;base64)?,", re.IGNORECASE)


class ImageError(UsageError):
    """An image that cannot be used (exit 2; a server answers 400)."""


def open_image(data: bytes, name: str):
    """An RGB PIL image from `data`; `name` is how an error names the input."""
    from PIL import Image, UnidentifiedImageError

    if not data:
        raise ImageError(f"{name}: the image is empty (0 bytes)")
    if len(data) > MAX_BYTES:
        raise ImageError(f"{name}: the image has {len(data)} bytes, more than the limit ({MAX_BYTES}); make it smaller")
    head = data[:1024].lstrip().lower()
    if head.startswith((b"<?xml", b"<svg", b"<!doctype svg")) or b"<svg" in head:
        raise ImageError(f"{name}: SVG (vector) images are not supported; convert it to PNG or JPEG")
    try:
        image = Image.open(io.BytesIO(data))
    except (UnidentifiedImageError, OSError, ValueError, SyntaxError):
        raise ImageError(f"{name}: not an image this build can read (PNG, JPEG, WebP, GIF, BMP, TIFF...)") from None
    except Image.DecompressionBombError:
        raise ImageError(
            f"{name}: the image states more pixels than the limit ({MAX_PIXELS}); make it smaller"
        ) from None
    width, height = image.size
    if width < 1 or height < 1 or max(width, height) > MAX_SIDE or width * height > MAX_PIXELS:
        raise ImageError(
            f"{name}: the image is {width}x{height} pixels; the limit is {MAX_SIDE} a side and {MAX_PIXELS} in all"
        )
    try:
        image.load()  # decodes now: a truncated or damaged file fails here
    except (OSError, ValueError, SyntaxError, Image.DecompressionBombError) as exc:
        raise ImageError(f"{name}: the image is truncated or damaged ({str(exc).splitlines()[0][:80]})") from None
    return image.convert("RGB")  # first frame of an animation; alpha dropped as processors expect


def read_image_file(path: str, flag: str = "--image"):
    name = f"{flag} {path}"
    p = Path(path).expanduser()
    if not p.exists():
        raise ImageError(f"{name}: no such file")
    if not p.is_file():
        raise ImageError(f"{name}: not a file")
    try:
        with p.open("rb") as fh:
            data = fh.read(MAX_BYTES + 1)
    except OSError as exc:
        raise ImageError(f"{name}: cannot read it ({exc.strerror or exc})") from None
    return open_image(data, name)


def data_url_bytes(url: str, name: str) -> bytes:
    """The bytes of a `data:` URL (base64 or percent-encoded)."""
    m = _DATA_URL.match(url)
    if m is None:
        raise ImageError(f"{name}: not a data: URL (data:image/png;base64,...)")
    if m.group("mime") and not m.group("mime").lower().startswith("image/"):
        raise ImageError(f"{name}: the data: URL holds {m.group('mime')}, not an image")
    payload = url[m.end() :]
    if m.group("b64"):
        return b64_bytes(payload, name)
    from urllib.parse import unquote_to_bytes

    return unquote_to_bytes(payload)


def b64_bytes(payload: str, name: str) -> bytes:
    if len(payload) > MAX_BYTES * 4 // 3 + 8:
        raise ImageError(f"{name}: the image has more than {MAX_BYTES} bytes (the limit); make it smaller")
    try:
        return base64.b64decode("".join(payload.split()), validate=True)
    except (binascii.Error, ValueError):
        raise ImageError(f"{name}: the base64 data is malformed") from None
