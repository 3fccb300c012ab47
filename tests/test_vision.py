"""Vision-language models (mlx-vlm families) through the engine: the prompt's image rows are the
family's own, plain decoding equals a reference loop over mlx-vlm's own caches, every text drafter
equals plain with an image in the prompt, a second request about the same image reuses its
prefill, and bad images are refused with one line naming the input."""

from __future__ import annotations

import io
import json
import struct
import zlib

import mlx.core as mx
import numpy as np
import pytest
import tiny_vlms
from conftest import make_tiny_model, mlxcel_cmd
from PIL import Image
from test_cli_generate import mlxcel
from test_engine import engine_for, lookup, run

from mlxcel_py.engine.cache import SequenceCache, text_prefix
from mlxcel_py.models import loading
from mlxcel_py.options import DraftConfig, LookupConfig, SamplingOptions
from mlxcel_py.vision import images as vimages

GREEDY = SamplingOptions(temp=0.0)
COPY = "copy this: the quick brown fox jumps over the lazy dog. the quick brown fox jumps over the lazy dog. the"


def picture(seed: int = 0, size=(40, 50)) -> Image.Image:
    return Image.fromarray((np.random.RandomState(seed).rand(*size, 3) * 255).astype("uint8"))


@pytest.fixture(scope="module", params=list(tiny_vlms.FAMILIES))
def vlm(request, tmp_path_factory):
    folder = tiny_vlms.FAMILIES[request.param](tmp_path_factory.mktemp(request.param) / "model")
    return loading.load(loading.resolve(str(folder)))


def ids_for(lm, text: str, imgs) -> list[int]:
    return lm.vision.prompt_ids(lm.tokenizer, text, imgs)


def reference(lm, text: str, imgs, n: int, logits: list | None = None) -> list[int]:
    """Greedy tokens from mlx-vlm's own pieces: its processor output, its merge
    (get_input_embeddings), its language model and its own cache classes (`logits` gets the
    prompt's last row)."""
    from mlx_vlm import load
    from mlx_vlm.models.cache import KVCache

    vlm, proc = load(str(lm.resolved.path))  # its own copy: ours runs the text decoder on mlx-lm's model
    prompt = lm.vision.render(
        lm.tokenizer, [{"role": "user", "content": [{"type": "image"}] * len(imgs) + [{"type": "text", "text": text}]}]
    )
    inp = proc(text=[prompt], images=imgs, return_tensors="np")
    extra = {k: mx.array(v) for k, v in inp.items() if k not in ("input_ids", "pixel_values", "attention_mask")}
    x = mx.array(inp["input_ids"])
    e = vlm.get_input_embeddings(x, mx.array(inp["pixel_values"]), mask=mx.array(inp["attention_mask"]), **extra)
    lm_ = vlm.language_model
    cache = lm_.make_cache() if hasattr(lm_, "make_cache") else [KVCache() for _ in lm_.layers]
    beside = {k: v for k, v in e.to_dict().items() if k != "inputs_embeds" and v is not None}  # as its generate does
    out, toks = lm_(x, inputs_embeds=e.inputs_embeds, cache=cache, **beside), []
    if logits is not None:
        logits.append(out.logits[0, -1])
    for _ in range(n):
        toks.append(int(mx.argmax(out.logits[0, -1])))
        out = lm_(mx.array([[toks[-1]]]), cache=cache)
    return toks


def test_plain_decoding_equals_mlx_vlms_own_loop(vlm):
    """Token for token, and the prompt's last logits to float32 rounding (tokens alone miss a
    wrong RoPE base on these tiny random models: a config that omits rope_theta means mlx-vlm's
    default for the family, which mlx-lm's differs from)."""
    text = "describe the picture in detail please, " * 4
    ids = ids_for(vlm, text, [picture()])
    assert sum(t < 0 for t in ids) > 0  # the image's positions
    toks, _ = run(engine_for(vlm), ids, max_tokens=24, sampling=GREEDY, ignore_eos=True)
    theirs: list = []
    assert toks == reference(vlm, text, [picture()], 24, theirs)
    ours = SequenceCache(vlm.model).feed(ids)[-1]
    assert mx.allclose(ours, theirs[0], atol=1e-3, rtol=1e-3), float(mx.abs(ours - theirs[0]).max())


def test_the_image_changes_the_logits(vlm):
    def last(img):
        return SequenceCache(vlm.model).feed(ids_for(vlm, "describe it", [img]))[-1]

    assert mx.allclose(last(picture(0)), last(picture(0)))
    assert not mx.allclose(last(picture(0)), last(picture(5)))


@pytest.mark.parametrize(
    "draft",
    [
        lookup(),
        DraftConfig(kind="suffix", block_size=4, lookup=LookupConfig(max_draft=4, policy="cost")),
        "full-model",
    ],
    ids=["prompt-lookup", "suffix", "full-model"],
)
def test_text_drafters_equal_plain_with_an_image(vlm, draft, tmp_path_factory):
    assets = None
    if draft == "full-model":  # a text llama with the same ids drafts beside the image prompt
        d = make_tiny_model(tmp_path_factory.mktemp("vd") / "m", seed=3, hidden=32, layers=1, vocab=264, scale=3.0)
        assets = loading.load(loading.resolve(str(d))).model
        draft = DraftConfig(kind="full-model", draft_model=str(d), block_size=3)
    for seed in (0, 1):
        ids = ids_for(vlm, COPY, [picture(seed)])
        plain, _ = run(engine_for(vlm), ids, max_tokens=40, sampling=GREEDY, ignore_eos=True)
        spec, g = run(engine_for(vlm, draft, draft_model=assets), ids, max_tokens=40, sampling=GREEDY, ignore_eos=True)
        assert spec == plain
        assert g.stats.drafted_rounds > 0
        assert min(spec) >= 0


def test_sampled_speculation_never_emits_an_image_id(vlm):
    """The image sits right after the repeated text, so lookup proposals run into it; a p/q
    verify must never take an image id (it would index the logits from the end)."""
    text = "ab ab ab ab ab ab"
    turn = [{"type": "text", "text": text}, {"type": "image"}, {"type": "text", "text": text}]
    prompt = vlm.vision.render(vlm.tokenizer, [{"role": "user", "content": turn}])
    ids = vlm.vision.encode(prompt, [picture()])
    s = SamplingOptions(temp=1.5, seed=3, top_k=0, top_p=1.0)
    toks, g = run(engine_for(vlm, lookup()), ids, max_tokens=40, sampling=s, ignore_eos=True)
    assert min(toks) >= 0 and g.stats.proposed > 0


def test_text_prefix_cuts_a_draft_at_the_first_image_id():
    assert text_prefix([5, 6, 7]) == 3
    assert text_prefix([5, -3, 7]) == 1
    assert text_prefix([-1]) == 0


def test_a_second_question_about_the_same_image_reuses_its_prefill(vlm):
    eng = engine_for(vlm)
    eng.keep_prompts(None)
    first = ids_for(vlm, "what is in the picture", [picture(0)])
    run(eng, first, max_tokens=8, sampling=GREEDY, ignore_eos=True)
    again = ids_for(vlm, "what colour is it", [picture(0)])
    last_image = max(i for i, t in enumerate(again) if t < 0)
    toks, g = run(eng, again, max_tokens=8, sampling=GREEDY, ignore_eos=True)
    assert g.stats.cached_tokens > last_image  # the image's positions were not prefilled again
    assert toks == run(engine_for(vlm), again, max_tokens=8, sampling=GREEDY, ignore_eos=True)[0]
    other = ids_for(vlm, "what colour is it", [picture(7)])
    first_image = min(i for i, t in enumerate(other) if t < 0)
    _, g = run(eng, other, max_tokens=8, sampling=GREEDY, ignore_eos=True)
    assert g.stats.cached_tokens <= first_image  # another image: nothing past its start is reused


# ---- bad images -------------------------------------------------------------------------------------


def png_bytes(img: Image.Image) -> bytes:
    buf = io.BytesIO()
    img.save(buf, format="PNG")
    return buf.getvalue()


def huge_header_png(width: int, height: int) -> bytes:
    """A PNG whose header states width x height, with a tiny (wrong) body: never decoded."""
    ihdr = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    chunk = lambda kind, data: struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))  # noqa: E731
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"IDAT", zlib.compress(b"\0" * 10)) + chunk(b"IEND", b"")


SVG_BOMB = (
    b'<?xml version="1.0"?><!DOCTYPE svg [<!ENTITY a "aaaaaaaaaa"><!ENTITY b "&a;&a;&a;&a;&a;&a;&a;&a;">]>'
    b'<svg xmlns="http://www.w3.org/2000/svg" width="100000" height="100000"><text>&b;</text></svg>'
)


@pytest.mark.parametrize(
    "data,words",
    [
        (lambda: png_bytes(picture())[:200], "truncated or damaged"),
        (lambda: huge_header_png(20000, 20000), "more pixels than the limit"),
        (lambda: huge_header_png(20000, 10), "20000x10 pixels"),
        (lambda: b"hello, not an image at all", "not an image"),
        (lambda: SVG_BOMB, "SVG"),
        (lambda: b"", "empty"),
    ],
    ids=["truncated", "20000px-bomb", "20000px-wide", "text", "svg-bomb", "empty"],
)
def test_bad_images_are_refused_naming_the_input(data, words):
    with pytest.raises(vimages.ImageError) as e:
        vimages.open_image(data(), "--image x.png")
    assert str(e.value).startswith("--image x.png: ") and words in str(e.value)
    assert e.value.exit_code == 2


def test_data_urls():
    raw = png_bytes(picture())
    import base64

    url = "data:image/png;base64," + base64.b64encode(raw).decode()
    assert vimages.data_url_bytes(url, "image_url") == raw
    for bad, words in [
        ("data:text/plain;base64,aGk=", "not an image"),
        ("data:image/png;base64,@@@", "malformed"),
        ("https://example.com/a.png", "not a data: URL"),
    ]:
        with pytest.raises(vimages.ImageError, match=words):
            vimages.data_url_bytes(bad, "image_url")


# ---- the command line ---------------------------------------------------------------------------


@pytest.fixture(scope="module")
def llava_dir(tmp_path_factory):
    return tiny_vlms.llava(tmp_path_factory.mktemp("cli_llava") / "model")


def test_generate_with_an_image_and_prompt_lookup_equals_plain(llava_dir, tmp_path, cli_env):
    img = tmp_path / "a.png"
    picture().save(img)
    cmd = ["generate", "-m", str(llava_dir), "--image", str(img), "-p", COPY, "-n", "40"]
    r = mlxcel(cmd + ["--prompt-lookup", "--verify-exact"], cli_env)
    assert r.returncode == 0, r.stderr
    assert "speculative output equals plain output" in r.stderr
    plain = mlxcel(cmd, cli_env)
    assert plain.returncode == 0 and plain.stdout == r.stdout


@pytest.mark.parametrize(
    "setup,words",
    [
        ("missing", "--image nope.png: no such file"),
        ("text-model", "is a text model"),
        ("truncated", "truncated or damaged"),
    ],
)
def test_generate_refuses_bad_image_input_with_exit_2(setup, words, llava_dir, tiny_dir, tmp_path, cli_env):
    model, image = str(llava_dir), "nope.png"
    if setup == "text-model":
        model, image = str(tiny_dir), str(tmp_path / "a.png")
        picture().save(image)
    elif setup == "truncated":
        image = str(tmp_path / "t.png")
        (tmp_path / "t.png").write_bytes(png_bytes(picture())[:150])
    r = mlxcel(["generate", "-m", model, "--image", image, "-p", "hi", "-n", "4"], cli_env, cwd=tmp_path)
    assert r.returncode == 2, r.stderr
    assert words in r.stderr and "Traceback" not in r.stderr
    assert len(r.stderr.strip().splitlines()) <= 2


def test_learned_drafters_are_refused_beside_a_vision_model(llava_dir, tmp_path, cli_env):
    cfg = json.loads((llava_dir / "config.json").read_text())
    assert "vision_config" in cfg
    r = mlxcel(
        ["generate", "-m", str(llava_dir), "-p", "hi", "--draft-kind", "mtp", "--draft-model", str(llava_dir)], cli_env
    )
    assert r.returncode == 1 and "--draft-kind mtp reads the target's hidden states" in r.stderr


def test_an_image_keeps_its_ids_when_a_later_turn_adds_another(vlm):
    """Chat: turn 2 holds turn 1's image and a new one; the first image's positions carry the
    same ids (so its prefill is reused), and spec == plain over both images."""
    a, b = picture(0), picture(9, size=(30, 60))
    one = vlm.vision.encode(vlm.vision.render(vlm.tokenizer, [user([a], "first")]), [a])
    conv = [user([a], "first"), {"role": "assistant", "content": "ok"}, user([b], COPY)]
    two = vlm.vision.encode(vlm.vision.render(vlm.tokenizer, conv), [a, b])
    first_ids = [t for t in one if t < 0]
    assert [t for t in two if t < 0][: len(first_ids)] == first_ids
    assert len(set(t for t in two if t < 0)) > len(first_ids)  # the new image has ids of its own
    plain, _ = run(engine_for(vlm), two, max_tokens=30, sampling=GREEDY, ignore_eos=True)
    spec, _ = run(engine_for(vlm, lookup()), two, max_tokens=30, sampling=GREEDY, ignore_eos=True)
    assert spec == plain


def user(imgs, text):
    return {"role": "user", "content": [{"type": "image"} for _ in imgs] + [{"type": "text", "text": text}]}


def test_chat_attaches_images_and_keeps_the_conversation_on_a_bad_one(llava_dir, tmp_path, cli_env):
    img = tmp_path / "a.png"
    picture().save(img)
    (tmp_path / "bad.png").write_bytes(b"not a picture")
    lines = f"/image {img}\ndescribe it\n/image {tmp_path / 'bad.png'}\n/image\nand again\n"
    r = mlxcel(["chat", "-m", str(llava_dir), "-n", "6", "--temp", "0", "--profile"], cli_env, input=lines)
    assert r.returncode == 0, r.stderr
    assert f"Attached {img} to your next message." in r.stderr
    assert "bad.png: not an image" in r.stderr and "/image needs a file" in r.stderr
    turns = [line for line in r.stderr.splitlines() if "prompt tokens reused" in line]
    assert len(turns) == 2  # both messages were answered
    reused = int(turns[1].split(" prompt tokens reused")[0].rsplit(", ", 1)[1])
    assert reused > 16  # the second turn re-sends the first turn's image: its 16 positions are reused
    assert "Traceback" not in r.stderr


def test_chat_image_on_a_text_model_is_one_line(tiny_dir, tmp_path, cli_env):
    img = tmp_path / "a.png"
    picture().save(img)
    r = mlxcel(["chat", "-m", str(tiny_dir), "-n", "4"], cli_env, input=f"/image {img}\nhello\n")
    assert r.returncode == 0 and "/image: " in r.stderr and "is a text model" in r.stderr
    assert r.stdout.strip()  # the text turn was still answered


def test_seeded_sampling_and_penalties_with_an_image_equal_plain(vlm):
    """Sampler-match with position-keyed draws repeats the plain run with an image in the prompt;
    a repetition penalty whose window covers the image's ids penalizes text tokens only, alike."""
    ids = ids_for(vlm, COPY, [picture(2)])
    for s in (
        SamplingOptions(temp=0.8, top_p=0.95, seed=11),
        SamplingOptions(temp=0.0, repetition_penalty=1.3, repeat_last_n=256),
    ):
        plain, _ = run(engine_for(vlm), ids, max_tokens=30, sampling=s, ignore_eos=True)
        spec, g = run(
            engine_for(vlm, lookup("graded", adaptive=False)), ids, max_tokens=30, sampling=s, ignore_eos=True
        )
        assert spec == plain and min(spec) >= 0


def test_full_model_drafter_samples_with_p_q_beside_an_image(vlm, tmp_path_factory):
    """Sampling with a text draft model: the lossless p/q rule runs over the image prompt (the
    drafter sees token 0 at the image's positions) and no image id is ever emitted."""
    d = make_tiny_model(tmp_path_factory.mktemp("vq") / "m", seed=4, hidden=32, layers=1, vocab=264, scale=3.0)
    assets = loading.load(loading.resolve(str(d))).model
    draft = DraftConfig(kind="full-model", draft_model=str(d), block_size=3, acceptance="p-q")
    ids = ids_for(vlm, COPY, [picture(1)])
    s = SamplingOptions(temp=1.0, seed=5, top_k=0, top_p=1.0)
    toks, g = run(engine_for(vlm, draft, draft_model=assets), ids, max_tokens=40, sampling=s, ignore_eos=True)
    assert g.stats.acceptance_rule == "lossless-p/q" and g.stats.proposed > 0 and min(toks) >= 0


def test_no_mmproj_loads_a_vision_model_as_its_text_model(tmp_path, cli_env):
    """--no-mmproj (llama-server's): a Gemma 3 vision folder decodes text through mlx-lm's own
    loader, the vision tower left out (mlx-lm ties the head, which this random fixture has apart,
    so the two texts differ here; a real Gemma 3 ties it)."""
    folder = tiny_vlms.gemma3(tmp_path / "g3")
    base = ["generate", "-m", str(folder), "-p", "hello there", "-n", "8", "--temp", "0", "--verbose"]
    full = mlxcel(base, cli_env)
    text = mlxcel(base + ["--no-mmproj"], cli_env)
    assert full.returncode == 0 and text.returncode == 0, (full.stderr, text.stderr)
    assert "(vision model)" in full.stderr and "(vision model)" not in text.stderr
    assert text.stdout.strip()  # mlx-lm's gemma3 reads the folder's text weights and decodes


def test_families_whose_image_positions_live_in_the_model_are_refused_by_name():
    """A family with mRoPE runs when its language model takes positions per call (Qwen2-VL, a
    fixture here); one that keeps them as its own state only is refused with one line."""
    from types import SimpleNamespace

    from mlxcel_py.vision.loading import unsupported

    class Stateful:  # positions only from state kept between calls: nothing to pass them in
        def get_rope_index(self):
            pass

        def __call__(self, inputs, cache=None):
            pass

    fake = SimpleNamespace(language_model=Stateful(), config=SimpleNamespace(vision_config=SimpleNamespace()))
    assert "mRoPE" in unsupported(fake)
    assert "keeps image positions" in unsupported(SimpleNamespace(language_model=SimpleNamespace(_rope_deltas=None)))


@pytest.mark.parametrize("family", ["idefics3", "gemma3"])
def test_a_text_gguf_with_its_mmproj_equals_the_folder(family, tmp_path, cli_env):
    """llama.cpp's pair of files (`-m text.gguf --mmproj mmproj.gguf`) runs the same model as
    the folder they were written from: the same greedy text with an image, with prompt lookup
    equal to plain (--verify-exact); a projector of another type is refused by name."""
    if family == "idefics3":
        folder = tiny_vlms.idefics3(tmp_path / "folder")
        text, proj = tiny_vlms.idefics3_ggufs(folder, tmp_path / "gguf")
    else:
        folder, text, proj = tiny_vlms.gemma3_ggufs(tmp_path / "gguf")
    img = tmp_path / "a.png"
    picture(2).save(img)
    env = {**cli_env, "MLXCEL_CACHE_DIR": str(tmp_path / "cache")}
    ask = ["--image", str(img), "-p", COPY, "-n", "30", "--temp", "0"]
    ref = mlxcel(["generate", "-m", str(folder), *ask], env)
    r = mlxcel(
        ["generate", "-m", str(text), "--mmproj", str(proj), *ask, "--prompt-lookup", "--verify-exact", "--verbose"],
        env,
    )
    assert ref.returncode == 0 and r.returncode == 0, (ref.stderr, r.stderr)
    assert r.stdout == ref.stdout and "speculative output equals plain output" in r.stderr
    assert "vision projector" in r.stderr and "(vision model)" in r.stderr
    r = mlxcel(["generate", "-m", str(folder), "--mmproj", str(proj), "-p", "x"], env)
    assert r.returncode == 2 and "--mmproj pairs with a .gguf model" in r.stderr
    r = mlxcel(["generate", "-m", str(text), "--mmproj", str(proj), "--draft-kind", "mtp", "-p", "x"], env)
    assert r.returncode == 1 and "reads the target's hidden states, which a vision model (a GGUF projector)" in r.stderr
    import gguf

    other = gguf.GGUFWriter(str(tmp_path / "qwen-mmproj.gguf"), "clip")
    other.add_clip_projector_type("qwen2vl_merger")
    other.add_clip_has_vision_encoder(True)
    tiny_vlms._close(other)
    r = mlxcel(["generate", "-m", str(text), "--mmproj", str(tmp_path / "qwen-mmproj.gguf"), "-p", "x"], env)
    assert (
        r.returncode == 1
        and "projector type 'qwen2vl_merger' is not converted yet" in r.stderr
        and "Traceback" not in r.stderr
    )


def test_chat_image_under_a_real_terminal(llava_dir, tmp_path, cli_env):
    """/image under a pseudo-terminal: attached, a bad file refused in one line, the turn
    answered with the image, /bye ends it."""
    from test_chat_pty import Pty

    img = tmp_path / "a.png"
    picture().save(img)
    env = {**cli_env, "TERM": "dumb", "COLUMNS": "120"}
    t = Pty(mlxcel_cmd() + ["chat", "-m", str(llava_dir), "-n", "6", "--temp", "0", "--profile"], env)
    t.read_until(">>> ", timeout=180)
    t.send(f"/image {img}\r")
    assert "Attached" in t.read_until(">>> ")
    t.send(f"/image {tmp_path / 'missing.png'}\r")
    assert "no such file" in t.read_until(">>> ")
    t.send("describe it\r")
    assert "prompt tokens reused" in t.read_until(">>> ")
    t.send("/bye\r")
    assert t.wait() == 0


def test_a_processor_or_vision_tower_failure_is_one_line(vlm, monkeypatch):
    """Whatever the family's processor or merge raises on an input becomes one error line
    (exit 2 for the processor's refusal, 1 for the tower's), never a traceback."""
    from mlxcel_py.errors import ModelError
    from mlxcel_py.vision.prompts import Vision

    v = vlm.vision
    broken = Vision(
        v.target,
        lambda **kw: (_ for _ in ()).throw(RuntimeError("bad pixels")),
        v.image_token_id,
        v.image_token,
        v.family,
        v.tokenizer,
    )
    with pytest.raises(vimages.ImageError, match="refused the prompt's images: bad pixels"):
        broken.encode("x", [picture()])
    merge = v.target.vlm.get_input_embeddings

    def failing(ids, pixels=None, **kw):  # the merge fails on images (text rows still embed)
        if pixels is not None:
            raise KeyError("grid")
        return merge(ids, pixels, **kw)

    monkeypatch.setattr(v.target.vlm, "get_input_embeddings", failing)
    ids = ids_for(vlm, "a fresh image", [picture(123)])
    with pytest.raises(ModelError, match="vision tower failed"):
        SequenceCache(vlm.model).feed(ids)
