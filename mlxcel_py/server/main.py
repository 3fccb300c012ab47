"""Run the server: bind (port 0 = ephemeral), load and warm up while answering 503, run uvicorn
until a signal.

No CLI or terminal code here: the command (`commands/serve.py`) passes `say`/`warn` callbacks
for the startup lines and owns how they look.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import sys
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

from ..engine.context_shift import ContextShift
from ..errors import exit_on_signal
from ..formats.template_vars import server_kwargs
from ..options import SERVER_SAMPLING_DEFAULTS, RunConfig, SamplingOptions
from ..session import describe_draft, open_session, resolved_drafter_line
from . import vertex
from .image_parts import ImageSources
from .model_meta import model_meta


def run_server(run: RunConfig, *, say: Callable[[str], None], warn: Callable[[str], None], world: Any = None) -> None:
    """Bind first, then load while already answering: `/health` (and every route) says 503
    "Loading model" until the model is warm, as llama-server does. The `listening on` line is
    printed once requests can be served."""
    import threading

    from .app import create_app

    srv = run.options.server
    # the key file is read and the port bound before the model loads, so either fails in a second
    access, cors = policies(srv, warn)
    prediction = vertex.Prediction.from_env(os.environ)  # Vertex AI's container protocol (AIP_MODE=PREDICTION)
    port = srv.port
    if prediction is not None and prediction.port is not None and prediction.port != srv.port:
        warn(f"AIP_HTTP_PORT={prediction.port} replaces --port {srv.port} (Vertex AI's prediction protocol)")
        port = prediction.port
    socks = _bind(srv.host, port)
    app = create_app(access=access, cors=cors, access_log=not srv.log_disable, webui=srv.webui, slots=srv.slots)
    if prediction is not None:
        vertex.install(app, prediction)
        say(f"Vertex AI prediction protocol: POST {prediction.predict_route} (AIP_MODE=PREDICTION)")
    app.state.slot_dir = Path(srv.slot_save_path) if srv.slot_save_path else None
    app.state.mcp_proxy, app.state.mcp_proxy_allow = srv.mcp_proxy, srv.mcp_proxy_allow
    app.state.tools = server_tools(srv, say, warn, cors.relaxed and not access.api_keys)
    # on SIGTERM/SIGINT uvicorn stops accepting, waits this long for requests in flight, then
    # cancels them (their streams end, the finally below stops the worker's job)
    config = uvicorn_config(app, srv)
    loaded: dict = {}

    def first_signal() -> None:
        if "worker" in loaded:
            # a second before the grace runs out (when uvicorn would cancel them mid-write),
            # stop every request: a stream ends with an error chunk and [DONE], a plain
            # request gets a 503, instead of a cut connection
            t = threading.Timer(max(srv.shutdown_grace - 1.0, 0.0), loaded["worker"].shut_down, args=(SHUTTING_DOWN,))
            t.daemon = True
            t.start()

    server = stopping_server(config, app, first_signal)

    def load() -> None:
        try:
            session, loaded["worker"] = _load(run, app, socks, say=say, warn=warn, world=world)
            if loaded["worker"].resident is None:  # else the resident holds it (and lets go of it asleep)
                loaded["session"] = session
        except BaseException as exc:  # reported by the main thread once uvicorn has stopped
            loaded["error"] = exc
            server.should_exit = True

    threading.Thread(target=load, name="mlxcel-load", daemon=True).start()

    def cleanup() -> None:
        if app.state.tools is not None:
            app.state.tools.close()  # a container started for --tools-runtime stops with the server
        if "worker" in loaded:
            worker = loaded["worker"]
            worker.stop()
            # asleep (--sleep-idle-seconds), the store was saved as the model was released
            session = worker.resident.session if worker.resident is not None else loaded["session"]
            said = session.save_store() if session is not None else None  # the suffix drafter's memory
            if said:
                say(said)

    code = serve_until_signal(server, socks, cleanup)
    if "error" in loaded:
        raise loaded["error"]
    if world is not None and world.channel is not None:
        world.channel.close(code)  # the other ranks stop too (before the exit below skips every finally)
    _exit_now(code)


SHUTTING_DOWN = "the server is shutting down; this reply was cut short"


def stopping_server(config: Any, app: Any, first_signal: Callable[[], None] = lambda: None) -> Any:
    """uvicorn's server for a model's server or a router: at the first SIGTERM/SIGINT the agent
    tools' MCP calls and commands in flight end at once (the requests waiting on them then let
    the server stop within its grace), and `first_signal` runs."""
    import uvicorn

    class Server(uvicorn.Server):
        def handle_exit(self, sig, frame) -> None:
            first = not self.should_exit
            super().handle_exit(sig, frame)
            if first and getattr(app.state, "tools", None) is not None:
                app.state.tools.shutting_down()  # MCP calls in flight end now, not at their timeout
            if first:
                first_signal()

    return Server(config)


def serve_until_signal(server: Any, socks: list[socket.socket], cleanup: Callable[[], None]) -> int:
    """Run uvicorn on the bound sockets until it stops; `cleanup` runs whatever stopped it. Returns
    the exit code: a SIGTERM's (uvicorn shuts down, then re-raises it under the handler it found:
    exit_on_signal makes that an exception, so `cleanup` runs instead of the default kill), 130
    after Ctrl-C, else 0. A model's server and a router end the same way."""
    signal.signal(signal.SIGTERM, exit_on_signal)
    code = 0
    try:
        server.run(sockets=socks)
    except SystemExit as exc:  # SIGTERM (see exit_on_signal)
        code = exc.code if isinstance(exc.code, int) else 1
    except KeyboardInterrupt:  # Ctrl-C: uvicorn shut down, then re-raised SIGINT
        sys.stderr.write("\ninterrupted\n")
        code = 130
    finally:
        cleanup()
    return code


def server_tools(srv: Any, say: Callable[[str], None], warn: Callable[[str], None], exposed: bool) -> Any:
    """--tools as a tools.ServerTools (None without), its --tools-runtime started; said at startup.
    `exposed`: any web page may call this server and no key guards it (then said loudly)."""
    if not srv.tools and not srv.mcp_servers_config and not srv.mcp_servers_json:
        return None
    from .tools import McpServers, ServerTools, select
    from .tools.mcp import read_configs
    from .tools.runtime import ToolsRuntime

    configs = read_configs(srv.mcp_servers_config, srv.mcp_servers_json, say)  # a bad file: exit 2, now
    if exposed:
        warn("/tools with --cors-origins '*' and no --api-key: any web page you open can run these tools")
    runtime = ToolsRuntime(srv.tools_runtime) if srv.tools_runtime else None
    tools = ServerTools(select(srv.tools) if srv.tools else [], runtime)
    if configs:
        tools.mcp = McpServers(configs, say)
        tools.mcp.warm_up()
        tools.tools += tools.mcp.as_tools({t.name for t in tools.tools})
    where = f"in {runtime.spec()}" if runtime is not None else "on this host, as this user"
    say(
        f"tools (experimental): {', '.join(t.name for t in tools.tools) or 'none'} at /tools, run {where}; "
        "never let untrusted clients reach this server"
    )
    return tools


def policies(srv: Any, warn: Callable[[str], None]) -> tuple[Any, Any]:
    """(security.AccessPolicy, security.CorsPolicy) from serve's flags, a server's or a router's;
    a relaxed CORS without a key is said once."""
    from .security import AccessPolicy, CorsPolicy, is_loopback, parse_keys

    access = AccessPolicy(
        api_keys=parse_keys(srv.api_keys, srv.api_key_file),
        loopback_only_hosts=all(is_loopback(h) for h in hosts(srv.host)),
    )
    cors = CorsPolicy.parse(srv.cors_origins, srv.cors_methods, srv.cors_headers, srv.cors_credentials)
    if cors.relaxed and not access.api_keys:
        warn(
            "CORS: any web page may call this server (--cors-origins '*'), and no --api-key is set; "
            "the default, localhost, allows only pages served from this machine"
        )
    return access, cors


def uvicorn_config(app: Any, srv: Any) -> Any:
    """uvicorn as every server here runs it: request headers within HEADER_TIMEOUT (slowloris), at
    most MAX_CONNECTIONS open, --shutdown-grace for requests in flight at SIGTERM."""
    import uvicorn

    from .protocol import MAX_CONNECTIONS, HeaderDeadlineProtocol

    return uvicorn.Config(
        app,
        log_level="warning",
        access_log=False,
        timeout_graceful_shutdown=srv.shutdown_grace,
        http=HeaderDeadlineProtocol,
        limit_concurrency=MAX_CONNECTIONS,
    )


def _exit_now(code: int) -> None:
    """Leave without C++ static destructors: MLX, used from the worker thread, sometimes aborted in
    them at interpreter exit ("terminate called without an active exception", exit 134). What is
    worth keeping (the suffix store, the log) was written and flushed above."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def listening(host: str, socks: list[socket.socket]) -> tuple[str, str]:
    """(the first address's URL, the others as the startup line adds them: "" when there are none)."""
    port = socks[0].getsockname()[1]
    first, *others = (f"http://{_url_host(h)}:{port}" for h in hosts(host))
    return first, (f" (and {', '.join(others)})" if others else "")


def _url_host(host: str) -> str:
    """The host as a URL spells it: IPv6 in brackets."""
    return f"[{host}]" if ":" in host and not host.startswith("[") else host


def hosts(host: str) -> list[str]:
    """--host's addresses: llama-server takes a comma-separated list (`127.0.0.1,::1`)."""
    return [h.strip().strip("[]") for h in host.split(",") if h.strip()] or [host]


def _bind(host: str, port: int) -> list[socket.socket]:
    """A listening socket per --host address, all on one port (with --port 0, the port the first
    was given). Any address that cannot be bound is the error: serving on part of what was asked
    would hide it."""
    socks: list[socket.socket] = []
    for h in hosts(host):
        family = socket.AF_INET6 if ":" in h else socket.AF_INET
        sock = socket.socket(family, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        if family == socket.AF_INET6:  # `::` serves IPv6 only; 0.0.0.0 may be listed beside it
            sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
        try:
            sock.bind((h, port))
        except OSError as exc:
            from ..errors import MlxcelError

            for s in socks + [sock]:
                s.close()
            raise MlxcelError(f"--host {h} --port {port}: cannot bind ({exc.strerror})") from None
        sock.listen(2048)  # accept (queue) connections from the start; they get 503 while loading
        socks.append(sock)
        port = sock.getsockname()[1]
    return socks


def _load(run: RunConfig, app, socks: list[socket.socket], *, say, warn, world=None):
    """Load and warm the model, then put it on the app (requests stop getting 503)."""
    from ..models.default_model import DEFAULT_MODEL_NAME
    from .context import ServerContext
    from .worker import Worker

    opts = run.options
    srv = opts.server
    session = open_session(run, say=say, warn=warn, world=world)
    draft = session.engine.draft  # as resolved at load (an MTP checkpoint's kind and width)
    speculative = draft.enabled and not srv.no_batch and not srv.kv_unified
    if (resolved := resolved_drafter_line(draft)) is not None:
        say(resolved)
    line = describe_draft(draft, max_batch=srv.prompt_lookup_max_batch or "auto")
    if draft.enabled and not speculative:
        line += " [verify rounds off: " + ("--no-batch" if srv.no_batch else "--kv-unified") + "]"
    if srv.cache_ram != 0 and world is None:
        say(
            "prompt cache: finished requests' caches kept for prompts that share a prefix, "
            + ("no size limit" if srv.cache_ram < 0 else f"up to {srv.cache_ram} MiB")
            + " (--cache-ram)"
        )
    elif srv.cache_ram != 0:  # each follower rank keeps caches for a few sequences only
        say("prompt cache: off under --tp-size/--pp-size")
    # a distributed run mirrors one sequence's forwards at a time (its followers keep few caches)
    parallel = 1 if srv.no_batch or world is not None else srv.parallel
    if world is not None and srv.parallel > 1:
        say(f"slots: 1 under {opts.parallel.flag} (-np {srv.parallel} applies to one-process servers)")
    _set_up(session.engine, srv, parallel, world)
    if srv.split_context and world is None:
        say(
            f"context: {session.engine.context_length} tokens per slot (the {srv.ctx_size or 'model'} window "
            f"split across -np {srv.parallel}; -kvu gives every slot the whole window)"
        )
    worker = Worker(
        session.engine,
        session.tokenizer,
        speculative_allowed=speculative,
        parallel=parallel,
        max_batch=srv.prompt_lookup_max_batch,
        resident=_resident(run, session, say=say, warn=warn),
    )
    worker.variants = _adapter_variants(run, session, parallel, say=say)
    worker.start(warmup=srv.warmup)
    if worker.warmup_error:
        warn(f"warmup failed: {worker.warmup_error}")
    if parallel > 1:
        probe = worker.probe
        how = (
            f"batched forward: {probe.detail}"
            if probe is not None and probe.batches
            else "one forward per sequence" + (f" ({probe.detail})" if probe is not None else "")
        )
        say(
            f"slots: {parallel} requests decoded together (-np); {how}"
            + (f"; {worker.gate.describe()}" if speculative else "")
        )
    aliases, tags = names(srv.alias), names(srv.tags)
    # llama-server keeps its aliases in a sorted set and takes the first as the id
    model_id = (
        aliases[0]
        if aliases
        else opts.model.hf_repo  # llama-server names an -hf model by its repo
        if opts.model.hf_repo
        else (DEFAULT_MODEL_NAME if opts.model.model is None else session.target.resolved.named.name)
    )
    defaults = server_sampling(opts.sampling, srv.sampling_given, session.target.resolved.path)
    say(
        f"default sampling: temp {defaults.temp:g}, top-p {defaults.top_p:g}, top-k {defaults.top_k}, "
        f"min-p {defaults.min_p:g} (requests may override)"
    )
    app.state.ctx = ServerContext(
        session.tokenizer,
        session.engine,
        worker,
        defaults,
        opts.generation.max_tokens,
        model_id,
        body_limit=app.state.body_limit,
        max_predict_ms=srv.max_predict_ms,
        reasoning_format=srv.reasoning_format,
        verbose=srv.verbose,
        template_kwargs=server_kwargs(srv),
        reasoning_budget=srv.reasoning_budget,
        context_shift=ContextShift(keep=srv.keep) if srv.context_shift else None,
        embeddings=srv.embeddings,
        metrics_endpoint=srv.metrics,
        reranking=srv.reranking,
        adapters=worker.variants,
        pooling=srv.pooling,
        vision=session.target.vision,
        images=ImageSources(srv.image_url_fetch, Path(srv.media_path) if srv.media_path else None, srv.image_url_allow),
        model_path=str(session.target.resolved.named),
        aliases=aliases,
        tags=tags,
        model_meta=model_meta(
            session.target.resolved,
            n_vocab=session.engine.vocab_size or len(session.tokenizer.get_vocab()),
            n_ctx=session.engine.context_length,
            n_ctx_train=session.target.context_length,
        ),
    )
    say(line)
    worker.serving()  # the idle clock (--sleep-idle-seconds) starts now, not while this still holds the session
    url, others = listening(srv.host, socks)
    say(f"mlxcel serve: model {model_id} listening on {url}{others}")
    if srv.webui:
        say(f"chat page: {url}/ (--no-webui turns it off)")
    sys.stderr.flush()
    return session, worker


def _set_up(engine, srv, parallel: int, world) -> None:
    """What serve sets on an engine it decodes on, the startup one and each adapter variant alike:
    the prompt cache (--cache-ram; one process only) and a drafter per request under -np > 1."""
    if srv.cache_ram != 0 and world is None:
        engine.keep_prompts(None if srv.cache_ram < 0 else srv.cache_ram * 2**20)
    engine.private_drafters = parallel > 1


def _adapter_variants(run: RunConfig, session, parallel: int, *, say):
    """--lora / --lora-scaled / --adapter-path: the fused models for other adapter scales (POST
    /lora-adapters, a request's `lora`), each loaded as the startup one was and set up alike
    (None: no adapters)."""
    from .adapter_variants import AdapterVariants

    if not session.target.adapters:
        return None
    srv, model = run.options.server, run.options.model
    quiet = replace(run, warnings=())  # its warnings were printed at startup

    def load(scales: tuple[float, ...]):
        specs = tuple(replace(a, scale=s) for a, s in zip(model.adapters, scales))
        options = replace(run.options, model=replace(model, adapters=specs))
        engine = open_session(replace(quiet, options=options), say=lambda _: None, warn=lambda _: None).engine
        _set_up(engine, srv, parallel, None)
        if srv.warmup:
            engine.warmup()
        say(f"adapters: weights fused at scales {', '.join(f'{s:g}' for s in scales)} for a request")
        return engine

    listed = ", ".join(f"{i}: {a.spec.path} at {a.spec.scale:g}" for i, a in enumerate(session.target.adapters))
    say(f"adapters: {listed} (GET/POST /lora-adapters; a request's 'lora' picks its own scales)")
    return AdapterVariants(session.target.adapters, session.engine, load)


def _resident(run: RunConfig, session, *, say, warn):
    """--sleep-idle-seconds: the session, released when idle and loaded again on demand (None:
    it stays loaded). A vision model stays loaded: an image's rows, kept by content across
    requests, belong to the loaded vision tower."""
    from .sleep import Resident

    srv = run.options.server
    if srv.sleep_idle_seconds <= 0:
        return None
    if session.target.vision is not None:
        warn("--sleep-idle-seconds: a vision model stays loaded (its image rows are kept across requests)")
        return None
    quiet = replace(run, warnings=())  # its warnings were printed at startup

    def load():
        return open_session(quiet, say=lambda _: None, warn=lambda _: None)

    say(f"sleep: the model is released after {srv.sleep_idle_seconds} s idle and loaded again on demand")
    return Resident(session, load, srv.sleep_idle_seconds, warmup=srv.warmup, say=say)


def names(text: str | None) -> list[str]:
    """llama-server's comma-separated --alias / --tags: stripped, empty ones dropped, a sorted set."""
    return sorted({n.strip() for n in (text or "").split(",") if n.strip()})


def server_sampling(flags: SamplingOptions, given: tuple[str, ...], model_dir: Path) -> SamplingOptions:
    """The server's default sampling, field by field: a command-line flag, else the model's
    generation_config.json (temperature, top_p, top_k, min_p), else llama-server's defaults."""
    try:
        gen = json.loads((Path(model_dir) / "generation_config.json").read_text())
    except (OSError, ValueError):
        gen = {}
    if not isinstance(gen, dict):
        gen = {}
    elif gen.get("do_sample") is False:  # a checkpoint that asks for greedy decoding
        gen = {"temperature": 0.0}
    keys = {"temp": "temperature", "top_p": "top_p", "top_k": "top_k", "min_p": "min_p"}
    values = {}
    for field_name, key in keys.items():
        if field_name in given:
            continue
        v = gen.get(key)
        ok = isinstance(v, (int, float)) and not isinstance(v, bool)
        values[field_name] = (
            type(SERVER_SAMPLING_DEFAULTS[field_name])(v) if ok else SERVER_SAMPLING_DEFAULTS[field_name]
        )
    return replace(flags, **values)
