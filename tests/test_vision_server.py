"""Images over HTTP, on a tiny random LLaVA served with prompt lookup: OpenAI `image_url` parts
(with the official client), Anthropic image blocks (in a message and inside a tool_result, with the
official client), the Responses API's `input_image`, llama-server's `multimodal_data`; greedy
replies equal `generate --image`'s, a second request about the same image reuses its prefill, image
and text requests decode side by side, and bad or remote images are a 400 that leaves the server
serving. /props and /v1/models say the model takes images."""

from __future__ import annotations

import base64
import concurrent.futures as cf
import io
import os
import re
import subprocess

import pytest
import tiny_vlms
from conftest import mlxcel_cmd
from test_cli_generate import mlxcel
from test_server import get, post, start_server
from test_vision import COPY, picture

PROMPT = "the quick brown fox jumps over the lazy dog. the quick brown fox jumps over the lazy dog. the"


def b64(img) -> str:
    buf = io.BytesIO()
    img.save(buf, format="PNG")
    return base64.b64encode(buf.getvalue()).decode()


def data_url(img) -> str:
    return "data:image/png;base64," + b64(img)


def generated(folder, image, text: str, n: int, env) -> str:
    """`generate --image` 's greedy text (what an HTTP reply to the same image and text must be)."""
    cli = mlxcel(["generate", "-m", str(folder), "--image", str(image), "-p", text, "-n", str(n), "--temp", "0"], env)
    assert cli.returncode == 0, cli.stderr
    return cli.stdout.rstrip("\n")


def chat_body(img, text=PROMPT, n=24, **kw):
    content = [{"type": "image_url", "image_url": {"url": data_url(img)}}, {"type": "text", "text": text}]
    return {"messages": [{"role": "user", "content": content}], "max_tokens": n, "temperature": 0, **kw}


@pytest.fixture(scope="module")
def media_dir(tmp_path_factory):
    """The server's --media-path folder (file:// image URLs), beside a file outside it."""
    root = tmp_path_factory.mktemp("media")
    (root / "pics").mkdir()
    picture(31).save(root / "pics" / "a.png")
    picture(32).save(root.parent / "outside.png")
    (root / "pics" / "link.png").symlink_to(root.parent / "outside.png")  # a link out of the folder
    return root


@pytest.fixture(scope="module")
def vserver(tmp_path_factory, media_dir):
    folder = tiny_vlms.llava(tmp_path_factory.mktemp("vsrv") / "model")
    env = dict(os.environ, HF_HUB_OFFLINE="1", XDG_CONFIG_HOME=str(tmp_path_factory.mktemp("cfg")))
    slots = tmp_path_factory.mktemp("slots")
    proc, url, lines = start_server(
        env,
        "-m",
        str(folder),
        "--draft-kind",
        "prompt-lookup",
        "-np",
        "2",
        "--slot-save-path",
        str(slots),
        "--media-path",
        str(media_dir),
    )
    yield url, folder, env
    proc.terminate()
    proc.wait(timeout=30)


def test_openai_client_image_url_reply_equals_generate_image(vserver, tmp_path):
    import openai

    url, folder, env = vserver
    img = picture(1)
    client = openai.OpenAI(base_url=url + "/v1", api_key="x")
    r = client.chat.completions.create(
        model="m", **{k: v for k, v in chat_body(img).items() if k != "max_tokens"}, max_tokens=24
    )
    text = r.choices[0].message.content
    assert r.usage.prompt_tokens > 16  # the image's 16 positions are in the prompt
    path = tmp_path / "a.png"
    img.save(path)
    assert generated(folder, path, PROMPT, 24, env) == text


def test_a_second_request_about_the_same_image_reuses_its_prefill(vserver):
    url, _, _ = vserver
    img = picture(2)
    s1, first = post(url + "/v1/chat/completions", chat_body(img, "what is this?"))
    s2, second = post(url + "/v1/chat/completions", chat_body(img, "what colour is it?"))
    assert s1 == s2 == 200
    assert second["usage"]["prompt_tokens_details"]["cached_tokens"] > 16  # past the image's positions
    s3, other = post(url + "/v1/chat/completions", chat_body(picture(3), "what colour is it?"))
    assert s3 == 200 and other["usage"]["prompt_tokens_details"]["cached_tokens"] < 16


def test_speculation_with_an_image_drafts_and_equals_plain(vserver):
    url, _, _ = vserver
    img = picture(4)
    _, spec = post(url + "/v1/chat/completions", chat_body(img, COPY, n=40))
    _, plain = post(url + "/v1/chat/completions", chat_body(img, COPY, n=40, **{"speculative.n_max": 0}))
    assert spec["choices"][0]["message"]["content"] == plain["choices"][0]["message"]["content"]
    assert spec["timings"]["draft_n"] > 0 and plain["timings"].get("draft_n", 0) == 0


def test_image_and_text_requests_side_by_side_equal_alone(vserver):
    url, _, _ = vserver
    bodies = [
        chat_body(picture(5), COPY, n=30),
        {"messages": [{"role": "user", "content": COPY}], "max_tokens": 30, "temperature": 0},
        chat_body(picture(6), PROMPT, n=30),
    ]
    alone = [post(url + "/v1/chat/completions", b)[1]["choices"][0]["message"]["content"] for b in bodies]
    with cf.ThreadPoolExecutor(3) as pool:
        together = list(pool.map(lambda b: post(url + "/v1/chat/completions", b), bodies))
    assert [r[0] for r in together] == [200, 200, 200]
    assert [r[1]["choices"][0]["message"]["content"] for r in together] == alone


def test_anthropic_client_image_blocks_and_an_image_in_a_tool_result(vserver):
    import anthropic

    url, _, _ = vserver
    client = anthropic.Anthropic(base_url=url, api_key="x")
    img = {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": b64(picture(7))}}
    r = client.messages.create(
        model="m", max_tokens=8, messages=[{"role": "user", "content": [img, {"type": "text", "text": "describe"}]}]
    )
    assert r.content[0].type == "text" and r.usage.input_tokens > 16
    tools = [{"name": "shot", "description": "a screenshot", "input_schema": {"type": "object"}}]
    history = [
        {"role": "user", "content": "take a screenshot"},
        {"role": "assistant", "content": [{"type": "tool_use", "id": "t1", "name": "shot", "input": {}}]},
    ]

    def result(content):
        return history + [
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1", "content": content}]}
        ]

    with_image = client.messages.count_tokens(
        model="m", tools=tools, messages=result([img, {"type": "text", "text": "done"}])
    )
    without = client.messages.count_tokens(model="m", tools=tools, messages=result([{"type": "text", "text": "done"}]))
    assert with_image.input_tokens >= without.input_tokens + 16  # the image is in the prompt, not dropped
    r = client.messages.create(
        model="m", max_tokens=8, tools=tools, messages=result([img, {"type": "text", "text": "done"}])
    )
    assert r.stop_reason in ("end_turn", "max_tokens", "tool_use")


def test_responses_input_image_and_llama_server_multimodal_data(vserver):
    url, _, _ = vserver
    img = picture(8)
    item = {
        "role": "user",
        "content": [{"type": "input_image", "image_url": data_url(img)}, {"type": "input_text", "text": PROMPT}],
    }
    s, r = post(url + "/v1/responses", {"input": [item], "max_output_tokens": 12, "temperature": 0})
    assert s == 200 and r["usage"]["input_tokens"] > 16, r
    _, chat = post(url + "/v1/chat/completions", chat_body(img, n=12))
    assert r["output"][0]["content"][0]["text"] == chat["choices"][0]["message"]["content"]
    s, n = post(
        url + "/completion",
        {"prompt": {"prompt_string": "<__media__>describe", "multimodal_data": [b64(img)]}, "n_predict": 4},
    )
    assert s == 200 and n["tokens_evaluated"] > 16 and "<image>" in n["prompt"], n
    s, e = post(
        url + "/completion", {"prompt": {"prompt_string": "<__media__><__media__>x", "multimodal_data": [b64(img)]}}
    )
    assert s == 400 and "2 <__media__> markers for 1 images" in e["error"]["message"]


@pytest.mark.parametrize(
    "content,words",
    [
        ([{"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}}], "not an image"),
        ([{"type": "image_url", "image_url": {"url": "data:image/png;base64,%%%"}}], "malformed"),
        ([{"type": "image_url", "image_url": {"url": "https://example.com/a.png"}}], "--image-url-fetch"),
        (
            [{"type": "image_url", "image_url": {"url": "file:///etc/passwd"}}],
            "no such file in the --media-path folder",
        ),
        ([{"type": "input_audio", "input_audio": {"data": "AAAA"}}], "'input_audio' parts are not supported"),
    ],
    ids=["not-image", "bad-base64", "remote", "file-url", "audio"],
)
def test_bad_images_are_400_and_the_server_keeps_serving(vserver, content, words):
    url, _, _ = vserver
    s, e = post(url + "/v1/chat/completions", {"messages": [{"role": "user", "content": content}], "max_tokens": 4})
    assert s == 400 and words in e["error"]["message"], e
    assert get(url + "/health")["status"] == "ok"
    s, _ = post(url + "/v1/chat/completions", chat_body(picture(0), "hi", n=2))
    assert s == 200


def test_props_and_models_advertise_vision(vserver):
    url, _, _ = vserver
    assert get(url + "/props")["modalities"] == {"vision": True, "audio": False}
    assert "multimodal" in get(url + "/v1/models")["data"][0]["capabilities"]


def test_a_text_model_server_refuses_images_with_a_400(tiny_dir, tmp_path):
    env = dict(os.environ, HF_HUB_OFFLINE="1", XDG_CONFIG_HOME=str(tmp_path))
    proc, url, _ = start_server(env, "-m", str(tiny_dir))
    try:
        s, e = post(url + "/v1/chat/completions", chat_body(picture(0), "hi", n=2))
        assert s == 400 and "this model takes text only" in e["error"]["message"]
        assert get(url + "/props")["modalities"]["vision"] is False
        assert (
            post(url + "/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2})[0]
            == 200
        )
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def test_llama_server_image_data_with_img_markers(vserver):
    url, _, _ = vserver
    img = picture(9)
    body = {
        "prompt": "USER: [img-12] describe\nASSISTANT:",
        "image_data": [{"data": b64(img), "id": 12}],
        "n_predict": 6,
    }
    s, r = post(url + "/completion", {**body, "temperature": 0})
    assert s == 200 and r["tokens_evaluated"] > 16 and "<image>" in r["prompt"], r
    s, e = post(url + "/completion", {**body, "prompt": "[img-3] x"})
    assert s == 400 and "[img-3] names no image_data entry" in e["error"]["message"]
    s, e = post(url + "/completion", {**body, "image_data": [{"data": "@@", "id": 12}]})
    assert s == 400 and "malformed" in e["error"]["message"]


@pytest.mark.parametrize("family", ["gemma3", "idefics3", "qwen2_vl", "qwen2_5_vl", "qwen3_vl"])
def test_other_families_over_http_equal_generate_image(family, tmp_path):
    folder = tiny_vlms.FAMILIES[family](tmp_path / family)
    img = picture(4)
    path = tmp_path / "a.png"
    img.save(path)
    env = dict(os.environ, HF_HUB_OFFLINE="1", XDG_CONFIG_HOME=str(tmp_path / "cfg"))
    proc, url, _ = start_server(env, "-m", str(folder), "--draft-kind", "prompt-lookup")
    try:
        s, r = post(url + "/v1/chat/completions", chat_body(img, COPY, n=30))
        assert s == 200 and r["timings"]["draft_n"] > 0
        assert generated(folder, path, COPY, 30, env) == r["choices"][0]["message"]["content"]
        # the same image and text as an Anthropic image block and a Responses input_image
        block = {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": b64(img)}}
        body = {
            "max_tokens": 30,
            "temperature": 0,
            "messages": [{"role": "user", "content": [block, {"type": "text", "text": COPY}]}],
        }
        s, a = post(url + "/v1/messages", body)
        assert s == 200 and a["content"][0]["text"] == r["choices"][0]["message"]["content"]
        item = {
            "role": "user",
            "content": [{"type": "input_image", "image_url": data_url(img)}, {"type": "input_text", "text": COPY}],
        }
        s, o = post(url + "/v1/responses", {"input": [item], "max_output_tokens": 30, "temperature": 0})
        assert s == 200 and o["output"][0]["content"][0]["text"] == r["choices"][0]["message"]["content"]
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def test_remote_images_are_fetched_only_under_the_flag_within_limits(monkeypatch):
    """--image-url-fetch: a real HTTP server on loopback serves a picture, a body over the byte
    limit, a 404 and redirects; each is an image or a one-line 400. Loopback is reached only as
    an --image-url-allow host (public addresses only otherwise, as the MCP proxy: a request must
    not make the server reach what its client cannot), and a redirect is followed only where the
    same policy lets it go."""
    import http.server
    import threading

    from mlxcel_py.server import image_parts
    from mlxcel_py.server.http import ApiError

    png = base64.b64decode(b64(picture(1)))
    port = []

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802 (http.server's name)
            moved = {"/r-ok": "/a.png", "/r-out": f"http://localhost:{port[0]}/a.png", "/loop": "/loop"}
            if self.path in moved:
                self.send_response(302)
                self.send_header("Location", moved[self.path])
                self.send_header("Content-Length", "0")
                self.end_headers()
                return
            body = {"/a.png": png, "/big.png": b"\0" * 4096}.get(self.path)
            if body is None:
                self.send_error(404)
                return
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *a):
            pass

    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    port.append(srv.server_address[1])
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    base = f"http://127.0.0.1:{port[0]}"
    fetching = image_parts.ImageSources(fetch=True, allow=("127.0.0.1",))
    try:
        part = {"type": "image", "url": base + "/a.png", "where": "an image_url part"}
        assert image_parts.decode(part, fetching).size == (50, 40)
        assert image_parts.decode({**part, "url": base + "/r-ok"}, fetching).size == (50, 40)
        with pytest.raises(ApiError, match="--image-url-fetch"):
            image_parts.decode(part, image_parts.ImageSources())
        for url, message in (
            (base + "/a.png", "does not reach 127.0.0.1: not a public address (--image-url-allow)"),
            ("http://169.254.169.254/latest/meta-data/", "does not reach 169.254.169.254"),
            ("http://metadata.google.internal/", "not a public name"),
            ("http://[::ffff:127.0.0.1]/a.png", "not a public address"),
            ("http://user:pw@example.com/a.png", "must not carry credentials"),
            ("ftp://example.com/a.png", "an image URL must be a data: URL"),
        ):
            with pytest.raises(ApiError, match=re.escape(message)):
                image_parts.decode({**part, "url": url}, image_parts.ImageSources(fetch=True))
        with pytest.raises(ApiError, match="does not reach localhost"):  # redirected out of the allowed host
            image_parts.decode({**part, "url": base + "/r-out"}, fetching)
        with pytest.raises(ApiError, match="redirects more than 3 times"):
            image_parts.decode({**part, "url": base + "/loop"}, fetching)
        monkeypatch.setattr(image_parts.vimages, "MAX_BYTES", 1024)
        with pytest.raises(ApiError, match="more than the limit"):
            image_parts.decode({**part, "url": base + "/big.png"}, fetching)
        with pytest.raises(ApiError, match="cannot fetch the image"):
            image_parts.decode({**part, "url": base + "/missing.png"}, fetching)
    finally:
        srv.shutdown()


def _file_chat(url: str, image_url: str) -> tuple[int, dict]:
    content = [{"type": "image_url", "image_url": {"url": image_url}}, {"type": "text", "text": PROMPT}]
    return post(
        url + "/v1/chat/completions",
        {"messages": [{"role": "user", "content": content}], "max_tokens": 12, "temperature": 0},
    )


def test_file_urls_read_inside_the_media_path_only(vserver, media_dir):
    """llama-server's --media-path: file:// URLs are paths relative to the folder (extra slashes
    are one); `..`, a link out of it, a missing file or an absolute path outside are a 400."""
    url, _, _ = vserver
    s, want = post(url + "/v1/chat/completions", chat_body(picture(31), n=12))
    assert s == 200
    for good in ("file://pics/a.png", "file:////pics//a.png"):
        s, body = _file_chat(url, good)
        assert s == 200, body
        assert body["choices"][0]["message"]["content"] == want["choices"][0]["message"]["content"]
    for bad, why in (
        ("file://../outside.png", "not a file inside the --media-path folder"),
        ("file://pics/link.png", "not a file inside the --media-path folder"),
        ("file://pics/none.png", "no such file in the --media-path folder"),
        (f"file://{media_dir.parent}/outside.png", "no such file in the --media-path folder"),  # never absolute
        ("file://", "not a file inside the --media-path folder"),
        ("file://pics/a\u0000.png", "cannot read"),  # a NUL byte
        ("file://pics/" + "x" * 5000 + ".png", "cannot read"),  # a name longer than the system takes
    ):
        s, body = _file_chat(url, bad)
        assert s == 400 and why in body["error"]["message"], (bad, body)
    assert _file_chat(url, "file://pics/a.png")[0] == 200  # still serving


def test_file_urls_are_refused_without_a_media_path(tmp_path, cli_env):
    from mlxcel_py.server import image_parts
    from mlxcel_py.server.http import ApiError

    picture(33).save(tmp_path / "p.png")
    with pytest.raises(ApiError, match=r"reads no local files \(start it with --media-path DIR\)"):
        image_parts.decode({"type": "image", "url": "file://p.png", "where": "x"}, image_parts.ImageSources())
    img = image_parts.decode({"type": "image", "url": "file://p.png"}, image_parts.ImageSources(media_path=tmp_path))
    assert img.size == picture(33).size
    r = subprocess.run(
        [*mlxcel_cmd(), "serve", "--media-path", str(tmp_path / "none")], capture_output=True, text=True, env=cli_env
    )
    assert r.returncode == 2 and "--media-path" in r.stderr and "no such folder" in r.stderr
    assert "Traceback" not in r.stderr


def test_a_cached_image_prompt_is_not_written_to_a_slot_file(vserver):
    """An image's ids name rows this process holds: another process could give the same ids to
    another image, so a slot file would restore the wrong image's cache. Refused in one line."""
    url, _, _ = vserver
    post(url + "/slots/0?action=erase", {})
    s, _ = post(url + "/v1/chat/completions", chat_body(picture(11), "hi", n=2))
    assert s == 200
    s, e = post(url + "/slots/0?action=save", {"filename": "img.bin"})
    assert s == 400 and "holds an image; slot files keep text prompts only" in e["error"]["message"]
    s, _ = post(url + "/v1/chat/completions", {"messages": [{"role": "user", "content": "hello"}], "max_tokens": 2})
    assert s == 200
