"""Speculation with an image in the prompt, measured on a vision model with a real text model.

No vision-language model's weights are on this machine, so this builds one: mlx-vlm's Idefics3
layout (SmolVLM's: a SigLIP tower, pixel shuffle, a llama text model) around the default model's
own text weights (SmolLM2-135M-Instruct, dequantized), with a random vision tower of SmolVLM's
shape (512 px images, 16 px patches, 64 positions an image). The image's rows carry no meaning,
but the text model is real, so a reply that copies the prompt (edit a caption, transcribe) lets
prompt lookup draft as it does on text. Measured, interleaved, greedy (outputs compared):

  - plain against `--prompt-lookup` decoding on "edit this caption" and "describe" prompts, each
    with the image first;
  - a second question about the same image with the prompt cache on: the prefill it skips.

    .venv/bin/python scripts/vision_bench.py [--repeats 3] [--tokens 128]
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import tempfile
import time
from pathlib import Path

from mlxcel_py.cpu import blas

blas.prepare()

import mlx.core as mx  # noqa: E402
from mlx.utils import tree_flatten  # noqa: E402
from PIL import Image  # noqa: E402

CAPTION = (
    "A brown dog runs across a wide green field toward a red ball, while two children watch from a "
    "wooden bench under an old oak tree; behind them a small white house with blue shutters stands "
    "beside a narrow gravel road that winds up a gentle hill into the late afternoon sun."
)
PROMPTS = {
    "edit-caption": f"Here is the image's caption:\n\n{CAPTION}\n\nRewrite the caption exactly as it is, "
    "but replace 'dog' with 'cat' and 'red' with 'yellow'.",
    "transcribe": f"The image shows this text:\n\n{CAPTION}\n\nTranscribe the text exactly.",
    "describe": "Describe this image in detail.",
}
SPECIAL = ["<image>", "<fake_token_around_image>", "<global-img>", "<end_of_utterance>"]
TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{% if m['content'] is string %}{{ m['content'] }}"
    "{% else %}{% for p in m['content'] %}{% if p['type'] == 'image' %}<image>{% else %}{{ p['text'] }}{% endif %}"
    "{% endfor %}{% endif %}<|im_end|>\n{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def build(folder: Path) -> Path:
    """An Idefics3 folder: SmolLM2-135M's text weights, a random SigLIP tower of SmolVLM's shape."""
    from mlx_lm import load as lm_load
    from mlx_lm.utils import dequantize_model
    from mlx_vlm.models import idefics3
    from tokenizers import Tokenizer

    from mlxcel_py.models import loading

    src = loading.resolve(None).path
    text_cfg = json.loads((src / "config.json").read_text())
    lm, _ = lm_load(str(src))
    lm = dequantize_model(lm)
    tok = Tokenizer.from_file(str(src / "tokenizer.json"))
    tok.add_special_tokens(SPECIAL)
    folder.mkdir(parents=True, exist_ok=True)
    tok.save(str(folder / "tokenizer.json"))
    vocab = 49280  # SmolVLM's: the text model's 49152 and room for the image tokens
    text = {k: text_cfg[k] for k in ("hidden_size", "intermediate_size", "num_attention_heads", "num_hidden_layers")}
    text.update(
        model_type="llama",
        num_key_value_heads=text_cfg["num_key_value_heads"],
        rms_norm_eps=text_cfg["rms_norm_eps"],
        rope_theta=text_cfg["rope_theta"],
        vocab_size=vocab,
        tie_word_embeddings=True,
        max_position_embeddings=8192,
    )
    image_id = tok.token_to_id("<image>")
    cfg = dict(
        model_type="idefics3",
        image_token_id=image_id,
        scale_factor=4,
        vocab_size=vocab,
        eos_token_id=text_cfg["eos_token_id"],
        text_config=text,
        vision_config=dict(
            model_type="idefics3_vision",
            hidden_size=192,
            num_hidden_layers=4,
            intermediate_size=768,
            num_attention_heads=3,
            patch_size=16,
            image_size=512,
        ),
    )
    conf = idefics3.ModelConfig.from_dict(cfg)
    conf.text_config = idefics3.TextConfig.from_dict(cfg["text_config"])
    conf.vision_config = idefics3.VisionConfig.from_dict(cfg["vision_config"])
    mx.random.seed(0)
    vlm = idefics3.Model(conf)
    weights = dict(tree_flatten(vlm.parameters()))
    for key in [k for k in weights if k.startswith("connector.")]:  # image rows about as long as text rows
        weights[key] = weights[key] * 0.2
    for name, w in tree_flatten(lm.model.parameters()):  # Idefics3's text model holds them directly
        key = "language_model." + name
        if name == "embed_tokens.weight":  # the new rows: small random vectors; the head is tied
            w = mx.concatenate([w, 0.02 * mx.random.normal((vocab - w.shape[0], w.shape[1]))])
            weights["language_model.lm_head.weight"] = w.astype(mx.float32)
        assert weights[key].shape == w.shape, (key, weights[key].shape, w.shape)
        weights[key] = w.astype(mx.float32)
    mx.save_safetensors(str(folder / "model.safetensors"), weights, {"format": "mlx"})
    (folder / "config.json").write_text(json.dumps(cfg))
    tcfg = json.loads((src / "tokenizer_config.json").read_text())
    tcfg.update(chat_template=TEMPLATE)
    tcfg.pop("added_tokens_decoder", None)
    (folder / "tokenizer_config.json").write_text(json.dumps(tcfg))
    norm = {"image_mean": [0.5] * 3, "image_std": [0.5] * 3, "do_normalize": True, "do_rescale": True}
    (folder / "preprocessor_config.json").write_text(
        json.dumps(
            {
                "image_processor_type": "Idefics3ImageProcessor",
                "do_resize": True,
                "size": {"longest_edge": 512},
                "max_image_size": {"longest_edge": 512},
                "do_image_splitting": False,
                "do_pad": True,
                "resample": 1,
                **norm,
            }
        )
    )
    (folder / "processor_config.json").write_text(
        json.dumps({"processor_class": "Idefics3Processor", "image_seq_len": 64})
    )
    return folder


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--keep", help="build the model here and keep it (default: a temporary folder)")
    args = ap.parse_args()

    from mlxcel_py.drafters import registry
    from mlxcel_py.engine.engine import Engine
    from mlxcel_py.models import loading
    from mlxcel_py.options import DraftConfig, LookupConfig, SamplingOptions

    tmp = None if args.keep else tempfile.mkdtemp(prefix="vision-bench-")
    folder = Path(args.keep or tmp) / "smolvlm-like"
    if not (folder / "config.json").exists():
        build(folder)
    lm = loading.load(loading.resolve(str(folder)))
    v = lm.vision
    image = screenshot()
    greedy = SamplingOptions(temp=0.0)

    def engine(lookup: bool) -> Engine:
        draft = DraftConfig(kind="prompt-lookup", lookup=LookupConfig()) if lookup else None
        drafters = None
        if draft is not None:
            drafters = registry.kind_of(draft.kind).source(
                draft, model=lm.model, eos_ids=lm.tokenizer.eos_token_ids, vocab_size=lm.vocab_size, assets=None
            )
        return Engine(lm.model, eos_ids=lm.tokenizer.eos_token_ids, vocab_size=lm.vocab_size, drafters=drafters)

    engines = {"plain": engine(False), "prompt-lookup": engine(True)}
    print(f"model: Idefics3 layout, SmolLM2-135M text weights (float32), random vision tower; {lm.kernels}")
    rows = []
    for name, text in PROMPTS.items():
        ids = v.prompt_ids(lm.tokenizer, text, [image])
        for eng in engines.values():
            eng.warmup(ids, sampling=greedy)
        tps: dict[str, list[float]] = {k: [] for k in engines}
        outs, acc = {}, []
        for _ in range(args.repeats):
            for mode, eng in engines.items():  # interleaved
                g = eng.generate(ids, max_tokens=args.tokens, sampling=greedy)
                toks = [e.token for e in g]
                tps[mode].append(g.stats.decode_tps)
                outs.setdefault(mode, toks)
                assert toks == outs[mode], "a repeat differs"
                if mode == "prompt-lookup":
                    acc.append(g.stats.accepted / max(g.stats.proposed, 1))
        same = outs["plain"] == outs["prompt-lookup"]
        plain, spec = statistics.median(tps["plain"]), statistics.median(tps["prompt-lookup"])
        images = sum(t < 0 for t in ids)
        rows.append((name, len(ids), images, plain, spec, spec / plain, statistics.mean(acc), same))
    print(
        f"\n{'prompt':14} {'tokens':>6} {'image':>5} {'plain tok/s':>11} {'lookup tok/s':>12} {'ratio':>6} {'accept':>6} same"
    )
    for name, n, images, plain, spec, ratio, acc, same in rows:
        print(f"{name:14} {n:6d} {images:5d} {plain:11.1f} {spec:12.1f} {ratio:5.2f}x {acc:6.2f} {same}")
    print("sample reply (edit-caption):", repr(lm.tokenizer.decode(outs_sample(engines, v, lm, image, greedy))[:160]))

    # a second question about the same image: the prompt cache holds the first request's image prefill
    first = v.prompt_ids(lm.tokenizer, "What is in this image? Answer in one sentence.", [image])
    second = v.prompt_ids(lm.tokenizer, "What colours are in this image?", [image])
    cold, warm = [], []
    for _ in range(args.repeats):
        fresh = engine(False)
        fresh.keep_prompts(None)
        g = fresh.generate(second, max_tokens=1, sampling=greedy)
        list(g)
        cold.append(g.stats.prefill_s)
        pooled = engine(False)
        pooled.keep_prompts(None)
        list(pooled.generate(first, max_tokens=8, sampling=greedy))
        t = time.perf_counter()
        g = pooled.generate(second, max_tokens=1, sampling=greedy)
        list(g)
        warm.append(g.stats.prefill_s)
        reused = g.stats.cached_tokens
        _ = time.perf_counter() - t
    print(
        f"\nsecond question about the same image ({len(second)} prompt tokens, {sum(t < 0 for t in second)} of them "
        f"the image's): prefill {statistics.median(cold) * 1000:.1f} ms cold, {statistics.median(warm) * 1000:.1f} ms "
        f"with the first request's cache ({reused} tokens reused): {statistics.median(cold) / statistics.median(warm):.1f}x"
    )
    if tmp:
        shutil.rmtree(tmp, ignore_errors=True)


def screenshot() -> Image.Image:
    """The caption rendered as black text on white, 512x384: a "transcribe this" image."""
    from PIL import ImageDraw

    image = Image.new("RGB", (512, 384), "white")
    draw = ImageDraw.Draw(image)
    words = CAPTION.split()
    for i in range(0, len(words), 8):
        draw.text((10, 10 + 20 * (i // 8)), " ".join(words[i : i + 8]), fill="black")
    return image


def outs_sample(engines, v, lm, image, greedy) -> list[int]:
    ids = v.prompt_ids(lm.tokenizer, PROMPTS["edit-caption"], [image])
    return [e.token for e in engines["prompt-lookup"].generate(ids, max_tokens=60, sampling=greedy)]


if __name__ == "__main__":
    main()
