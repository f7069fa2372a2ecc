// v8: bf16 or fp32 attention of one request with its two matmuls on oneDNN's brgemm micro-kernel
// (through ATen's cpublas: bf16 on the AMX tiles where the CPU has them), the softmax in fp32 vectors
// between them. Included by engine_ops.cpp (inside its namespace: Vec, kW and kNegInf come from there).
//
// FlashAttention's tiling, as torch's CPU flash attention does it for fp16, with three changes:
//   - K and V are packed into the micro-kernel's layout (VNNI for bf16) once per KV head and shared
//     by the KV head's G query heads (torch packs per query head, and for bf16 does not pack: it
//     calls oneDNN's gemm, a call per block). v8 packs them itself (pack_keys, pack_values: a
//     32-bit transpose and paired rows), checked once against oneDNN's own pack: calling that per
//     64 keys was most of a decode's and a short chunk's time;
//   - the causal mask is a row's count of keys, and a block's keys past the last row's are skipped;
//   - where torch's probe says AVX-512, exp is 2^x on the scores times scale·log2(e): a floor and a
//     fit of 2^f on [0, 1), then vscalefps. bf16: degree 4, relative error 7e-6 (bf16's half step,
//     which P is rounded to before P V, is 2e-3), P rounded by AVX512-BF16's instruction where the
//     CPU has it (as the other ops do). fp32: degree 5, 1.8e-7 (1.5 ulp), P kept in fp32. The
//     softmax was 60% of the bf16 time with ATen's exp_u20.
// Whether the micro-kernel runs a dtype here is tried (brgemm_problem); where it does not, v8 is out
// of that dtype's dispatch, with why.

namespace cpublas = at::native::cpublas;

#if defined(CPU_CAPABILITY_AVX512)
#define NATIVE_ROUND NativeRound
#else
#define NATIVE_ROUND AtenRound  // no AVX-512 build: bf16_dot_enabled() is false anyway
#endif

constexpr int64_t kPack = 64;       // keys per packed K block, and columns per packed V slice (oneDNN's pack: 16..64)
constexpr int64_t kQRows = 64;      // query rows per task
constexpr int64_t kKeyBlock = 256;  // keys per softmax block

// K rows [first, first + rows) of one KV head (rows <= 64; a row's D values contiguous, rows `stride`
// apart) as the micro-kernel's B for Q K^T: K^T [D, 64] in VNNI, [D / 2][64][2], keys past `rows` zero.
// A pair of D values is one 32-bit word, so this is a transpose of 32-bit words.
inline void pack_keys(const c10::BFloat16* k, int64_t stride, int64_t rows, int64_t dim, c10::BFloat16* out) {
  uint32_t* o = reinterpret_cast<uint32_t*>(out);
  for (int64_t r = 0; r < rows; ++r) {
    const c10::BFloat16* row = k + r * stride;
    for (int64_t p = 0; p < dim / 2; ++p) {
      uint32_t word;
      std::memcpy(&word, row + 2 * p, sizeof(word));
      o[p * kPack + r] = word;
    }
  }
  for (int64_t r = rows; r < kPack; ++r)
    for (int64_t p = 0; p < dim / 2; ++p) o[p * kPack + r] = 0;
}

// V rows [first, first + rows) of one KV head, columns [c, c + 64), as the micro-kernel's B for P V:
// [64 keys, 64] in VNNI, [32][64][2] (two keys' values of a column side by side), keys past `rows` zero.
inline void pack_values(const c10::BFloat16* v, int64_t stride, int64_t rows, c10::BFloat16* out) {
  uint32_t* o = reinterpret_cast<uint32_t*>(out);
  const uint16_t* bits = reinterpret_cast<const uint16_t*>(v);
  for (int64_t pair = 0; pair < kPack / 2; ++pair) {
    const int64_t r = 2 * pair;
    const uint16_t* even = bits + r * stride;
    const uint16_t* odd = bits + (r + 1) * stride;
    uint32_t* dst = o + pair * kPack;
    if (r + 1 < rows) {
      for (int64_t c = 0; c < kPack; ++c) dst[c] = uint32_t(even[c]) | (uint32_t(odd[c]) << 16);
    } else if (r < rows) {
      for (int64_t c = 0; c < kPack; ++c) dst[c] = uint32_t(even[c]);
    } else {
      std::memset(dst, 0, kPack * sizeof(uint32_t));
    }
  }
}

// fp32 needs no VNNI: K^T [D, 64] plain, and V's 64-column slice [64 keys, 64] plain; keys past `rows` zero.
inline void pack_keys(const float* k, int64_t stride, int64_t rows, int64_t dim, float* out) {
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t d = 0; d < dim; ++d) out[d * kPack + r] = k[r * stride + d];
  for (int64_t d = 0; d < dim; ++d) std::fill(out + d * kPack + rows, out + (d + 1) * kPack, 0.f);
}

inline void pack_values(const float* v, int64_t stride, int64_t rows, float* out) {
  for (int64_t r = 0; r < rows; ++r) std::memcpy(out + r * kPack, v + r * stride, kPack * sizeof(float));
  std::fill(out + rows * kPack, out + kPack * kPack, 0.f);
}

// '' when oneDNN's brgemm micro-kernel packs and multiplies bf16 here, in the layout v8 packs itself,
// else why not. torch's cpublas::could_pack asks the CPU only; oneDNN's own cap (DNNL_MAX_CPU_ISA below
// AMX) makes pack refuse ("No need to pack"), so it is tried: oneDNN packs a 64 x 64 B, which must equal
// pack_keys' and pack_values' (VNNI), and a 4 x 64 x 64 product on it must equal plain sums.
std::string brgemm_bf16_problem() {
  if (!cpublas::could_pack(at::kBFloat16)) return "oneDNN does not pack bf16 for its brgemm micro-kernel here (torch's cpublas::could_pack said no)";
  using BF = c10::BFloat16;
  constexpr int64_t M = 4;
  std::vector<BF> a(M * kPack), b(kPack * kPack), packed(kPack * kPack), bt(kPack * kPack), ours(kPack * kPack);
  std::vector<float> c(M * kPack, 0.f);
  for (int64_t i = 0; i < M * kPack; ++i) a[i] = BF(static_cast<float>(i % 7) - 3.f);
  for (int64_t i = 0; i < kPack * kPack; ++i) b[i] = BF(static_cast<float>(i % 5) - 2.f + static_cast<float>(i / kPack) / 64.f);
  for (int64_t i = 0; i < kPack; ++i)
    for (int64_t j = 0; j < kPack; ++j) bt[j * kPack + i] = b[i * kPack + j];  // b = bt^T: bt's rows are "keys"
  try {
    cpublas::pack(kPack, kPack, kPack, kPack, at::kBFloat16, at::kBFloat16, b.data(), packed.data());
    pack_values(b.data(), kPack, kPack, ours.data());
    if (std::memcmp(ours.data(), packed.data(), ours.size() * sizeof(BF)) != 0)
      return "oneDNN's brgemm micro-kernel packs bf16 in another layout than VNNI [K / 2][N][2] here";
    pack_keys(bt.data(), kPack, kPack, kPack, ours.data());
    if (std::memcmp(ours.data(), packed.data(), ours.size() * sizeof(BF)) != 0)
      return "oneDNN's brgemm micro-kernel packs bf16 in another layout than VNNI [K / 2][N][2] here";
    for (int64_t i = 0; i < kPack * kPack; ++i) b[i] = BF(static_cast<float>(i % 5) - 2.f);  // small integers: exact sums
    cpublas::pack(kPack, kPack, kPack, kPack, at::kBFloat16, at::kBFloat16, b.data(), packed.data());
    cpublas::brgemm(M, kPack, kPack, kPack, kPack, kPack, false, a.data(), packed.data(), c.data());
    cpublas::brgemm_release();
  } catch (const std::exception& error) {
    std::string what = error.what();
    return "oneDNN's brgemm micro-kernel refused bf16 here (" + what.substr(0, what.find('\n')) + ")";
  }
  for (int64_t i = 0; i < M; ++i)
    for (int64_t j = 0; j < kPack; ++j) {
      float want = 0.f;
      for (int64_t k = 0; k < kPack; ++k) want += static_cast<float>(a[i * kPack + k]) * static_cast<float>(b[k * kPack + j]);
      if (c[i * kPack + j] != want) return "oneDNN's brgemm micro-kernel gave a wrong bf16 product here";
    }
  return "";
}

// '' when oneDNN's brgemm micro-kernel multiplies fp32 here (a 4 x 64 x 64 product against plain
// sums, on small integers: exact), else why not.
std::string brgemm_fp32_problem() {
  constexpr int64_t M = 4;
  std::vector<float> a(M * kPack), b(kPack * kPack), c(M * kPack, 0.f);
  for (int64_t i = 0; i < M * kPack; ++i) a[i] = static_cast<float>(i % 7) - 3.f;
  for (int64_t i = 0; i < kPack * kPack; ++i) b[i] = static_cast<float>(i % 5) - 2.f;
  try {
    cpublas::brgemm(M, kPack, kPack, kPack, kPack, kPack, false, a.data(), b.data(), c.data());
    cpublas::brgemm_release(false);
  } catch (const std::exception& error) {
    std::string what = error.what();
    return "oneDNN's brgemm micro-kernel refused fp32 here (" + what.substr(0, what.find('\n')) + ")";
  }
  for (int64_t i = 0; i < M; ++i)
    for (int64_t j = 0; j < kPack; ++j) {
      float want = 0.f;
      for (int64_t k = 0; k < kPack; ++k) want += a[i * kPack + k] * b[k * kPack + j];
      if (c[i * kPack + j] != want) return "oneDNN's brgemm micro-kernel gave a wrong fp32 product here";
    }
  return "";
}

// why v8 can't run `dtype` here ('' when it can)
std::string brgemm_problem(const std::string& dtype) {
  if (dtype == "bfloat16") return brgemm_bf16_problem();
  if (dtype == "float32") return brgemm_fp32_problem();
  return "v8 runs bf16 and fp32 only";
}

#if defined(CPU_CAPABILITY_AVX512)
// 2^x for x <= 0 (below -126: 2^-126)
inline __m512 exp2_nonpositive(__m512 x) {
  x = _mm512_max_ps(x, _mm512_set1_ps(-126.f));
  __m512 whole = _mm512_roundscale_ps(x, _MM_FROUND_TO_NEG_INF | _MM_FROUND_NO_EXC);
  __m512 f = _mm512_sub_ps(x, whole);
  __m512 p = _mm512_set1_ps(0.013676531f);
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(0.051666877f));
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(0.24171026f));
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(0.69293129f));
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(1.0000073f));
  return _mm512_scalef_ps(p, whole);
}

inline __mmask16 first_lanes(int64_t n) { return n >= 16 ? __mmask16(0xFFFF) : __mmask16((1u << n) - 1); }
#endif

// the largest of row[0 .. n)
inline float row_max(const float* row, int64_t n) {
#if defined(CPU_CAPABILITY_AVX512)
  __m512 m = _mm512_set1_ps(kNegInf);
  for (int64_t c = 0; c < n; c += 16) m = _mm512_mask_max_ps(m, first_lanes(n - c), m, _mm512_maskz_loadu_ps(first_lanes(n - c), row + c));
  return _mm512_reduce_max_ps(m);
#else
  float m = kNegInf;
  for (int64_t c = 0; c < n; ++c) m = std::max(m, row[c]);
  return m;
#endif
}

// p[c] = 2^(row[c] * a - b) rounded to bf16 (R: ATen's rounding, or AVX512-BF16's instruction), for c < n;
// returns their fp32 sum
template <typename R>
inline float row_exp2(const float* row, int64_t n, float a, float b, c10::BFloat16* p) {
#if defined(CPU_CAPABILITY_AVX512)
  __m512 va = _mm512_set1_ps(a), vb = _mm512_set1_ps(b), sum = _mm512_setzero_ps();
  int64_t c = 0;
  for (; c + 32 <= n; c += 32) {
    __m512 e0 = exp2_nonpositive(_mm512_fmsub_ps(_mm512_loadu_ps(row + c), va, vb));
    __m512 e1 = exp2_nonpositive(_mm512_fmsub_ps(_mm512_loadu_ps(row + c + 16), va, vb));
    sum = _mm512_add_ps(sum, _mm512_add_ps(e0, e1));
    R::store(p + c, Vec(e0), Vec(e1));
  }
  for (; c < n; c += 16) {
    __mmask16 lanes = first_lanes(n - c);
    __m512 e = _mm512_maskz_mov_ps(lanes, exp2_nonpositive(_mm512_fmsub_ps(_mm512_maskz_loadu_ps(lanes, row + c), va, vb)));
    sum = _mm512_add_ps(sum, e);
    at::vec::convert_from_float<c10::BFloat16>(Vec(e), Vec(0.f)).store(p + c, std::min<int64_t>(16, n - c));
  }
  return _mm512_reduce_add_ps(sum);
#else
  float sum = 0.f;
  for (int64_t c = 0; c < n; ++c) {
    float e = std::exp2(row[c] * a - b);
    sum += e;
    p[c] = c10::BFloat16(e);
  }
  return sum;
#endif
}

#if defined(CPU_CAPABILITY_AVX512)
// 2^x for x <= 0 to fp32's precision: a degree-5 fit of 2^f on [0, 1), relative error 1.8e-7 (1.5 ulp)
inline __m512 exp2_nonpositive_fp32(__m512 x) {
  x = _mm512_max_ps(x, _mm512_set1_ps(-126.f));
  __m512 whole = _mm512_roundscale_ps(x, _MM_FROUND_TO_NEG_INF | _MM_FROUND_NO_EXC);
  __m512 f = _mm512_sub_ps(x, whole);
  __m512 p = _mm512_set1_ps(0.00189511f);
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(0.00894621f));
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(0.05586328f));
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(0.24014077f));
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(0.69315463f));
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(0.9999999f));
  return _mm512_scalef_ps(p, whole);
}
#endif

// fp32: p[c] = 2^(row[c] * a - b) for c < n, to fp32's precision (AVX-512: the fit above; else Sleef's
// exp2, 1 ulp); returns their sum
template <typename R>
inline float row_exp2(const float* row, int64_t n, float a, float b, float* p) {
#if defined(CPU_CAPABILITY_AVX512)
  __m512 va = _mm512_set1_ps(a), vb = _mm512_set1_ps(b), sum = _mm512_setzero_ps();
  for (int64_t c = 0; c < n; c += 16) {
    __mmask16 lanes = first_lanes(n - c);
    __m512 e = _mm512_maskz_mov_ps(lanes, exp2_nonpositive_fp32(_mm512_fmsub_ps(_mm512_maskz_loadu_ps(lanes, row + c), va, vb)));
    sum = _mm512_add_ps(sum, e);
    _mm512_mask_storeu_ps(p + c, lanes, e);
  }
  return _mm512_reduce_add_ps(sum);
#else
  Vec va(a), vb(b), sum(0.f);
  int64_t c = 0;
  for (; c + kW <= n; c += kW) {
    Vec e = (Vec::loadu(row + c) * va - vb).exp2();
    sum = sum + e;
    e.store(p + c);
  }
  float total = at::vec::vec_reduce_all<float>([](Vec x, Vec y) { return x + y; }, sum);
  for (; c < n; ++c) {
    p[c] = std::exp2(row[c] * a - b);
    total += p[c];
  }
  return total;
#endif
}

// One request's attention in T (bf16 or fp32); q (H, N, D), k and v (KVH, Nk, D), out (N, H, D).
template <typename T>
void brgemm_attention_impl(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, double scale, at::Tensor& out) {
  const int64_t heads = q.size(0), n = q.size(1), dim = q.size(2), kv_heads = k.size(0), keys = k.size(1);
  const int64_t group = heads / kv_heads, cached = keys - n;
  const int64_t padded = (keys + kPack - 1) / kPack * kPack, blocks = padded / kPack;
  constexpr bool vnni = std::is_same_v<T, c10::BFloat16>;
  at::Tensor packed_k = at::empty({kv_heads, padded * dim}, q.options());  // per 64 keys: K^T [D, 64] (VNNI in bf16)
  at::Tensor packed_v = at::empty({kv_heads, padded * dim}, q.options());  // per 64 columns of D: V [padded, 64] (VNNI in bf16)
  const T* kd = k.data_ptr<T>();
  const T* vd = v.data_ptr<T>();
  T* pk = packed_k.data_ptr<T>();
  T* pv = packed_v.data_ptr<T>();
  at::parallel_for(0, kv_heads * blocks, 1, [&](int64_t begin, int64_t end) {
    for (int64_t z = begin; z < end; ++z) {
      const int64_t h = z / blocks, first = z % blocks * kPack, rows = std::min(kPack, keys - first);
      pack_keys(kd + h * k.stride(0) + first * k.stride(1), k.stride(1), rows, dim, pk + h * padded * dim + first * dim);
      // a 64-column slice of V is [padded, 64] (in bf16's VNNI [padded / 2, 64, 2]): 64 rows of it start at row * 64
      for (int64_t c = 0; c < dim; c += kPack)
        pack_values(vd + h * v.stride(0) + first * v.stride(1) + c, v.stride(1), rows, pv + h * padded * dim + c * padded + first * kPack);
    }
  });
  const T* qd = q.data_ptr<T>();
  T* od = out.data_ptr<T>();
  const int64_t q_blocks = (n + kQRows - 1) / kQRows;
  const bool native = bf16_dot_enabled();  // AVX512-BF16's rounding instruction for P, where the CPU has it
  const float log2_scale = static_cast<float>(scale) * 1.4426950408889634f;  // exp(s * scale) = 2^(s * log2_scale)
  at::parallel_for(0, heads * q_blocks, 1, [&](int64_t begin, int64_t end) {
    std::vector<float> scores(kQRows * kKeyBlock), acc(kQRows * dim), top(kQRows), total(kQRows);
    std::vector<T> probs(kQRows * kKeyBlock);
    for (int64_t z = begin; z < end; ++z) {
      const int64_t head = z / q_blocks, first = z % q_blocks * kQRows, rows = std::min(kQRows, n - first), h = head / group;
      const T* qrows = qd + head * q.stride(0) + first * q.stride(1);
      std::fill(top.begin(), top.end(), kNegInf);  // running max, in log2 units
      std::fill(total.begin(), total.end(), 0.f);
      const int64_t seen = cached + first + rows;  // keys the block's last row sees
      for (int64_t key = 0; key < seen; key += kKeyBlock) {
        const int64_t cols = std::min(kKeyBlock, seen - key), padded_cols = (cols + kPack - 1) / kPack * kPack;
        for (int64_t b = 0; b < padded_cols; b += kPack)
          cpublas::brgemm(rows, kPack, dim, q.stride(1), kPack, kKeyBlock, false, qrows, pk + h * padded * dim + (key + b) * dim,
                          scores.data() + b);
        for (int64_t r = 0; r < rows; ++r) {
          const float* row = scores.data() + r * kKeyBlock;
          T* p = probs.data() + r * kKeyBlock;
          const int64_t live = std::max<int64_t>(0, std::min(cols, cached + first + r + 1 - key));  // keys row r sees here
          const float high = live > 0 ? std::max(top[r], row_max(row, live) * log2_scale) : top[r];
          const float sum = live == 0 ? 0.f : native ? row_exp2<NATIVE_ROUND>(row, live, log2_scale, high, p) : row_exp2<AtenRound>(row, live, log2_scale, high, p);
          std::fill(p + live, p + padded_cols, T(0.f));
          const float shrink = std::exp2(top[r] - high);  // 0 for the first block (top is -inf)
          total[r] = total[r] * shrink + sum;
          top[r] = high;
          if (key > 0 && shrink != 1.f) {
            float* a = acc.data() + r * dim;
            for (int64_t d = 0; d < dim; d += kW) (Vec::loadu(a + d) * Vec(shrink)).store(a + d);
          }
        }
        for (int64_t c = 0; c < dim; c += kPack)
          cpublas::brgemm(rows, kPack, padded_cols, kKeyBlock, kPack, dim, key > 0, probs.data(), pv + h * padded * dim + c * padded + key * kPack,
                          acc.data() + c);
      }
      for (int64_t r = 0; r < rows; ++r) {
        const float inv = 1.f / total[r];
        T* o = od + ((first + r) * heads + head) * dim;
        for (int64_t d = 0; d < dim; ++d) o[d] = T(acc[r * dim + d] * inv);
      }
    }
  });
  cpublas::brgemm_release(vnni);
}

// q (H, N, D), k and v (KVH, Nk, D), all bf16 or all fp32, each row contiguous; causal with the last query
// at the last key (a chunk after Nk - N cached keys). Returns (H, N, D): a view of an (N, H, D) tensor, the
// layout the engine's o projection reads, so the caller's reshape to (N, H D) copies nothing.
at::Tensor brgemm_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, double scale) {
  const auto dtype = q.scalar_type();
  TORCH_CHECK((dtype == at::kBFloat16 || dtype == at::kFloat) && k.scalar_type() == dtype && v.scalar_type() == dtype,
              "v8 runs bf16 or fp32, q, k and v in one dtype");
  TORCH_CHECK(q.dim() == 3 && k.dim() == 3 && v.dim() == 3 && q.stride(2) == 1 && k.stride(2) == 1 && v.stride(2) == 1,
              "v8: q, k, v must be (heads, tokens, D) with contiguous rows");
  const int64_t heads = q.size(0), n = q.size(1), dim = q.size(2), kv_heads = k.size(0), keys = k.size(1);
  TORCH_CHECK(dim % kPack == 0, "v8: head size ", dim, " is not a multiple of ", kPack);
  TORCH_CHECK(heads % kv_heads == 0 && keys >= n && v.size(1) == keys, "v8: heads must be a multiple of KV heads, and keys >= queries");
  at::Tensor out = at::empty({n, heads, dim}, q.options());
  if (dtype == at::kBFloat16)
    brgemm_attention_impl<c10::BFloat16>(q, k, v, scale, out);
  else
    brgemm_attention_impl<float>(q, k, v, scale, out);
  return out.transpose(0, 1);
}
