"""llama-server's slot files over HTTP (`--slot-save-path`, `POST /slots/{id}?action=...`): a cached
prompt saved, the cache erased, the file restored, and the next request starting from it with the
same output; bad names, ids, actions and files refused with the server still serving."""

from __future__ import annotations

import pytest
from test_server import post, start_server

PROMPT = {"prompt": "The quick brown fox jumps over the lazy dog", "n_predict": 6, "temperature": 0}


@pytest.fixture(scope="module")
def slot_server(tiny_dir, tmp_path_factory):
    import os

    folder = tmp_path_factory.mktemp("slots")
    env = dict(os.environ, HF_HUB_OFFLINE="1", XDG_CONFIG_HOME=str(tmp_path_factory.mktemp("cfg")))
    proc, url, _ = start_server(env, "-m", str(tiny_dir), "-np", "2", "--slot-save-path", str(folder), "--no-warmup")
    yield url, folder
    proc.terminate()
    proc.wait(timeout=30)


def test_save_erase_restore_and_the_next_request_starts_from_the_file(slot_server):
    url, folder = slot_server
    status, first = post(url + "/completion", PROMPT)
    assert status == 200 and first["timings"]["cache_n"] == 0
    n_prompt = first["timings"]["prompt_n"]
    status, saved = post(url + "/slots/1?action=save", {"filename": "slot1.bin"})
    assert status == 200 and saved["id_slot"] == 1 and saved["filename"] == "slot1.bin"
    assert saved["n_saved"] == n_prompt + 6 - 1  # the prompt and the reply, but the newest token
    assert saved["n_written"] == (folder / "slot1.bin").stat().st_size > 0 and "save_ms" in saved["timings"]
    status, erased = post(url + "/slots/1?action=erase", {})
    assert status == 200 and erased == {"id_slot": 1, "n_erased": saved["n_saved"]}
    status, again = post(url + "/completion", PROMPT)
    assert status == 200 and again["timings"]["cache_n"] == 0  # nothing cached any more
    post(url + "/slots/0?action=erase", {})
    status, restored = post(url + "/slots/0?action=restore", {"filename": "slot1.bin"})
    assert status == 200 and restored["n_restored"] == saved["n_saved"]
    assert restored["n_read"] == saved["n_written"] and "restore_ms" in restored["timings"]
    status, third = post(url + "/completion", PROMPT)
    assert status == 200 and third["timings"]["cache_n"] == n_prompt - 1  # all but the last prompt token
    assert third["content"] == first["content"]


def test_bad_names_ids_actions_and_files_are_refused(slot_server, tiny_draft_dir):
    from mlx_lm.models.cache import make_prompt_cache, save_prompt_cache

    from mlxcel_py.models import loading

    url, folder = slot_server
    for name in ("../escape.bin", "a/b", "", ".", " x", 7):
        status, err = post(url + "/slots/0?action=save", {"filename": name})
        assert status == 400 and err["error"]["message"] == "Invalid filename", name
    for slot in ("2", "-1", "x"):
        status, err = post(url + f"/slots/{slot}?action=erase", {})
        assert status == 400 and err["error"]["message"] == "Invalid slot ID"
    status, err = post(url + "/slots/0?action=fly", {"filename": "a"})
    assert status == 400 and err["error"]["message"] == "Invalid action"
    status, err = post(url + "/slots/0?action=restore", {"filename": "missing.bin"})
    assert status == 404
    (folder / "garbage.bin").write_bytes(b"not a cache at all")
    other = loading.load(loading.resolve(str(tiny_draft_dir)))  # another model's cache
    layers = make_prompt_cache(other.model)
    import mlx.core as mx

    other.model(mx.array([[1, 2, 3]]), cache=layers)
    save_prompt_cache(str(folder / "other.safetensors"), layers, {"tokens": "[1, 2, 3]"})
    for name in ("garbage.bin", "other.safetensors"):
        status, err = post(url + "/slots/0?action=restore", {"filename": name})
        assert status == 400 and "invalid slot save file" in err["error"]["message"], name
    status, ok = post(url + "/completion", {**PROMPT, "n_predict": 2})
    assert status == 200


def test_without_a_slot_folder_the_actions_are_not_supported(tiny_dir, tmp_path):
    import os

    env = dict(os.environ, HF_HUB_OFFLINE="1", XDG_CONFIG_HOME=str(tmp_path))
    proc, url, _ = start_server(env, "-m", str(tiny_dir), "--no-warmup")
    try:
        status, err = post(url + "/slots/0?action=save", {"filename": "x"})
        assert status == 501 and err["error"]["type"] == "not_supported_error"
        assert "--slot-save-path" in err["error"]["message"]
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def test_q8_0_rows_round_trip_and_a_file_from_before_their_rotation_is_refused(tmp_path):
    """A q8_0 cache's rows are stored rotated (csrc rotate()); its slot file says so, restores to
    the same reply, and a file without the mark (an earlier version's unrotated rows) is refused."""
    import os

    from conftest import make_tiny_model
    from mlx_lm.models.cache import load_prompt_cache, save_prompt_cache

    model = make_tiny_model(tmp_path / "m", seed=3, hidden=128, scale=2.5)  # head dim 32: q8_0 runs
    folder = tmp_path / "slots"
    folder.mkdir()
    env = dict(os.environ, HF_HUB_OFFLINE="1", XDG_CONFIG_HOME=str(tmp_path / "cfg"))
    proc, url, _ = start_server(
        env, "-m", str(model), "--slot-save-path", str(folder), "--no-warmup", "-ctk", "q8_0", "-ctv", "q8_0"
    )
    try:
        status, first = post(url + "/completion", PROMPT)
        assert status == 200
        status, saved = post(url + "/slots/0?action=save", {"filename": "q8.bin"})
        assert status == 200
        link = tmp_path / "q8.safetensors"
        link.symlink_to(folder / "q8.bin")
        layers, meta = load_prompt_cache(str(link), return_metadata=True)
        assert meta["kv_block_rows"] == "rotated" and layers[0].keys.dtype.size == 1  # int8 rows
        post(url + "/slots/0?action=erase", {})
        status, restored = post(url + "/slots/0?action=restore", {"filename": "q8.bin"})
        assert status == 200 and restored["n_restored"] == saved["n_saved"]
        status, again = post(url + "/completion", PROMPT)
        assert status == 200 and again["timings"]["cache_n"] > 0 and again["content"] == first["content"]
        del meta["kv_block_rows"]
        save_prompt_cache(str(folder / "old.safetensors"), layers, meta)
        status, err = post(url + "/slots/0?action=restore", {"filename": "old.safetensors"})
        assert status == 400 and "stored them unrotated" in err["error"]["message"]
        status, _ = post(url + "/completion", {**PROMPT, "n_predict": 2})
        assert status == 200
    finally:
        proc.terminate()
        proc.wait(timeout=30)
