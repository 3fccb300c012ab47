"""`mlxcel draft train`: a learned drafter for a target, trained on this machine.

Data flows one way: prompts (corpus.py) -> the target answers them with its own decoding, batched,
while the tap the drafter reads records its rows (recording.py) -> a draft vocabulary from what it
said (vocab.py) -> training with EAGLE's training-time test (ttt.py, trainer.py) -> a checkpoint in
vLLM speculators' EAGLE-3 layout with a card naming the target (export.py), which every command
loads with `--draft-model DIR`. Nothing here is on the decoding path: the drafter it writes runs
through drafters/eagle3.py like any published one.
"""
