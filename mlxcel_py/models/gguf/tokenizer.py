"""A GGUF file's tokenizer, rebuilt from its metadata as a `tokenizer.json` + `tokenizer_config.json`.

transformers already knows how to turn llama.cpp's `tokenizer.ggml.*` keys into a fast tokenizer
for byte-level BPE (`gpt2`), sentencepiece (`llama`, with Gemma's and Phi-3's variants) and unigram
files (`convert_gguf_tokenizer`); we lean on it and add what it lacks: llama.cpp's `smollm`,
`starcoder` and `refact` pre-tokenizers split every digit before the GPT-2 regex (transformers falls
back to the plain GPT-2 split for them, which merges "\\n\\n" differently from llama.cpp).
"""

from __future__ import annotations

from typing import Any

from ...errors import ModelError

# llama.cpp pre-tokenizer names whose regex list starts with a lone "\p{N}"
_DIGITS_FIRST = frozenset({"smollm", "starcoder", "refact"})


def adds_special(md: dict) -> tuple[bool, bool]:
    """(BOS, EOS) llama.cpp puts around tokenized text: the file's flags, and BOS for a
    sentencepiece vocabulary that says nothing (llama.cpp's default)."""
    add_bos = md.get("tokenizer.ggml.add_bos_token", md.get("tokenizer.ggml.model") == "llama")
    return bool(add_bos), bool(md.get("tokenizer.ggml.add_eos_token", False))


def _special_around(md: dict) -> Any:
    """A post-processor adding the BOS/EOS llama.cpp adds to a whole prompt. transformers ignores
    tokenizer_config's add_bos_token once there is a tokenizer.json, so the flag lives here."""
    from tokenizers import processors

    tokens = md.get("tokenizer.ggml.tokens") or []
    add_bos, add_eos = adds_special(md)
    around: dict[str, int] = {}
    for flag, key in ((add_bos, "bos_token_id"), (add_eos, "eos_token_id")):
        i = md.get(f"tokenizer.ggml.{key}")
        if flag and isinstance(i, int) and 0 <= i < len(tokens):
            around[key] = i
    if not around:
        return None
    bos = tokens[around["bos_token_id"]] if "bos_token_id" in around else None
    eos = tokens[around["eos_token_id"]] if "eos_token_id" in around else None
    # lists, not one spaced string: a token's own text may hold a space
    single = [f"{bos}:0"] * (bos is not None) + ["$A:0"] + [f"{eos}:0"] * (eos is not None)
    pair = single + [f"{bos}:1"] * (bos is not None) + ["$B:1"] + [f"{eos}:1"] * (eos is not None)
    specials = [(tokens[i], i) for i in around.values()]
    return processors.TemplateProcessing(single=single, pair=pair, special_tokens=specials)


def tokenizer_json(md: dict, arch: str, path: Any) -> str:
    from tokenizers import pre_tokenizers

    try:
        from transformers.integrations.gguf.gguf_tokenizer_mapping import (
            GGUF_TOKENIZER_MAPPING,
            convert_gguf_tokenizer,
        )
    except ImportError as exc:  # pragma: no cover - transformers is an mlx-lm dependency
        raise ModelError(f"{path}: cannot rebuild the GGUF tokenizer ({exc})") from None
    if "tokenizer.ggml.tokens" not in md:
        raise ModelError(f"{path}: the GGUF file has no tokenizer (no tokenizer.ggml.tokens)")
    tdict = {
        name: md[f"tokenizer.{key}"]
        for key, name in GGUF_TOKENIZER_MAPPING["tokenizer"].items()
        if f"tokenizer.{key}" in md
    }
    try:
        backend, _ = convert_gguf_tokenizer(arch, tdict)
    except (ValueError, KeyError, TypeError) as exc:
        kind = md.get("tokenizer.ggml.model", "?")
        raise ModelError(
            f"{path}: GGUF tokenizer model '{kind}' cannot be rebuilt ({str(exc).splitlines()[0]})"
        ) from None
    if md.get("tokenizer.ggml.model") == "gpt2" and md.get("tokenizer.ggml.pre") in _DIGITS_FIRST:
        backend.pre_tokenizer = pre_tokenizers.Sequence(
            [
                pre_tokenizers.Digits(individual_digits=True),
                pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True),
            ]
        )
    around = _special_around(md)
    if around is not None:
        backend.post_processor = around
    return backend.to_str()


def tokenizer_config(md: dict, context_length: int) -> dict:
    tokens = md.get("tokenizer.ggml.tokens") or []

    def token(key: str) -> str | None:
        i = md.get(f"tokenizer.ggml.{key}")
        return tokens[i] if isinstance(i, int) and 0 <= i < len(tokens) else None

    add_bos, add_eos = adds_special(md)
    eos = token("eos_token_id") or "<|endoftext|>"
    config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "eos_token": eos,
        "bos_token": token("bos_token_id"),
        "unk_token": token("unknown_token_id"),
        "pad_token": token("padding_token_id") or eos,
        "add_bos_token": add_bos,
        "add_eos_token": add_eos,
        "clean_up_tokenization_spaces": False,
        "model_max_length": context_length,
    }
    if "tokenizer.chat_template" in md:
        config["chat_template"] = str(md["tokenizer.chat_template"])
    if "tokenizer.chat_template.rerank" in md:  # a reranker's judge prompt (serve --reranking)
        # tokenizer_config's list of named templates; transformers reads it as a dict by name
        named = [{"name": "rerank", "template": str(md["tokenizer.chat_template.rerank"])}]
        if "chat_template" in config:
            named.insert(0, {"name": "default", "template": config["chat_template"]})
        config["chat_template"] = named
    return config
