"""llama-server's `/infill` prompt: fill-in-the-middle for code models, in llama.cpp's layout.

The model's FIM tokens are found as llama.cpp finds them, by their text in the vocabulary
(`<|fim_prefix|>` Qwen, `<fim_prefix>` StarCoder/Granite, `<｜fim▁begin｜>` DeepSeek, `<PRE>`
CodeLlama...); a model without prefix, suffix and middle tokens cannot infill (501, llama-server's
answer). The prompt is the repo-level pattern (arXiv 2409.12186) llama-server builds:

    [FIM_REP]myproject\\n [FIM_SEP]file\\n chunk ... [FIM_SEP]filename\\n
    [BOS] [FIM_PRE]prefix+prompt [FIM_SUF]suffix [FIM_MID]

with llama-server's budgets: the prefix's last 3/4 of a batch, the suffix's first 1/4 (less the
prompt), the extra chunks' last tokens in what the window leaves.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from .http import ApiError

N_BATCH = 2048  # llama-server's default -b, which sizes the prefix and suffix kept

# llama.cpp's names for each FIM token (src/llama-vocab.cpp), in its order of preference
FIM_TEXTS = {
    "pre": ("<|fim_prefix|>", "<fim-prefix>", "<fim_prefix>", "<｜fim▁begin｜>", "<PRE>", "▁<PRE>",
            "<|code_prefix|>", "<|prefix|>"),
    "suf": ("<|fim_suffix|>", "<fim-suffix>", "<fim_suffix>", "<｜fim▁hole｜>", "<SUF>", "▁<SUF>",
            "<|code_suffix|>", "<|suffix|>"),
    "mid": ("<|fim_middle|>", "<fim-middle>", "<fim_middle>", "<｜fim▁end｜>", "<MID>", "▁<MID>",
            "<|code_middle|>", "<|middle|>"),
    "rep": ("<|fim_repo|>", "<|repo_name|>", "<fim-repo>", "<REPO>", "<reponame>"),
    "sep": ("<|file_sep|>",),
}  # fmt: skip
# the separator llama-server puts between extra chunks when the vocabulary has no file separator
CHUNK_SEPARATOR = "\n\n--- snippet ---\n\n"


def fim_tokens(vocab: dict[str, int]) -> dict[str, int | None]:
    """Each FIM role's token id in `vocab` (text -> id), None where the vocabulary has none."""
    return {role: next((vocab[t] for t in texts if t in vocab), None) for role, texts in FIM_TEXTS.items()}


def why_not(fim: dict[str, int | None]) -> str | None:
    """llama-server's refusal for a model that cannot infill (None: it can)."""
    missing = "".join(f"{name} token is missing. " for role, name in _NAMES if fim[role] is None)
    return f"Infill is not supported by this model: {missing}" if missing else None


_NAMES = (("pre", "prefix"), ("suf", "suffix"), ("mid", "middle"))


def check_extra(value: Any) -> list[dict]:
    """`input_extra` as llama-server validates it: a list of {"text": str, "filename"?: str}."""
    if value is None:
        return []
    if not isinstance(value, list):
        raise ApiError('"input_extra" must be an array of {"filename": string, "text": string}')
    for chunk in value:
        if not isinstance(chunk, dict) or not isinstance(chunk.get("text"), str):
            raise ApiError('extra_context chunk must contain a "text" field with a string value')
        if "filename" in chunk and not isinstance(chunk["filename"], str):
            raise ApiError('extra_context chunk\'s "filename" field must be a string')
    return value


def infill_prompt(
    fim: dict[str, int | None],
    encode: Callable[[str], list[int]],
    prefix: Sequence[int],
    suffix: Sequence[int],
    extra: list[dict],
    prompt: Sequence[int],
    *,
    n_ctx: int,
    n_predict: int,
    bos: int | None,
    n_batch: int = N_BATCH,
) -> list[int]:
    """The token ids llama-server's format_prompt_infill builds (`encode`: text to ids, no specials)."""
    extra_ids: list[int] = []
    if fim["rep"] is not None:
        extra_ids += [fim["rep"], *encode("myproject\n")]
    for chunk in extra:
        if fim["sep"] is not None:
            extra_ids += [fim["sep"], *encode(chunk.get("filename", "tmp") + "\n")]
        else:
            extra_ids += encode(CHUNK_SEPARATOR)
        extra_ids += encode(chunk["text"])
    if fim["sep"] is not None:
        extra_ids += [fim["sep"], *encode("filename\n")]
    n_prefix = min(len(prefix), 3 * (n_batch // 4))
    n_suffix = min(len(suffix), max(0, n_batch // 4 - (2 + len(prompt))))
    n_extra = min(max(0, n_ctx - n_batch - 2 * n_predict), len(extra_ids))
    head = [fim["pre"], *list(prefix)[len(prefix) - n_prefix :], *prompt]
    tail = [fim["suf"], *list(suffix)[:n_suffix]]
    ids = ([bos] if bos is not None else []) + head
    ids = (extra_ids[len(extra_ids) - n_extra :] if n_extra else []) + ids
    return [*ids, *tail, fim["mid"]]
