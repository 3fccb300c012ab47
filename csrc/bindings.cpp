// The Python module `mlxcel_py.cpu._qmm` (nanobind, in MLX's type domain so mx.array passes straight
// through): the primitives, the layout helpers, the CPU checks and the kernels' settings. One
// primitive per file (*_primitive.cpp); the kernels themselves (*_kernel.cpp) see only pointers.
#include <nanobind/nanobind.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/pair.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/tuple.h>
#include <nanobind/stl/vector.h>

#include <climits>
#include <optional>
#include <stdexcept>
#include <utility>

#include "attention_primitive.h"
#include "cache_attention_primitive.h"
#include "cpu_features.h"
#include "dequantize_primitive.h"
#include "fmm_primitive.h"
#include "huge_pages.h"
#include "isa.h"
#include "layer_primitive.h"
#include "layout.h"
#include "move_rows_primitive.h"
#include "qmm_kernel.h"
#include "qmm_primitive.h"
#include "rope_primitive.h"
#include "runtime.h"
#include "swiglu_primitive.h"
#include "tree_rows.h"

namespace nb = nanobind;
using namespace nb::literals;

namespace {
// MLXCEL_KERNEL_ISA's names of the builds, both ways
constexpr std::pair<const char*, mlxcel::Isa> kIsaNames[] = {
    {"avx512", mlxcel::Isa::avx512}, {"avxvnni", mlxcel::Isa::avxvnni}, {"avx2", mlxcel::Isa::avx2}};

std::optional<mlxcel::Isa> isa_named(const std::string& name) {
  for (const auto& [n, isa] : kIsaNames)
    if (name == n) return isa;
  return std::nullopt;
}

const char* isa_name(mlxcel::Isa isa) {
  for (const auto& [n, i] : kIsaNames)
    if (i == isa) return n;
  return "?";
}

using Rows = std::optional<std::vector<int>>;
using Tails = std::optional<std::vector<std::vector<int>>>;

// draft-tree rows from Python's three optional lists (all or none)
mlxcel::TreeRows tree_rows(const Rows& slot, const Rows& base, const Tails& tail) {
  if (!slot && !base && !tail) return {};
  if (!slot || !base || !tail) throw std::invalid_argument("tree rows need slot, base and tail together");
  return {*slot, *base, *tail};
}
}  // namespace

NB_MODULE(_qmm, m) {
  m.doc() = "Row-exact int8 x 4/8-bit affine matmul for MLX on x86 CPUs (AVX-512 VNNI, AVX-VNNI or AVX2)";
  m.def("row_exact_qmm", &mlxcel::row_exact_qmm, "x"_a, "w"_a, "scales"_a, "biases"_a, "bits"_a,
        "x @ W.T for W = scales * q + biases per block of 32 (w from repack); each output row is "
        "bit-identical whatever the number of rows");
  m.def("row_exact_qmm_multi", &mlxcel::row_exact_qmm_multi, "x"_a, "ws"_a, "scales"_a, "biases"_a, "bits"_a,
        "[x @ W_i.T] for weights sharing one input (x quantized once); each equals row_exact_qmm alone");
  m.def("float_repack", &mlxcel::float_repack_weight, "w"_a,
        "a float weight [N, K] (float32, float16 or bfloat16) -> the float kernel's layout [ceil(N/16), K, 16], "
        "the same values (eager)");
  m.def("row_exact_fmm_multi", &mlxcel::row_exact_fmm_multi, "x"_a, "ws"_a, "ns"_a,
        "[x @ W_i.T] for packed float weights W_i of N_i outputs sharing one input, each element summed over K "
        "in order: each output row bit-identical whatever the number of rows");
  m.def("row_exact_fmm", [](const mlx::core::array& x, const mlx::core::array& w, int n) {
          return mlxcel::row_exact_fmm_multi(x, {w}, {n})[0];
        }, "x"_a, "w"_a, "n"_a, "x @ W.T for a packed float weight W of n outputs (row_exact_fmm_multi with one weight)");
  m.def("float_rows", &mlxcel::float_weight_rows, "w"_a, "n"_a, "ids"_a = nb::none(),
        "rows ids (default: all n) of a packed float weight as float32 [..., K]");
  m.def("row_exact_attention", &mlxcel::row_exact_attention, "q"_a, "k"_a, "v"_a, "scale"_a, "causal"_a,
        "softmax(scale q k^T) v computed one query row at a time (row i of a causal block sees keys "
        "0..S-L+i): each row bit-identical to a one-row call at the same position");
  m.def("kv_rows", &mlxcel::kv_rows, "x"_a, "dtype"_a,
        "float32 rows [..., D] as KV cache rows of dtype (float32, float16, bfloat16; int8 for q8_0: "
        "[..., D + D/16], D int8 then D/32 float16 scales; uint8 for q4_0: [..., D/2 + D/16]), rounded as the "
        "kernels round a row they write");
  m.def("row_exact_cache_attention",
        [](const mlx::core::array& q, const mlx::core::array& k_new, const mlx::core::array& v_new,
           const std::vector<mlx::core::array>& k_bufs, const std::vector<mlx::core::array>& v_bufs,
           const std::vector<int>& seq, const std::vector<int>& pos, float scale, const Rows& slot, const Rows& base,
           const Tails& tail) {
          return mlxcel::row_exact_cache_attention(q, k_new, v_new, k_bufs, v_bufs, seq, pos, scale,
                                                   tree_rows(slot, base, tail));
        },
        "q"_a, "k_new"_a, "v_new"_a, "k_bufs"_a, "v_bufs"_a, "seq"_a, "pos"_a, "scale"_a, "slot"_a = nb::none(),
        "base"_a = nb::none(), "tail"_a = nb::none(),
        "entries of L rows, entry e of sequence seq[e] at positions pos[e]..: their new keys/values "
        "written into that sequence's buffers and each row attended over keys 0..its position of its "
        "own sequence: [attention, k_bufs..., v_bufs...]; rows equal row_exact_attention over each "
        "sequence alone. Draft-tree rows (entries of one row; slot, base and tail together): entry e "
        "written at row slot[e] of its buffers and attending rows 0..base[e]-1, then the rows tail[e]");
  m.def("move_rows", &mlxcel::move_rows, "bufs"_a, "rows"_a, "first"_a,
        "KV buffers [1, heads, capacity, dim] with row rows[j] moved to row first + j (a draft tree's "
        "accepted path), in place where only this op holds them");
  m.def("buffer_updates", []() { return std::make_pair(mlxcel::buffers_donated.load(), mlxcel::buffers_copied.load()); },
        "(buffers updated in place, buffers copied first) by row_exact_cache_attention so far");
  m.def("row_swiglu", &mlxcel::row_swiglu, "gate"_a, "up"_a, "silu(gate) * up, elementwise (vectorised exp)");
  m.def("row_rope", &mlxcel::row_rope, "x"_a, "dims"_a, "traditional"_a, "base"_a, "scale"_a, "offset"_a = 0,
        "offsets"_a = nb::none(),
        "rotary embedding of x [B, heads, L, dim], entry b at offsets[b] (or offset); each row depends "
        "on its own values and position alone");
  m.def("dequantize_rows", &mlxcel::dequantize_weight_rows, "w"_a, "scales"_a, "biases"_a, "bits"_a, "ids"_a = nb::none(),
        "rows ids (default: all) of a repacked weight as float32 [..., K]");
  m.def("to_huge_pages", [](std::vector<mlx::core::array> arrays) {
        auto r = mlxcel::to_huge_pages(std::move(arrays));
        return std::make_tuple(r.arrays, r.bytes, r.huge_bytes);
      }, "arrays"_a,
      "copies of the arrays, back to back in one arena of transparent huge pages: (copies, arena bytes, "
      "bytes in huge pages); the inputs and 0, 0 where no arena can be made");
  m.def("huge_pages_bytes", &mlxcel::huge_pages_bytes, "bytes the live huge-page arenas map");
  m.def("repack", &mlxcel::repack_weight, "w"_a, "bits"_a, "MLX affine uint32 rows -> the kernel's uint8 layout (eager)");
  m.def("interleave", &mlxcel::interleave_blocks, "a"_a,
        "per-block scales or biases float32 [N, K/32] -> the kernel's order (16 rows side by side per block; eager)");
  m.def("unpack", &mlxcel::unpack_weight, "w"_a, "bits"_a, "the kernel's layout -> uint8 values [N, K] (eager)");
  m.def("isa_supported", [](const std::string& name) { const auto isa = isa_named(name); return isa && mlxcel::isa_supported(*isa); },
        "name"_a, "whether this CPU runs the kernels' build for 'avx512', 'avxvnni' or 'avx2'");
  m.def("set_isa", [](const std::string& name) { const auto isa = isa_named(name); return isa && mlxcel::set_isa(*isa); },
        "name"_a, "run the 'avx512', 'avxvnni' or 'avx2' build of the kernels (same bits); False where this CPU cannot");
  m.def("isa", []() { return std::string(isa_name(mlxcel::active_isa())); }, "the build of the kernels in use");
  m.def("avxvnni_as_evex", []() { return MLXCEL_AVXVNNI_EVEX != 0; },
        "whether this is the test build whose 'avxvnni' kernels use EVEX vpdpbusd (CMakeLists.txt)");
  m.def("amx_supported", &mlxcel::amx_supported,
        "whether AMX int8 tiles are usable here (CPU and OS; the extension built with them)");
  m.def("set_amx_rows", [](int n) {
          const bool on = n > 0 && mlxcel::amx_supported() && mlxcel::active_isa() == mlxcel::Isa::avx512;
          mlxcel::amx_rows.store(on ? n : INT_MAX);
          return mlxcel::amx_rows.load() != INT_MAX;
        }, "n"_a, "blocks of at least n rows go through AMX tiles (0: never); returns whether AMX is on");
  m.def("amx_rows", []() { const int n = mlxcel::amx_rows.load(); return n == INT_MAX ? 0 : n; });
  m.def("set_threads", [](int n) { mlxcel::kernel_threads.store(n < 1 ? 1 : n); }, "n"_a);
  m.def("threads", []() { return mlxcel::kernel_threads.load(); });
  m.def("kernel_time", []() { return std::make_pair(mlxcel::qmm_ns.load() * 1e-9, mlxcel::qmm_calls.load()); },
        "(seconds spent in the row kernel, calls) since the process started");
  m.def("layer_time", []() { return std::make_pair(mlxcel::layer_ns.load() * 1e-9, mlxcel::layer_calls.load()); },
        "(seconds spent in the fused decoder layers, calls) since the process started");
  nb::class_<mlxcel::DecoderLayer>(m, "DecoderLayer",
                                   "one llama-family decoder layer (RMSNorm, q/k/v, rope, cache write, attention, "
                                   "o, residual, RMSNorm, gate/up, SwiGLU, down, residual) as one op")
      .def(nb::init<const std::vector<mlx::core::array>&, const std::vector<std::optional<mlx::core::array>>&,
                    const std::vector<std::optional<mlx::core::array>>&,
                    const std::vector<int>&, const std::vector<std::optional<mlx::core::array>>&, const mlx::core::array&,
                    const mlx::core::array&, std::optional<mlx::core::array>, std::optional<mlx::core::array>, float, float, int, int, int,
                    int, bool, float, float, float, std::optional<mlx::core::array>>(),
           "ws"_a, "scales"_a, "biases"_a, "bits"_a, "bias"_a, "attn_norm"_a, "mlp_norm"_a, "q_norm"_a.none(),
           "k_norm"_a.none(), "eps"_a, "qk_eps"_a, "heads"_a, "kv_heads"_a, "head_dim"_a, "rope_dims"_a,
           "rope_traditional"_a, "rope_base"_a, "rope_scale"_a, "attn_scale"_a, "in2_norm"_a.none() = nb::none(),
           "linears in the order q, k, v, o, gate, up, down (the kernels' layouts, as RowExactLinear and "
           "RowExactFloatLinear hold them; a float linear's scales and biases are None); in2_norm: an EAGLE-3 "
           "midlayer, whose q/k/v read [attn_norm(e); in2_norm(h)] and whose calls pass e")
      .def("__call__",
           [](const mlxcel::DecoderLayer& self, const mlx::core::array& h, const std::vector<mlx::core::array>& k_bufs,
              const std::vector<mlx::core::array>& v_bufs, const std::vector<int>& seq, const std::vector<int>& pos,
              const Rows& slot, const Rows& base, const Tails& tail, std::optional<mlx::core::array> e) {
             return self(h, k_bufs, v_bufs, seq, pos, tree_rows(slot, base, tail), e);
           },
           "h"_a, "k_bufs"_a, "v_bufs"_a, "seq"_a, "pos"_a, "slot"_a = nb::none(), "base"_a = nb::none(),
           "tail"_a = nb::none(), "e"_a.none() = nb::none(),
           "[h out, key buffers..., value buffers...]: row t of sequence seq[t] at position pos[t]; draft-tree "
           "rows (slot, base and tail together): row t rotated at pos[t], written at row slot[t] and attending "
           "rows 0..base[t]-1, then the rows tail[t]");
  m.def("attention_time", []() { return mlxcel::attention_ns.load() * 1e-9; },
        "seconds spent in the row-exact attention kernels since the process started");
}
