"""Run the router: read the folder, bind, serve until a signal, then stop every model's process."""

from __future__ import annotations

import sys
from collections.abc import Callable, Sequence
from dataclasses import replace
from pathlib import Path

from ...errors import MlxcelError
from ...models.hub_cache import cache_root
from ...options import RunConfig
from ..http import ApiError
from .catalog import Entry, Preset


def run_router(
    run: RunConfig,
    child_argv: Sequence[str],
    *,
    preset: Preset | None = None,
    read_preset: Callable[[], Preset] | None = None,
    say: Callable[[str], None],
    warn: Callable[[str], None],
) -> None:
    """Serve the models of --models-dir and --models-preset (`preset`, read by the command;
    `read_preset` reads it again for GET /models?reload=1) until a signal; every model's server
    gets `child_argv` after the preset's flags."""

    from ..main import (
        _bind,
        _exit_now,
        listening,
        policies,
        serve_until_signal,
        server_tools,
        stopping_server,
        uvicorn_config,
    )
    from .instances import Instances
    from .routes import create_router_app

    srv = run.options.server
    access, cors = policies(srv, warn)
    preset = preset or Preset()
    root = cache_root()
    entries = entries_of(srv.models_dir, preset, root, warn)
    where = " and ".join(f for f in (srv.models_dir, srv.models_preset, f"the Hugging Face cache ({root})") if f)
    if not entries:
        warn(f"{where}: no models there (.gguf files, folders of one model each, or preset sections with model = PATH)")
    for name in sorted(set(preset.flags) - {"*"} - {e.id for e in entries} - set(preset.hf)):
        warn(f"--models-preset: [{name}] names no model of the folder and gives no model = PATH; it is ignored")
    socks = _bind(srv.host, srv.port)
    instances = Instances(
        entries, child_argv, max_instances=srv.models_max, autoload=srv.models_autoload, say=say, preset=preset
    )

    def reread() -> tuple[list[Entry], Preset]:  # GET /models?reload=1
        try:
            again = read_preset() if read_preset is not None else preset
        except MlxcelError as exc:  # the file was edited into something wrong: the list stays
            raise ApiError(exc.message) from None
        return entries_of(srv.models_dir, again, root, warn), again

    app = create_router_app(
        instances,
        access=access,
        cors=cors,
        access_log=not srv.log_disable,
        reload=reread,
        webui=srv.webui,
        cache=root,
    )
    tools = app.state.tools = server_tools(srv, say, warn, cors.relaxed and not access.api_keys)
    server = stopping_server(uvicorn_config(app, srv), app)  # MCP calls in flight end at SIGTERM
    limit = f"at most {srv.models_max} loaded at once" if srv.models_max else "no limit on how many are loaded"
    say(
        f"router: {len(entries)} model{'s' if len(entries) != 1 else ''} from {where} ({limit}; "
        + ("loaded on a request's first use)" if srv.models_autoload else "loaded by POST /models/load only)")
    )
    url, others = listening(srv.host, socks)
    say(f"mlxcel serve: router listening on {url}{others}")
    sys.stderr.flush()

    def shutdown() -> None:
        if tools is not None:
            tools.close()
        instances.shutdown()

    _exit_now(serve_until_signal(server, socks, shutdown))


def entries_of(models_dir: str | None, preset: Preset, root: Path, warn: Callable[[str], None]) -> list[Entry]:
    """The folder's models, the preset's own (`model = PATH`, or `hf-repo` found in the cache), then
    the cache's (llama-server lists all three). A preset's `spec-draft-hf` becomes its model's
    drafter; with `dedup-cache-models` the cache entries it uses are left out of the list."""
    from ...models import hub_cache
    from .catalog import discover

    found = discover(Path(models_dir)) if models_dir else []
    known = {e.id for e in found}
    out = found + [Entry(n, Path(p), source="preset") for n, p in preset.paths.items() if n not in known]
    used: set[Path] = set()  # cache files a dedup-cache-models preset stands for

    def cached(name: str, key: str, spec: str, file: str | None, missing: str) -> Path | None:
        path = hub_cache.resolve(root, spec, file)
        if path is None:
            warn(f"--models-preset: [{name}] {key} {spec}: not in the Hugging Face cache ({root}); {missing}")
        elif preset.dedups(name):
            used.add(path)
        return path

    for name, spec in preset.hf.items():
        get_it = f'download it (POST /models {{"model": "{spec}"}}), then GET /models?reload=1'
        path = cached(name, "hf-repo", spec, preset.hf_file.get(name), get_it)
        if path is not None and name not in known:
            out.append(Entry(name, path, source="preset"))
    drafts = {
        name: path
        for name, spec in preset.draft_hf.items()
        if (path := cached(name, "spec-draft-hf", spec, None, "not drafting")) is not None
    }
    out = [replace(e, draft=drafts[e.id]) if e.id in drafts else e for e in out]
    taken = {e.id for e in out}
    for m in hub_cache.models(root):
        if m.id not in taken:
            out.append(Entry(m.id, m.path, m.mmproj, source="cache", listed=m.path not in used))
    return out
