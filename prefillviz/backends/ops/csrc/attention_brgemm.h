// v8: a paged step's bf16 or fp32 attention (every request in one call, read through its slots) with
// its two matmuls on oneDNN's brgemm micro-kernel (through ATen's cpublas: bf16 on the AMX tiles where
// the CPU has them), the softmax in fp32 vectors between them. Included by engine_ops.cpp (inside its namespace: Vec, kW and kNegInf come from there).
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

// Keys row[0 .. rows) of one KV head (rows <= 64; each row's D values contiguous) as 64 columns of the
// micro-kernel's B for Q K^T: K^T [D, ld] in VNNI, [D / 2][ld][2] (ld: the packed block's keys, 64 or 256),
// keys past `rows` zero. A pair of D values is one 32-bit word, so this is a transpose of 32-bit words.
inline void pack_keys(const c10::BFloat16* const* row, int64_t rows, int64_t dim, c10::BFloat16* out, int64_t ld = kPack) {
  uint32_t* o = reinterpret_cast<uint32_t*>(out);
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t p = 0; p < dim / 2; ++p) {
      uint32_t word;
      std::memcpy(&word, row[r] + 2 * p, sizeof(word));
      o[p * ld + r] = word;
    }
  for (int64_t r = rows; r < kPack; ++r)
    for (int64_t p = 0; p < dim / 2; ++p) o[p * ld + r] = 0;
}

// Values row[0 .. rows) of one KV head, columns [c, c + 64), as the micro-kernel's B for P V:
// [64 keys, 64] in VNNI, [32][64][2] (two keys' values of a column side by side), keys past `rows` zero.
inline void pack_values(const c10::BFloat16* const* row, int64_t rows, int64_t c, c10::BFloat16* out) {
  uint32_t* o = reinterpret_cast<uint32_t*>(out);
  for (int64_t pair = 0; pair < kPack / 2; ++pair) {
    const int64_t r = 2 * pair;
    uint32_t* dst = o + pair * kPack;
    if (r < rows) {
      const uint16_t* even = reinterpret_cast<const uint16_t*>(row[r] + c);
      const uint16_t* odd = r + 1 < rows ? reinterpret_cast<const uint16_t*>(row[r + 1] + c) : nullptr;
      if (odd != nullptr) {
        for (int64_t j = 0; j < kPack; ++j) dst[j] = uint32_t(even[j]) | (uint32_t(odd[j]) << 16);
      } else {
        for (int64_t j = 0; j < kPack; ++j) dst[j] = uint32_t(even[j]);
      }
    } else {
      std::memset(dst, 0, kPack * sizeof(uint32_t));
    }
  }
}

// fp32 needs no VNNI: 64 columns of K^T [D, ld] plain, and V's 64-column slice [64 keys, 64] plain; keys past `rows` zero.
inline void pack_keys(const float* const* row, int64_t rows, int64_t dim, float* out, int64_t ld = kPack) {
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t d = 0; d < dim; ++d) out[d * ld + r] = row[r][d];
  for (int64_t d = 0; d < dim; ++d) std::fill(out + d * ld + rows, out + d * ld + kPack, 0.f);
}

inline void pack_values(const float* const* row, int64_t rows, int64_t c, float* out) {
  for (int64_t r = 0; r < rows; ++r) std::memcpy(out + r * kPack, row[r] + c, kPack * sizeof(float));
  std::fill(out + rows * kPack, out + kPack * kPack, 0.f);
}

// the rows of a [rows, stride] matrix, as pack_keys and pack_values take them
template <typename T>
std::vector<const T*> rows_of(const T* matrix, int64_t rows, int64_t stride) {
  std::vector<const T*> row(rows);
  for (int64_t r = 0; r < rows; ++r) row[r] = matrix + r * stride;
  return row;
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
    pack_values(rows_of(b.data(), kPack, kPack).data(), kPack, 0, ours.data());
    if (std::memcmp(ours.data(), packed.data(), ours.size() * sizeof(BF)) != 0)
      return "oneDNN's brgemm micro-kernel packs bf16 in another layout than VNNI [K / 2][N][2] here";
    pack_keys(rows_of(bt.data(), kPack, kPack).data(), kPack, kPack, ours.data());
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
// 2^x for x <= 0 (below -126: 2^-126): a floor, a fit of 2^f on [0, 1) (coefficients from the highest
// power down), and vscalefps
template <size_t N>
inline __m512 exp2_fit(__m512 x, const std::array<float, N>& fit) {
  x = _mm512_max_ps(x, _mm512_set1_ps(-126.f));
  __m512 whole = _mm512_roundscale_ps(x, _MM_FROUND_TO_NEG_INF | _MM_FROUND_NO_EXC);
  __m512 f = _mm512_sub_ps(x, whole);
  __m512 p = _mm512_set1_ps(fit[0]);
  for (size_t i = 1; i < N; ++i) p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(fit[i]));
  return _mm512_scalef_ps(p, whole);
}

// for bf16 results: degree 4, relative error 7e-6 (bf16's half step is 2e-3)
constexpr std::array<float, 5> kExp2Bf16 = {0.013676531f, 0.051666877f, 0.24171026f, 0.69293129f, 1.0000073f};
// to fp32's precision: degree 5, relative error 1.8e-7 (1.5 ulp)
constexpr std::array<float, 6> kExp2Fp32 = {0.00189511f, 0.00894621f, 0.05586328f, 0.24014077f, 0.69315463f, 0.9999999f};
inline __m512 exp2_nonpositive(__m512 x) { return exp2_fit(x, kExp2Bf16); }

inline __mmask16 first_lanes(int64_t n) { return n >= 16 ? __mmask16(0xFFFF) : __mmask16((1u << n) - 1); }
#endif

// the largest of row[0 .. n): two vectors at a time without masks, into two maxima, then a masked tail
// (one masked vector at a time into one maximum: v8 at 512 tokens 0.01-0.02 ms a layer longer)
inline float row_max(const float* row, int64_t n) {
#if defined(CPU_CAPABILITY_AVX512)
  __m512 m0 = _mm512_set1_ps(kNegInf), m1 = m0;
  int64_t c = 0;
  for (; c + 32 <= n; c += 32) {
    m0 = _mm512_max_ps(m0, _mm512_loadu_ps(row + c));
    m1 = _mm512_max_ps(m1, _mm512_loadu_ps(row + c + 16));
  }
  for (; c < n; c += 16) m0 = _mm512_mask_max_ps(m0, first_lanes(n - c), m0, _mm512_maskz_loadu_ps(first_lanes(n - c), row + c));
  return _mm512_reduce_max_ps(_mm512_max_ps(m0, m1));
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

// fp32: p[c] = 2^(row[c] * a - b) for c < n, to fp32's precision (AVX-512: the fit above; else Sleef's
// exp2, 1 ulp); returns their sum. Two vectors at a time without masks, their sum added once, as the
// bf16 loop does: a masked vector at a time, each added to the running sum, took v8 at 512 tokens
// 0.11 ms a layer longer (1.74 against 1.63 ms, A/B in one process, the Xeon with AMX), the adds'
// chain being the bound; the same loop keeping that order gained 0.02.
template <typename R>
inline float row_exp2(const float* row, int64_t n, float a, float b, float* p) {
#if defined(CPU_CAPABILITY_AVX512)
  __m512 va = _mm512_set1_ps(a), vb = _mm512_set1_ps(b), sum = _mm512_setzero_ps();
  int64_t c = 0;
  for (; c + 32 <= n; c += 32) {
    const __m512 e0 = exp2_fit(_mm512_fmsub_ps(_mm512_loadu_ps(row + c), va, vb), kExp2Fp32);
    const __m512 e1 = exp2_fit(_mm512_fmsub_ps(_mm512_loadu_ps(row + c + 16), va, vb), kExp2Fp32);
    sum = _mm512_add_ps(sum, _mm512_add_ps(e0, e1));
    _mm512_storeu_ps(p + c, e0);
    _mm512_storeu_ps(p + c + 16, e1);
  }
  for (; c < n; c += 16) {
    __mmask16 lanes = first_lanes(n - c);
    __m512 e = _mm512_maskz_mov_ps(lanes, exp2_fit(_mm512_fmsub_ps(_mm512_maskz_loadu_ps(lanes, row + c), va, vb), kExp2Fp32));
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

// Room for `elements` of T kept by the calling thread between calls, one buffer per Slot, cache-line
// aligned, its contents whatever the last call left (grown when a call needs more; freed when the thread
// ends). Slot 0: a step's packed K and V (the calling thread's, reused at every layer): a tensor per call
// was freed between the captures an inspection pass keeps, and the heap (its freed memory kept for reuse:
// engine/host_memory.py) did not reuse the holes: a 4,096-token fp32 inspection's peak RSS grew from 2.6
// to 3.8 GB. The other slots: each thread's scratch in v8 and the brgemm linear (16-128 KB), which had been
// vectors made and zeroed per parallel region, ~420 a 512-token prefill: perf put glibc's malloc, free and
// memset at ~1.3 ms of its main thread. Kept instead (the Xeon with AMX, A/B in one process, alternating
// pairs, paired medians): bf16 512 tokens 83.9 -> 80.9 ms, 2,048 tokens -14.7 ms of ~400, fp32 512 tokens
// -8.3 ms of ~348; a one-token step the same.
template <typename T, int Slot = 0>
T* thread_buffer(int64_t elements) {
  constexpr int64_t kAlign = 64 / sizeof(T);  // a cache line
  thread_local std::vector<T> buffer;
  if (static_cast<int64_t>(buffer.size()) < elements + kAlign) {
    buffer = std::vector<T>();  // the old one is freed before the new one is made
    buffer.resize(elements + kAlign);
  }
  const auto address = reinterpret_cast<std::uintptr_t>(buffer.data());
  return buffer.data() + (kAlign - address / sizeof(T) % kAlign) % kAlign;
}
enum ThreadBufferSlot { kPackedKV = 0, kScores, kAccumulator, kProbabilities, kLinearSums };

// A paged step's attention in T (bf16 or fp32): q (T, H D) rows (unit inner stride), the caches
// (blocks, block size, KVH, D), every request's context slots one after another, and per request
// (query start, query length, cached tokens, its first slot's index in `slots`), as v7 takes them.
// out (T, H D). Each request is causal with its last query at its last key (a chunk after its cached keys).
// Block-sparse (brgemm_block_sparse): request r's tiles of `tile` queries by `tile` keys are the (heads, nb, nb)
// bytes at kept + kept_at[r], nonzero where a tile is computed (kept_at[r] < 0, or no kept_at: every tile, dense).
// A block-sparse request has nothing cached; its query block's keys are walked in runs of kept tiles, each within
// one kKeyBlock (so with every tile kept, exactly as dense), and a skipped tile costs nothing.
template <typename T>
void brgemm_paged_impl(const at::Tensor& q, const at::Tensor& key_cache, const at::Tensor& value_cache, const at::Tensor& slots,
                       const at::Tensor& meta, int64_t heads, double scale, at::Tensor& out, const uint8_t* kept = nullptr,
                       const int64_t* kept_at = nullptr, int64_t tile = kKeyBlock) {
  const int64_t kv_heads = key_cache.size(2), dim = key_cache.size(3), group = heads / kv_heads, requests = meta.size(0);
  const int64_t* m = meta.data_ptr<int64_t>();
  const int64_t* slot = slots.data_ptr<int64_t>();
  constexpr bool vnni = std::is_same_v<T, c10::BFloat16>;
  // K^T is packed in blocks of kblock keys, [D, kblock] each (bf16: [D / 2][kblock][2]). bf16: a softmax block's
  // keys, so Q K^T is one micro-kernel call a block (each call costs cpublas a kernel lookup and oneDNN a
  // context check): v8 at 512 tokens 0.03 ms a layer faster than a call per 64 keys, a
  // whole prefill 1.1 ms of 88 faster at 512 tokens and 20 of 501 at 2,048 (A/B in one process, the Xeon with
  // AMX). fp32: 64 keys, a call each: one call a block took 0.05 ms a layer longer at 512 tokens, 0.6 in a mixed step
  const int64_t kblock = vnni ? kKeyBlock : kPack;
  // per request: its keys padded to kblock, and where its packed K and V start (each KV head: padded * D)
  std::vector<int64_t> padded(requests), base(requests + 1, 0);
  std::vector<std::array<int64_t, 3>> pack_tasks, tasks;  // (request, KV head, first key); (request, head, first query row)
  for (int64_t r = 0; r < requests; ++r) {
    const int64_t queries = m[4 * r + 1], keys = m[4 * r + 2] + queries;
    padded[r] = (keys + kblock - 1) / kblock * kblock;
    base[r + 1] = base[r] + kv_heads * padded[r] * dim;
    for (int64_t h = 0; h < kv_heads; ++h)
      for (int64_t first = 0; first < keys; first += kPack) pack_tasks.push_back({r, h, first});
    for (int64_t head = 0; head < heads; ++head)
      for (int64_t first = 0; first < queries; first += kQRows) tasks.push_back({r, head, first});
  }
  T* pk = thread_buffer<T, kPackedKV>(2 * base[requests]);  // per 64 keys: K^T [D, 64] (VNNI in bf16)
  T* pv = pk + base[requests];                    // per 64 columns of D: V [padded, 64] (VNNI in bf16)
  const T* kc = key_cache.data_ptr<T>();
  const T* vc = value_cache.data_ptr<T>();
  at::parallel_for(0, static_cast<int64_t>(pack_tasks.size()), 1, [&](int64_t begin, int64_t end) {
    std::array<const T*, kPack> krow, vrow;
    for (int64_t z = begin; z < end; ++z) {
      const auto [r, h, first] = pack_tasks[z];
      const int64_t rows = std::min(kPack, m[4 * r + 2] + m[4 * r + 1] - first), pad = padded[r];
      for (int64_t j = 0; j < rows; ++j) {
        const int64_t at = (slot[m[4 * r + 3] + first + j] * kv_heads + h) * dim;
        krow[j] = kc + at;
        vrow[j] = vc + at;
      }
      T* head_k = pk + base[r] + h * pad * dim;
      T* head_v = pv + base[r] + h * pad * dim;
      // this 64-key slice of K^T at its columns of its block
      pack_keys(krow.data(), rows, dim, head_k + (first / kblock) * kblock * dim + (first % kblock) * (vnni ? 2 : 1), kblock);
      // a 64-column slice of V is [padded, 64] (in bf16's VNNI [padded / 2, 64, 2]): 64 rows of it start at row * 64
      for (int64_t c = 0; c < dim; c += kPack) pack_values(vrow.data(), rows, c, head_v + c * pad + first * kPack);
    }
  });
  const T* qd = q.data_ptr<T>();
  T* od = out.data_ptr<T>();
  const int64_t q_stride = q.stride(0);
  const bool native = bf16_dot_enabled();  // AVX512-BF16's rounding instruction for P, where the CPU has it
  const float log2_scale = static_cast<float>(scale) * 1.4426950408889634f;  // exp(s * scale) = 2^(s * log2_scale)
  // each thread a run of tasks of about equal cost (a task's rows times the keys they see, plus a 64 x 64
  // block's worth for its calls): split by count, one thread got a head's late (long) query blocks and the
  // other its early ones. Runs, not one queue: a thread then mostly reads the K and V it packed itself.
  // A thread done with its run takes the next tasks of the others' (a core of a busy host can fall behind).
  const int64_t count = static_cast<int64_t>(tasks.size()), threads = std::min<int64_t>(at::get_num_threads(), count);
  // block-sparse: the kept tiles of request r's query block at row `first`, nb of them (nullptr: dense)
  auto kept_row = [&](int64_t r, int64_t head, int64_t first) -> const uint8_t* {
    if (kept_at == nullptr || kept_at[r] < 0) return nullptr;
    const int64_t nb = (m[4 * r + 1] + tile - 1) / tile;
    return kept + kept_at[r] + (head * nb + first / tile) * nb;
  };
  std::vector<int64_t> bounds(threads + 1, count);
  {
    std::vector<double> before(count + 1, 0.);
    for (int64_t z = 0; z < count; ++z) {
      const auto [r, head, first] = tasks[z];
      const int64_t rows = std::min(kQRows, m[4 * r + 1] - first);
      int64_t keys = m[4 * r + 2] + first + rows;  // the keys the task's rows see, or their kept tiles' keys
      if (const uint8_t* row = kept_row(r, head, first)) keys = tile * std::count_if(row, row + first / tile + 1, [](uint8_t k) { return k != 0; });
      before[z + 1] = before[z] + static_cast<double>(rows * keys + kPack * kPack);
    }
    for (int64_t t = 0, z = 0; t < threads; ++t) {
      while (z < count && before[z] < before[count] * t / threads) ++z;
      bounds[t] = z;
    }
  }
  struct alignas(64) Taken {
    std::atomic<int64_t> tasks{0};
  };
  std::vector<Taken> taken(threads);  // per run, how many of its tasks the threads have taken, from its front
  // the next task for the thread that owns run `own`: its own run's, then the others' in turn (-1: none left)
  auto next_task = [&](int64_t own, int64_t& turn) -> int64_t {
    for (; turn < threads; ++turn) {
      const int64_t from = (own + turn) % threads, z = bounds[from] + taken[from].tasks++;
      if (z < bounds[from + 1]) return z;
    }
    return -1;
  };
  at::parallel_for(0, threads, 1, [&](int64_t own, int64_t) {
    float* const scores = thread_buffer<float, kScores>(kQRows * kKeyBlock);
    float* const acc = thread_buffer<float, kAccumulator>(kQRows * dim);
    T* const probs = thread_buffer<T, kProbabilities>(kQRows * kKeyBlock);
    std::array<float, kQRows> top, total;
    for (int64_t turn = 0, z; (z = next_task(own, turn)) >= 0;) {
      const auto [r, head, first] = tasks[z];
      const int64_t start = m[4 * r], cached = m[4 * r + 2], rows = std::min(kQRows, m[4 * r + 1] - first), h = head / group, pad = padded[r];
      const T* qrows = qd + (start + first) * q_stride + head * dim;
      const T* head_k = pk + base[r] + h * pad * dim;
      const T* head_v = pv + base[r] + h * pad * dim;
      std::fill(top.begin(), top.end(), kNegInf);  // running max, in log2 units
      std::fill(total.begin(), total.end(), 0.f);
      const int64_t seen = cached + first + rows;  // keys the block's last row sees
      const uint8_t* tiles = kept_row(r, head, first);
      bool first_block = true;
      for (int64_t key = 0, end; key < seen; key = end) {
        end = key + kKeyBlock;  // dense: kKeyBlock keys at a time
        if (tiles != nullptr) {  // block-sparse: a run of kept tiles within one kKeyBlock (every tile kept: as dense)
          end = key + tile;
          if (!tiles[key / tile]) continue;  // a skipped tile
          while (end < seen && end % kKeyBlock != 0 && tiles[end / tile]) end += tile;
        }
        const int64_t cols = std::min(end, seen) - key, padded_cols = (cols + kPack - 1) / kPack * kPack;
        // key is a multiple of 64 (and dense, of kblock): its packed block, at its column
        const T* keys_at = head_k + (key / kblock) * kblock * dim + (key % kblock) * (vnni ? 2 : 1);
        for (int64_t b = 0; b < padded_cols; b += kblock)
          cpublas::brgemm(rows, std::min(kblock, padded_cols - b), dim, q_stride, kblock, kKeyBlock, false, qrows, keys_at + b * dim, scores + b);
        // the block's softmax in three passes over its rows, each row's work independent of the other rows'
        // in a pass, so that the CPU overlaps them: each row's max, its exponentials and their sum, then the
        // running max and sum and the accumulator's rescaling. One pass a row (max, exp, then the rest)
        // waited on each row's chain of reductions: v8 at 512 tokens took 0.03 (bf16) and 0.05 (fp32) ms a
        // layer longer (A/B in one process, the Xeon with AMX)
        std::array<int64_t, kQRows> live;
        std::array<float, kQRows> high, sum;
        for (int64_t i = 0; i < rows; ++i) {
          live[i] = std::max<int64_t>(0, std::min(cols, cached + first + i + 1 - key));  // keys row i sees here
          high[i] = live[i] > 0 ? std::max(top[i], row_max(scores + i * kKeyBlock, live[i]) * log2_scale) : top[i];
        }
        for (int64_t i = 0; i < rows; ++i) {
          const float* row = scores + i * kKeyBlock;
          T* p = probs + i * kKeyBlock;
          sum[i] = live[i] == 0 ? 0.f : native ? row_exp2<NATIVE_ROUND>(row, live[i], log2_scale, high[i], p) : row_exp2<AtenRound>(row, live[i], log2_scale, high[i], p);
          std::fill(p + live[i], p + padded_cols, T(0.f));
        }
        for (int64_t i = 0; i < rows; ++i) {
          // 2^(top - high): 0 for the first block (top is -inf), 1 where the max did not move: exp2's own
          // values there, without its call
          const float shrink = top[i] == high[i] ? 1.f : top[i] == kNegInf ? 0.f : std::exp2(top[i] - high[i]);
          total[i] = total[i] * shrink + sum[i];
          top[i] = high[i];
          if (!first_block && shrink != 1.f) {
            float* a = acc + i * dim;
            for (int64_t d = 0; d < dim; d += kW) (Vec::loadu(a + d) * Vec(shrink)).store(a + d);
          }
        }
        for (int64_t c = 0; c < dim; c += kPack)
          cpublas::brgemm(rows, kPack, padded_cols, kKeyBlock, kPack, dim, !first_block, probs, head_v + c * pad + key * kPack, acc + c);
        first_block = false;
      }
      for (int64_t i = 0; i < rows; ++i) {  // out = acc / total, rounded to nearest even (as T(x)) in the same pass
        const float* a = acc + i * dim;
        const Vec inv(1.f / total[i]);
        T* o = od + (start + first + i) * heads * dim + head * dim;
        for (int64_t d = 0; d < dim; d += 2 * kW) store_pair<AtenRound>(o + d, Vec::loadu(a + d) * inv, Vec::loadu(a + d + kW) * inv);
      }
    }
    // each thread lets go of its AMX tiles, as torch's flash attention does: cpublas keeps a per-thread
    // note of the tile configuration it last loaded and skips loading it again, and another library's
    // kernel on this thread (oneDNN's matmul in the linears) may have released or changed the tiles since
    cpublas::brgemm_release(vnni);
  });
}

// v8 over a paged step, as v7's paged_attention takes it (q (T, H D) rows, the caches, the slots and
// (R, 4) meta); bf16 or fp32, and a head size that is a multiple of 64. Returns (T, H D).
at::Tensor brgemm_paged(const at::Tensor& q, const at::Tensor& key_cache, const at::Tensor& value_cache, const at::Tensor& slots,
                        const at::Tensor& meta, int64_t num_heads, double scale, const uint8_t* kept = nullptr,
                        const int64_t* kept_at = nullptr, int64_t tile = kKeyBlock) {
  const auto dtype = q.scalar_type();
  TORCH_CHECK((dtype == at::kBFloat16 || dtype == at::kFloat) && key_cache.scalar_type() == dtype && value_cache.scalar_type() == dtype,
              "v8 runs bf16 or fp32, q and the caches in one dtype");
  TORCH_CHECK(q.dim() == 2 && q.stride(1) == 1, "v8: q (T, H D) with unit inner stride");
  TORCH_CHECK(key_cache.is_contiguous() && value_cache.is_contiguous() && key_cache.dim() == 4, "v8: contiguous (blocks, block size, KVH, D) caches");
  TORCH_CHECK(slots.scalar_type() == at::kLong && slots.is_contiguous() && meta.scalar_type() == at::kLong && meta.is_contiguous() &&
              meta.dim() == 2 && meta.size(1) == 4, "v8: contiguous int64 slots and (R, 4) meta");
  const int64_t dim = key_cache.size(3), kv_heads = key_cache.size(2);
  TORCH_CHECK(dim % kPack == 0, "v8: head size ", dim, " is not a multiple of ", kPack);
  TORCH_CHECK(num_heads % kv_heads == 0 && q.size(1) >= num_heads * dim, "v8: heads must be a multiple of KV heads, and q must hold them");
  at::Tensor out = at::empty({q.size(0), num_heads * dim}, q.options());
  if (dtype == at::kBFloat16)
    brgemm_paged_impl<c10::BFloat16>(q, key_cache, value_cache, slots, meta, num_heads, scale, out, kept, kept_at, tile);
  else
    brgemm_paged_impl<float>(q, key_cache, value_cache, slots, meta, num_heads, scale, out, kept, kept_at, tile);
  return out;
}

// v8 with some requests block-sparse (brgemm_paged_impl): kept_at (R,) int64, request r's (H, nb, nb) map's offset
// in `kept` (flat uint8; nb = its blocks of `tile` tokens, 64, 128 or 256), -1 for a dense request. A block-sparse
// request has nothing cached, and each of its rows keeps its diagonal tile and nothing above it. Returns (T, H D).
at::Tensor brgemm_block_sparse(const at::Tensor& q, const at::Tensor& key_cache, const at::Tensor& value_cache, const at::Tensor& slots,
                               const at::Tensor& meta, int64_t num_heads, double scale, const at::Tensor& kept,
                               const at::Tensor& kept_at, int64_t tile) {
  TORCH_CHECK(tile > 0 && tile % kPack == 0 && kKeyBlock % tile == 0, "v8 block-sparse: a tile of 64, 128 or 256 tokens");
  TORCH_CHECK(kept.scalar_type() == at::kByte && kept.is_contiguous() && kept_at.scalar_type() == at::kLong && kept_at.is_contiguous() &&
              meta.dim() == 2 && kept_at.numel() == meta.size(0), "v8 block-sparse: kept flat uint8, kept_at (R,) int64");
  const int64_t* m = meta.data_ptr<int64_t>();
  const int64_t* at = kept_at.data_ptr<int64_t>();
  for (int64_t r = 0; r < meta.size(0); ++r) {
    const int64_t nb = (m[4 * r + 1] + tile - 1) / tile;
    TORCH_CHECK(at[r] < 0 || (m[4 * r + 2] == 0 && at[r] + num_heads * nb * nb <= kept.numel()),
                "v8 block-sparse: request ", r, " has cached tokens or its map lies past `kept`");
  }
  return brgemm_paged(q, key_cache, value_cache, slots, meta, num_heads, scale, kept.data_ptr<uint8_t>(), at, tile);
}
