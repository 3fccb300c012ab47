"""One model across processes: joining the ranks and mirroring rank 0's forwards (distributed),
pipeline stages for llama-style models (pipeline_stages), and `mlxcel launch` (launcher)."""
