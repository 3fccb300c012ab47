"""Batched decoding in `serve -np N`: rows equal solo steps, outputs equal solo outputs under 2, 4
and 8 concurrent clients, and speculation gated by the number of live requests."""

from __future__ import annotations

import json
import threading
import time
import urllib.request

import mlx.core as mx
import pytest
from test_server import COPY_PROMPT, get, post, start_server

from mlxcel_py.cpu import extension as cpu_extension
from mlxcel_py.cpu import layers as cpu_layers
from mlxcel_py.engine import batch
from mlxcel_py.engine.cache import SequenceCache
from mlxcel_py.engine.gate import REOPEN_TICKS, Gate
from mlxcel_py.options import SamplingOptions


def test_batched_rows_equal_solo_steps_bit_for_bit(real, tiny):
    """The default model on the row-exact path, and a tiny llama: a batch of sequences of
    different lengths gives each row exactly its solo decode step (what `probe` checks at start)."""
    for loaded in (real, tiny):
        p = batch.probe(loaded.model, loaded.vocab_size)
        assert p.mode == "exact", p.detail
    seqs = []
    for n in (3, 17, 40):
        c = SequenceCache(real.model)
        c.prefill(list(range(200, 200 + n)))
        seqs.append(c)
    qmm = cpu_extension.kernel_status()[0]
    fused_before = qmm.buffer_updates() if qmm else None
    got = batch.batched_step(real.model, seqs, [11, 12, 13])
    assert [len(c.tokens) for c in seqs] == [4, 18, 41]
    blocks = [[5, 6, 7, 8], [9], [10, 11]]  # a verify block beside a plain step: padded, then trimmed
    got2 = batch.batched_forward(real.model, seqs, blocks)
    mx.eval(got, got2)
    fused_after = qmm.buffer_updates() if qmm else None
    assert [len(c.tokens) for c in seqs] == [8, 19, 43] and [c.layers[0].offset for c in seqs] == [8, 19, 43]
    for i, n in enumerate((3, 17, 40)):
        c = SequenceCache(real.model)
        c.prefill(list(range(200, 200 + n)))
        assert (c.feed([11 + i]) == got[i : i + 1]).all().item()
        assert (c.feed(blocks[i]) == got2[i]).all().item()
    if qmm is not None:  # on the kernel path each layer's writes and attentions were one fused op
        donated, copied = (a - b for a, b in zip(fused_after, fused_before))
        assert donated + copied == 2 * 2 * 3 * len(seqs[0].layers) and donated > copied


def test_a_batch_wider_than_the_kernel_block_stays_exact(tiny):
    """90 sequences x 1-5 rows is 270 rows, unpadded: split into forwards of at most KERNEL_ROWS
    rows, so every row stays on the row-exact kernel (a wider forward would go through float32
    BLAS); every block's rows equal its solo forward, verify blocks and plain steps alike."""

    blocks = [[(3 * i + j) % 200 + 1 for j in range(1 + i % 5)] for i in range(90)]
    assert sum(map(len, blocks)) > cpu_layers.KERNEL_ROWS
    seqs, solo = [], []
    for i in range(90):
        for pool in (seqs, solo):
            c = SequenceCache(tiny.model)
            c.prefill(list(range(10 + i % 30, 30 + i % 40)))
            pool.append(c)
    got = batch.batched_forward(tiny.model, seqs, blocks)
    for s, b, g in zip(solo, blocks, got):
        assert (s.feed(b) == g).all().item()
    assert [len(s.tokens) for s in seqs] == [len(s.tokens) for s in solo]


def test_prompt_chunks_ride_in_the_batch_without_logits(real):
    """A prompt chunk in a ragged batched forward (logits not wanted) comes back as None, and the
    sequence then continues exactly as one whose prompt was prefilled alone; the others' rows are
    unchanged by the chunk beside them."""
    prompt = real.tokenizer.encode("The quick brown fox jumps over the lazy dog. " * 4)
    fresh, other = SequenceCache(real.model), SequenceCache(real.model)
    fresh.prefill(prompt[:10])
    other.prefill(list(range(300, 340)))
    got = batch.batched_forward(real.model, [fresh, other], [prompt[10:], [7, 8]], [False, True])
    assert got[0] is None and got[1].shape[0] == 2
    solo_a, solo_b = SequenceCache(real.model), SequenceCache(real.model)
    solo_a.prefill(prompt)
    solo_b.prefill(list(range(300, 340)))
    assert (solo_b.feed([7, 8]) == got[1]).all().item()
    assert (solo_a.feed([5]) == fresh.feed([5])).all().item()


def test_the_gate_closes_at_once_and_reopens_after_a_calm_spell():
    g = Gate(2)
    assert g.tick(1) and g.tick(2)
    assert not g.tick(3)
    for _ in range(REOPEN_TICKS - 1):
        assert not g.tick(2)
    assert g.tick(1) and g.closings == 1
    assert not g.tick(5) and g.closings == 2


@pytest.fixture(scope="module")
def server8(tmp_path_factory):
    import os

    env = dict(os.environ, HF_HUB_OFFLINE="1", XDG_CONFIG_HOME=str(tmp_path_factory.mktemp("cfg")))
    # the count (mlxcel's flag, its default spelled out): the tests below count on no verify round at 3 live
    proc, url, lines = start_server(
        env, "--draft-kind", "prompt-lookup", "-np", "8", "--cache-ram", "0", "--prompt-lookup-max-batch", "2"
    )
    yield url, lines
    proc.terminate()
    proc.wait(timeout=30)


def _chat(url: str, prompt: str, n: int = 24) -> dict:
    _, r = post(
        url + "/v1/chat/completions",
        {"messages": [{"role": "user", "content": prompt}], "max_tokens": n, "temperature": 0},
    )
    return r


def _together(url: str, prompts: list[str], n: int = 24) -> list[dict]:
    out: list = [None] * len(prompts)

    def one(i):
        out[i] = _chat(url, prompts[i], n)

    threads = [threading.Thread(target=one, args=(i,)) for i in range(len(prompts))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return out


@pytest.mark.real
def test_concurrent_clients_get_exactly_their_solo_output(server8, workloads):
    """2 clients (verify rounds: at most 2 live), 4 and 8 (batched plain steps): every greedy reply
    equals the reply the same request got alone. `--cache-ram 0`: nothing is reused between them."""
    url, lines = server8
    assert any("slots: 8 requests decoded together" in ln and "bit for bit" in ln for ln in lines)
    prompts = [w["prompt"] for w in workloads[:8]]
    alone = [_chat(url, p) for p in prompts]
    assert sum(r["timings"].get("draft_rounds", 0) for r in alone) > 0
    for clients in (2, 4, 8):
        got = _together(url, prompts[:clients])
        for i, r in enumerate(got):
            assert r["choices"][0]["message"]["content"] == alone[i]["choices"][0]["message"]["content"], (clients, i)
    assert get(url + "/health")["batch"]["max_batch_size"] == 8


@pytest.mark.real
def test_speculation_switches_off_above_the_gate_and_back_on_below(server8):
    url, _ = server8
    lone = _chat(url, COPY_PROMPT, 48)
    assert lone["timings"]["draft_rounds"] > 0
    seen = []
    stop = threading.Event()

    def watch():
        while not stop.is_set():
            h = get(url + "/health")
            seen.append((h["batch"]["active_sequences"], h["batch"]["speculating"]))
            time.sleep(0.05)

    watcher = threading.Thread(target=watch)
    watcher.start()
    crowd = _together(url, [COPY_PROMPT + f" ({i})" for i in range(5)], 48)
    stop.set()
    watcher.join()
    assert any(active >= 3 and not speculating for active, speculating in seen)
    assert not any(active >= 3 and speculating for active, speculating in seen)
    # per request: the rounds counted are the verify rounds that ran (few or none while the gate was shut)
    assert sum(r["timings"].get("draft_rounds", 0) for r in crowd) < 5 * lone["timings"]["draft_rounds"] / 2
    again = _chat(url, COPY_PROMPT, 48)  # alone again: the gate reopens after its calm spell
    assert again["timings"]["draft_rounds"] > 0
    assert again["choices"][0]["message"]["content"] == lone["choices"][0]["message"]["content"]
    slots = json.loads(urllib.request.urlopen(url + "/slots", timeout=30).read())
    assert len(slots) == 8 and not any(s["is_processing"] for s in slots)


@pytest.mark.real
def test_a_seeded_sampled_request_draws_the_same_beside_others(server8):
    """Position-keyed draws: a seeded request samples the same tokens whatever else is decoding."""
    url, _ = server8
    body = {
        "messages": [{"role": "user", "content": "Invent a name for a cat."}],
        "max_tokens": 20,
        "temperature": 0.9,
        "seed": 1234,
    }
    _, alone = post(url + "/v1/chat/completions", body)
    out: dict = {}

    def seeded():
        out["r"] = post(url + "/v1/chat/completions", body)[1]

    t = threading.Thread(target=seeded)
    others = [
        threading.Thread(target=_chat, args=(url, f"Write a short poem about the number {i}.", 30)) for i in range(4)
    ]
    for th in others:
        th.start()
    t.start()
    for th in others + [t]:
        th.join()
    assert out["r"]["choices"][0]["message"]["content"] == alone["choices"][0]["message"]["content"]


def test_a_result_reader_gets_only_the_result_and_a_stream_its_pieces_in_order(tiny):
    # the worker wakes the event loop once per turn for a streaming request and not at all
    # before the end for a request whose reader takes only the result
    import asyncio

    from mlxcel_py.engine.engine import Engine
    from mlxcel_py.server.worker import Job, Worker

    eng = Engine(tiny.model, eos_ids=[], vocab_size=tiny.vocab_size, context_length=2048)
    worker = Worker(eng, tiny.tokenizer, parallel=2)
    worker.start(warmup=False)

    async def run(pieces: bool):
        loop = asyncio.get_running_loop()
        calls = 0
        handoff = loop.call_soon_threadsafe

        def counted(*args):
            nonlocal calls
            calls += 1
            return handoff(*args)

        loop.call_soon_threadsafe = counted
        job = Job(
            prompt=[5, 6, 7, 8, 9], max_tokens=24, sampling=SamplingOptions(temp=0.0), ignore_eos=True, pieces=pieces
        )
        events = [(kind, payload) async for kind, payload in worker.submit(job)]
        return events, calls

    try:
        streamed, stream_calls = asyncio.run(run(True))
        result_only, result_calls = asyncio.run(run(False))
    finally:
        worker.stop()
    assert [k for k, _ in result_only] == ["done"] and result_calls == 1
    kinds = [k for k, _ in streamed]
    assert kinds[-1] == "done" and set(kinds[:-1]) == {"text"}
    done = streamed[-1][1]
    assert "".join(p.text for k, p in streamed[:-1]) == done.text == result_only[0][1].text
    assert done.tokens == result_only[0][1].tokens and len(done.tokens) == 24
    assert 2 <= stream_calls <= len(kinds)  # pieces as they come, never more hand-offs than events
