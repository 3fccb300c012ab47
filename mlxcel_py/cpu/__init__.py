"""The Linux CPU fast path, and every place mlxcel-py changes mlx-lm's code at run time.

Each patch swaps a name in a model's own module (or one object's class) for a dispatcher that
runs ours only where we asked for it, so stock mlx-lm in the same process is unchanged:

- blas.prepare: OpenBLAS under MLX's CPU backend, loaded before mlx.core (the wheel's reference
  BLAS makes a verify block ~6x a step).
- kernels.enable: the model module's `scaled_dot_product_attention` and `swiglu` names -> vectorised
  exp kernels (MLX's CPU exp is scalar), and the row-exact attention and SwiGLU of the extension
  (`_qmm`, csrc/) on the kernel weights; only inside `kernels.engaged(model)`.
- weights.apply / weights.patch_rope: linear layers -> RowExactLinear (the int8 kernel, rows
  bit-identical whatever the block; layers reading one input, q/k/v and gate/up, quantize it
  once), tied embeddings' `as_linear`, plain nn.RoPE modules -> the extension's rope.
- recurrent_steps.enable: a Gated DeltaNet module's `gated_delta_update` name and each layer's
  conv1d class, so a verify block records the state after every step (rollback by picking).
- models.decoder_layers.install (not here: it needs the model families): the text model's class,
  on that one object, -> a subclass whose forward runs each llama-family layer as one extension
  op, bit-identical to mlx-lm's layer code on these weights.
- models.taps.hidden_tap (not here: it changes no arithmetic): a final norm's class records its
  output for MTP drafters and distributed followers.
"""
