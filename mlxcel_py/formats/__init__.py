"""Text formats that validation checks before any model loads (pure): output grammars
(`grammars`: JSON schema, GBNF, Lark, regex), chat templates (`chat_templates`), and the flags
that give them as text or files (`flag_texts`)."""
