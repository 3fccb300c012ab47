"""llama-server's built-in agent tools, by name: read_file, file_glob_search, grep_search,
exec_shell_command, write_file, edit_file, get_info. Each is a definition (the OpenAI function
schema a client hands its model) and a call: `invoke(params, io, push)` returns the JSON result,
where a failure the model should read is `{"error": ...}` inside a 200, as llama-server answers.
`push` (exec_shell_command only) streams output as it comes.

The limits, answers and messages are llama-server's (16 KB reads and command output, 100 search
results, a 60 s command ceiling), so a client written for its web UI reads these the same way.
Where this differs, on purpose: a glob's `**/` also matches no folder at all, so `src/*.cpp` finds
`src/a.cpp` at the top of the tree (llama-server's matcher needs a folder before it).
"""

from __future__ import annotations

import base64
import os
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ...options import TOOL_NAMES
from .io import READ_LIMIT, ToolIO

READ_MAX = 16 * 1024
READ_MAX_BASE64 = 32 << 20
SEARCH_MAX = 100
EXEC_MAX_OUTPUT = 16 * 1024
EXEC_MAX_TIMEOUT = 60
INFO_TIMEOUT = 5


class ParamError(ValueError):
    """A missing or mistyped parameter: the request's fault (400)."""


def _param(params: dict, name: str, kind: type, default: Any = ...) -> Any:
    value = params.get(name, default)
    if value is ...:
        raise ParamError(f"'{name}' is required")
    if value is default and default is not ...:
        return value
    if kind is int and (isinstance(value, bool) or not isinstance(value, int)):
        raise ParamError(f"'{name}' must be an integer")
    if kind is not int and not isinstance(value, kind):
        raise ParamError(f"'{name}' must be a {kind.__name__}")
    return value


def _function(name: str, description: str, properties: dict, required: list[str]) -> dict:
    params: dict = {"type": "object", "properties": properties}
    if required:
        params["required"] = required
    return {"type": "function", "function": {"name": name, "description": description, "parameters": params}}


def _prop(kind: str, description: str) -> dict:
    return {"type": kind, "description": description}


@dataclass(frozen=True)
class Tool:
    name: str
    display_name: str
    definition: dict
    call: Callable[[dict, ToolIO, Callable[[str], bool] | None], dict | None]
    write: bool = False  # it changes files or runs commands
    stream: bool = False  # `stream: true` gets its output as it comes
    uses_cwd: bool = True
    kind: str = "server"  # or "mcp": an MCP server's tool (mcp.py)

    def describe(self) -> dict:
        """GET /tools' entry, llama-server's shape."""
        return {
            "display_name": self.display_name,
            "tool": self.name,
            "type": self.kind,
            "permissions": {"write": self.write},
            "uses_cwd": self.uses_cwd,
            "definition": self.definition,
        }


# ---- globs ---------------------------------------------------------------------------------------
def _glob_regex(pattern: str) -> re.Pattern:
    """`*` any characters but '/', `**` anything, `**/` any folders (none included), `?` one
    character but '/', `[...]` a class (`[!...]` negated)."""
    out, i = [], 0
    while i < len(pattern):
        c = pattern[i]
        if pattern.startswith("**/", i):
            out.append("(?:.*/)?")
            i += 3
        elif pattern.startswith("**", i):
            out.append(".*")
            i += 2
        elif c == "*":
            out.append("[^/]*")
            i += 1
        elif c == "?":
            out.append("[^/]")
            i += 1
        elif c == "[" and (end := pattern.find("]", i + 2)) != -1:
            body = pattern[i + 1 : end]
            neg = body[:1] in ("!", "^")
            body = body[1:] if neg else body
            out.append("[" + ("^" if neg else "") + body.replace("\\", "\\\\") + "]")
            i = end + 1
        else:
            out.append(re.escape(c))
            i += 1
    return re.compile("".join(out), re.DOTALL)


def path_matches(pattern: str, rel: str) -> bool:
    """No '/' in the pattern: the basename at any depth; else the whole path under the base,
    anchored with `**/` unless it starts with `**/` or '/' (then at the base)."""
    if "/" not in pattern:
        return _glob_regex(pattern).fullmatch(rel.rsplit("/", 1)[-1]) is not None
    if pattern.startswith("/"):
        pattern = pattern[1:]
    elif pattern != "**" and not pattern.startswith("**/"):
        pattern = "**/" + pattern
    return _glob_regex(pattern).fullmatch(rel) is not None


# ---- the tools -----------------------------------------------------------------------------------
def read_file(params: dict, io: ToolIO, _push=None) -> dict:
    path = _param(params, "path", str)
    start = _param(params, "start_line", int, 1)
    end = _param(params, "end_line", int, -1)
    numbered = _param(params, "append_loc", bool, False)
    size = io.size(path)
    if size is None:
        return {"error": f"cannot stat file: {path}"}
    if params.get("resp_type") == "base64":  # the x-resp-type header, never the model
        if size > READ_MAX_BASE64:
            return {"error": f"file too large ({size} bytes, max {READ_MAX_BASE64})"}
        data = io.read(path)
        if data is None:
            return {"error": f"failed to open file: {path}"}
        return {"base64": base64.b64encode(data).decode(), "size_bytes": len(data)}
    if size > READ_MAX and end == -1:
        return {"error": f"file too large ({size} bytes, max {READ_MAX}). Use start_line/end_line to read a portion."}
    if size > READ_LIMIT:  # llama-server reads any size for a range; a huge file must not fill memory
        return {"error": f"file too large ({size} bytes, max {READ_LIMIT} for a line range)"}
    data = io.read(path)
    if data is None:
        return {"error": f"failed to open file: {path}"}
    out: list[str] = []
    used = 0
    for n, line in enumerate(data.decode("utf-8", errors="replace").split("\n"), 1):
        if n == 1 + data.count(b"\n") and line == "":
            break  # the split's empty piece after a final newline is no line
        if n < start:
            continue
        if end != -1 and n > end:
            break
        piece = (f"{n}\u2192" if numbered else "") + line + "\n"
        if used + len(piece.encode()) > READ_MAX:
            out.append("[output truncated]")
            break
        out.append(piece)
        used += len(piece.encode())
    return {"plain_text_response": "".join(out)}


def file_glob_search(params: dict, io: ToolIO, _push=None) -> dict:
    path = _param(params, "path", str)
    include = _param(params, "include", str, "**")
    exclude = _param(params, "exclude", str, "")
    kind = _param(params, "type", str, "file")
    max_depth = max(0, _param(params, "max_depth", int, 0))
    limit = _param(params, "limit", int, SEARCH_MAX)
    if limit < 1:
        return {"error": f"invalid limit: {limit} (expected 1 or more)"}
    if kind not in ("file", "dir", "all"):
        return {"error": f'invalid type: {kind} (expected "file", "dir" or "all")'}
    base = io.resolve(path)
    listing = io.list(base, max_depth, kind)
    if listing.error:
        return {"error": f"{listing.error}: {path}"}
    matches = [
        (rel, is_dir)
        for rel, is_dir in listing.entries
        if path_matches(include, rel) and not (exclude and path_matches(exclude, rel))
    ]
    shown = matches[: min(limit, SEARCH_MAX)]
    text = "".join(rel + ("/" if is_dir else "") + "\n" for rel, is_dir in shown)
    text += f"\n---\nTotal matches: {len(matches)}\n"
    if len(matches) > len(shown):
        text += (
            f"[{len(shown)} results limit reached ({len(matches)} total matches). "
            "Refine the glob pattern to narrow the search.]\n"
        )
    if listing.truncated:
        text += "[results truncated: time budget or unreadable directory]\n"
    entries = [{"path": rel, "type": "dir" if is_dir else "file"} for rel, is_dir in shown]
    return {"plain_text_response": text, "entries": entries, "base": base}


def grep_search(params: dict, io: ToolIO, _push=None) -> dict:
    path = _param(params, "path", str)
    pattern = _param(params, "pattern", str)
    include = _param(params, "include", str, "**")
    exclude = _param(params, "exclude", str, "")
    numbers = _param(params, "return_line_numbers", bool, False)
    literal = _param(params, "literal", bool, False)
    ignore_case = _param(params, "ignore_case", bool, False)
    context = max(0, _param(params, "context_lines", int, 0))
    try:
        rx = re.compile(re.escape(pattern) if literal else pattern, re.IGNORECASE if ignore_case else 0)
    except re.error as exc:
        return {"error": f"invalid regex: {exc}"}
    full = io.resolve(path)
    if io.is_file(full):
        files = [(full, path)]
    elif io.is_dir(full):
        listing = io.list(full, 0, "file")
        if listing.error:
            return {"error": f"{listing.error}: {path}"}
        files = [
            (f"{full.rstrip('/')}/{rel}", rel)
            for rel, _ in listing.entries
            if path_matches(include, rel) and not (exclude and path_matches(exclude, rel))
        ]
    else:
        return {"error": f"path does not exist: {path}"}
    show_numbers = numbers or context > 0
    out: list[str] = []
    total, capped = 0, False
    for absolute, shown_as in files:
        if capped:
            break
        # an isolate's read stops at its own cap; a stat per file there would cost a command each.
        # Here a file larger than that is not read, nor an empty one: /proc's files say 0 bytes,
        # and some (kmsg) block a reader for good
        size = 1 if io.isolated else io.size(absolute)
        data = io.read(absolute) if size is not None and 0 < size <= READ_LIMIT else None
        if data is None:  # unreadable, empty, or too large to search
            continue
        lines = data.decode("utf-8", errors="replace").split("\n")
        if lines and lines[-1] == "":
            lines.pop()
        for i, line in enumerate(lines):
            if total >= SEARCH_MAX:
                capped = True
                break
            if not rx.search(line):
                continue
            for j in range(max(0, i - context), min(len(lines) - 1, i + context) + 1):
                mark = ":" if j == i else "-"
                out.append(f"{shown_as}{mark}" + (f"{j + 1}{mark}" if show_numbers else "") + lines[j] + "\n")
            if context:
                out.append("--\n")
            total += 1
    text = "".join(out) + f"\n---\nTotal matches: {total}\n"
    if capped:
        text += f"[{SEARCH_MAX} matches limit reached. Narrow the path/pattern/include to see more.]\n"
    return {"plain_text_response": text}


def exec_shell_command(params: dict, io: ToolIO, push: Callable[[str], bool] | None = None) -> dict | None:
    command = _param(params, "command", str)
    timeout = min(_param(params, "timeout", int, 10), EXEC_MAX_TIMEOUT)
    max_output = min(_param(params, "max_output_size", int, EXEC_MAX_OUTPUT), EXEC_MAX_OUTPUT)
    if timeout < 1 or max_output < 1:
        raise ParamError("'timeout' and 'max_output_size' must be positive")
    argv = ["sh", "-c", command]
    ran = io.run(argv, max_output, timeout, push)
    tail = f"\n[exit code: {ran.exit_code}]" + (" [exit due to timed out]" if ran.timed_out else "")
    if push is not None:
        push(tail)
        return None
    return {"plain_text_response": ran.output + tail}


def write_file(params: dict, io: ToolIO, _push=None) -> dict:
    path = _param(params, "path", str)
    content = _param(params, "content", str)
    data = content.encode()
    if not io.write(path, data):
        return {"error": f"failed to write file: {path}"}
    return {"result": "file written successfully", "path": path, "bytes": len(data)}


# characters a model writes for ASCII ones: smart quotes, dashes, the minus sign, special spaces
_FUZZY = str.maketrans(
    {
        **dict.fromkeys("\u2018\u2019\u201a\u201b", "'"),
        **dict.fromkeys("\u201c\u201d\u201e\u201f", '"'),
        **dict.fromkeys("\u2010\u2011\u2012\u2013\u2014\u2015\u2212", "-"),
        **dict.fromkeys("\u00a0\u2002\u2003\u2004\u2005\u2006\u2007\u2008\u2009\u200a\u202f\u205f\u3000", " "),
    }
)


def _fuzzy(text: str) -> str:
    """Each line without trailing blanks and with ASCII quotes, dashes and spaces (line count kept)."""
    return "\n".join(line.rstrip(" \t\r").translate(_FUZZY) for line in text.split("\n"))


def edit_file(params: dict, io: ToolIO, _push=None) -> dict:
    path = _param(params, "path", str)
    edits = params.get("edits")
    if not isinstance(edits, list) or not edits:
        return {"error": '"edits" must be a non-empty array'}
    pairs = []
    for i, e in enumerate(edits):
        if not isinstance(e, dict) or not isinstance(e.get("old_text"), str) or not isinstance(e.get("new_text"), str):
            raise ParamError(f"edits[{i}] must have string 'old_text' and 'new_text'")
        if not e["old_text"]:
            return {"error": f"edits[{i}].old_text must not be empty"}
        pairs.append((e["old_text"], e["new_text"]))
    data = io.read(path)
    if data is None:
        return {"error": f"failed to open file: {path}"}
    original = data.decode("utf-8", errors="surrogateescape")
    fuzzy_original = _fuzzy(original)
    any_fuzzy = False
    for i, (old, _) in enumerate(pairs):
        if old in original:
            continue
        if _fuzzy(old) not in fuzzy_original:
            return {
                "error": f"could not find edits[{i}].old_text in {path}, it must match the file's current content exactly"
            }
        any_fuzzy = True
    base = fuzzy_original if any_fuzzy else original
    found = []  # (where in base, length, edit index, new text)
    for i, (old, new) in enumerate(pairs):
        count = fuzzy_original.count(_fuzzy(old))  # a duplicate that differs in blanks still counts
        if count > 1:
            return {"error": f"found {count} occurrences of edits[{i}].old_text in {path}, it must be unique"}
        needle = _fuzzy(old) if any_fuzzy else old
        found.append((base.find(needle), len(needle), i, new))
    found.sort()
    for a, b in zip(found, found[1:]):
        if a[0] + a[1] > b[0]:
            return {
                "error": f"edits[{a[2]}] and edits[{b[2]}] overlap in {path}; "
                "merge them into one edit or target disjoint regions"
            }
    result = _replace_keeping_lines(original, base, found) if any_fuzzy else _replace(base, found)
    if result == original:
        return {"error": "no changes made: the replacement(s) produced identical content"}
    if not io.write(path, result.encode("utf-8", errors="surrogateescape")):
        return {"error": f"failed to write file: {path}"}
    return {"result": "file edited successfully", "path": path, "edits_applied": len(found)}


def _replace(text: str, found: list, offset: int = 0) -> str:
    for where, length, _, new in reversed(found):
        at = where - offset
        text = text[:at] + new + text[at + length :]
    return text


def _replace_keeping_lines(original: str, base: str, found: list) -> str:
    """Replacements found in the normalized text; the lines they do not touch come from the
    original, so a fuzzy match changes nothing else (no blanks stripped, no quotes rewritten)."""
    orig_lines = original.splitlines(keepends=True)
    spans, at = [], 0
    for line in base.splitlines(keepends=True):
        spans.append((at, at + len(line)))
        at += len(line)
    groups: list[list] = []  # [first line, end line (exclusive), replacements]
    for rep in found:
        start = next(i for i, (a, b) in enumerate(spans) if a <= rep[0] < b or (a == b == rep[0]))
        end = start
        while end < len(spans) - 1 and spans[end][1] < rep[0] + rep[1]:
            end += 1
        if groups and start < groups[-1][1]:
            groups[-1][1] = max(groups[-1][1], end + 1)
            groups[-1][2].append(rep)
        else:
            groups.append([start, end + 1, [rep]])
    out, kept = [], 0
    for first, last, reps in groups:
        out += orig_lines[kept:first]
        lo, hi = spans[first][0], spans[last - 1][1]
        out.append(_replace(base[lo:hi], reps, lo))
        kept = last
    out += orig_lines[kept:]
    return "".join(out)


def get_info(params: dict, io: ToolIO, _push=None) -> dict:
    ran = io.run(["uname", "-a"], 4096, INFO_TIMEOUT)
    system = ran.output.strip() if ran.exit_code == 0 and not ran.timed_out else "unknown"
    cwd = params.get("cwd") or ""
    if not cwd:
        if io.isolated:
            pwd = io.run(["pwd"], 4096, INFO_TIMEOUT)
            cwd = pwd.output.strip() if pwd.exit_code == 0 and not pwd.timed_out else "unknown"
        else:
            cwd = os.getcwd()
    return {"os": system, "cwd": cwd}


TOOLS: dict[str, Tool] = {
    t.name: t
    for t in (
        Tool(
            "read_file",
            "Read file",
            _function(
                "read_file",
                "Read the contents of a file. Optionally specify a 1-based line range. If append_loc is true, "
                'each line is prefixed with its line number (e.g. "1\u2192...").',
                {
                    "path": _prop("string", "Path to the file"),
                    "start_line": _prop("integer", "First line to read, 1-based (default: 1)"),
                    "end_line": _prop("integer", "Last line to read, 1-based inclusive (default: end of file)"),
                    "append_loc": _prop("boolean", "Prefix each line with its line number"),
                },
                ["path"],
            ),
            read_file,
        ),
        Tool(
            "file_glob_search",
            "File search",
            _function(
                "file_glob_search",
                "Recursively search for files matching a glob pattern under a directory. Skips files ignored "
                "by .gitignore (inside a git repo) and common junk directories (.git, node_modules, build, "
                "dist, etc.). A pattern with no '/' (e.g. \"*.cpp\") matches the basename at any depth; one "
                "with '/' matches the relative path, anchored with \"**/\" unless it starts with \"**/\" or '/'. "
                'Use type="dir" or "all" to list directories too (suffixed with \'/\' in the output).',
                {
                    "path": _prop("string", "Base directory to search in"),
                    "include": _prop("string", 'Glob pattern for files to include (e.g. "*.cpp"). Default: **'),
                    "exclude": _prop("string", "Glob pattern for files to exclude"),
                    "type": _prop("string", 'Entry type to return: "file" (default), "dir" or "all"'),
                    "max_depth": _prop("integer", "Maximum depth (default: 0 = unlimited; 1 = direct children)"),
                    "limit": _prop("integer", f"Maximum number of results, capped at {SEARCH_MAX}"),
                },
                ["path"],
            ),
            file_glob_search,
        ),
        Tool(
            "grep_search",
            "Grep search",
            _function(
                "grep_search",
                "Search for a pattern in files under a path. Returns matching lines with file paths (relative "
                "to the given directory). Skips files ignored by .gitignore and common junk directories.",
                {
                    "path": _prop("string", "File or directory to search in"),
                    "pattern": _prop("string", "Pattern to search for (regular expression unless literal is true)"),
                    "include": _prop("string", "Glob pattern to filter files (default: **)"),
                    "exclude": _prop("string", "Glob pattern to exclude files"),
                    "return_line_numbers": _prop("boolean", "If true, include line numbers in results"),
                    "literal": _prop("boolean", "Treat pattern as a literal string (default: false)"),
                    "ignore_case": _prop("boolean", "Case-insensitive search (default: false)"),
                    "context_lines": _prop("integer", "Lines of context before and after each match (default: 0)"),
                },
                ["path", "pattern"],
            ),
            grep_search,
        ),
        Tool(
            "exec_shell_command",
            "Execute shell command",
            _function(
                "exec_shell_command",
                "Execute a shell command and return its output (stdout and stderr combined).",
                {
                    "command": _prop("string", "Shell command to execute"),
                    "timeout": _prop("integer", f"Timeout in seconds (default 10, max {EXEC_MAX_TIMEOUT})"),
                    "max_output_size": _prop("integer", f"Maximum output size in bytes (default {EXEC_MAX_OUTPUT})"),
                },
                ["command"],
            ),
            exec_shell_command,
            write=True,
            stream=True,
        ),
        Tool(
            "write_file",
            "Write file",
            _function(
                "write_file",
                "Write content to a file, creating it (including parent directories) if it does not exist. "
                "May use with edit_file for more complex edits.",
                {"path": _prop("string", "Path of the file to write"), "content": _prop("string", "Content to write")},
                ["path", "content"],
            ),
            write_file,
            write=True,
        ),
        Tool(
            "edit_file",
            "Edit file",
            _function(
                "edit_file",
                "Edit a file using exact text replacement. Each edits[].old_text must be unique in the file and is "
                "matched against the original content, not incrementally. Merge nearby changes into one edit "
                "instead of overlapping edits. Use write_file to replace the whole file.",
                {
                    "path": _prop("string", "Path to the file to edit"),
                    "edits": {
                        "type": "array",
                        "description": "One or more exact text replacements to apply",
                        "items": {
                            "type": "object",
                            "properties": {
                                "old_text": _prop("string", "Exact text to find; unique in the file, not overlapping"),
                                "new_text": _prop("string", "Text to replace old_text with"),
                            },
                            "required": ["old_text", "new_text"],
                        },
                    },
                },
                ["path", "edits"],
            ),
            edit_file,
            write=True,
        ),
        Tool(
            "get_info",
            "Get Runtime Info",
            _function(
                "get_info", "Returns runtime info: the OS name/version and the current working directory", {}, []
            ),
            get_info,
        ),
    )
}


assert tuple(TOOLS) == TOOL_NAMES  # the flag's names (options.py) are these tools


def select(names: tuple[str, ...]) -> list[Tool]:
    """The tools `--tools` names ("all": every one), in llama-server's order."""
    return [t for t in TOOLS.values() if "all" in names or t.name in names]
