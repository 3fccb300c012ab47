"""Run the router: read the folder, bind, serve until a signal, then stop every model's process."""

from __future__ import annotations

import signal
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

from ...errors import exit_on_signal
from ...options import RunConfig


def run_router(
    run: RunConfig, child_argv: Sequence[str], *, say: Callable[[str], None], warn: Callable[[str], None]
) -> None:
    import uvicorn

    from ..main import _bind, _exit_now, _url_host
    from ..protocol import MAX_CONNECTIONS, HeaderDeadlineProtocol
    from ..security import AccessPolicy, CorsPolicy, is_loopback, parse_keys
    from .catalog import discover
    from .instances import Instances
    from .routes import create_router_app

    srv = run.options.server
    access = AccessPolicy(
        api_keys=parse_keys(srv.api_keys, srv.api_key_file), loopback_only_hosts=is_loopback(srv.host)
    )
    cors = CorsPolicy.parse(srv.cors_origins, srv.cors_methods, srv.cors_headers, srv.cors_credentials)
    folder = Path(srv.models_dir)
    entries = discover(folder)
    if not entries:
        warn(f"--models-dir {folder}: no models in it (.gguf files, or folders of one model each)")
    sock = _bind(srv.host, srv.port)
    instances = Instances(entries, child_argv, max_instances=srv.models_max, autoload=srv.models_autoload, say=say)
    app = create_router_app(instances, access=access, cors=cors, access_log=not srv.log_disable)
    config = uvicorn.Config(
        app,
        log_level="warning",
        access_log=False,
        timeout_graceful_shutdown=srv.shutdown_grace,
        http=HeaderDeadlineProtocol,
        limit_concurrency=MAX_CONNECTIONS,
    )
    server = uvicorn.Server(config)
    limit = f"at most {srv.models_max} loaded at once" if srv.models_max else "no limit on how many are loaded"
    say(
        f"router: {len(entries)} model{'s' if len(entries) != 1 else ''} in {folder} ({limit}; "
        + ("loaded on a request's first use)" if srv.models_autoload else "loaded by POST /models/load only)")
    )
    say(f"mlxcel serve: router listening on http://{_url_host(srv.host)}:{sock.getsockname()[1]}")
    sys.stderr.flush()
    signal.signal(signal.SIGTERM, exit_on_signal)
    code = 0
    try:
        server.run(sockets=[sock])
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else 1
    except KeyboardInterrupt:
        sys.stderr.write("\ninterrupted\n")
        code = 130
    finally:
        instances.shutdown()
    _exit_now(code)
