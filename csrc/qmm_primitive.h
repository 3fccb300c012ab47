// RowExactQMM: y_i = x @ W_i^T on the row-exact kernel (qmm_kernel.h), one or several weights per
#pragma once
#include <optional>
#include <vector>

#include "mlx/mlx.h"

namespace mlxcel {

namespace mx = mlx::core;

// x @ W.T for W = scales * q + biases per block of 32 (w from repack); each output row is
// bit-identical whatever the number of rows
mx::array row_exact_qmm(const mx::array& x, const mx::array& w, const mx::array& scales, const mx::array& biases,
                        int bits);

// [x @ W_i.T] for weights sharing one input (x quantized once); each equals row_exact_qmm alone
std::vector<mx::array> row_exact_qmm_multi(const mx::array& x, const std::vector<mx::array>& ws,
                                           const std::vector<mx::array>& scales, const std::vector<mx::array>& biases,
                                           int bits);

}  // namespace mlxcel
