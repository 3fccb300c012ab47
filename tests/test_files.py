"""Files the user names (#47 item 6): bounded in size and in the wait, whatever they are.

`--config /dev/zero` grew to 4.5 GB in 8 s and a FIFO nobody writes to hung the command; every
flag that reads a file (--config, --json-schema-file, --grammar-file, --chat-template-file,
--api-key-file, --suffix-store) now refuses those with one line naming the flag, in seconds.
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time

import pytest
from conftest import mlxcel_cmd

from mlxcel_py.inputs.files import UnreadableFile, read_bytes, read_text


def test_regular_files_devices_fifos_and_links(tmp_path):
    (tmp_path / "ok").write_text("hello")
    assert read_text(tmp_path / "ok", 5) == "hello"
    (tmp_path / "big").write_bytes(b"x" * 6)
    cases = [
        (tmp_path / "big", "is 6 bytes; the limit is 5"),
        ("/dev/zero", "holds more than 5 bytes"),
        (tmp_path / "missing", "no such file"),
        (tmp_path, "is a folder"),
    ]
    os.symlink(tmp_path / "loop1", tmp_path / "loop2")
    os.symlink(tmp_path / "loop2", tmp_path / "loop1")
    cases.append((tmp_path / "loop1", "Too many levels of symbolic links"))
    os.mkfifo(tmp_path / "fifo")
    cases.append((tmp_path / "fifo", "nothing arrived on it for 0.3 s"))
    for path, message in cases:
        start = time.perf_counter()
        with pytest.raises(UnreadableFile, match=message):
            read_bytes(path, 5, wait=0.3)
        assert time.perf_counter() - start < 3, path
    assert read_bytes("/dev/null", 5) == b""  # a device's end is its end (--config /dev/null)
    (tmp_path / "latin1").write_bytes(b"\xff\xfe")
    with pytest.raises(UnreadableFile, match="is not UTF-8 text"):
        read_text(tmp_path / "latin1", 5)


def test_a_fifo_whose_writer_comes_later_and_a_pipe_are_read_whole(tmp_path):
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)

    def writer() -> None:
        time.sleep(0.3)
        with open(fifo, "w") as fh:
            fh.write("root ::= ")
            fh.flush()
            time.sleep(0.2)
            fh.write('"yes"\n')

    t = threading.Thread(target=writer)
    t.start()
    assert read_text(fifo, 100, wait=5) == 'root ::= "yes"\n'
    t.join()
    # process substitution, as a shell passes <(cmd)
    r = subprocess.run(
        ["bash", "-c", f'{sys.executable} -c "import sys; from mlxcel_py.inputs.files import read_text; '
         f'print(read_text(sys.argv[1], 100))" <(echo piped)'],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert r.returncode == 0 and r.stdout.strip() == "piped", r.stderr


@pytest.mark.parametrize(
    "args,message",
    [
        (["--config", "/dev/zero", "generate", "-p", "x"], "--config /dev/zero: holds more than 1048576 bytes"),
        (["generate", "-p", "x", "--json-schema-file", "/dev/zero"], "--json-schema-file /dev/zero: holds more than"),
        (["generate", "-p", "x", "--grammar-file", "FIFO"], "--grammar-file FIFO: nothing arrived on it for 0.5 s"),
        (["generate", "-p", "x", "--chat-template-file", "/dev/zero"], "--chat-template-file /dev/zero: holds more"),
        (["serve", "--api-key-file", "/dev/zero"], "--api-key-file /dev/zero: holds more than 1048576 bytes"),
        (["serve", "--api-key-file", "FIFO"], "--api-key-file FIFO: nothing arrived on it"),
    ],
)
def test_every_file_flag_refuses_endless_and_silent_files_in_seconds(args, message, cli_env, tmp_path):
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    args = [str(fifo) if a == "FIFO" else a for a in args]
    start = time.perf_counter()
    r = subprocess.run(
        mlxcel_cmd() + args + ["-m", "/nonexistent-model"],
        capture_output=True,
        text=True,
        env={**cli_env, "MLXCEL_FILE_WAIT": "0.5"},
        timeout=60,
    )
    assert r.returncode == 2, r.stderr
    assert message.replace("FIFO", str(fifo)) in r.stderr and "Traceback" not in r.stderr
    assert time.perf_counter() - start < 20


def test_suffix_store_file_bounded_and_stale_temporaries_of_killed_saves_removed(tmp_path):
    from mlxcel_py.drafters.suffix import SuffixStore

    with pytest.raises(ValueError, match="holds more than"):
        SuffixStore.load("/dev/zero", "fp", budget=100)
    path = tmp_path / "store.json"
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    stale = tmp_path / f".store.json.{dead.pid}.abc123.tmp"  # a save killed with -9
    alive = tmp_path / f".store.json.{os.getppid()}.def456.tmp"  # a save under way elsewhere
    other = tmp_path / ".other.json.1.x.tmp"
    for p in (stale, alive, other):
        p.write_text("{")
    store = SuffixStore(100)
    store.add([1, 2, 3])
    store.save(path, "fp")
    assert not stale.exists() and alive.exists() and other.exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(["store.json", alive.name, other.name])
    assert list(SuffixStore.load(path, "fp", budget=100).seqs.values()) == [[1, 2, 3]]
