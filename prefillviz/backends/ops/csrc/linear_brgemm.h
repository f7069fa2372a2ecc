// A linear layer on oneDNN's brgemm micro-kernel (through ATen's cpublas, as v8's attention), bf16 or
// fp32: y = x W^T, or, for a gated MLP's stacked [gate; up] weight, y = silu(x G^T) * (x U^T) in one
// pass. Included by engine_ops.cpp after attention_brgemm.h (cpublas, Vec, kW, load_pair, store_pair).
//
// The weight is packed once (brgemm_linear.py's BrgemmLinear) into slabs of 64 output columns, each
// [K, 64]: VNNI [K / 2][64][2] in bf16, plain in fp32, columns past N zero. A task is one slab (for the
// gated weight, a gate slab and its up slab) over one group of rows; each micro-kernel call takes up to
// 256 rows of x against the whole slab, and the fp32 sums are rounded (bf16) or activated in the
// epilogue, while they are in L1/L2. Two things oneDNN's matmul primitive does not do here:
//   - a step of >= 256 rows is split into groups of rows, one or more per thread and at most 512 rows
//     each, each group reading every slab (a weight 576 wide has 9 slabs: split over 2 threads by
//     slab, one would take 5);
//   - the gate's and up's sums meet in the epilogue: silu(g) * u in fp32, rounded once, so the
//     gated MLP's [gate | up] (2 x 1536 wide for the bundled model) is never written out and read
//     back for a separate silu_mul pass. (torch rounds g, silu(g) and u first: 3 roundings apart.)
// The epilogue asks for its output's lines kWriteAhead rows before it writes them (the first rows' before
// the micro-kernel runs): a slab writes 64 columns of each row, the output's width apart, a pattern the
// hardware's prefetchers do not follow, and each line written is first read. On the Xeon with AMX, bf16,
// the whole epilogue was ~8.5 ms of a 100 ms 512-token prefill (skipped, A/B), ~3 of them the SiLU.
// The bits are the same.
// Whether it is faster is measured (the dispatch's linears family), as for every candidate.
//
// The slab linear (the dispatch's "slab linear"): the same packs, tasks and epilogue, fp32 only, with the
// micro-kernel the engine's own (slab_rows below, AVX-512 builds only) in oneDNN's place. It multiplies in
// oneDNN's order (blocks of 6 rows x 64 columns in 24 vector accumulators, K in order: the same sums) and
// asks for the next slab's weights while it computes, a cache line every kPrefetchEvery steps of K, which a
// call into oneDNN's micro-kernel can't do. oneDNN's kernel runs at ~95% of the FMA peak with a slab in L2
// (one core, 256 x 64 x 576), but each slab's first pass fetches its 147 KB from L3 at ~14 GB/s, ~10 us of a
// ~90 us slab, and asking for the next slab between calls costs the core as much as it saves (a burst of
// prefetches waits for fill buffers). On the Xeon with AMX, fp32, the model's 120 linears at 512 rows (each
// layer's weights in turn, alternating, paired medians): 276 -> 251-254 ms; 128 rows 84 -> 71.5; 2,048 rows
// 1,060 -> 1,047; one row 17.3 -> 15.5; 16 rows the same.

constexpr int64_t kSlab = 64;        // output columns per packed slab of the weight
constexpr int64_t kCallRows = 256;   // rows of x per micro-kernel call
constexpr int64_t kGroupRows = 128;  // a thread takes a group of rows of its own from 2 x this many rows
constexpr int64_t kMaxGroupRows = 512;  // and more groups than threads past this many rows a thread
// rows of the output asked for ahead of the epilogue. On the Xeon with AMX, bf16, A/B in one process
// (alternating pairs, paired medians): a 2,048-token prefill 552 -> 522 ms (24 beat 12, 48 and 96 by
// 4-6 ms), a 512-token one -1.2 to -1.5 ms of 100; fp32 unchanged within the noise at both sizes
constexpr int64_t kWriteAhead = 24;
// The next slab's weights are asked for in L2 (prefetcht1) while the epilogue walks its rows, at most
// kPrefetchLines cache lines a row, in groups of at least kPrefetchRows rows: the hardware's prefetchers
// do not run ahead from one slab to the next, and a slab's weights come from beyond L2 in a forward
// (each layer's once). Spread, not all at a slab's start: a burst of a slab's lines gained little (bf16
// -1.7 ms of 98) and cost fp32 6 ms. On the Xeon with AMX, bf16, A/B in one process (alternating pairs,
// paired medians): a 512-token prefill 97.5 -> 91.7 ms, 2,048 tokens 541 -> 528 ms; the model's 120
// linears alone at 512 rows -5.0 ms of 63, 128 rows -2.3, 64 rows -0.7, but 16 rows +0.4 (hence the
// floor: a short call has no time to hide the fetch). fp32 within the noise (its full slabs have no epilogue).
constexpr int64_t kPrefetchLines = 8;
constexpr int64_t kPrefetchRows = 64;

// asks for row y's `width` values of T, to be written soon (one request per cache line)
template <typename T>
inline void prefetch_for_write(const T* y, int64_t width) {
  for (int64_t c = 0; c < width; c += 64 / static_cast<int64_t>(sizeof(T))) __builtin_prefetch(y + c, 1, 3);
}

#if defined(CPU_CAPABILITY_AVX512)
constexpr bool kSlabKernel = true;
// steps of K between two of the next slab's lines asked for (prefetcht1): every 4 took the 120 linears at 512
// rows 22-23 ms under oneDNN's kernel, every 8 14-15, 16 3.5, 2 16, 1 10 (fill buffers again)
constexpr int64_t kPrefetchEvery = 4;

// rows r < R (R <= 6) of x (row stride k) against a [k, 64] slab, into c (row stride ldc): 4R accumulators of
// 16 floats, K in order; asks for `next`'s line `line` every kPrefetchEvery steps while line < lines
template <int R>
inline void slab_block(const float* a, int64_t k, const float* b, float* c, int64_t ldc, const char* next, int64_t& line, int64_t lines) {
  __m512 acc[R][4];
  for (int i = 0; i < R; ++i)
    for (int j = 0; j < 4; ++j) acc[i][j] = _mm512_setzero_ps();
  auto step = [&](int64_t q) {
    const float* bq = b + q * kSlab;
    const __m512 b0 = _mm512_loadu_ps(bq), b1 = _mm512_loadu_ps(bq + 16), b2 = _mm512_loadu_ps(bq + 32), b3 = _mm512_loadu_ps(bq + 48);
    for (int i = 0; i < R; ++i) {
      const __m512 x = _mm512_set1_ps(a[i * k + q]);
      acc[i][0] = _mm512_fmadd_ps(x, b0, acc[i][0]);
      acc[i][1] = _mm512_fmadd_ps(x, b1, acc[i][1]);
      acc[i][2] = _mm512_fmadd_ps(x, b2, acc[i][2]);
      acc[i][3] = _mm512_fmadd_ps(x, b3, acc[i][3]);
    }
  };
  int64_t q = 0;
  if (next != nullptr)
    for (; q + kPrefetchEvery <= k && line < lines; q += kPrefetchEvery, ++line) {
      _mm_prefetch(next + line * 64, _MM_HINT_T1);
#pragma GCC unroll 4
      for (int64_t u = 0; u < kPrefetchEvery; ++u) step(q + u);
    }
#pragma GCC unroll 4
  for (; q < k; ++q) step(q);
  for (int i = 0; i < R; ++i)
    for (int j = 0; j < 4; ++j) _mm512_storeu_ps(c + i * ldc + 16 * j, acc[i][j]);
}

// rows x [k] against a [k, 64] slab into c (row stride ldc), 6 rows at a time; asks for the slab at `next` (null: none)
inline void slab_rows(const float* a, int64_t rows, int64_t k, const float* b, float* c, int64_t ldc, const char* next) {
  const int64_t lines = k * kSlab * static_cast<int64_t>(sizeof(float)) / 64;
  int64_t line = 0, r = 0;
  for (; r + 6 <= rows; r += 6) slab_block<6>(a + r * k, k, b, c + r * ldc, ldc, next, line, lines);
  const float* ar = a + r * k;
  float* cr = c + r * ldc;
  switch (rows - r) {
    case 5: slab_block<5>(ar, k, b, cr, ldc, next, line, lines); break;
    case 4: slab_block<4>(ar, k, b, cr, ldc, next, line, lines); break;
    case 3: slab_block<3>(ar, k, b, cr, ldc, next, line, lines); break;
    case 2: slab_block<2>(ar, k, b, cr, ldc, next, line, lines); break;
    case 1: slab_block<1>(ar, k, b, cr, ldc, next, line, lines); break;
    default: break;
  }
}
#else
constexpr bool kSlabKernel = false;  // an AVX2 or plain build: the slab linear is out of the dispatch (slab_kernel_built)
inline void slab_rows(const float*, int64_t, int64_t, const float*, float*, int64_t, const char*) {
  TORCH_CHECK(false, "the slab linear's micro-kernel is built for AVX-512 only");
}
#endif

bool slab_kernel_built() { return kSlabKernel; }

template <typename T, typename R>
void brgemm_linear_impl(const at::Tensor& x, const at::Tensor& packed, int64_t n, bool gated, bool own, at::Tensor& out) {
  const int64_t m = x.size(0), k = x.size(1), units = gated ? packed.size(0) / 2 : packed.size(0);
  // bf16 on this Xeon, 2,048 rows: groups of 1,024 rows 6.4 ms a layer (hot), of 512 5.6, of 256 5.8
  const int64_t groups = std::max({int64_t(1), std::min<int64_t>(at::get_num_threads(), m / kGroupRows), (m + kMaxGroupRows - 1) / kMaxGroupRows});
  const int64_t group_rows = (m + groups - 1) / groups;
  const T* a = x.data_ptr<T>();
  const T* b = packed.data_ptr<T>();
  T* o = out.data_ptr<T>();
  constexpr bool vnni = std::is_same_v<T, c10::BFloat16>;
  // rows of x against one slab into c (row stride ldc): oneDNN's micro-kernel, or (fp32, own) the engine's, which asks
  // for the slab at `ahead` (null: none) as it goes
  auto multiply = [&](int64_t rows, const T* xr, const T* slab, float* c, int64_t ldc, const T* ahead) {
    if constexpr (std::is_same_v<T, float>) {
      if (own) return slab_rows(xr, rows, k, slab, c, ldc, reinterpret_cast<const char*>(ahead));
    }
    cpublas::brgemm(rows, kSlab, k, k, kSlab, ldc, false, xr, slab, c, vnni);
  };
  at::parallel_for(0, groups * units, 1, [&](int64_t begin, int64_t end) {  // group-major: a thread keeps its rows
    float* cg = thread_buffer<float, kLinearSums>((gated ? 2 : 1) * kCallRows * kSlab);
    float* cu = gated ? cg + kCallRows * kSlab : nullptr;
    for (int64_t item = begin; item < end; ++item) {
      const int64_t group = item / units, s = item % units, col = s * kSlab, width = std::min(kSlab, n - col);
      const int64_t first_row = group * group_rows, last = std::min(m, (group + 1) * group_rows);
      // the next slab (gated: the next gate slab, its up slab units further), spread over the group's rows
      const int64_t lines = k * kSlab * static_cast<int64_t>(sizeof(T)) / 64;
      const T* ahead = s + 1 < units ? b + (s + 1) * k * kSlab : nullptr;  // the own kernel asks for it as it multiplies, else the epilogue
      const char* next = !own && last - first_row >= kPrefetchRows ? reinterpret_cast<const char*>(ahead) : nullptr;
      const int64_t per_row = std::min(kPrefetchLines, (lines + last - first_row - 1) / (last - first_row));
      const int64_t up_bytes = units * k * kSlab * static_cast<int64_t>(sizeof(T));  // gate slab -> its up slab
      for (int64_t r0 = first_row; r0 < last; r0 += kCallRows) {
        const int64_t rows = std::min(kCallRows, last - r0);
        const T* xr = a + r0 * k;
        const T* first_ahead = r0 == first_row ? ahead : nullptr;  // the slab's first call asks for the next one
        if (!gated && !vnni && width == kSlab) {  // fp32, a whole slab: the sums are the output
          multiply(rows, xr, b + s * k * kSlab, reinterpret_cast<float*>(o) + r0 * n + col, n, first_ahead);
          continue;
        }
        for (int64_t r = 0; r < std::min(kWriteAhead, rows); ++r) prefetch_for_write(o + (r0 + r) * n + col, width);
        multiply(rows, xr, b + s * k * kSlab, cg, kSlab, first_ahead);
        if (gated) multiply(rows, xr, b + (s + units) * k * kSlab, cu, kSlab, first_ahead != nullptr ? first_ahead + units * k * kSlab : nullptr);
        for (int64_t r = 0; r < rows; ++r) {
          if (next != nullptr)
            for (int64_t l = (r0 - first_row + r) * per_row, stop = std::min(lines, l + per_row); l < stop; ++l) {
              __builtin_prefetch(next + l * 64, 0, 2);
              if (gated) __builtin_prefetch(next + up_bytes + l * 64, 0, 2);
            }
          const float* g = cg + r * kSlab;
          const float* u = gated ? cu + r * kSlab : nullptr;
          T* y = o + (r0 + r) * n + col;
          if (r + kWriteAhead < rows) prefetch_for_write(y + kWriteAhead * n, width);
          int64_t j = 0;
          for (; j + 2 * kW <= width; j += 2 * kW) {
            Vec g0 = Vec::loadu(g + j), g1 = Vec::loadu(g + j + kW);
            if (gated) {  // silu_mul_impl's arithmetic without its roundings in between
              g0 = silu(g0) * Vec::loadu(u + j);
              g1 = silu(g1) * Vec::loadu(u + j + kW);
            }
            store_pair<R>(y + j, g0, g1);
          }
          for (; j < width; ++j) y[j] = T(gated ? g[j] / (1.f + std::exp(-g[j])) * u[j] : g[j]);
        }
      }
    }
    if (!own) cpublas::brgemm_release(vnni);  // per thread, as v8 (attention_brgemm.h says why)
  });
}

// x (M, K) contiguous; packed (slabs, K * 64) from BrgemmLinear's packing (gated: the gate's slabs,
// then as many of up's); n: the output's width (N, or gated the gate's); own: the slab linear (fp32, the
// engine's micro-kernel: slab_kernel_built()). Returns (M, n).
at::Tensor brgemm_linear(const at::Tensor& x, const at::Tensor& packed, int64_t n, bool gated, bool own) {
  const auto dtype = x.scalar_type();
  TORCH_CHECK((dtype == at::kBFloat16 || dtype == at::kFloat) && packed.scalar_type() == dtype, "brgemm_linear: bf16 or fp32, x and the weight in one dtype");
  TORCH_CHECK(x.dim() == 2 && x.is_contiguous() && packed.dim() == 2 && packed.is_contiguous(), "brgemm_linear: contiguous x (M, K) and packed weight");
  TORCH_CHECK(packed.size(1) == x.size(1) * kSlab, "brgemm_linear: the weight was packed for ", packed.size(1) / kSlab, " inputs, x has ", x.size(1));
  const int64_t units = gated ? packed.size(0) / 2 : packed.size(0);
  TORCH_CHECK(n > 0 && n <= units * kSlab && n > (units - 1) * kSlab && (!gated || packed.size(0) % 2 == 0), "brgemm_linear: ", n, " outputs do not fit the packed slabs");
  TORCH_CHECK(dtype != at::kBFloat16 || x.size(1) % 2 == 0, "brgemm_linear: bf16 needs an even input width (VNNI pairs)");
  TORCH_CHECK(!own || (dtype == at::kFloat && kSlabKernel), "brgemm_linear: the slab linear's micro-kernel runs fp32 on an AVX-512 build only");
  at::Tensor out = at::empty({x.size(0), n}, x.options());
  if (x.size(0) > 0) by_dtype_and_rounding(dtype, [&](auto t, auto r) { brgemm_linear_impl<decltype(t), decltype(r)>(x, packed, n, gated, own, out); });
  return out;
}
