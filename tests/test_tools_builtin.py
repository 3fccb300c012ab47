"""serve --tools: llama-server's built-in agent tools (server/tools/). The tools on real files and
processes (this host, and an isolate driven through a stand-in container engine that runs the
command here), the HTTP routes in-process, then the real server over a socket: the key, a
streamed command, and a client that leaves stopping its command. llama.cpp's own
test_tools_builtin.py passes against this server too (scripts/llama_cpp_suite.py)."""

from __future__ import annotations

import base64
import json
import os
import socket
import subprocess
import time
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from mlxcel_py.server.tools import ServerTools, select
from mlxcel_py.server.tools.builtin import (
    READ_MAX,
    ParamError,
    edit_file,
    exec_shell_command,
    file_glob_search,
    get_info,
    grep_search,
    path_matches,
    read_file,
    write_file,
)
from mlxcel_py.server.tools.io import READ_LIMIT, ContainerIO, HostIO, ToolRuntimeError, make_io


@pytest.fixture
def tree(tmp_path) -> Path:
    (tmp_path / "project-alpha" / "src").mkdir(parents=True)
    (tmp_path / "project-alpha" / "README.md").write_text("alpha\n")
    (tmp_path / "project-alpha" / "src" / "main.cpp").write_text("int main() {}\n// TODO fix\n")
    (tmp_path / "build" / "nested").mkdir(parents=True)
    (tmp_path / "build" / "artifact.txt").write_text("TODO built\n")
    (tmp_path / "notes.txt").write_text("one\nTODO two\nthree\nfour\n")
    return tmp_path


def _paths(result: dict) -> list[str]:
    return [e["path"] for e in result["entries"]]


def test_read_file_ranges_numbers_limits_and_base64(tree):
    io = HostIO(str(tree))
    assert read_file({"path": "notes.txt"}, io)["plain_text_response"] == "one\nTODO two\nthree\nfour\n"
    part = read_file({"path": "notes.txt", "start_line": 2, "end_line": 3, "append_loc": True}, io)
    assert part["plain_text_response"] == "2\u2192TODO two\n3\u2192three\n"
    (tree / "big.txt").write_text("x" * 100 + "\n" + ("y" * 99 + "\n") * 400)
    assert "file too large" in read_file({"path": "big.txt"}, io)["error"]
    capped = read_file({"path": "big.txt", "start_line": 1, "end_line": 400}, io)["plain_text_response"]
    assert capped.endswith("[output truncated]") and len(capped.encode()) <= READ_MAX + 20
    raw = read_file({"path": "big.txt", "resp_type": "base64"}, io)
    assert base64.b64decode(raw["base64"]) == (tree / "big.txt").read_bytes()
    assert read_file({"path": "missing.txt"}, io) == {"error": "cannot stat file: missing.txt"}
    with open(tree / "huge.log", "wb") as f:  # sparse: no disk used; never loaded into memory whole
        f.truncate(READ_LIMIT + 1)
    assert "max 67108864 for a line range" in read_file({"path": "huge.log", "end_line": 2}, io)["error"]
    assert "Total matches: 0" in grep_search({"path": "huge.log", "pattern": "x"}, io)["plain_text_response"]
    assert io.read("huge.log") is None  # never a cut copy
    # a device reports 0 bytes and never ends: it is no file to read
    assert io.size("/dev/zero") is None and io.read("/dev/zero") is None
    assert read_file({"path": "/dev/zero"}, io) == {"error": "cannot stat file: /dev/zero"}
    with pytest.raises(ParamError, match="'path' is required"):
        read_file({}, io)
    with pytest.raises(ParamError, match="'start_line' must be an integer"):
        read_file({"path": "notes.txt", "start_line": "2"}, io)


def test_write_then_edit_exactly_fuzzily_and_the_refusals(tree):
    io = HostIO(str(tree))
    assert write_file({"path": "sub/log.txt", "content": "line1\nline2\nline3\n"}, io)["bytes"] == 18
    edits = [{"old_text": "line2", "new_text": "line2-edited"}, {"old_text": "line3\n", "new_text": "line3\nline4\n"}]
    assert edit_file({"path": "sub/log.txt", "edits": edits}, io)["edits_applied"] == 2
    assert (tree / "sub" / "log.txt").read_text() == "line1\nline2-edited\nline3\nline4\n"
    # a model's smart quotes and trailing blanks still find the line; the lines it does not touch stay as they were
    (tree / "q.py").write_text('a = "x"   \nprint("hi")\t\nz = 1\n')
    out = edit_file({"path": "q.py", "edits": [{"old_text": "print(\u201chi\u201d)", "new_text": "print('bye')"}]}, io)
    assert out["result"] == "file edited successfully"
    assert (tree / "q.py").read_text() == "a = \"x\"   \nprint('bye')\nz = 1\n"
    (tree / "d.txt").write_text("dup\ndup\n")
    assert (
        "must be unique" in edit_file({"path": "d.txt", "edits": [{"old_text": "dup", "new_text": "x"}]}, io)["error"]
    )
    (tree / "o.txt").write_text("line1\nline2\n")
    overlap = [{"old_text": "line1\nline2", "new_text": "a"}, {"old_text": "line2", "new_text": "b"}]
    assert "overlap" in edit_file({"path": "o.txt", "edits": overlap}, io)["error"]
    missing = edit_file({"path": "o.txt", "edits": [{"old_text": "nope", "new_text": "b"}]}, io)
    assert "could not find edits[0].old_text" in missing["error"]
    same = edit_file({"path": "o.txt", "edits": [{"old_text": "line1", "new_text": "line1"}]}, io)
    assert "no changes made" in same["error"]
    assert edit_file({"path": "o.txt", "edits": []}, io)["error"] == '"edits" must be a non-empty array'
    assert (tree / "o.txt").read_text() == "line1\nline2\n"  # every refusal left the file alone


def test_glob_search_kinds_depths_limits_and_junk_folders(tree):
    io = HostIO()
    files = file_glob_search({"path": str(tree)}, io)
    assert sorted(_paths(files)) == ["notes.txt", "project-alpha/README.md", "project-alpha/src/main.cpp"]
    assert files["base"] == str(tree)  # build/ is junk: never walked
    dirs = file_glob_search({"path": str(tree), "type": "dir"}, io)
    assert {"project-alpha", "project-alpha/src", "build"} == set(_paths(dirs)) and "project-alpha/" in dirs[
        "plain_text_response"
    ]
    assert _paths(file_glob_search({"path": str(tree), "max_depth": 1}, io)) == ["notes.txt"]
    limited = file_glob_search({"path": str(tree), "limit": 1}, io)
    assert len(limited["entries"]) == 1 and "Total matches: 3" in limited["plain_text_response"]
    assert _paths(file_glob_search({"path": str(tree), "include": "src/*.cpp"}, io)) == ["project-alpha/src/main.cpp"]
    assert _paths(file_glob_search({"path": str(tree), "include": "*.md", "exclude": "project-*/*"}, io)) == []
    assert "invalid type" in file_glob_search({"path": str(tree), "type": "bogus"}, io)["error"]
    assert "invalid limit" in file_glob_search({"path": str(tree), "limit": 0}, io)["error"]
    assert "not a directory" in file_glob_search({"path": str(tree / "nope")}, io)["error"]


def test_glob_search_in_a_git_repository_follows_gitignore(tree):
    subprocess.run(["git", "init", "-q", str(tree)], check=True)
    (tree / ".gitignore").write_text("notes.txt\n")
    got = _paths(file_glob_search({"path": str(tree)}, HostIO()))
    assert "notes.txt" not in got and "project-alpha/src/main.cpp" in got and ".gitignore" in got


def test_glob_patterns():
    assert path_matches("*.cpp", "a/b/c.cpp") and not path_matches("*.cpp", "a/b/c.cc")
    assert path_matches("src/*.cpp", "src/a.cpp") and path_matches("src/*.cpp", "x/src/a.cpp")
    assert not path_matches("src/*.cpp", "src/x/a.cpp") and path_matches("src/**", "src/x/a.cpp")
    assert path_matches("/top.txt", "top.txt") and not path_matches("/top.txt", "a/top.txt")
    assert path_matches("[!a]*.txt", "b.txt") and not path_matches("[!a]*.txt", "a.txt")
    assert path_matches("?.txt", "b.txt") and not path_matches("?.txt", "bb.txt")


def test_grep_search_matches_context_and_limits(tree):
    io = HostIO(str(tree))
    out = grep_search({"path": ".", "pattern": "TODO", "return_line_numbers": True}, io)["plain_text_response"]
    assert "notes.txt:2:TODO two" in out and "project-alpha/src/main.cpp:2:// TODO fix" in out
    assert "artifact" not in out and "Total matches: 2" in out  # build/ is junk
    ctx = grep_search({"path": "notes.txt", "pattern": "two", "context_lines": 1}, io)["plain_text_response"]
    assert ctx.startswith("notes.txt-1-one\nnotes.txt:2:TODO two\nnotes.txt-3-three\n--\n")
    assert (
        "Total matches: 1"
        in grep_search({"path": ".", "pattern": "todo two", "ignore_case": True}, io)["plain_text_response"]
    )
    literal = grep_search({"path": ".", "pattern": "main()", "literal": True}, io)["plain_text_response"]
    assert "main.cpp:int main() {}" in literal and "Total matches: 1" in literal
    assert "invalid regex" in grep_search({"path": ".", "pattern": "("}, io)["error"]
    assert grep_search({"path": "nope", "pattern": "x"}, io) == {"error": "path does not exist: nope"}
    (tree / "many.txt").write_text("hit\n" * 150)
    capped = grep_search({"path": "many.txt", "pattern": "hit"}, io)["plain_text_response"]
    assert "Total matches: 100" in capped and "100 matches limit reached" in capped


def test_exec_shell_command_output_exit_code_timeout_and_cap(tree):
    io = HostIO(str(tree))
    out = exec_shell_command({"command": "pwd; echo oops >&2; exit 3"}, io)["plain_text_response"]
    assert out == f"{tree}\noops\n\n[exit code: 3]"
    start = time.monotonic()
    slow = exec_shell_command({"command": "echo a; sleep 30", "timeout": 1}, io)["plain_text_response"]
    assert time.monotonic() - start < 10 and slow.startswith("a\n") and "[exit due to timed out]" in slow
    big = exec_shell_command({"command": "yes | head -c 100000", "max_output_size": 1000}, io)["plain_text_response"]
    assert big.startswith("y\n") and "[output truncated]" in big and "[exit code: 0]" in big and len(big) < 1100
    pieces: list[str] = []
    assert exec_shell_command({"command": "echo hello"}, io, lambda c: pieces.append(c) or True) is None
    assert "".join(pieces) == "hello\n\n[exit code: 0]"
    info = get_info({}, io)
    assert info["os"].startswith(os.uname().sysname) and info["cwd"] == os.getcwd()


@pytest.fixture
def engine(tmp_path) -> str:
    """A stand-in for `docker`: `engine exec [-i] ID CMD...` runs CMD here, so the isolate's
    commands (sh, cat, wc, mkdir, find, timeout) run for real."""
    path = tmp_path / "fake-engine"
    path.write_text('#!/bin/sh\nshift\n[ "$1" = "-i" ] && shift\nshift\nexec "$@"\n')
    path.chmod(0o755)
    return str(path)


def test_an_isolate_reads_writes_lists_and_runs_through_its_engine(tree, engine):
    io = ContainerIO(engine, "abc123", str(tree))
    assert write_file({"path": "deep/new.txt", "content": "in the box\n"}, io)["result"] == "file written successfully"
    assert (tree / "deep" / "new.txt").read_text() == "in the box\n"
    assert read_file({"path": "deep/new.txt"}, io)["plain_text_response"] == "in the box\n"
    edit = edit_file({"path": "deep/new.txt", "edits": [{"old_text": "box", "new_text": "crate"}]}, io)
    assert edit["edits_applied"] == 1 and (tree / "deep" / "new.txt").read_text() == "in the crate\n"
    found = file_glob_search({"path": ".", "type": "all"}, io)
    assert {"deep", "deep/new.txt", "notes.txt", "project-alpha/src/main.cpp"} <= set(_paths(found))
    assert "build/artifact.txt" not in _paths(found)
    assert "notes.txt:TODO two" in grep_search({"path": ".", "pattern": "TODO t"}, io)["plain_text_response"]
    ran = exec_shell_command({"command": "pwd; echo hi"}, io)["plain_text_response"]
    assert ran == f"{tree}\nhi\n\n[exit code: 0]"
    assert "[exit due to timed out]" not in ran
    assert get_info({}, io)["cwd"] == str(tree)


def test_runtimes_are_checked_before_anything_runs():
    assert isinstance(make_io(), HostIO)
    for spec, message in (
        ("fake:does-not-exist", "unknown tool runtime"),
        ("ssh:-oProxyCommand=touch /tmp/pwned", "invalid ssh target"),
        ("docker-container:--privileged", "invalid container id"),
        ("podman-container:", "invalid container id"),
        ("docker:busybox", "must name a running container"),
    ):
        with pytest.raises(ToolRuntimeError, match=message):
            make_io(runtime=spec)
    assert make_io(runtime="ssh:user@host.example").argv(["echo", "a b"], False)[-2:] == [
        "user@host.example",
        "echo 'a b'",
    ]


def _app(tools: ServerTools | None, **kw):
    from mlxcel_py.server.app import create_app

    app = create_app(**kw)
    app.state.tools = tools
    return TestClient(app, raise_server_exceptions=False)


def test_routes_list_call_stream_and_refuse(tree):
    off = _app(None)
    assert off.get("/tools").status_code == 403 and "--tools" in off.post("/tools", json={}).json()["error"]["message"]
    client = _app(ServerTools(select(("read_file", "exec_shell_command"))))
    listed = client.get("/tools").json()
    assert [t["tool"] for t in listed] == ["read_file", "exec_shell_command"]
    assert listed[1]["permissions"] == {"write": True} and listed[1]["definition"]["function"]["name"]
    # the header's folder, not the model's
    headers = {"x-tool-cwd": str(tree)}
    body = {"tool": "read_file", "params": {"path": "notes.txt", "cwd": "/no/such/place"}}
    assert client.post("/tools", json=body, headers=headers).json()["plain_text_response"].startswith("one\n")
    raw = client.post("/tools", json=body, headers={**headers, "x-resp-type": "base64"}).json()
    assert base64.b64decode(raw["base64"]) == (tree / "notes.txt").read_bytes()
    with client.stream(
        "POST", "/tools", json={"tool": "exec_shell_command", "params": {"command": "echo hello"}, "stream": True}
    ) as r:
        events = [json.loads(line[6:]) for line in r.iter_lines() if line.startswith("data: ")]
    assert events[-1] == {"done": True} and "".join(e.get("chunk", "") for e in events) == "hello\n\n[exit code: 0]"
    for body, status, message in (
        ({"tool": "write_file", "params": {}}, 404, 'unknown tool "write_file"'),
        ({"tool": "read_file", "params": {}, "stream": True}, 404, "does not support stream"),
        ({"tool": "read_file", "params": {}}, 400, "'path' is required"),
        ({"tool": "read_file", "params": "x"}, 400, "'params' must be an object"),
        ({"params": {}}, 400, "'tool' must name a tool"),
    ):
        r = client.post("/tools", json=body)
        assert r.status_code == status and message in r.json()["error"]["message"], (body, r.text)
    r = client.post("/tools", json={"tool": "read_file", "params": {"path": "x"}}, headers={"x-tool-runtime": "fake:x"})
    assert r.status_code == 500 and "unknown tool runtime: fake:x" in r.json()["error"]["message"]
    assert client.post("/tools", content=b"{not json").status_code == 400


def test_the_real_server_guards_tools_with_its_key_and_a_leaving_client_stops_the_command(tiny_dir, tmp_path):
    from test_server import start_server

    env = dict(os.environ, HF_HUB_OFFLINE="1", XDG_CONFIG_HOME=str(tmp_path / "cfg"))
    marker = tmp_path / "finished"
    proc, url, lines = start_server(
        env, "-m", str(tiny_dir), "--no-warmup", "--tools", "exec_shell_command,get_info", "--api-key", "k"
    )
    try:
        assert any("tools (experimental): exec_shell_command, get_info" in ln for ln in lines)
        port = int(url.rsplit(":", 1)[1])

        def request(body: dict, key: str | None) -> socket.socket:
            data = json.dumps(body).encode()
            s = socket.create_connection(("127.0.0.1", port), timeout=30)
            auth = f"Authorization: Bearer {key}\r\n" if key else ""
            s.sendall(
                f"POST /tools HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n{auth}"
                f"Content-Length: {len(data)}\r\n\r\n".encode()
                + data
            )
            return s

        s = request({"tool": "get_info", "params": {}}, None)
        assert b" 401 " in s.recv(200).split(b"\r\n")[0]
        s.close()
        command = f"echo started; sleep 8; touch {marker}"
        s = request({"tool": "exec_shell_command", "params": {"command": command}, "stream": True}, "k")
        got = b""
        while b"started" not in got:
            got += s.recv(4096)
        s.close()  # the client leaves while the command sleeps
        time.sleep(10)
        assert not marker.exists()  # the command was stopped, not left to finish
    finally:
        proc.terminate()
        proc.wait(timeout=30)


@pytest.mark.parametrize(
    "args,message",
    [
        (["--tools", "read_file,bogus"], "--tools: unknown tool 'bogus'"),
        (["--tools-runtime", "ssh:host"], "--tools-runtime says where --tools run; add --tools"),
        (["--tools", "all", "--tools-runtime", "ssh:-oProxyCommand=x"], "--tools-runtime: invalid ssh target"),
        (["--tools", "all", "--tools-runtime", "lxc:box"], "--tools-runtime: unknown tool runtime"),
        (["--tools", "all", "--tools-runtime", "docker:"], "requires an image name"),
    ],
)
def test_bad_tool_flags_are_usage_errors_before_anything_loads(args, message, cli_env):
    from conftest import mlxcel_cmd

    r = subprocess.run(mlxcel_cmd() + ["serve", *args], capture_output=True, text=True, env=cli_env, timeout=60)
    assert r.returncode == 2 and message in r.stderr and "Traceback" not in r.stderr


def test_tools_runtime_starts_a_container_reuses_restarts_and_removes_it(tmp_path, monkeypatch):
    """--tools-runtime docker:IMAGE with a stand-in `docker` on PATH: `run --rm -i --cidfile F IMAGE
    sh` writes an id and holds a shell on stdin; `exec [-i] ID CMD` runs CMD here."""
    from mlxcel_py.server.tools.runtime import ToolsRuntime

    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    fake = bin_dir / "docker"
    fake.write_text(
        "#!/bin/sh\n"
        'if [ "$1" = run ]; then echo "cid$$" > "$5"; exec sh; fi\n'
        'shift; [ "$1" = "-i" ] && shift; shift; exec "$@"\n'
    )
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")
    runtime = ToolsRuntime("docker:busybox")
    try:
        first = runtime.spec()
        assert first.startswith("docker-container:cid") and runtime.spec() == first  # reused
        out = exec_shell_command({"command": "echo inside"}, make_io(runtime=first))["plain_text_response"]
        assert out == "inside\n\n[exit code: 0]"
        held = runtime._proc
        held.kill()  # the container dies on its own: the next call gets a new one
        held.wait()
        assert runtime.spec() != first
    finally:
        runtime.close()
    assert runtime._proc is None and held.poll() is not None


def test_a_file_over_the_read_cap_is_refused_not_cut(tree, engine, monkeypatch):
    """A file longer than the read cap is not read at all, in an isolate or here: a cut copy would
    let edit_file write the cut file back (and the cap bounds memory while reading)."""
    from mlxcel_py.server.tools import io as tools_io

    monkeypatch.setattr(tools_io, "READ_LIMIT", 64)
    io = ContainerIO(engine, "abc123", str(tree))
    (tree / "long.txt").write_text("start " + "x" * 200 + "\n")
    before = (tree / "long.txt").read_text()
    out = edit_file({"path": "long.txt", "edits": [{"old_text": "start", "new_text": "begin"}]}, io)
    assert out == {"error": "failed to open file: long.txt"} and (tree / "long.txt").read_text() == before
    assert io.read("notes.txt") == (tree / "notes.txt").read_bytes()  # under the cap: whole
    host = edit_file({"path": "long.txt", "edits": [{"old_text": "start", "new_text": "begin"}]}, HostIO(str(tree)))
    assert host == {"error": "failed to open file: long.txt"} and (tree / "long.txt").read_text() == before


def test_sigterm_ends_a_running_tool_command_with_the_server(tiny_dir, tmp_path):
    """A command runs in a session of its own, so nothing else would end it: SIGTERM kills it at
    once (the stream then ends and the server does not wait out its grace for it)."""
    import signal as signals

    from test_server import start_server

    env = dict(os.environ, HF_HUB_OFFLINE="1", XDG_CONFIG_HOME=str(tmp_path / "cfg"))
    proc, url, _ = start_server(env, "-m", str(tiny_dir), "--no-warmup", "--tools", "exec_shell_command")
    pause = f"{40 + os.getpid() % 1000 / 1000:.3f}"  # a sleep no other process runs
    try:
        body = json.dumps(
            {"tool": "exec_shell_command", "params": {"command": f"echo go; sleep {pause}"}, "stream": True}
        )
        s = socket.create_connection(("127.0.0.1", int(url.rsplit(":", 1)[1])), timeout=30)
        s.sendall(
            f"POST /tools HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(body)}\r\n\r\n{body}".encode()
        )
        got = b""
        while b"go" not in got:
            got += s.recv(4096)
        assert subprocess.run(["pgrep", "-f", f"sleep {pause}"], capture_output=True).returncode == 0
        start = time.monotonic()
        proc.send_signal(signals.SIGTERM)
        proc.wait(timeout=30)
        assert time.monotonic() - start < 4  # not the 5 s grace: the stream ended with its command
        s.close()
        time.sleep(0.3)
        assert subprocess.run(["pgrep", "-f", f"sleep {pause}"], capture_output=True).returncode == 1
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
