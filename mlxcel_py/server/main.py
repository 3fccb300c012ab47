"""`mlxcel serve` / `mlxcel-server`: load once, warm up, bind (port 0 = ephemeral), run uvicorn."""

from __future__ import annotations

import signal
import socket
import sys

from .. import ui
from ..options import RunConfig
from ..engine_builder import describe_draft, open_session, resolved_drafter_line


def run_server(run: RunConfig) -> None:
    import uvicorn

    from .app import create_app
    from .worker import Worker

    from .security import AccessPolicy, is_loopback, parse_keys

    opts = run.options
    srv = opts.server
    # the key file is read before the model loads, so a wrong path fails in a second
    access = AccessPolicy(api_keys=parse_keys(srv.api_keys, srv.api_key_file),
                          loopback_only_hosts=is_loopback(srv.host))
    session = open_session(run, say=ui.info, warn=ui.warn)
    draft = session.engine.draft  # as resolved at load (an MTP checkpoint's kind and width)
    speculative = draft.enabled and not srv.no_batch and not srv.kv_unified
    if (resolved := resolved_drafter_line(draft)) is not None:
        ui.info(resolved)
    line = describe_draft(draft)
    if draft.kind == "prompt-lookup":
        line = line.rstrip(")") + f", max_batch={srv.prompt_lookup_max_batch})"
    if draft.enabled and not speculative:
        line += " [verify rounds off: " + ("--no-batch" if srv.no_batch else "--kv-unified") + "]"
    worker = Worker(session.engine, session.tokenizer, speculative_allowed=speculative)
    worker.start(warmup=srv.warmup)
    if worker.warmup_error:
        ui.warn(f"warmup failed: {worker.warmup_error}")
    from ..default_model import DEFAULT_MODEL_NAME

    model_id = srv.alias or (DEFAULT_MODEL_NAME if opts.model.model is None else session.target.resolved.path.name)
    app = create_app(session, worker, defaults=opts.sampling, max_tokens=opts.generation.max_tokens,
                     model_id=model_id, access=access, cors_origins=srv.cors_origins, access_log=not srv.log_disable)
    family = socket.AF_INET6 if ":" in srv.host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((srv.host, srv.port))
    except OSError as exc:
        from ..errors import MlxcelError

        raise MlxcelError(f"--host {srv.host} --port {srv.port}: cannot bind ({exc.strerror})") from None
    sock.listen(2048)  # accept (queue) connections from the moment the port is announced
    port = sock.getsockname()[1]
    ui.info(line)
    ui.err().print(f"mlxcel serve: model {model_id} listening on http://{srv.host}:{port}", markup=False)
    sys.stderr.flush()
    # on SIGTERM/SIGINT uvicorn stops accepting, waits this long for requests in flight, then
    # cancels them (their streams end, the finally below stops the worker's job)
    config = uvicorn.Config(app, log_level="warning", access_log=False,
                            timeout_graceful_shutdown=srv.shutdown_grace)
    server = uvicorn.Server(config)
    # uvicorn shuts down on SIGTERM, then re-raises it under the handler it found: make that an
    # exception, so the cleanup below (worker, suffix store) runs instead of the default kill
    signal.signal(signal.SIGTERM, _exit_on_sigterm)
    try:
        server.run(sockets=[sock])
    finally:
        worker.stop()
        said = session.save_store()  # the suffix drafter's memory of this server's requests
        if said:
            ui.info(said)


def _exit_on_sigterm(signum, frame) -> None:
    raise SystemExit(128 + signum)


def server_main() -> None:
    """The `mlxcel-server` console script: the serve flags, no subcommand."""
    import typer

    from ..commands.serve import serve

    app = typer.Typer(add_completion=False, context_settings={"help_option_names": ["-h", "--help", "--usage"]})
    app.command(help=serve.__doc__)(serve)
    app()
