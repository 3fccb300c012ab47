"""What a router passes on to each model's server, read against serve's own option table so every
flag's values travel with it:

- its own command line less what the router itself owns (its address and keys, CORS and the
  pages, the model folder and its limits);
- a `--models-preset` INI file (llama-server's): `[*]` flags for every model, `[ID]` flags for
  one model (a section naming no model of the folder needs `model = PATH` and makes one), keys
  spelled as flags without their dashes (`c`, `ctx-size`, `temp`, `draft-model`...), `true` /
  `false` for switches, and the preset-only `load-on-startup` and `stop-timeout`. The command
  line wins over a model's section, which wins over `[*]`: the flags go to the model's server
  in that order and the last spelling of a flag counts.
"""

from __future__ import annotations

import configparser
from collections.abc import Callable, Sequence
from pathlib import Path

from ..errors import UsageError
from ..server.router.catalog import Preset

ROUTER_ONLY = {
    "--models-dir",
    "--models-max",
    "--models-preset",
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
    "--tools",  # the router serves /tools itself (where the web UI calls them)
    "--tools-runtime",
    "--mcp-servers-config",
    "--mcp-servers-json",
    "--model",
    "-m",
    "--hf-repo",  # a preset repo's own name (its preset names the models)
    "--hf-file",
}
PRESET_ONLY = ("load-on-startup", "stop-timeout", "dedup-cache-models")
ON, OFF = ("true", "1", "yes", "on"), ("false", "0", "no", "off")  # a switch's values in a preset
# llama-server's Hugging Face keys: a model (or its drafter) from the cache, by OWNER/NAME[:QUANT]
HF_REPO = ("hf-repo", "hf", "hfr")
HF_FILE = ("hf-file", "hff")
DRAFT_HF = ("spec-draft-hf", "hfd", "hfrd", "hf-repo-draft")


class _Table:
    """serve's options by every spelling: how many values each takes, and its other spellings."""

    def __init__(self, command: Callable):
        import typer

        app = typer.Typer(add_completion=False)
        app.command()(command)
        self.arity: dict[str, int] = {}
        self.names: dict[str, set[str]] = {}
        self.negation: dict[str, str] = {}  # a switch's --flag -> its --no-flag, where it has one
        for p in typer.main.get_command(app).params:
            opts, secondary = list(getattr(p, "opts", [])), list(getattr(p, "secondary_opts", []))
            switch = getattr(p, "is_flag", False) or getattr(p, "count", False)
            takes = 0 if switch else max(getattr(p, "nargs", 1), 1)
            for o in opts + secondary:
                self.arity[o] = takes
                self.names[o] = set(opts + secondary)
            if switch and secondary:
                for o in opts:
                    self.negation[o] = secondary[0]

    def owned_by_router(self, flag: str) -> bool:
        return flag in ROUTER_ONLY or bool(self.names.get(flag, set()) & ROUTER_ONLY)

    def flag_of(self, key: str) -> str | None:
        for spelled in (f"--{key}", f"-{key}"):
            if spelled in self.arity:
                return spelled
        return None


def child_argv(argv: Sequence[str], command: Callable) -> list[str]:
    """`argv` (serve's arguments, after the command name) without the router's own flags."""
    table = _Table(command)
    out: list[str] = []
    i = 0
    while i < len(argv):
        token = argv[i]
        flag = token.split("=", 1)[0] if token.startswith("--") else token
        n = 0 if "=" in token and token.startswith("--") else table.arity.get(flag, 0)
        if not table.owned_by_router(flag):
            out.extend(argv[i : i + 1 + n])
        i += 1 + n
    return out


def read_preset(path: str | None, command: Callable) -> Preset:
    """A --models-preset file as flags per model (exit 2 naming the section and key at fault)."""
    if path is None:
        return Preset()
    where = f"--models-preset {path}"
    try:
        text = Path(path).read_text()
    except OSError as exc:
        raise UsageError(f"{where}: cannot read it ({exc.strerror or exc})") from None
    parser = configparser.ConfigParser(interpolation=None, default_section="\x00none")
    parser.optionxform = str  # keys as written (flags are case-sensitive: -c, -C)
    try:
        parser.read_string("[\x00top]\n" + text)  # `version = 1` sits above every section
    except configparser.Error as exc:
        raise UsageError(f"{where}: not an INI file ({str(exc).splitlines()[0]})") from None
    table = _Table(command)
    preset = Preset()
    for section in parser.sections():
        if section == "\x00top":
            continue
        flags: list[str] = []
        for key, value in parser.items(section):
            key = key.strip()
            if key in PRESET_ONLY:
                _preset_only(preset, where, section, key, value)
                continue
            if key == "model" and section != "*":
                preset.paths[section] = value.strip()
                continue
            if key in HF_REPO + HF_FILE + DRAFT_HF:
                _hf_key(preset, where, section, key, value.strip())
                continue
            flag = table.flag_of(key)
            if flag is None:
                raise UsageError(f"{where}: [{section}] {key}: not a serve flag (keys are flags without their dashes)")
            if table.owned_by_router(flag):
                raise UsageError(f"{where}: [{section}] {key}: the router sets it for every model; drop it")
            flags += _as_flags(where, section, key, flag, value.strip(), table)
        preset.flags[section] = flags
    for section in preset.hf:
        if section in preset.paths:
            raise UsageError(f"{where}: [{section}] gives both model and hf-repo; keep one")
    for section in set(preset.hf_file) - set(preset.hf):
        raise UsageError(f"{where}: [{section}] hf-file names a file of hf-repo, which the section lacks")
    return preset


def _hf_key(preset: Preset, where: str, section: str, key: str, value: str) -> None:
    from ..models.hub_cache import split_spec

    if section == "*":
        raise UsageError(f"{where}: [*] {key}: a repo names one model; give it in that model's section")
    if key in HF_FILE:
        preset.hf_file[section] = value
        return
    try:
        split_spec(value)
    except ValueError as exc:
        raise UsageError(f"{where}: [{section}] {key}: {exc}") from None
    if key in DRAFT_HF:
        preset.draft_hf[section] = value
    else:
        preset.hf[section] = value


def _as_flags(where: str, section: str, key: str, flag: str, value: str, table: _Table) -> list[str]:
    if table.arity[flag] > 0:
        return [flag, value]
    on = value.lower()
    if on in (*ON, ""):
        return [flag]
    if on in OFF:
        negation = table.negation.get(flag)
        return [negation] if negation else []
    raise UsageError(f"{where}: [{section}] {key} is a switch: true or false, got {value[:40]!r}")


def _preset_only(preset: Preset, where: str, section: str, key: str, value: str) -> None:
    if key in ("load-on-startup", "dedup-cache-models"):
        on = value.strip().lower()
        if on not in ON + OFF:
            raise UsageError(f"{where}: [{section}] {key} is a switch: true or false, got {value[:40]!r}")
        if on in ON:
            (preset.startup if key == "load-on-startup" else preset.dedup).add(section)
        return
    try:
        seconds = float(value)
    except ValueError:
        seconds = -1.0
    if not seconds > 0:
        raise UsageError(f"{where}: [{section}] stop-timeout must be a number of seconds above 0, got {value!r}")
    preset.stop_timeout[section] = seconds


def serve_arguments(argv: Sequence[str]) -> list[str]:
    """This process's serve arguments: after `serve` (`mlxcel serve`, `python -m mlxcel_py serve`)
    or all of them (`mlxcel-server`)."""
    args = list(argv[1:])
    return args[1:] if args and args[0] == "serve" else args
