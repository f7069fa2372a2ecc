// Linear layers on oneDNN's matmul primitive, the way vLLM's CPU backend runs them
// (csrc/cpu/dnnl_helper.cpp there): kernels/onednn_linear.py builds, loads and checks it.
//
// torch's packed linear (torch.ops.mkldnn._linear_pointwise) describes, looks up and runs a
// oneDNN primitive at every call. Here the weight is reordered once into the blocked layout
// oneDNN's matmul picks for it, and the primitive made for each row count M is kept, so a call
// is one execute. That matters most where a matmul is short: a decode step (M = 1) and the few
// rows of a prefix-cache hit or a chunk.
//
// It links Debian's oneDNN (libdnnl-dev, OpenMP threading: it runs on torch's OpenMP threads)
// and is compiled against that library's own headers, not the newer ones torch ships.
#include <torch/extension.h>

#include <oneapi/dnnl/dnnl.hpp>
#include <oneapi/dnnl/dnnl_version.h>

#include <list>
#include <mutex>
#include <unordered_map>

namespace {

dnnl::engine& cpu_engine() {
  static dnnl::engine engine(dnnl::engine::kind::cpu, 0);
  return engine;
}

dnnl::stream& thread_stream() {  // a stream is not thread-safe: each calling thread has its own
  thread_local dnnl::stream stream(cpu_engine());
  return stream;
}

dnnl::memory::data_type dnnl_type(at::ScalarType type) {
  if (type == at::kFloat) return dnnl::memory::data_type::f32;
  if (type == at::kBFloat16) return dnnl::memory::data_type::bf16;
  TORCH_CHECK(false, "onednn_linear: float32 or bfloat16 only, not ", type);
}

// row counts whose primitive each Linear keeps (least recently used dropped). A primitive holds
// its own JIT code: 121 linears x 16 row counts of the bundled model measured +454 MiB, so 8 bound
// it to about half that, and hold every row count of a bench round (1, 33, 64, 512, 1025, 2048).
// Making one costs about 0.8 ms (a step at a new row count: ~100 ms more, once). The library's own
// global cache would keep 1,024 more primitives, so it is turned off (module init, below).
constexpr size_t kCachedShapes = 8;

// Where oneDNN has no brgemm for the CPU (oneDNN 2.6 on AVX2) it runs its JIT gemm, which blocks
// a wide matmul badly at 2-256 rows: on AVX2 code, gate|up (3072 x 576) ran at 78-88 GFLOP/s there
// whole and at 122-139 in column blocks of 768, as did 1536-, 6144- and 4096 x 2048-wide weights.
// So a weight wider than kWideJit runs in blocks of kJitBlock columns on that kernel, one
// primitive a block writing its columns of the output; one row (a decode) still runs whole, which
// was faster there. The weight stays in its (N, K) layout, so both read the same buffer.
constexpr int64_t kJitBlock = 768;
constexpr int64_t kWideJit = 1024;

class Linear {
 public:
  // weight (N, K), the layout of nn.Linear's; bias (N,) or None
  Linear(const at::Tensor& weight, const c10::optional<at::Tensor>& bias) : type_(weight.scalar_type()) {
    TORCH_CHECK(weight.dim() == 2 && weight.device().is_cpu(), "onednn_linear: a 2-D CPU weight");
    n_ = weight.size(0);
    k_ = weight.size(1);
    const auto dt = dnnl_type(type_);
    // the layout the matmul wants for its weights, asked of a primitive for 32 rows (vLLM asks the same)
    const dnnl::memory::desc any({k_, n_}, dt, dnnl::memory::format_tag::any);
    const auto probe = make_desc(32, any, {0, n_});
    const std::string kernel = probe.impl_info_str();
    blocked_ = kernel.rfind("gemm", 0) == 0 && n_ > kWideJit;
    weight_desc_ = blocked_ ? dnnl::memory::desc({k_, n_}, dt, dnnl::memory::format_tag::ba) : probe.weights_desc();
    const at::Tensor plain = weight.contiguous();
    dnnl::memory source({{k_, n_}, dt, dnnl::memory::format_tag::ba}, cpu_engine(), plain.data_ptr());  // (K, N) view of (N, K)
    packed_ = dnnl::memory(weight_desc_, cpu_engine());
    dnnl::reorder(source, packed_).execute(thread_stream(), source, packed_);
    thread_stream().wait();
    if (bias.has_value() && bias->defined()) bias_ = bias->contiguous().to(type_);
  }

  at::Tensor forward(const at::Tensor& x) {
    TORCH_CHECK(x.scalar_type() == type_ && x.size(-1) == k_ && x.device().is_cpu(), "onednn_linear: x (..., ", k_, ") of the weight's dtype");
    const at::Tensor rows = x.reshape({-1, k_}).contiguous();
    const int64_t m = rows.size(0);
    std::vector<int64_t> shape(x.sizes().begin(), x.sizes().end());
    shape.back() = n_;
    at::Tensor out = at::empty({m, n_}, x.options());
    if (m > 0) {
      const Prepared prepared = primitive(m);
      const auto dt = dnnl_type(type_);
      const size_t item = out.element_size();
      dnnl::memory src({{m, k_}, dt, dnnl::memory::format_tag::ab}, cpu_engine(), rows.data_ptr());
      auto* weights = static_cast<uint8_t*>(packed_.get_data_handle());
      auto* destination = static_cast<uint8_t*>(out.data_ptr());
      // the scratchpad is the caller's (this thread's): with the library's own, two threads running
      // one primitive at once would share it (the app's sessions share the model's linears)
      thread_local std::vector<uint8_t> scratch;
      for (const auto& block : prepared.blocks) {
        if (scratch.size() < block.scratchpad.get_size()) scratch.resize(block.scratchpad.get_size());
        dnnl::memory scratchpad(block.scratchpad, cpu_engine(), scratch.data());
        // a block of columns [start, start + width): its rows of the (N, K) weight, its columns of the output
        dnnl::memory weight(block.weights, cpu_engine(), blocked_ ? weights + block.start * k_ * item : weights);
        dnnl::memory dst(block.dst, cpu_engine(), destination + block.start * item);
        block.matmul.execute(thread_stream(), {{DNNL_ARG_SRC, src}, {DNNL_ARG_WEIGHTS, weight}, {DNNL_ARG_DST, dst}, {DNNL_ARG_SCRATCHPAD, scratchpad}});
      }
      thread_stream().wait();
      if (bias_.defined()) out.add_(bias_);
    }
    return out.view(shape);
  }

  int64_t out_features() const { return n_; }
  int64_t in_features() const { return k_; }
  std::string implementation(int64_t m) {
    const auto columns = blocks_of(m);
    const std::string kernel = make_desc(m, weights_of(columns.front()), columns.front()).impl_info_str();
    return columns.size() == 1 ? kernel : kernel + ", in " + std::to_string(columns.size()) + " blocks of " + std::to_string(kJitBlock) + " columns";
  }

 private:
  using Columns = std::pair<int64_t, int64_t>;  // (start, width)

  std::vector<Columns> blocks_of(int64_t m) const {
    if (!blocked_ || m == 1) return {{0, n_}};
    std::vector<Columns> columns;
    for (int64_t start = 0; start < n_; start += kJitBlock) columns.emplace_back(start, std::min(kJitBlock, n_ - start));
    return columns;
  }

  dnnl::memory::desc weights_of(const Columns& columns) const {  // blocked: rows of the (N, K) weight, seen as (K, width)
    return blocked_ ? dnnl::memory::desc({k_, columns.second}, dnnl_type(type_), {1, k_}) : weight_desc_;
  }

  dnnl::matmul::primitive_desc make_desc(int64_t m, const dnnl::memory::desc& weights, const Columns& columns) const {
    const auto dt = dnnl_type(type_);
    const dnnl::memory::desc src({m, k_}, dt, dnnl::memory::format_tag::ab);
    const dnnl::memory::desc dst({m, columns.second}, dt, {n_, 1});  // its columns of the (m, N) output
    dnnl::primitive_attr attr;
    attr.set_scratchpad_mode(dnnl::scratchpad_mode::user);
#if DNNL_VERSION_MAJOR >= 3
    return dnnl::matmul::primitive_desc(cpu_engine(), src, weights, dst, attr);
#else
    return dnnl::matmul::primitive_desc(dnnl::matmul::desc(src, weights, dst), attr, cpu_engine());
#endif
  }

  struct Block {
    int64_t start;
    dnnl::matmul matmul;
    dnnl::memory::desc weights, dst, scratchpad;
  };
  struct Prepared {
    std::vector<Block> blocks;  // one, or the column blocks of a wide weight on the JIT gemm
  };

  Prepared primitive(int64_t m) {  // handles (shared), so another thread's eviction can't free them under us
    std::lock_guard<std::mutex> guard(lock_);  // the app's sessions share a model
    auto found = primitives_.find(m);
    if (found != primitives_.end()) {
      order_.splice(order_.begin(), order_, found->second.second);
      return found->second.first;
    }
    if (primitives_.size() >= kCachedShapes) {
      primitives_.erase(order_.back());
      order_.pop_back();
    }
    order_.push_front(m);
    Prepared prepared;
    for (const auto& columns : blocks_of(m)) {
      const auto weights = weights_of(columns);
      const auto desc = make_desc(m, weights, columns);
      prepared.blocks.push_back(Block{columns.first, dnnl::matmul(desc), weights, desc.dst_desc(), desc.scratchpad_desc()});
    }
    return primitives_.emplace(m, std::make_pair(std::move(prepared), order_.begin())).first->second.first;
  }

  at::ScalarType type_;
  int64_t n_ = 0, k_ = 0;
  bool blocked_ = false;  // a wide weight on oneDNN's JIT gemm: column blocks of kJitBlock
  dnnl::memory::desc weight_desc_;
  dnnl::memory packed_;
  at::Tensor bias_;
  std::mutex lock_;
  std::list<int64_t> order_;  // most recently used first
  std::unordered_map<int64_t, std::pair<Prepared, std::list<int64_t>::iterator>> primitives_;
};

std::string version() {
  const auto* v = dnnl_version();
  return std::to_string(v->major) + "." + std::to_string(v->minor) + "." + std::to_string(v->patch);
}

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  dnnl::set_primitive_cache_capacity(0);  // this library's copy only; torch's oneDNN keeps its own
  pybind11::class_<Linear>(m, "Linear")
      .def(pybind11::init<const at::Tensor&, const c10::optional<at::Tensor>&>(), pybind11::arg("weight"), pybind11::arg("bias") = pybind11::none())
      .def("__call__", &Linear::forward, pybind11::call_guard<pybind11::gil_scoped_release>())
      .def_property_readonly("out_features", &Linear::out_features)
      .def_property_readonly("in_features", &Linear::in_features)
      .def("implementation", &Linear::implementation);
  m.def("version", &version);
}
