"""`mlxcel chat` under a real pseudo-terminal: two turns, /clear, Ctrl-C mid-reply, /bye; piped stdin."""

from __future__ import annotations

import os
import pty
import select
import signal
import subprocess
import time

import pytest
from conftest import mlxcel_cmd

pytestmark = pytest.mark.real


class Pty:
    def __init__(self, argv, env):
        self.pid, self.fd = pty.fork()
        if self.pid == 0:  # child
            # a terminal user's Ctrl-C: a suite started in the background (`make test &`, CI runners)
            # has SIGINT ignored, and an ignored signal stays ignored across exec
            signal.signal(signal.SIGINT, signal.SIG_DFL)
            os.execvpe(argv[0], argv, env)
        self.buf = ""

    def read_until(self, text: str, timeout: float = 120) -> str:
        deadline = time.time() + timeout
        while text not in self.buf:
            left = deadline - time.time()
            if left <= 0:
                raise AssertionError(f"timed out waiting for {text!r}; got:\n{self.buf[-2000:]}")
            r, _, _ = select.select([self.fd], [], [], min(left, 0.5))
            if r:
                try:
                    self.buf += os.read(self.fd, 4096).decode(errors="replace")
                except OSError:
                    break
        i = self.buf.index(text) + len(text)
        out, self.buf = self.buf[:i], self.buf[i:]
        return out

    def send(self, s: str) -> None:
        os.write(self.fd, s.encode())

    def wait(self, timeout: float = 60) -> int:
        deadline = time.time() + timeout
        while time.time() < deadline:
            pid, status = os.waitpid(self.pid, os.WNOHANG)
            if pid:
                return os.waitstatus_to_exitcode(status)
            try:
                select.select([self.fd], [], [], 0.2)
                os.read(self.fd, 4096)
            except OSError:
                pass
        os.kill(self.pid, signal.SIGKILL)
        raise AssertionError("chat did not exit")


def test_chat_two_turns_clear_ctrl_c_bye(cli_env):
    env = {**cli_env, "TERM": "dumb", "COLUMNS": "120"}
    t = Pty(mlxcel_cmd() + ["chat", "-n", "150"], env)
    t.read_until(">>> ", timeout=180)
    t.send("What is the capital of France? Answer in one word.\r")
    first = t.read_until(">>> ")
    assert "Paris" in first
    t.send("And of Italy? One word.\r")
    second = t.read_until(">>> ")
    assert "Rome" in second
    t.send("/clear\r")
    assert "Conversation cleared." in t.read_until(">>> ")
    t.send("Write a long story about a dragon who learns to bake bread.\r")
    t.read_until("bread.\r\n")  # the echoed line
    t.read_until(" ", timeout=120)  # the reply has started streaming (a fixed sleep raced a slow start)
    t.send("\x03")  # Ctrl-C mid-reply
    cancelled = t.read_until(">>> ")
    assert "reply cancelled" in cancelled
    t.send("/help\r")
    assert "/clear" in t.read_until(">>> ")
    t.send('"""\rSay the word\rbanana.\r"""\r')
    assert t.read_until(">>> ")
    t.send("/bye\r")
    assert t.wait() == 0


def test_piped_stdin_one_message_per_line_clean_stdout(cli_env):
    r = subprocess.run(
        mlxcel_cmd() + ["chat", "-n", "30"],
        input="Hi!\n/clear\nSay yes.\n",
        capture_output=True,
        text=True,
        env=cli_env,
        timeout=300,
    )
    assert r.returncode == 0, r.stderr
    assert "non-interactive stdin detected" in r.stderr
    assert ">>>" not in r.stdout and "Conversation cleared." not in r.stdout
    assert len([ln for ln in r.stdout.splitlines() if ln.strip()]) >= 2


def test_invalid_utf8_on_a_chat_line_is_replaced_and_the_session_goes_on(cli_env):
    """One line of bad bytes used to end the session (a TypeError from the chat template)."""
    env = {**cli_env, "TERM": "dumb", "COLUMNS": "120"}
    t = Pty(mlxcel_cmd() + ["chat", "-n", "40", "--temp", "0"], env)
    t.read_until(">>> ", timeout=180)
    os.write(t.fd, b"Say hello \xff\xfe in French. One word.\r")
    turn = t.read_until(">>> ")
    assert "invalid UTF-8 replaced" in turn and "Traceback" not in turn
    t.send("What is the capital of France? Answer in one word.\r")
    second = t.read_until(">>> ")  # the session and its history survived: a second reply
    reply = second.split("one word.\r\n", 1)[1].replace(">>> ", "").strip()
    assert reply and "Traceback" not in second and "error" not in second
    t.send("/bye\r")
    assert t.wait() == 0
