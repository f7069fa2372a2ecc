// XAttention's antidiagonal scores of one fresh prompt (engine/sparse_attention.py's antidiagonal_block_scores,
// the textbook's), read from the q|k|v rows as the forward leaves them, the matmul on oneDNN's brgemm
// micro-kernel. Included by engine_ops.cpp after attention_brgemm.h (pack_keys, thread_buffer, kQRows).
//
// Stride-row a of the queries and b of the keys meet in an S x S square of q k^T; its antidiagonal sum is
//     s[a][b] = sum over t < S of q[a S + t] . k[b S + S-1-t]
// one product S D deep: A's row a is queries a S .. a S + S-1 side by side (copied per task), B's column b
// keys b S + S-1 .. b S, packed once per KV head (a slab of D rows per t: B_t, the keys b S + S-1-t).
// Then, per stride-row, a softmax over its causal stride-rows (b <= a) in fp32, its probabilities summed
// per tile of `tile` tokens; each query tile's row of tiles is then normalised to sum to 1. The textbook
// rounds the matmul's output to the model's dtype first; here the sums stay fp32.
template <typename T>
void antidiagonal_scores_impl(const at::Tensor& q, const at::Tensor& k, int64_t heads, int64_t kv_heads, double scale,
                              int64_t stride, int64_t tile, at::Tensor& out) {
  constexpr bool vnni = std::is_same_v<T, c10::BFloat16>;
  const int64_t n = q.size(0), dim = q.size(1) / heads, group = heads / kv_heads, per = tile / stride;
  const int64_t rows = (n + stride - 1) / stride, nb = (n + tile - 1) / tile;
  const int64_t ldb = (rows + kPack - 1) / kPack * kPack;  // packed keys: [D, ldb] (bf16: [D / 2][ldb][2])
  const T* qd = q.data_ptr<T>();
  const T* kd = k.data_ptr<T>();
  const int64_t q_stride = q.stride(0), k_stride = k.stride(0);
  T* packed = thread_buffer<T, kPackedKV>(kv_heads * stride * ldb * dim);
  std::vector<T> zeros(dim, T(0.f));
  // B_t for each KV head g: the keys b S + S-1-t (zero past the prompt), 64 of them a pack_keys call
  at::parallel_for(0, kv_heads * stride * (ldb / kPack), 1, [&](int64_t begin, int64_t end) {
    std::array<const T*, kPack> row;
    for (int64_t z = begin; z < end; ++z) {
      const int64_t g = z / (stride * (ldb / kPack)), t = z / (ldb / kPack) % stride, b0 = z % (ldb / kPack) * kPack;
      for (int64_t j = 0; j < kPack; ++j) {
        const int64_t key = (b0 + j) * stride + stride - 1 - t;
        row[j] = key < n ? kd + key * k_stride + g * dim : zeros.data();
      }
      T* slab = packed + (g * stride + t) * ldb * dim;
      pack_keys(row.data(), kPack, dim, slab + b0 * (vnni ? 2 : 1), ldb);
    }
  });
  float* o = out.data_ptr<float>();  // (H, nb, nb), zeroed
  const float log2_scale = static_cast<float>(scale / stride) * 1.4426950408889634f;
  const int64_t blocks = (rows + kQRows - 1) / kQRows;  // a task: one head's 64 stride-rows (8 query tiles of 128)
  at::parallel_for(0, heads * blocks, 1, [&](int64_t begin, int64_t end) {
    float* const c = thread_buffer<float, kScores>(kQRows * ldb);
    T* const a = thread_buffer<T, kProbabilities>(kQRows * stride * dim);
    for (int64_t z = begin; z < end; ++z) {
      const int64_t h = z / blocks, a0 = z % blocks * kQRows, m = std::min(kQRows, rows - a0), g = h / group;
      const int64_t cols = (a0 + m + kPack - 1) / kPack * kPack;  // the causal stride-rows, padded to a pack
      // A: the task's stride-rows, each its S queries' D values side by side (zero past the prompt)
      for (int64_t i = 0; i < m; ++i)
        for (int64_t t = 0; t < stride; ++t) {
          const int64_t query = (a0 + i) * stride + t;
          std::memcpy(a + (i * stride + t) * dim, query < n ? qd + query * q_stride + h * dim : zeros.data(), dim * sizeof(T));
        }
      cpublas::brgemm(m, cols, stride * dim, stride * dim, ldb, ldb, false, a, packed + g * stride * ldb * dim, c);
      for (int64_t i = 0; i < m; ++i) {
        const int64_t a = a0 + i, seen = a + 1;  // stride-rows b <= a
        float* row = c + i * ldb;
        const float high = row_max(row, seen) * log2_scale;
        const float inv = 1.f / row_exp2<AtenRound>(row, seen, log2_scale, high, row);  // the row's softmax, in place
        float* bins = o + (h * nb + a / per) * nb;
        for (int64_t j = 0; j * per < seen; ++j) {
          float tile_sum = 0.f;
          for (int64_t b = j * per; b < std::min(seen, (j + 1) * per); ++b) tile_sum += row[b];
          bins[j] += tile_sum * inv;
        }
      }
    }
    cpublas::brgemm_release(vnni);
  });
  at::parallel_for(0, heads * nb, 16, [&](int64_t begin, int64_t end) {
    for (int64_t z = begin; z < end; ++z) {
      float* bins = o + z * nb;
      float total = 0.f;
      for (int64_t j = 0; j < nb; ++j) total += bins[j];
      for (int64_t j = 0; j < nb; ++j) bins[j] /= total;
    }
  });
}

// q (N, H D) and k (N, KVH D) rows of one fresh prompt (unit inner stride, any row stride), bf16 or fp32, head
// size a multiple of 64 -> (H, nb, nb) fp32: each query tile's share of attention per key tile, rows summing to 1.
at::Tensor antidiagonal_scores(const at::Tensor& q, const at::Tensor& k, int64_t heads, int64_t kv_heads, double scale,
                               int64_t stride, int64_t tile) {
  const auto dtype = q.scalar_type();
  TORCH_CHECK((dtype == at::kBFloat16 || dtype == at::kFloat) && k.scalar_type() == dtype, "antidiagonal_scores: bf16 or fp32");
  TORCH_CHECK(q.dim() == 2 && k.dim() == 2 && q.stride(1) == 1 && k.stride(1) == 1 && q.size(0) == k.size(0) && q.size(0) > 0,
              "antidiagonal_scores: q (N, H D) and k (N, KVH D) rows with unit inner stride");
  TORCH_CHECK(heads % kv_heads == 0 && q.size(1) % heads == 0 && k.size(1) == kv_heads * (q.size(1) / heads) &&
              (q.size(1) / heads) % kPack == 0, "antidiagonal_scores: heads a multiple of KV heads, head size of 64s");
  TORCH_CHECK(stride > 0 && tile % stride == 0 && (tile / stride) > 0 && kQRows % (tile / stride) == 0,
              "antidiagonal_scores: a tile of stride-rows dividing 64");
  const int64_t nb = (q.size(0) + tile - 1) / tile;
  at::Tensor out = at::zeros({heads, nb, nb}, q.options().dtype(at::kFloat));
  if (dtype == at::kBFloat16)
    antidiagonal_scores_impl<c10::BFloat16>(q, k, heads, kv_heads, scale, stride, tile, out);
  else
    antidiagonal_scores_impl<float>(q, k, heads, kv_heads, scale, stride, tile, out);
  return out;
}

// select_blocks (the textbook's) on scores (H, nb, nb) fp32: per head and query block i, its counts[i] causal key
// blocks that scored highest, the sink (0) and the diagonal (i) first, ties to the lower block (a stable sort)
// -> (H, nb, nb) uint8, 1 where a tile is kept
at::Tensor select_tiles(const at::Tensor& scores, const at::Tensor& counts) {
  TORCH_CHECK(scores.scalar_type() == at::kFloat && scores.is_contiguous() && scores.dim() == 3 && scores.size(1) == scores.size(2),
              "select_tiles: scores (H, nb, nb) contiguous fp32");
  const int64_t heads = scores.size(0), nb = scores.size(1);
  TORCH_CHECK(counts.scalar_type() == at::kLong && counts.is_contiguous() && counts.numel() == nb, "select_tiles: counts (nb,) int64");
  at::Tensor kept = at::zeros({heads, nb, nb}, scores.options().dtype(at::kByte));
  const float* s = scores.data_ptr<float>();
  const int64_t* count = counts.data_ptr<int64_t>();
  uint8_t* out = kept.data_ptr<uint8_t>();
  at::parallel_for(0, heads * nb, 64, [&](int64_t begin, int64_t end) {
    std::vector<int64_t> order;
    for (int64_t z = begin; z < end; ++z) {
      const int64_t i = z % nb;
      const float* row = s + z * nb;
      order.resize(i + 1);
      std::iota(order.begin(), order.end(), 0);
      auto rank = [&](int64_t j) { return j == 0 || j == i ? std::numeric_limits<float>::infinity() : row[j]; };
      std::stable_sort(order.begin(), order.end(), [&](int64_t x, int64_t y) { return rank(x) > rank(y); });
      for (int64_t r = 0; r < std::min(count[i], i + 1); ++r) out[z * nb + order[r]] = 1;
    }
  });
  return kept;
}
