"""The serve flags a router passes on to each model's server: the router's own command line less
what the router itself owns (its address and keys, CORS and the pages, the model folder and its
limits), read against serve's own option table so every flag's values travel with it."""

from __future__ import annotations

from collections.abc import Callable, Sequence

ROUTER_ONLY = {
    "--models-dir",
    "--models-max",
    "--models-autoload",
    "--no-models-autoload",
    "--host",
    "--port",
    "--api-key",
    "--api-key-file",
    "--alias",
    "--cors-origins",
    "--cors-methods",
    "--cors-headers",
    "--cors-credentials",
    "--no-cors-credentials",
    "--webui",
    "--no-webui",
    "--ui-mcp-proxy",
    "--webui-mcp-proxy",
    "--ui-mcp-proxy-allow",
}


def child_argv(argv: Sequence[str], command: Callable) -> list[str]:
    """`argv` (serve's arguments, after the command name) without the router's own flags."""
    import typer

    app = typer.Typer(add_completion=False)
    app.command()(command)
    click_cmd = typer.main.get_command(app)
    arity: dict[str, int] = {}
    names: dict[str, set[str]] = {}
    for p in click_cmd.params:
        opts = list(getattr(p, "opts", [])) + list(getattr(p, "secondary_opts", []))
        takes = 0 if getattr(p, "is_flag", False) or getattr(p, "count", False) else max(getattr(p, "nargs", 1), 1)
        for o in opts:
            arity[o] = takes
            names[o] = set(opts)
    out: list[str] = []
    i = 0
    while i < len(argv):
        token = argv[i]
        flag = token.split("=", 1)[0] if token.startswith("--") else token
        n = 0 if "=" in token and token.startswith("--") else arity.get(flag, 0)
        if flag in ROUTER_ONLY or names.get(flag, set()) & ROUTER_ONLY:
            i += 1 + n
            continue
        out.extend(argv[i : i + 1 + n])
        i += 1 + n
    return out


def serve_arguments(argv: Sequence[str]) -> list[str]:
    """This process's serve arguments: after `serve` (`mlxcel serve`, `python -m mlxcel_py serve`)
    or all of them (`mlxcel-server`)."""
    args = list(argv[1:])
    return args[1:] if args and args[0] == "serve" else args
