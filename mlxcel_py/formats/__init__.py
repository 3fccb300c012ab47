"""Text formats that validation checks before any model loads (pure): output grammars
(`grammars`: JSON schema, GBNF, Lark, regex), chat templates (`chat_templates`), the flags that
give them as text or files (`flag_texts`), and text turned into prompt ids through a tokenizer's
template (`prompting`: the tokenizer is the caller's; nothing here imports MLX)."""
