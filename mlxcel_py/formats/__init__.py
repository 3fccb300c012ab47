"""Text formats that validation checks before any model loads (pure): output grammars
(`grammars`: JSON schema, GBNF, Lark, regex) and chat templates (`chat_templates`)."""
