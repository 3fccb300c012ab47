"""Serve the model over HTTP (OpenAI and llama-server compatible), speculative per request."""

from __future__ import annotations

from .. import fastpath, ui
from ..validate import validate
from ._options import MODEL_PARAMS, RUNTIME_PARAMS, SAMPLING_PARAMS, SERVER_PARAMS, SPEC_PARAMS, LOOKUP_PARAMS_HIDDEN, _kw, MaxTokensOpt, build_options, with_params

EPILOG = (
    "Examples:\n\n"
    "  mlxcel serve --draft-kind prompt-lookup --port 8080\n\n"
    "  mlxcel serve -m ./Llama-3.1-8B --draft-model ./Llama-3.2-1B --port 0"
)

SERVE_PARAMS = (MODEL_PARAMS + [_kw("max_tokens", MaxTokensOpt, -1)] + SAMPLING_PARAMS + SPEC_PARAMS
                + LOOKUP_PARAMS_HIDDEN + SERVER_PARAMS + RUNTIME_PARAMS)


@with_params(SERVE_PARAMS)
def serve(**params) -> None:
    """Serve the model over HTTP (OpenAI and llama-server compatible), speculative per request."""
    with ui.exit_on_error():
        cfg = validate(build_options("serve", params))
        fastpath.prepare((cfg).options.model.blas)
        from ..server.main import run_server

        run_server(cfg)
