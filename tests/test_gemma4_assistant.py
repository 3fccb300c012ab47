"""Gemma 4's assistant drafter (a `gemma4_assistant` checkpoint as --draft-model, run as mtp) on a
tiny random Gemma 4 with KV-shared layers and a sliding window shorter than the prompts.

Random weights prove exactness and mechanics (accepts and rejections both ran), never acceptance
rates; the "echo" assistant passes the target's hidden state through, so it is right whenever
the output repeats itself.
"""

from __future__ import annotations

import json
import shutil

import pytest
import tiny_models
from test_families import copy_prompts
from test_mtp import session, speculate_like_plain

from mlxcel_py.drafters import mtp
from mlxcel_py.errors import ModelError


@pytest.fixture(scope="module")
def g4(tmp_path_factory):
    root = tmp_path_factory.mktemp("gemma4")
    target = tiny_models.build(root / "target", tiny_models.GEMMA4, scale=0.2)
    return {
        "target": target,
        "echo": tiny_models.gemma4_assistant_checkpoint(root / "echo", target),
        "random": tiny_models.gemma4_assistant_checkpoint(root / "random", target, kind="random"),
        "ordered": tiny_models.gemma4_assistant_checkpoint(root / "ordered", target, kind="random", ordered=True),
    }


@pytest.mark.parametrize("assistant", ["echo", "random", "ordered"])
def test_assistant_drafts_equal_plain_decoding(g4, assistant):
    s = session(g4["target"], draft_model=g4[assistant])  # kind detected from the checkpoint
    d = s.engine.draft
    assert (d.kind, d.block_size) == ("mtp", 3) and isinstance(s.drafters, mtp.Source)  # not loaded as a full model
    s.engine.warmup()
    proposed, accepted = speculate_like_plain(s, copy_prompts(5, seed=4), 30)
    assert proposed > accepted  # rejections: the target's window and KV caches rolled back
    if assistant == "echo":
        assert accepted > 0  # and accepted drafts, where the output repeats


def test_assistant_reads_the_kv_of_the_last_cache_holding_layer_of_each_type(g4):
    from mlxcel_py.drafters.gemma4_assistant import _kv_layers

    s = session(g4["target"], draft_model=g4["echo"])
    assert _kv_layers(s.engine.model) == {"sliding_attention": 0, "full_attention": 1}


def test_width_from_generation_config_and_flag(g4, tmp_path):
    d = tmp_path / "a"
    shutil.copytree(g4["echo"], d)
    cfg = json.loads((d / "config.json").read_text())
    cfg.pop("block_size")
    (d / "config.json").write_text(json.dumps(cfg))
    (d / "generation_config.json").write_text(json.dumps({"num_assistant_tokens": 5}))
    assert session(g4["target"], draft_model=d).engine.draft.block_size == 5
    assert session(g4["target"], draft_model=d, draft_block_size=2).engine.draft.block_size == 2


def test_refuses_an_assistant_for_another_family(g4, tiny_dir, no_weights):
    with pytest.raises(ModelError, match="drafts only for Gemma 4 targets; the target is a llama model"):
        session(tiny_dir, draft_model=g4["echo"])


@pytest.mark.parametrize(
    "edit,message",
    [
        (
            {"backbone_hidden_size": 32},
            "the assistant's backbone_hidden_size \\(32\\) does not match the target's hidden size",
        ),
        ({"text_config": dict(tiny_models.GEMMA4, vocab_size=300)}, "text_config.vocab_size \\(300\\) does not match"),
        (
            {"text_config": dict(tiny_models.GEMMA4, head_dim=8)},
            "text_config.head_dim \\(8\\) does not match the target's K/V",
        ),
    ],
)
def test_refuses_an_assistant_made_for_another_target(g4, tmp_path, no_weights, edit, message):
    d = tmp_path / "other"
    shutil.copytree(g4["echo"], d)
    cfg = json.loads((d / "config.json").read_text())
    cfg.update(edit)
    (d / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ModelError, match=message):
        session(g4["target"], draft_model=d)


def test_refuses_a_checkpoint_missing_tensors(g4, tmp_path):
    import mlx.core as mx

    d = tmp_path / "partial"
    shutil.copytree(g4["echo"], d)
    w = mx.load(str(d / "model.safetensors"))
    w.pop("post_projection.weight")
    mx.save_safetensors(str(d / "model.safetensors"), w)
    with pytest.raises(ModelError, match="the Gemma 4 assistant checkpoint lacks post_projection.weight"):
        session(g4["target"], draft_model=d)
