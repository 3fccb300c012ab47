"""The terminal: the only rich importer and the one error boundary for commands (ui), and the
chat view (chat_view). stdout carries generated text only; everything else goes to stderr."""
