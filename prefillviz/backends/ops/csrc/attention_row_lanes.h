// Attention with a task's query rows across the vector lanes, in fp32; included by engine_ops.cpp
// (inside its namespace: Vec, kW, kNegInf, Task, kKeyTile and to_float come from there).
//
// The scores of a tile of keys are kept transposed, S^T (keys, rows) = K Q^T: each FMA broadcasts
// one element of a key row, read from the paged cache as it lies, against kW query rows. So:
//   - K and V need no transposed tiles: no gather, no transpose (an fp32 cache is read in place);
//   - the online softmax's max and sum over keys are plain vector max and add down the keys,
//     with no horizontal reductions, and the causal mask is one compare per key and vector;
//   - P V is O^T (dim, rows) += V^T P^T, again one broadcast element of a V row per FMA.
// A bf16 cache's K and V rows of a tile are made fp32 first, once per task and tile (then read by
// each of its row vectors), so the arithmetic is fp32 in either dtype, P included. It needs rows
// to fill the lanes, so a decode's few rows (one token times G heads) keep the tile kernels.

constexpr int kNV = 3;                  // row vectors per micro-kernel (accumulators: kNV x kKB; 12 of AVX2's 16 registers)
constexpr int kKB = kW == 16 ? 8 : 4;   // keys (scores) or dimensions (P V) per micro-kernel

// query tokens per task: 32 where that still leaves each thread four tasks or more, else 16
inline int64_t lane_block(int64_t query_len, int64_t kv_heads) {
  return query_len / 32 * kv_heads >= 4 * at::get_num_threads() ? 32 : 16;
}

// S^T[k, rows] = K[k, :] . Q^T[:, rows] for KB keys and NV row vectors; q and s point at the first row vector
template <int NV, int KB>
inline void lane_scores(const float* const* keys, const float* qt, float* st, int64_t rp, int64_t dim) {
  Vec acc[KB][NV];
  for (int k = 0; k < KB; ++k)
    for (int c = 0; c < NV; ++c) acc[k][c] = Vec(0.f);
  for (int64_t d = 0; d < dim; ++d) {
    Vec qv[NV];
    for (int c = 0; c < NV; ++c) qv[c] = Vec::loadu(qt + d * rp + c * kW);
    for (int k = 0; k < KB; ++k) {
      const Vec kv(keys[k][d]);
      for (int c = 0; c < NV; ++c) acc[k][c] = at::vec::fmadd(kv, qv[c], acc[k][c]);
    }
  }
  for (int k = 0; k < KB; ++k)
    for (int c = 0; c < NV; ++c) acc[k][c].store(st + k * rp + c * kW);
}

// O^T[d0 .. d0 + KB, rows] = alpha O^T + V[:, d0 .. d0 + KB]^T P^T for NV row vectors over n keys
template <int NV, int KB>
inline void lane_pv(const float* pt, const float* alpha, const float* const* values, int64_t n, int64_t d0, float* ot, int64_t rp) {
  Vec acc[KB][NV];
  for (int c = 0; c < NV; ++c) {
    const Vec a = Vec::loadu(alpha + c * kW);
    for (int k = 0; k < KB; ++k) acc[k][c] = Vec::loadu(ot + k * rp + c * kW) * a;
  }
  for (int64_t j = 0; j < n; ++j) {
    Vec pv[NV];
    for (int c = 0; c < NV; ++c) pv[c] = Vec::loadu(pt + j * rp + c * kW);
    const float* v = values[j] + d0;
    for (int k = 0; k < KB; ++k) {
      const Vec vv(v[k]);
      for (int c = 0; c < NV; ++c) acc[k][c] = at::vec::fmadd(vv, pv[c], acc[k][c]);
    }
  }
  for (int k = 0; k < KB; ++k)
    for (int c = 0; c < NV; ++c) acc[k][c].store(ot + k * rp + c * kW);
}

template <int NV>
inline void lane_scores_tile(const float* const* keys, int64_t n, const float* qt, float* st, int64_t rp, int64_t dim) {
  int64_t k = 0;
  for (; k + kKB <= n; k += kKB) lane_scores<NV, kKB>(keys + k, qt, st + k * rp, rp, dim);
  for (; k < n; ++k) lane_scores<NV, 1>(keys + k, qt, st + k * rp, rp, dim);
}

template <int NV>
inline void lane_pv_tile(const float* pt, const float* alpha, const float* const* values, int64_t n, float* ot, int64_t rp, int64_t dim) {
  for (int64_t d0 = 0; d0 < dim; d0 += kKB) lane_pv<NV, kKB>(pt, alpha, values, n, d0, ot + d0 * rp, rp);
}

// NV = min(kNV, the row vectors left) at run time
template <typename F>
inline void by_row_vectors(int64_t nvec, F f) {
  for (int64_t c0 = 0; c0 < nvec; c0 += kNV) {
    const int64_t nv = std::min<int64_t>(kNV, nvec - c0);
    if (nv == 1) f(std::integral_constant<int, 1>(), c0);
    else if (nv == 2) f(std::integral_constant<int, 2>(), c0);
    else f(std::integral_constant<int, kNV>(), c0);
  }
}

// whether a request's tasks run here: enough rows (query tokens x G) to fill a vector
inline bool fills_lanes(int64_t query_len, int64_t groups) { return query_len * groups >= kW; }

template <typename T, int64_t dim>
void attention_task_lanes(const Task& task, const T* q, int64_t q_row, T* out, const int64_t* meta, int64_t num_heads,
                          int64_t kv_heads, float scale, std::vector<float>& scratch, const T* key_cache, const T* value_cache,
                          const int64_t* slots) {
  const int64_t groups = num_heads / kv_heads;
  const int64_t query_start = meta[task.request * 4 + 0], num_computed = meta[task.request * 4 + 2];
  const int64_t* context = slots + meta[task.request * 4 + 3];
  const int64_t rows = task.count * groups, rp = (rows + kW - 1) / kW * kW, nvec = rp / kW;
  constexpr bool convert = !std::is_same_v<T, float>;  // a bf16 cache: each tile's K and V rows in fp32 first
  scratch.assign(2 * dim * rp + kKeyTile * rp + 4 * rp + (convert ? 2 * kKeyTile * dim : 0), 0.f);
  float* qt = scratch.data();        // (dim, rp) scaled queries, transposed (zeros past the rows)
  float* ot = qt + dim * rp;         // (dim, rp) running output, transposed
  float* st = ot + dim * rp;         // (kKeyTile, rp) this tile's scores, then probabilities
  float* mx = st + kKeyTile * rp;    // (rp,) running max
  float* sum = mx + rp;              // (rp,) running sum
  float* alpha = sum + rp;           // (rp,) this tile's rescale of the running output
  float* pos = alpha + rp;           // (rp,) the last key each row sees (padding rows: all)
  float* kf = pos + rp;              // (kKeyTile, dim) a bf16 tile's keys, then its values, in fp32
  float* vf = kf + kKeyTile * dim;
  for (int64_t i = 0; i < rp; ++i) {
    if (i < rows) {
      const int64_t t = task.first + i / groups, head = task.kv_head * groups + i % groups;
      const T* src = q + (query_start + t) * q_row + head * dim;
      for (int64_t d = 0; d < dim; ++d) qt[d * rp + i] = static_cast<float>(src[d]) * scale;
      pos[i] = static_cast<float>(num_computed + t);
    } else {
      pos[i] = std::numeric_limits<float>::max();
    }
  }
  const int64_t row_stride = kv_heads * dim, first_position = num_computed + task.first;
  const float* keys[kKeyTile];
  const float* values[kKeyTile];
  for (int64_t j0 = 0; j0 < task.keys; j0 += kKeyTile) {
    const int64_t n = std::min<int64_t>(kKeyTile, task.keys - j0);
    for (int64_t j = 0; j < n; ++j) {
      const T* k = key_cache + context[j0 + j] * row_stride + task.kv_head * dim;
      const T* v = value_cache + context[j0 + j] * row_stride + task.kv_head * dim;
      if constexpr (convert) {
        to_float(k, kf + j * dim, dim);
        to_float(v, vf + j * dim, dim);
        keys[j] = kf + j * dim;
        values[j] = vf + j * dim;
      } else {
        keys[j] = k;
        values[j] = v;
      }
    }
    by_row_vectors(nvec, [&](auto nv, int64_t c0) { lane_scores_tile<decltype(nv)::value>(keys, n, qt + c0 * kW, st + c0 * kW, rp, dim); });
    const bool masked = j0 + n - 1 > first_position;  // some row of the task is before some key of the tile
    for (int64_t c = 0; c < nvec; ++c) {
      const Vec old_max = j0 == 0 ? Vec(kNegInf) : Vec::loadu(mx + c * kW);
      const Vec position = Vec::loadu(pos + c * kW);
      // two running maxima, so that each key's max waits on the key two before it, not on the last;
      // clamp_min is the plain vector max (a NaN score gives a NaN output either way)
      Vec max_even = old_max, max_odd = old_max;
      for (int64_t j = 0; j < n; ++j) {
        Vec s = Vec::loadu(st + j * rp + c * kW);
        if (masked) {
          s = Vec::blendv(Vec(kNegInf), s, Vec(static_cast<float>(j0 + j)) <= position);
          s.store(st + j * rp + c * kW);
        }
        if (j % 2 == 0) max_even = at::vec::clamp_min(max_even, s);
        else max_odd = at::vec::clamp_min(max_odd, s);
      }
      const Vec new_max = at::vec::clamp_min(max_even, max_odd);
      // every real row sees key 0, so after the first tile its max is finite; padding rows score 0
      const Vec a = j0 == 0 ? Vec(0.f) : (old_max - new_max).exp_u20();
      Vec total = Vec::loadu(sum + c * kW) * a;
      for (int64_t j = 0; j < n; ++j) {
        Vec p = (Vec::loadu(st + j * rp + c * kW) - new_max).exp_u20();
        if (masked) p = Vec::blendv(Vec(0.f), p, Vec(static_cast<float>(j0 + j)) <= position);  // exp_u20(-inf) need not be 0
        p.store(st + j * rp + c * kW);
        total = total + p;
      }
      total.store(sum + c * kW);
      new_max.store(mx + c * kW);
      a.store(alpha + c * kW);
    }
    by_row_vectors(nvec, [&](auto nv, int64_t c0) {
      lane_pv_tile<decltype(nv)::value>(st + c0 * kW, alpha + c0 * kW, values, n, ot + c0 * kW, rp, dim);
    });
  }
  for (int64_t i = 0; i < rows; ++i) {
    const int64_t t = task.first + i / groups, head = task.kv_head * groups + i % groups;
    T* dst = out + (query_start + t) * num_heads * dim + head * dim;
    const float inv = 1.f / sum[i];
    for (int64_t d = 0; d < dim; ++d) dst[d] = static_cast<T>(ot[d * rp + i] * inv);
  }
}
