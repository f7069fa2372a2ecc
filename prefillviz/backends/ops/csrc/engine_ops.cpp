// The engine's compiled CPU ops (kernels/engine_ops.py builds, loads and checks them).
//
// One op per step of a decoder layer that plain torch runs as several:
//   rms_norm          RMSNorm of each row, in fp32, rounded as transformers rounds it
//   add_rms_norm      residual += x, then RMSNorm of the new residual (vLLM's fused_add_rms_norm), new or over x
//   silu_mul          silu(gate) * up over the stacked [gate | up] projection
//   rope_write_kv     RoPE on the q and k of the stacked [q | k | v] projection, in place, and
//                     the step's K and V written into the paged cache through the slot mapping
//   paged_attention   flash-style attention of every request's new queries over its context,
//                     read from the paged cache through its slots; scores, online softmax and
//                     P V in fp32 (FlashAttention's tiling, on a CPU). With row_lanes, a request
//                     whose rows fill a vector has them across the lanes (attention_row_lanes.h;
//                     v7); without, every request is in key tiles (v7 tiles), where a bf16 model
//                     on a CPU with AVX512-BF16 (asked at run time) multiplies bf16 pairs
//                     (vdpbf16ps): q.k exact, P rounded to bf16 before P V, sums in fp32
//   brgemm_paged      v8: a paged step's bf16 or fp32 attention, its two matmuls on oneDNN's brgemm
//                     micro-kernel (AMX where the CPU has it), the softmax between them in fp32
//                     (attention_brgemm.h); brgemm_block_sparse: the same over a fresh prompt's kept tiles only,
//                     and antidiagonal_scores and select_tiles, XAttention's scores of its tiles and the
//                     tiles they keep (antidiagonal_scores.h)
//   brgemm_linear     x W^T (bf16 or fp32) on the same micro-kernel (fp32: or the engine's own, the slab linear), from a weight packed in slabs of
//                     64 columns; a gated MLP's silu(x G^T) * (x U^T) in one pass (linear_brgemm.h)
//
// Vectors are ATen's at::vec::Vectorized<float>: 16 lanes where torch's probe of the CPU says
// AVX-512, 8 for AVX2, plain C++ otherwise (the build passes that probe's flags and macro).
#include <torch/extension.h>

#include <ATen/Parallel.h>
#include <ATen/cpu/vec/functional.h>
#include <ATen/cpu/vec/vec.h>
#include <ATen/native/CPUBlas.h>
#include <c10/util/BFloat16.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cstdint>
#include <cstring>
#include <numeric>
#if defined(CPU_CAPABILITY_AVX512)
#include <immintrin.h>
#endif
#include <cmath>
#include <limits>
#include <string>
#include <tuple>
#include <type_traits>
#include <vector>

namespace {

using Vec = at::vec::Vectorized<float>;
constexpr int kW = Vec::size();
constexpr float kNegInf = -std::numeric_limits<float>::infinity();

template <typename T>
inline float rnd(float x) {  // round to T's precision (the identity for float)
  return static_cast<float>(static_cast<T>(x));
}

// n elements of T as floats (bf16: ATen's vector conversion), and back, rounded to nearest even
inline void to_float(const float* src, float* dst, int64_t n) { std::memcpy(dst, src, n * sizeof(float)); }
inline void to_float(const c10::BFloat16* src, float* dst, int64_t n) {
  using BVec = at::vec::Vectorized<c10::BFloat16>;
  int64_t i = 0;
  for (; i + BVec::size() <= n; i += BVec::size()) {
    auto halves = at::vec::convert_to_float<c10::BFloat16>(BVec::loadu(src + i));
    std::get<0>(halves).store(dst + i);
    std::get<1>(halves).store(dst + i + kW);
  }
  for (; i < n; ++i) dst[i] = static_cast<float>(src[i]);
}
inline void from_float(const float* src, float* dst, int64_t n) { std::memcpy(dst, src, n * sizeof(float)); }
inline void from_float(const float* src, c10::BFloat16* dst, int64_t n) {
  using BVec = at::vec::Vectorized<c10::BFloat16>;
  int64_t i = 0;
  for (; i + BVec::size() <= n; i += BVec::size())
    at::vec::convert_from_float<c10::BFloat16>(Vec::loadu(src + i), Vec::loadu(src + i + kW)).store(dst + i);
  for (; i < n; ++i) dst[i] = static_cast<c10::BFloat16>(src[i]);
}
// floats rounded to T's precision, in place (a no-op for float)
inline void round_to(float*, int64_t, float*) {}
inline void round_to(float* v, int64_t n, c10::BFloat16* tmp) {
  from_float(v, tmp, n);
  to_float(tmp, v, n);
}
template <typename T>
inline void round_as(float* v, int64_t n, std::vector<T>& tmp) {
  if constexpr (!std::is_same_v<T, float>) round_to(v, n, tmp.data());
}

// How floats become bf16 in the one-pass loops below: ATen's conversion (round to nearest even in
// integer arithmetic, about eight instructions a vector), or, on a CPU with AVX512-BF16 (asked at
// run time, as for the attention's dot products), its own instruction vcvtne(2)ps2bf16: the same
// rounding in one. They differ only on a float below 1.2e-38 (a denormal), which the instruction
// reads as zero, and in a NaN's payload (a NaN either way). Written as inline asm, which needs no
// target attribute, so the loops are templates on the rounding and the compiler never sees the
// instruction in an AVX2 or plain build.
using BVec = at::vec::Vectorized<c10::BFloat16>;
struct AtenRound {
  static void store(c10::BFloat16* p, const Vec& a, const Vec& b) { at::vec::convert_from_float<c10::BFloat16>(a, b).store(p); }
  static std::tuple<Vec, Vec> round(const Vec& a, const Vec& b) {
    return at::vec::convert_to_float<c10::BFloat16>(at::vec::convert_from_float<c10::BFloat16>(a, b));
  }
};
#if defined(CPU_CAPABILITY_AVX512)
struct NativeRound {
  static void store(c10::BFloat16* p, const Vec& a, const Vec& b) {
    __m512i both;  // a's 16 bf16 in the low half, b's in the high half
    asm("vcvtne2ps2bf16 %2, %1, %0" : "=v"(both) : "v"(static_cast<__m512>(b)), "v"(static_cast<__m512>(a)));
    _mm512_storeu_si512(p, both);
  }
  static Vec round_one(const Vec& a) {
    __m256i half;
    asm("vcvtneps2bf16 %1, %0" : "=v"(half) : "v"(static_cast<__m512>(a)));
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(half), 16));
  }
  static std::tuple<Vec, Vec> round(const Vec& a, const Vec& b) { return {round_one(a), round_one(b)}; }
};
#endif

// A row in pairs of float vectors (a bf16 vector holds 2 kW; a float row is read two vectors at a
// time so that both dtypes share one loop): load, store, and the round trip that rounds a float to
// T's precision in a register (what from_float then to_float does in memory; nothing for float)
inline std::tuple<Vec, Vec> load_pair(const c10::BFloat16* p) { return at::vec::convert_to_float<c10::BFloat16>(BVec::loadu(p)); }
inline std::tuple<Vec, Vec> load_pair(const float* p) { return {Vec::loadu(p), Vec::loadu(p + kW)}; }
template <typename R>
inline void store_pair(c10::BFloat16* p, const Vec& a, const Vec& b) { R::store(p, a, b); }
template <typename R>
inline void store_pair(float* p, const Vec& a, const Vec& b) {
  a.store(p);
  b.store(p + kW);
}
template <typename T, typename R>
inline std::tuple<Vec, Vec> round_pair(const Vec& a, const Vec& b) {
  if constexpr (std::is_same_v<T, float>) return {a, b};
  else return R::round(a, b);
}

// out = a (op) b over n floats, vectorized
template <typename F>
inline void map2(const float* a, const float* b, float* out, int64_t n, F f) {
  int64_t i = 0;
  for (; i + kW <= n; i += kW) f(Vec::loadu(a + i), Vec::loadu(b + i)).store(out + i);
  if (i < n) f(Vec::loadu(a + i, n - i), Vec::loadu(b + i, n - i)).store(out + i, n - i);
}

inline float sum_of_squares(const float* v, int64_t n) {
  Vec acc(0.f);
  int64_t i = 0;
  for (; i + kW <= n; i += kW) {
    Vec x = Vec::loadu(v + i);
    acc = at::vec::fmadd(x, x, acc);
  }
  float sum = at::vec::vec_reduce_all<float>([](Vec& x, Vec& y) { return x + y; }, acc);
  for (; i < n; ++i) sum += v[i] * v[i];
  return sum;
}

// One row's scratch: the row, the weight (as floats, once per chunk of rows), T-sized rounding room.
template <typename T>
struct RowScratch {
  std::vector<float> x, w, y;
  std::vector<T> tmp;
  RowScratch(const T* weight, int64_t n) : x(n), w(n), y(n), tmp(n) { to_float(weight, w.data(), n); }
};

// transformers' LlamaRMSNorm of the row in x: weight * (x * rsqrt(mean(x^2) + eps)).to(dtype), in fp32
template <typename T>
inline void rms_norm_row(RowScratch<T>& scratch, T* out, int64_t n, float eps) {
  const float s = 1.f / std::sqrt(sum_of_squares(scratch.x.data(), n) / static_cast<float>(n) + eps);
  const Vec scale(s);
  map2(scratch.x.data(), scratch.x.data(), scratch.y.data(), n, [&](Vec x, Vec) { return x * scale; });
  round_as(scratch.y.data(), n, scratch.tmp);
  map2(scratch.y.data(), scratch.w.data(), scratch.y.data(), n, [](Vec y, Vec w) { return y * w; });
  from_float(scratch.y.data(), out, n);
}

template <typename T>
void rms_norm_impl(const at::Tensor& x, const at::Tensor& w, at::Tensor& out, double eps) {
  const int64_t n = x.size(-1), rows = x.numel() / n;
  const T* xp = x.data_ptr<T>();
  const T* wp = w.data_ptr<T>();
  T* op = out.data_ptr<T>();
  at::parallel_for(0, rows, 64, [&](int64_t begin, int64_t end) {
    RowScratch<T> scratch(wp, n);
    for (int64_t r = begin; r < end; ++r) {
      to_float(xp + r * n, scratch.x.data(), n);
      rms_norm_row(scratch, op + r * n, n, static_cast<float>(eps));
    }
  });
}

// add_rms_norm_impl's arithmetic for a row of whole pairs of vectors, in two passes instead of ten
// (bf16) or six (float): h + x rounded (stored, and its square summed in the same order), then
// scaled, rounded, times w
template <typename T, typename R>
void add_rms_norm_pairs(const T* xp, T* hp, const T* wp, T* op, int64_t rows, int64_t n, float eps) {
  at::parallel_for(0, rows, 64, [&](int64_t begin, int64_t end) {
    std::vector<float> h(n), w(n);
    to_float(wp, w.data(), n);
    for (int64_t r = begin; r < end; ++r) {
      T* hr = hp + r * n;
      const T* xr = xp + r * n;
      Vec acc(0.f);
      for (int64_t i = 0; i < n; i += 2 * kW) {
        auto [h0, h1] = load_pair(hr + i);
        auto [x0, x1] = load_pair(xr + i);
        const Vec s0 = h0 + x0, s1 = h1 + x1;
        store_pair<R>(hr + i, s0, s1);  // h += x, in T
        auto [r0, r1] = round_pair<T, R>(s0, s1);
        r0.store(h.data() + i);
        r1.store(h.data() + i + kW);
        acc = at::vec::fmadd(r0, r0, acc);
        acc = at::vec::fmadd(r1, r1, acc);
      }
      const float sum = at::vec::vec_reduce_all<float>([](Vec& a, Vec& b) { return a + b; }, acc);
      const Vec scale(1.f / std::sqrt(sum / static_cast<float>(n) + eps));
      for (int64_t i = 0; i < n; i += 2 * kW) {
        auto [y0, y1] = round_pair<T, R>(Vec::loadu(h.data() + i) * scale, Vec::loadu(h.data() + i + kW) * scale);
        store_pair<R>(op + r * n + i, y0 * Vec::loadu(w.data() + i), y1 * Vec::loadu(w.data() + i + kW));
      }
    }
  });
}

template <typename T, typename R>
void add_rms_norm_impl(const at::Tensor& x, at::Tensor& residual, const at::Tensor& w, at::Tensor& out, double eps) {
  const int64_t n = x.size(-1), rows = x.numel() / n;
  const T* xp = x.data_ptr<T>();
  T* hp = residual.data_ptr<T>();
  const T* wp = w.data_ptr<T>();
  T* op = out.data_ptr<T>();
  if (n % (2 * kW) == 0) return add_rms_norm_pairs<T, R>(xp, hp, wp, op, rows, n, static_cast<float>(eps));
  at::parallel_for(0, rows, 64, [&](int64_t begin, int64_t end) {
    RowScratch<T> scratch(wp, n);
    for (int64_t r = begin; r < end; ++r) {
      to_float(hp + r * n, scratch.x.data(), n);
      to_float(xp + r * n, scratch.y.data(), n);
      map2(scratch.x.data(), scratch.y.data(), scratch.x.data(), n, [](Vec h, Vec a) { return h + a; });
      from_float(scratch.x.data(), hp + r * n, n);  // h += x, in T
      round_as(scratch.x.data(), n, scratch.tmp);
      rms_norm_row(scratch, op + r * n, n, static_cast<float>(eps));
    }
  });
}

// silu(x) = x / (1 + e^-x) in fp32 vectors: silu_mul's, and the brgemm linear's gated epilogue's
inline Vec silu(const Vec& x) { return x / (Vec(1.f) + x.neg().exp_u20()); }

// silu(gate) rounded to T, times up, rounded to T: as torch computes F.silu(gate) * up
template <typename T, typename R>
void silu_mul_impl(const at::Tensor& gate_up, at::Tensor& out) {
  const int64_t width = out.size(-1), rows = out.numel() / width;
  const T* gp = gate_up.data_ptr<T>();
  T* op = out.data_ptr<T>();
  if (width % (2 * kW) == 0) {  // the same arithmetic in one pass, a pair of vectors at a time
    at::parallel_for(0, rows, 16, [&](int64_t begin, int64_t end) {
      for (int64_t r = begin; r < end; ++r) {
        const T* g = gp + r * 2 * width;
        for (int64_t i = 0; i < width; i += 2 * kW) {
          auto [g0, g1] = load_pair(g + i);
          auto [u0, u1] = load_pair(g + width + i);
          auto [s0, s1] = round_pair<T, R>(silu(g0), silu(g1));
          store_pair<R>(op + r * width + i, s0 * u0, s1 * u1);
        }
      }
    });
    return;
  }
  at::parallel_for(0, rows, 16, [&](int64_t begin, int64_t end) {
    std::vector<float> gate(width), up(width);
    std::vector<T> tmp(width);
    for (int64_t r = begin; r < end; ++r) {
      const T* g = gp + r * 2 * width;
      to_float(g, gate.data(), width);
      to_float(g + width, up.data(), width);
      map2(gate.data(), gate.data(), gate.data(), width, [](Vec x, Vec) { return silu(x); });
      round_as(gate.data(), width, tmp);
      map2(gate.data(), up.data(), gate.data(), width, [](Vec a, Vec b) { return a * b; });
      from_float(gate.data(), op + r * width, width);
    }
  });
}

// qkv (T, (H + 2 KVH) D): RoPE on the first H + KVH heads in place (x cos + rotate_half(x) sin,
// each product rounded to T as transformers computes it), then K and V into the cache at slots.
template <typename T, typename R>
void rope_write_kv_impl(at::Tensor& qkv, const at::Tensor& cos, const at::Tensor& sin, const at::Tensor& slots,
                        at::Tensor& key_cache, at::Tensor& value_cache, int64_t num_heads) {
  const int64_t tokens = qkv.size(0), row = qkv.stride(0);
  const int64_t kv_heads = key_cache.size(2), dim = key_cache.size(3), half = dim / 2;
  T* base = qkv.data_ptr<T>();
  const T* cp = cos.data_ptr<T>();
  const T* sp = sin.data_ptr<T>();
  const int64_t* slot = slots.data_ptr<int64_t>();
  T* kc = key_cache.data_ptr<T>();
  T* vc = value_cache.data_ptr<T>();
  at::parallel_for(0, tokens, 16, [&](int64_t begin, int64_t end) {
    std::vector<float> x(dim);
    for (int64_t t = begin; t < end; ++t) {
      const T* c = cp + t * dim;
      const T* s = sp + t * dim;
      for (int64_t head = 0; head < num_heads + kv_heads; ++head) {
        T* v = base + t * row + head * dim;
        if (half % (2 * kW) == 0) {  // the same arithmetic, a pair of vectors of each half at a time
          for (int64_t d = 0; d < half; d += 2 * kW) {
            auto [lo0, lo1] = load_pair(v + d);
            auto [hi0, hi1] = load_pair(v + half + d);
            auto [clo0, clo1] = load_pair(c + d);
            auto [chi0, chi1] = load_pair(c + half + d);
            auto [slo0, slo1] = load_pair(s + d);
            auto [shi0, shi1] = load_pair(s + half + d);
            auto [a0, a1] = round_pair<T, R>(lo0 * clo0, lo1 * clo1);
            auto [b0, b1] = round_pair<T, R>(hi0.neg() * slo0, hi1.neg() * slo1);  // rotate_half: -x[d + half] first
            auto [e0, e1] = round_pair<T, R>(hi0 * chi0, hi1 * chi1);
            auto [f0, f1] = round_pair<T, R>(lo0 * shi0, lo1 * shi1);
            store_pair<R>(v + d, a0 + b0, a1 + b1);
            store_pair<R>(v + half + d, e0 + f0, e1 + f1);
          }
          continue;
        }
        for (int64_t d = 0; d < dim; ++d) x[d] = static_cast<float>(v[d]);
        for (int64_t d = 0; d < dim; ++d) {
          float rotated = d < half ? -x[d + half] : x[d - half];
          float a = rnd<T>(x[d] * static_cast<float>(c[d]));
          float b = rnd<T>(rotated * static_cast<float>(s[d]));
          v[d] = static_cast<T>(a + b);
        }
      }
      const T* k = base + t * row + num_heads * dim;
      const T* vv = k + kv_heads * dim;
      std::copy(k, k + kv_heads * dim, kc + slot[t] * kv_heads * dim);
      std::copy(vv, vv + kv_heads * dim, vc + slot[t] * kv_heads * dim);
    }
  });
}

// ---------------------------------------------------------------------------- attention
constexpr int kKeyTile = 2 * kW;  // keys per tile: two vectors of scores per query row
constexpr int kQueryBlock = 16;   // tokens per task (x G query heads of one KV head = its rows)
constexpr int kRows = kW == 16 ? 8 : 4;  // query rows per scores micro-kernel (16 or 8 accumulators)

struct Task {
  int64_t request, kv_head, first, count;  // query tokens [first, first + count) of the request
  int64_t keys;                            // keys its last row sees (its cost)
};

#include "attention_row_lanes.h"

inline float reduce_max(Vec v) {
  return at::vec::vec_reduce_all<float>([](Vec& a, Vec& b) { return at::vec::maximum(a, b); }, v);
}
inline float reduce_sum(Vec v) {
  return at::vec::vec_reduce_all<float>([](Vec& a, Vec& b) { return a + b; }, v);
}

// S[rows, kKeyTile] = Q[rows, dim] . Kt[dim, kKeyTile], kRows rows at a time (rows padded)
inline void scores_tile(const float* q, const float* kt, float* s, int64_t rows, int64_t dim) {
  for (int64_t i0 = 0; i0 < rows; i0 += kRows) {
    Vec acc[kRows][2];
    for (int r = 0; r < kRows; ++r) acc[r][0] = acc[r][1] = Vec(0.f);
    for (int64_t d = 0; d < dim; ++d) {
      Vec k0 = Vec::loadu(kt + d * kKeyTile), k1 = Vec::loadu(kt + d * kKeyTile + kW);
      for (int r = 0; r < kRows; ++r) {
        Vec qv(q[(i0 + r) * dim + d]);
        acc[r][0] = at::vec::fmadd(qv, k0, acc[r][0]);
        acc[r][1] = at::vec::fmadd(qv, k1, acc[r][1]);
      }
    }
    for (int r = 0; r < kRows; ++r) {
      acc[r][0].store(s + (i0 + r) * kKeyTile);
      acc[r][1].store(s + (i0 + r) * kKeyTile + kW);
    }
  }
}

// O[rows, DV kW] = alpha[row] O + P[rows, kKeyTile] . V[kKeyTile, DV kW], RB rows at a time
template <int DV>
inline void pv_tile(const float* p, const float* alpha, const float* v, float* o, int64_t rows, int64_t keys) {
  constexpr int RB = DV <= 4 ? 4 : (DV <= 8 ? 2 : 1);
  constexpr int64_t dim = DV * kW;
  for (int64_t i0 = 0; i0 < rows; i0 += RB) {
    Vec acc[RB][DV];
    for (int r = 0; r < RB; ++r) {
      Vec a(alpha[i0 + r]);
      for (int c = 0; c < DV; ++c) acc[r][c] = Vec::loadu(o + (i0 + r) * dim + c * kW) * a;
    }
    for (int64_t j = 0; j < keys; ++j) {
      Vec vv[DV];
      for (int c = 0; c < DV; ++c) vv[c] = Vec::loadu(v + j * dim + c * kW);
      for (int r = 0; r < RB; ++r) {
        Vec pv(p[(i0 + r) * kKeyTile + j]);
        for (int c = 0; c < DV; ++c) acc[r][c] = at::vec::fmadd(pv, vv[c], acc[r][c]);
      }
    }
    for (int r = 0; r < RB; ++r)
      for (int c = 0; c < DV; ++c) acc[r][c].store(o + (i0 + r) * dim + c * kW);
  }
}

// One request's context for one KV head, in fp32 tiles: K transposed (dim, kKeyTile) per tile,
// then V (kKeyTile, dim) per tile; keys past the context are zeros.
template <typename T>
void convert_tiles(const T* key_cache, const T* value_cache, const int64_t* slots, int64_t num_keys, int64_t tile,
                   int64_t kv_head, int64_t kv_heads, int64_t dim, float* kt, float* vf) {
  const int64_t row_stride = kv_heads * dim;
  for (int64_t j = 0; j < kKeyTile; ++j) {
    const int64_t key = tile * kKeyTile + j;
    if (key < num_keys) {
      const T* k = key_cache + slots[key] * row_stride + kv_head * dim;
      const T* v = value_cache + slots[key] * row_stride + kv_head * dim;
      for (int64_t d = 0; d < dim; ++d) {
        kt[d * kKeyTile + j] = static_cast<float>(k[d]);
        vf[j * dim + d] = static_cast<float>(v[d]);
      }
    } else {
      for (int64_t d = 0; d < dim; ++d) kt[d * kKeyTile + j] = vf[j * dim + d] = 0.f;
    }
  }
}

// fp32 tiles and FMAs: any CPU, any dtype
template <typename T, int DV>
struct Fp32Tiles {
  static constexpr int64_t dim = DV * kW;
  static constexpr int64_t tile_words = 2 * dim * kKeyTile;  // K^T (dim, 32) then V (32, dim), fp32
  static constexpr int64_t query_words = dim;
  static void convert(const T* kc, const T* vc, const int64_t* slots, int64_t num_keys, int64_t tile, int64_t kv_head,
                      int64_t kv_heads, float* dst) {
    convert_tiles(kc, vc, slots, num_keys, tile, kv_head, kv_heads, dim, dst, dst + dim * kKeyTile);
  }
  static float query(const T* src, float* dst, float scale) {  // returns the scale still to apply to the scores
    for (int64_t d = 0; d < dim; ++d) dst[d] = static_cast<float>(src[d]) * scale;
    return 1.f;
  }
  static void scores(const float* q, const float* tile, float* s, int64_t rows) { scores_tile(q, tile, s, rows, dim); }
  static void pv(const float* p, const float* alpha, const float* tile, float* o, int64_t rows, int64_t keys) {
    pv_tile<DV>(p, alpha, tile + dim * kKeyTile, o, rows, keys);
  }
};

#if defined(CPU_CAPABILITY_AVX512)
// bf16 pairs and AVX512-BF16's dot product (vdpbf16ps: two bf16 products a lane, summed in fp32), for a
// bf16 model on a CPU that has it: q.k products exact, P rounded to bf16 before P V (as torch's
// bf16 SDPA rounds it), accumulation in fp32.
#define PFV_BF16_TARGET __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx512bf16,fma"), noinline))

bool cpu_has_bf16_dot() {
  static const bool has = __builtin_cpu_supports("avx512bf16");
  return has;
}

// keys [tile * 32, + 32) of one KV head: K as (dim / 2, 32) words, each a pair of dims of one key;
// V as (16, dim) words, each one dim of a pair of keys; keys past the context are zeros
inline void convert_tiles_bf16(const c10::BFloat16* kc, const c10::BFloat16* vc, const int64_t* slots, int64_t num_keys, int64_t tile,
                               int64_t kv_head, int64_t kv_heads, int64_t dim, uint32_t* kt, uint32_t* vt) {
  const int64_t row_stride = kv_heads * dim;
  for (int64_t j = 0; j < kKeyTile; ++j) {
    const int64_t key = tile * kKeyTile + j;
    const uint32_t* k = key < num_keys ? reinterpret_cast<const uint32_t*>(kc + slots[key] * row_stride + kv_head * dim) : nullptr;
    for (int64_t d = 0; d < dim / 2; ++d) kt[d * kKeyTile + j] = k ? k[d] : 0u;
  }
  for (int64_t j = 0; j < kKeyTile / 2; ++j) {
    const int64_t key = tile * kKeyTile + 2 * j;
    const uint16_t* v0 = key < num_keys ? reinterpret_cast<const uint16_t*>(vc + slots[key] * row_stride + kv_head * dim) : nullptr;
    const uint16_t* v1 = key + 1 < num_keys ? reinterpret_cast<const uint16_t*>(vc + slots[key + 1] * row_stride + kv_head * dim) : nullptr;
    for (int64_t c = 0; c < dim; ++c) vt[j * dim + c] = (v0 ? v0[c] : 0u) | (static_cast<uint32_t>(v1 ? v1[c] : 0u) << 16);
  }
}

PFV_BF16_TARGET void scores_tile_bf16(const uint32_t* q, const uint32_t* kt, float* s, int64_t rows, int64_t dim) {
  const int64_t pairs = dim / 2;
  for (int64_t i0 = 0; i0 < rows; i0 += kRows) {
    __m512 acc[kRows][2];
    for (int r = 0; r < kRows; ++r) acc[r][0] = acc[r][1] = _mm512_setzero_ps();
    for (int64_t d = 0; d < pairs; ++d) {
      __m512bh k0 = (__m512bh)_mm512_loadu_si512(kt + d * kKeyTile), k1 = (__m512bh)_mm512_loadu_si512(kt + d * kKeyTile + 16);
      for (int r = 0; r < kRows; ++r) {
        __m512bh qv = (__m512bh)_mm512_set1_epi32(static_cast<int>(q[(i0 + r) * pairs + d]));
        acc[r][0] = _mm512_dpbf16_ps(acc[r][0], qv, k0);
        acc[r][1] = _mm512_dpbf16_ps(acc[r][1], qv, k1);
      }
    }
    for (int r = 0; r < kRows; ++r) {
      _mm512_storeu_ps(s + (i0 + r) * kKeyTile, acc[r][0]);
      _mm512_storeu_ps(s + (i0 + r) * kKeyTile + 16, acc[r][1]);
    }
  }
}

template <int DV>
PFV_BF16_TARGET void pv_tile_bf16(const float* p, const float* alpha, const uint32_t* vt, float* o, int64_t rows, int64_t keys) {
  constexpr int RB = DV <= 4 ? 4 : (DV <= 8 ? 2 : 1);
  constexpr int64_t dim = DV * 16;
  const int64_t pairs = (keys + 1) / 2;
  for (int64_t i0 = 0; i0 < rows; i0 += RB) {
    __m512 acc[RB][DV];
    alignas(64) uint32_t pp[RB][16];  // each row's probabilities as bf16 pairs of keys
    for (int r = 0; r < RB; ++r) {
      __m512 a = _mm512_set1_ps(alpha[i0 + r]);
      for (int c = 0; c < DV; ++c) acc[r][c] = _mm512_mul_ps(_mm512_loadu_ps(o + (i0 + r) * dim + c * 16), a);
      const float* row = p + (i0 + r) * kKeyTile;
      _mm512_store_si512(pp[r], (__m512i)_mm512_cvtne2ps_pbh(_mm512_loadu_ps(row + 16), _mm512_loadu_ps(row)));
    }
    for (int64_t j = 0; j < pairs; ++j) {
      __m512bh vv[DV];
      for (int c = 0; c < DV; ++c) vv[c] = (__m512bh)_mm512_loadu_si512(vt + j * dim + c * 16);
      for (int r = 0; r < RB; ++r) {
        __m512bh pv = (__m512bh)_mm512_set1_epi32(static_cast<int>(pp[r][j]));
        for (int c = 0; c < DV; ++c) acc[r][c] = _mm512_dpbf16_ps(acc[r][c], pv, vv[c]);
      }
    }
    for (int r = 0; r < RB; ++r)
      for (int c = 0; c < DV; ++c) _mm512_storeu_ps(o + (i0 + r) * dim + c * 16, acc[r][c]);
  }
}

template <int DV>
struct Bf16DotTiles {
  static constexpr int64_t dim = DV * kW;
  static constexpr int64_t tile_words = dim * kKeyTile;  // K pairs (dim / 2, 32) then V pairs (16, dim)
  static constexpr int64_t query_words = dim / 2;
  static void convert(const c10::BFloat16* kc, const c10::BFloat16* vc, const int64_t* slots, int64_t num_keys, int64_t tile,
                      int64_t kv_head, int64_t kv_heads, float* dst) {
    uint32_t* words = reinterpret_cast<uint32_t*>(dst);
    convert_tiles_bf16(kc, vc, slots, num_keys, tile, kv_head, kv_heads, dim, words, words + dim / 2 * kKeyTile);
  }
  static float query(const c10::BFloat16* src, float* dst, float scale) {  // the bf16 pairs as they are; scale the scores
    std::memcpy(dst, src, dim * sizeof(c10::BFloat16));
    return scale;
  }
  static void scores(const float* q, const float* tile, float* s, int64_t rows) {
    scores_tile_bf16(reinterpret_cast<const uint32_t*>(q), reinterpret_cast<const uint32_t*>(tile), s, rows, dim);
  }
  static void pv(const float* p, const float* alpha, const float* tile, float* o, int64_t rows, int64_t keys) {
    pv_tile_bf16<DV>(p, alpha, reinterpret_cast<const uint32_t*>(tile) + dim / 2 * kKeyTile, o, rows, keys);
  }
};
#else
bool cpu_has_bf16_dot() { return false; }
#endif

template <typename T, typename Tiles>
void attention_task(const Task& task, const T* q, int64_t q_row, T* out, const float* tiles, const int64_t* meta,
                    int64_t num_heads, int64_t kv_heads, float scale, std::vector<float>& scratch,
                    const T* key_cache, const T* value_cache, const int64_t* slots) {
  constexpr int64_t dim = Tiles::dim;
  const int64_t groups = num_heads / kv_heads;
  const int64_t query_start = meta[task.request * 4 + 0];
  const int64_t num_computed = meta[task.request * 4 + 2];
  const int64_t rows = task.count * groups, padded = (rows + kRows - 1) / kRows * kRows;
  scratch.assign(padded * Tiles::query_words + padded * dim + padded * kKeyTile + padded * 3 + (tiles ? 0 : Tiles::tile_words), 0.f);
  float* qf = scratch.data();                       // (padded, query_words) queries (zeros past the rows)
  float* of = qf + padded * Tiles::query_words;     // (padded, dim) running output
  float* sf = of + padded * dim;                    // (padded, kKeyTile) scores, then probabilities
  float* mx = sf + padded * kKeyTile;               // (padded,) running max
  float* sum = mx + padded;                         // (padded,) running sum
  float* alpha = sum + padded;                      // (padded,) this tile's rescale of the running output
  float* own_tile = alpha + padded;                 // without shared tiles: each tile converted here, as it is read
  float score_scale = 1.f;
  for (int64_t i = 0; i < rows; ++i) {
    const int64_t t = task.first + i / groups, head = task.kv_head * groups + i % groups;
    score_scale = Tiles::query(q + (query_start + t) * q_row + head * dim, qf + i * Tiles::query_words, scale);
  }
  const Vec scale_vec(score_scale);
  std::fill(mx, mx + padded, kNegInf);
  for (int64_t j0 = 0, tile = 0; j0 < task.keys; j0 += kKeyTile, ++tile) {
    const float* kt = tiles + tile * Tiles::tile_words;
    if (!tiles) {
      Tiles::convert(key_cache, value_cache, slots + meta[task.request * 4 + 3], task.keys, tile, task.kv_head, kv_heads, own_tile);
      kt = own_tile;
    }
    const int64_t n = std::min<int64_t>(kKeyTile, task.keys - j0);
    Tiles::scores(qf, kt, sf, padded);
    for (int64_t i = 0; i < rows; ++i) {
      float* s = sf + i * kKeyTile;
      const int64_t position = num_computed + task.first + i / groups;  // this row sees keys 0 .. position
      const int64_t last = std::min<int64_t>(n - 1, position - j0);
      if (last < 0) {  // every key of the tile is after this query
        std::fill(s, s + kKeyTile, 0.f);
        alpha[i] = 1.f;
        continue;
      }
      Vec s0 = Vec::loadu(s) * scale_vec, s1 = Vec::loadu(s + kW) * scale_vec;
      s0.store(s);
      s1.store(s + kW);
      for (int64_t j = last + 1; j < kKeyTile; ++j) s[j] = kNegInf;
      s0 = Vec::loadu(s);
      s1 = Vec::loadu(s + kW);
      const float new_max = std::max(mx[i], reduce_max(at::vec::maximum(s0, s1)));
      alpha[i] = std::exp(mx[i] - new_max);  // 0 for the first tile
      Vec m(new_max);
      Vec p0 = (s0 - m).exp_u20(), p1 = (s1 - m).exp_u20();
      p0.store(s);
      p1.store(s + kW);
      for (int64_t j = last + 1; j < kKeyTile; ++j) s[j] = 0.f;  // exp_u20(-inf) need not be exactly 0
      const float tile_sum = last == kKeyTile - 1 ? reduce_sum(p0 + p1) : reduce_sum(Vec::loadu(s) + Vec::loadu(s + kW));
      sum[i] = sum[i] * alpha[i] + tile_sum;
      mx[i] = new_max;
    }
    for (int64_t i = rows; i < padded; ++i) alpha[i] = 1.f;
    Tiles::pv(sf, alpha, kt, of, padded, n);
  }
  for (int64_t i = 0; i < rows; ++i) {
    const int64_t t = task.first + i / groups, head = task.kv_head * groups + i % groups;
    T* dst = out + (query_start + t) * num_heads * dim + head * dim;
    const float inv = 1.f / sum[i];
    for (int64_t d = 0; d < dim; ++d) dst[d] = static_cast<T>(of[i * dim + d] * inv);
  }
}

template <typename T, typename Tiles>
void paged_attention_impl(at::Tensor& out, const at::Tensor& q, const at::Tensor& key_cache, const at::Tensor& value_cache,
                          const at::Tensor& slots, const at::Tensor& meta, double scale, bool row_lanes) {
  const int64_t kv_heads = key_cache.size(2), dim = key_cache.size(3);
  const int64_t num_heads = out.size(1) / dim, num_requests = meta.size(0), groups = num_heads / kv_heads;
  const int64_t* m = meta.data_ptr<int64_t>();
  const T* kc = key_cache.data_ptr<T>();
  const T* vc = value_cache.data_ptr<T>();
  const int64_t* sp = slots.data_ptr<int64_t>();
  const auto lanes = [&](int64_t r) { return row_lanes && fills_lanes(m[r * 4 + 1], groups); };
  // phase 1: every request's context, per KV head, as fp32 tiles (read once, shared by its tasks)
  const int64_t tile_floats = Tiles::tile_words;
  std::vector<int64_t> first_tile(num_requests + 1, 0);  // request r's tiles of KV head h: first_tile[r] + h * tiles(r)
  std::vector<std::array<int64_t, 3>> units;            // (request, kv head, tile)
  int64_t work = 0;  // query rows x keys
  for (int64_t r = 0; r < num_requests; ++r) {
    const int64_t num_keys = m[r * 4 + 2] + m[r * 4 + 1];
    // a request with one block of queries reads each tile once: its task converts it as it goes;
    // an fp32 request whose rows fill the lanes reads the cache as it is
    const int64_t tiles = m[r * 4 + 1] > kQueryBlock && !lanes(r) ? (num_keys + kKeyTile - 1) / kKeyTile : 0;
    first_tile[r + 1] = first_tile[r] + tiles * kv_heads;
    for (int64_t h = 0; h < kv_heads; ++h)
      for (int64_t t = 0; t < tiles; ++t) units.push_back({r, h, t});
    work += m[r * 4 + 1] * groups * num_keys;
  }
  // kept between calls (grown, never shrunk): a fresh megabyte a layer would be mapped and
  // page-faulted anew by every call, which on a VM costs as much as the attention itself
  // (thread_local: the calling thread's; the workers below see it only through this pointer)
  thread_local std::vector<float> tile_buffer;
  if (tile_buffer.size() < static_cast<size_t>(first_tile[num_requests] * tile_floats)) tile_buffer.resize(first_tile[num_requests] * tile_floats);
  float* const tiles = tile_buffer.data();
  // a decode's few thousand products cost less than waking the other threads
  const bool serial = work < 16384;
  at::parallel_for(0, static_cast<int64_t>(units.size()), serial ? static_cast<int64_t>(units.size()) : 4, [&](int64_t begin, int64_t end) {
    for (int64_t u = begin; u < end; ++u) {
      const auto [r, h, t] = units[u];
      const int64_t num_keys = m[r * 4 + 2] + m[r * 4 + 1], count = (first_tile[r + 1] - first_tile[r]) / kv_heads;
      float* kt = tiles + (first_tile[r] + h * count + t) * tile_floats;
      Tiles::convert(kc, vc, sp + m[r * 4 + 3], num_keys, t, h, kv_heads, kt);
    }
  });
  // phase 2: one task per (request, KV head, block of query tokens)
  std::vector<Task> tasks;
  for (int64_t r = 0; r < num_requests; ++r) {
    const int64_t query_len = m[r * 4 + 1], num_computed = m[r * 4 + 2], block = lanes(r) ? lane_block(query_len, kv_heads) : kQueryBlock;
    for (int64_t first = 0; first < query_len; first += block) {
      const int64_t count = std::min<int64_t>(block, query_len - first);
      for (int64_t h = 0; h < kv_heads; ++h) tasks.push_back({r, h, first, count, num_computed + first + count});
    }
  }
  // dearest first, then zig-zag, so that each thread's contiguous share costs about the same
  std::stable_sort(tasks.begin(), tasks.end(), [](const Task& a, const Task& b) { return a.keys * a.count > b.keys * b.count; });
  std::vector<Task> order;
  order.reserve(tasks.size());
  for (size_t lo = 0, hi = tasks.size(); lo < hi;) {
    order.push_back(tasks[lo++]);
    if (lo < hi) order.push_back(tasks[--hi]);
  }
  const T* qp = q.data_ptr<T>();
  T* op = out.data_ptr<T>();
  const int64_t q_row = q.stride(0);
  at::parallel_for(0, static_cast<int64_t>(order.size()), serial ? static_cast<int64_t>(order.size()) : 1, [&](int64_t begin, int64_t end) {
    thread_local std::vector<float> scratch;  // each worker thread's own, kept between calls
    for (int64_t i = begin; i < end; ++i) {
      const Task& task = order[i];
      const int64_t count = (first_tile[task.request + 1] - first_tile[task.request]) / kv_heads;
      if (lanes(task.request)) {
        attention_task_lanes<T, Tiles::dim>(task, qp, q_row, op, m, num_heads, kv_heads, static_cast<float>(scale), scratch, kc, vc, sp);
        continue;
      }
      const float* request_tiles = count ? tiles + (first_tile[task.request] + task.kv_head * count) * tile_floats : nullptr;
      attention_task<T, Tiles>(task, qp, q_row, op, request_tiles, m, num_heads, kv_heads, static_cast<float>(scale), scratch, kc, vc, sp);
    }
  });
}

// AVX512-BF16 on a CPU that has it: the bf16 dot-product tiles, and its rounding instruction in the
// one-pass ops. set_bf16_dot_products(false) turns both off, as a CPU without it runs (the check,
// the kernels page and PREFILLVIZ_NO_BF16_DOT)
bool bf16_dot = true;
bool bf16_dot_enabled() { return bf16_dot && cpu_has_bf16_dot(); }

// f(T(), Round()) for a one-pass op on a tensor of this dtype: float (where the two roundings are the
// same code), bf16 with ATen's rounding, or bf16 with the instruction's on AVX512-BF16
template <typename F>
void by_dtype_and_rounding(at::ScalarType dtype, F f) {
  if (dtype != at::kBFloat16) return f(float(), AtenRound());
#if defined(CPU_CAPABILITY_AVX512)
  if (bf16_dot_enabled()) return f(c10::BFloat16(), NativeRound());
#endif
  f(c10::BFloat16(), AtenRound());
}

template <int DV>
void dispatch_attention(at::Tensor& out, const at::Tensor& q, const at::Tensor& kc, const at::Tensor& vc, const at::Tensor& slots,
                        const at::Tensor& meta, double scale, bool row_lanes) {
  if (q.scalar_type() == at::kBFloat16) {
#if defined(CPU_CAPABILITY_AVX512)
    if (bf16_dot_enabled()) return paged_attention_impl<c10::BFloat16, Bf16DotTiles<DV>>(out, q, kc, vc, slots, meta, scale, row_lanes);
#endif
    paged_attention_impl<c10::BFloat16, Fp32Tiles<c10::BFloat16, DV>>(out, q, kc, vc, slots, meta, scale, row_lanes);
  } else {
    paged_attention_impl<float, Fp32Tiles<float, DV>>(out, q, kc, vc, slots, meta, scale, row_lanes);
  }
}

void check_dtype(const at::Tensor& t, const char* what) {
  TORCH_CHECK(t.device().is_cpu(), what, " must be on the CPU");
  TORCH_CHECK(t.scalar_type() == at::kFloat || t.scalar_type() == at::kBFloat16, what, " must be float32 or bfloat16");
}

}  // namespace

at::Tensor rms_norm(const at::Tensor& x, const at::Tensor& weight, double eps) {
  check_dtype(x, "x");
  TORCH_CHECK(x.is_contiguous() && weight.is_contiguous() && weight.scalar_type() == x.scalar_type(), "rms_norm: contiguous x and weight of one dtype");
  at::Tensor out = at::empty_like(x);
  if (x.scalar_type() == at::kBFloat16) rms_norm_impl<c10::BFloat16>(x, weight, out, eps); else rms_norm_impl<float>(x, weight, out, eps);
  return out;
}

// in_place: the norm is written over x (vLLM's fused_add_rms_norm), which each row reads whole before its
// norm is written. The forward's x is a linear's output, dead after the add and still in L2, where a fresh
// tensor's lines come from beyond it. On the Xeon with AMX, A/B in one process (alternating pairs, paired
// medians): bf16 512 tokens -0.5 and -0.6 ms of 78, 2,048 tokens -3.4 of 371; fp32 512 tokens -3.4 of 326.
at::Tensor add_rms_norm(const at::Tensor& x, at::Tensor& residual, const at::Tensor& weight, double eps, bool in_place) {
  check_dtype(x, "x");
  TORCH_CHECK(x.is_contiguous() && residual.is_contiguous() && weight.is_contiguous(), "add_rms_norm: contiguous tensors");
  TORCH_CHECK(residual.scalar_type() == x.scalar_type() && weight.scalar_type() == x.scalar_type() && residual.sizes() == x.sizes(), "add_rms_norm: one dtype and shape");
  at::Tensor out = in_place ? x : at::empty_like(x);
  by_dtype_and_rounding(x.scalar_type(), [&](auto t, auto r) { add_rms_norm_impl<decltype(t), decltype(r)>(x, residual, weight, out, eps); });
  return out;
}

at::Tensor silu_mul(const at::Tensor& gate_up) {
  check_dtype(gate_up, "gate_up");
  TORCH_CHECK(gate_up.is_contiguous() && gate_up.size(-1) % 2 == 0, "silu_mul: contiguous [gate | up]");
  std::vector<int64_t> shape(gate_up.sizes().begin(), gate_up.sizes().end());
  shape.back() /= 2;
  at::Tensor out = at::empty(shape, gate_up.options());
  by_dtype_and_rounding(gate_up.scalar_type(), [&](auto t, auto r) { silu_mul_impl<decltype(t), decltype(r)>(gate_up, out); });
  return out;
}

void rope_write_kv(at::Tensor& qkv, const at::Tensor& cos, const at::Tensor& sin, const at::Tensor& slots, at::Tensor& key_cache,
                   at::Tensor& value_cache, int64_t num_heads) {
  check_dtype(qkv, "qkv");
  TORCH_CHECK(qkv.dim() == 2 && qkv.stride(1) == 1, "rope_write_kv: qkv (T, (H + 2 KVH) D) with unit inner stride");
  TORCH_CHECK(cos.is_contiguous() && sin.is_contiguous() && key_cache.is_contiguous() && value_cache.is_contiguous(), "rope_write_kv: contiguous tables and caches");
  TORCH_CHECK(cos.scalar_type() == qkv.scalar_type() && key_cache.scalar_type() == qkv.scalar_type(), "rope_write_kv: one dtype");
  TORCH_CHECK(slots.scalar_type() == at::kLong && slots.numel() == qkv.size(0), "rope_write_kv: one int64 slot per token");
  by_dtype_and_rounding(qkv.scalar_type(), [&](auto t, auto r) {
    rope_write_kv_impl<decltype(t), decltype(r)>(qkv, cos, sin, slots, key_cache, value_cache, num_heads);
  });
}

// out (T, H D); q (T, >= H D) rows of stride q.stride(0); caches (blocks, block_size, KVH, D);
// slots: every request's context slots, one request after another; meta (R, 4) int64:
// query start, query length, tokens cached before the step, where its slots start.
at::Tensor paged_attention(const at::Tensor& q, const at::Tensor& key_cache, const at::Tensor& value_cache, const at::Tensor& slots,
                           const at::Tensor& meta, int64_t num_heads, double scale, bool row_lanes) {
  check_dtype(q, "q");
  TORCH_CHECK(q.dim() == 2 && q.stride(1) == 1, "paged_attention: q (T, H D) with unit inner stride");
  TORCH_CHECK(key_cache.is_contiguous() && value_cache.is_contiguous() && key_cache.scalar_type() == q.scalar_type(), "paged_attention: contiguous caches of q's dtype");
  TORCH_CHECK(slots.scalar_type() == at::kLong && meta.scalar_type() == at::kLong && meta.is_contiguous() && meta.dim() == 2 && meta.size(1) == 4, "paged_attention: int64 slots and (R, 4) meta");
  const int64_t dim = key_cache.size(3), kv_heads = key_cache.size(2);
  TORCH_CHECK(num_heads % kv_heads == 0, "paged_attention: heads must be a multiple of KV heads");
  at::Tensor out = at::empty({q.size(0), num_heads * dim}, q.options());
  switch (dim / kW * (dim % kW == 0)) {
    case 1: dispatch_attention<1>(out, q, key_cache, value_cache, slots.contiguous(), meta, scale, row_lanes); break;
    case 2: dispatch_attention<2>(out, q, key_cache, value_cache, slots.contiguous(), meta, scale, row_lanes); break;
    case 4: dispatch_attention<4>(out, q, key_cache, value_cache, slots.contiguous(), meta, scale, row_lanes); break;
    case 8: dispatch_attention<8>(out, q, key_cache, value_cache, slots.contiguous(), meta, scale, row_lanes); break;
    case 16: dispatch_attention<16>(out, q, key_cache, value_cache, slots.contiguous(), meta, scale, row_lanes); break;
    default: TORCH_CHECK(false, "paged_attention: head_dim ", dim, " is not 1, 2, 4, 8 or 16 vectors of ", kW);
  }
  return out;
}

#include "attention_brgemm.h"
#include "antidiagonal_scores.h"
#include "linear_brgemm.h"

int64_t vector_width() { return kW; }

// whether a bf16 step's attention runs on AVX512-BF16 dot products (this CPU has them, and they are on)
bool bf16_dot_products() { return bf16_dot_enabled(); }
void set_bf16_dot_products(bool on) { bf16_dot = on; }

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("rms_norm", &rms_norm);
  m.def("add_rms_norm", &add_rms_norm, pybind11::arg("x"), pybind11::arg("residual"), pybind11::arg("weight"), pybind11::arg("eps"), pybind11::arg("in_place") = false);
  m.def("silu_mul", &silu_mul);
  m.def("rope_write_kv", &rope_write_kv);
  m.def("paged_attention", &paged_attention);
  m.def("brgemm_paged", [](const at::Tensor& q, const at::Tensor& key_cache, const at::Tensor& value_cache, const at::Tensor& slots,
                           const at::Tensor& meta, int64_t num_heads, double scale) {
    return brgemm_paged(q, key_cache, value_cache, slots, meta, num_heads, scale);
  });
  m.def("brgemm_block_sparse", &brgemm_block_sparse);
  m.def("antidiagonal_scores", &antidiagonal_scores);
  m.def("select_tiles", &select_tiles);
  m.def("brgemm_problem", &brgemm_problem);
  m.def("brgemm_linear", &brgemm_linear);
  m.def("slab_kernel_built", &slab_kernel_built);
  m.def("vector_width", &vector_width);
  m.def("bf16_dot_products", &bf16_dot_products);
  m.def("set_bf16_dot_products", &set_bf16_dot_products);
}
