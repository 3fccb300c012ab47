"""Defaults from a TOML file (`~/.config/mlxcel/config.toml` or `--config FILE`).

Top-level keys apply to every command that has that option; a `[generate]`, `[run]`, `[chat]`,
`[serve]` or `[bench]` table applies to that command only. Keys are option names with or without
dashes (`max-tokens` or `max_tokens`). Command-line flags win (the values become Click defaults).
Unknown keys and wrong types are errors naming the file and the key. No typer import here: the
caller passes each command's option names and kinds.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import tomli

from .errors import UsageError
from .inputs.files import MIB, UnreadableFile, read_text

CONFIG_LIMIT = MIB  # bytes of a config file


def load_toml(path: Path) -> dict:
    try:
        return tomli.loads(read_text(path, CONFIG_LIMIT))
    except UnreadableFile as exc:
        hint = f"; name the TOML file (for example {path}/config.toml)" if "folder" in str(exc) else ""
        raise UsageError(f"--config {path}: {exc}{hint}") from None
    except tomli.TOMLDecodeError as exc:
        raise UsageError(f"config file {path}: invalid TOML ({exc})") from None


def _check_type(path: Path, key: str, value: Any, kind: str, multiple: bool) -> Any:
    if multiple:
        if not isinstance(value, list):
            value = [value]
        return [_check_type(path, key, v, kind, False) for v in value]
    ok = {
        "bool": isinstance(value, bool),
        "int": isinstance(value, int) and not isinstance(value, bool),
        "float": isinstance(value, (int, float)) and not isinstance(value, bool),
        "str": isinstance(value, str),
    }.get(kind, True)
    if not ok:
        raise UsageError(f"config file {path}: key '{key}' must be a {kind}, got {type(value).__name__} {value!r}")
    return value


def default_maps(path: Path, data: dict, options: dict[str, dict[str, tuple[str, bool]]]) -> dict[str, dict]:
    """Turn parsed TOML into Click default maps. `options[cmd][name] = (kind, multiple)`."""
    maps: dict[str, dict] = {cmd: {} for cmd in options}

    def apply(cmd_names: list[str], key: str, value: Any, where: str) -> None:
        name = key.replace("-", "_")
        hit = False
        for cmd in cmd_names:
            if name in options[cmd]:
                kind, multiple = options[cmd][name]
                maps[cmd][name] = _check_type(path, key, value, kind, multiple)
                hit = True
        if not hit:
            raise UsageError(
                f"config file {path}: unknown key '{key}'{where}; keys are option names such as max-tokens"
            )

    for key, value in data.items():
        if key in options and isinstance(value, dict):
            for k, v in value.items():
                apply([key], k, v, f" in [{key}]")
        else:
            apply(list(options), key, value, "")
    return maps
