"""`mlxcel bench`, in one package: what runs, what it compares against, and how it is shown.

- `workload`: the prompts (JSON Lines of kind/prompt/source) and multi-turn traces, parsed and checked.
- `runner`: plain vs each drafter and width, interleaved prompt by prompt; records and summaries
  (engine level: token ids and Engines, no CLI or rich).
- `peers`, `peer_mlx_lm`, `peer_llama_cpp`: the side-by-side peers, each a worker process.
- `plot`: the width-sweep figure (matplotlib, optional).
- `report`: the command's side: open the session, run, print the table, write JSON/markdown.
"""
