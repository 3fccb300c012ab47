// RowExactFMM and FloatRows: the float kernel (fmm_kernel.h) as MLX ops, and its layout helper.
#pragma once
#include <optional>
#include <vector>

#include "fmm_kernel.h"
#include "mlx/mlx.h"

namespace mlxcel {

namespace mx = mlx::core;

// The form of a packed float weight from its dtype (float32, float16, bfloat16); invalid_argument otherwise
FloatForm float_form(const mx::array& w, const char* what);

// A float weight [N, K] (float32, float16 or bfloat16) in the float kernel's layout [ceil(N/16), K, 16]; eager
mx::array float_repack_weight(mx::array w);

// [x @ W_i.T] (W_i packed, N_i outputs each) for weights sharing one input; each row bit-identical
// whatever the number of rows
std::vector<mx::array> row_exact_fmm_multi(const mx::array& x, const std::vector<mx::array>& ws, const std::vector<int>& ns);

// rows ids (default: all N) of a packed weight as float32 [..., K]
mx::array float_weight_rows(const mx::array& w, int N, std::optional<mx::array> ids);

}  // namespace mlxcel
