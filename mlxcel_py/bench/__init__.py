"""`mlxcel bench`, in one package: what runs, what it compares against, and how it is shown.

- `workload`: the prompts (JSON Lines of kind/prompt/source) and multi-turn traces, parsed and checked.
- `checks`: the command's flags, checked with validate's rules before any model loads.
- `runner`: plain vs each drafter and width, interleaved prompt by prompt; the raw records
  (engine level: token ids and Engines, no CLI or rich).
- `report`: what is reported of a run: summaries, the recommended widths, peer ratios, JSON and
  the markdown table (pure).
- `peers`, `peer_mlx_lm`, `peer_llama_cpp`: the side-by-side peers, each a worker process.
- `plot`: the width-sweep figure (matplotlib, optional).
- `driver`: the command's side: open the session, run, print the table, write JSON/markdown.
"""
