// RowExactAttention: softmax(scale q k^T) v one query row at a time (attention_kernel.h), on
#pragma once
#include <optional>
#include <vector>

#include "mlx/mlx.h"

namespace mlxcel {

namespace mx = mlx::core;

// each row bit-identical to a one-row call at the same position (row i of a causal block sees
// keys 0..S-L+i)
mx::array row_exact_attention(const mx::array& q, const mx::array& k, const mx::array& v, float scale, bool causal);

// float32 rows [..., D] as KV rows of the cache type `dtype` (float32, float16, bfloat16, int8 for
// q8_0: [..., D + D/16], uint8 for q4_0: [..., D/2 + D/16]), rounded as the kernels round a row they write (store_kv_row). Eager (it
// evaluates x): for reference forwards and tests, not the decode path.
mx::array kv_rows(const mx::array& x, mx::Dtype dtype);

}  // namespace mlxcel
