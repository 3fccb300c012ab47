"""The prompt a causal-LM reranker judges one (query, document) pair from, as llama-server builds
it for `/rerank` on a model without a classification head.

A model may carry its own: a named chat template `rerank` (a GGUF's `tokenizer.chat_template.rerank`,
or tokenizer_config's list of named templates), plain text in which `{query}` and `{document}`
are replaced (not Jinja). Without one it is the judge prompt of Qwen3-Reranker's model card (a
ChatML system line asking for "yes" or "no", the instruction, query and document as the user's
turn, an empty think block opening the answer), which rerankers of that family were trained on.
The answer is read from the model's next-token logits for "yes" and "no" (engine/rerank.py).
"""

from __future__ import annotations

from typing import Any

QWEN3_INSTRUCTION = "Given a web search query, retrieve relevant passages that answer the query"
QWEN3_PROMPT = (
    "<|im_start|>system\nJudge whether the Document meets the requirements based on the Query and the "
    'Instruct provided. Note that the answer can only be "yes" or "no".<|im_end|>\n<|im_start|>user\n'
    "<Instruct>: {instruction}\n<Query>: {query}\n<Document>: {document}<|im_end|>\n"
    "<|im_start|>assistant\n<think>\n\n</think>\n\n"
)


def prompt(query: str, document: str, template: str | None = None, instruction: str | None = None) -> str:
    """The text the model reads for one pair: the model's `rerank` template with the two filled
    in, else Qwen3-Reranker's judge prompt (with `instruction`, or its default one)."""
    if template:
        # one pass, so a query that contains "{document}" is not filled in again
        parts = template.split("{query}")
        return query.join(p.replace("{document}", document) for p in parts)
    text = QWEN3_PROMPT.replace("{instruction}", instruction or QWEN3_INSTRUCTION)
    head, tail = text.split("{query}")
    return head + query + tail.replace("{document}", document)


def template_of(tokenizer: Any) -> str | None:
    """The model's named `rerank` template, if it has one."""
    for holder in (tokenizer, getattr(tokenizer, "_tokenizer", None)):
        template = getattr(holder, "chat_template", None)
        if isinstance(template, dict) and isinstance(template.get("rerank"), str):
            return template["rerank"]
        if isinstance(template, list):  # tokenizer_config's form: [{"name", "template"}]
            for t in template:
                if isinstance(t, dict) and t.get("name") == "rerank" and isinstance(t.get("template"), str):
                    return t["template"]
    return None
