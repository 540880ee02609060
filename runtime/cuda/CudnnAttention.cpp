// CudnnAttention.cpp - CudnnAttention.h on cuDNN's SDPA graphs (the
// cudnn-frontend's Graph::sdpa and Graph::sdpa_backward). Compiled into the
// CUDA backend where cuDNN's and the frontend's headers are found
// (runtime/CMakeLists.txt); otherwise CudnnAttentionAbsent.cpp stands in.
//
// The frontend loads cuDNN when the first handle is made
// (NV_CUDNN_FRONTEND_USE_DYNAMIC_LOADING): parax-run needs no libcudnn to
// start, and where none is found the attention runs parax's own kernels.
#include "CudnnAttention.h"

#include <cudnn_frontend.h>

#include <cstdlib>
#include <dlfcn.h>
#include <exception>
#include <unordered_map>

namespace fe = cudnn_frontend;

// The library the frontend's calls resolve in (its dynamic-loading mode
// leaves opening it to the program).
namespace cudnn_frontend {
void *cudnn_dlhandle = nullptr;
} // namespace cudnn_frontend

namespace parax::runtime {

namespace {

// Opens cuDNN 9 once ("" when it is open, else why not). The frontend
// looks for the CUDA runtime by name too: it is told the one this build
// links (several majors may be on the library path).
std::string loadCudnn() {
  static std::string error = [] {
    std::string cudart = "libcudart.so." + std::to_string(CUDART_VERSION / 1000);
    setenv("CUDNN_FRONTEND_CUDART_LIB_NAME", cudart.c_str(), /*overwrite=*/0);
    for (const char *name : {"libcudnn.so.9", "libcudnn.so"})
      if ((fe::cudnn_dlhandle = dlopen(name, RTLD_NOW | RTLD_GLOBAL))) return std::string();
    const char *why = dlerror();
    return std::string("cuDNN 9 not found (") + (why ? why : "libcudnn.so.9") + ")";
  }();
  return error;
}

// The tensors' ids in the graphs' variant packs.
enum Uid : int64_t { kQ = 1, kK, kV, kY, kStats, kDy, kDq, kDk, kDv };

Status failed(const char *what, fe::error_object e) {
  return Status::error(std::string("cuDNN SDPA ") + what + ": " + e.get_message());
}

// [B, S, H, D] row-major as cuDNN's (b, h, s, d) dims and strides.
std::vector<int64_t> dims(int64_t b, int64_t s, int64_t h, int64_t d) { return {b, h, s, d}; }
std::vector<int64_t> strides(int64_t s, int64_t h, int64_t d) { return {s * h * d, d, h * d, 1}; }

std::shared_ptr<fe::graph::Tensor_attributes> input(fe::graph::Graph &g, const char *name, Uid uid, int64_t b,
                                                    int64_t s, int64_t h, int64_t d) {
  return g.tensor(fe::graph::Tensor_attributes().set_name(name).set_uid(uid).set_dim(dims(b, s, h, d)).set_stride(
      strides(s, h, d)));
}

void output(const std::shared_ptr<fe::graph::Tensor_attributes> &t, Uid uid, int64_t b, int64_t s, int64_t h,
            int64_t d) {
  t->set_output(true).set_uid(uid).set_dim(dims(b, s, h, d)).set_stride(strides(s, h, d));
}

fe::graph::Graph &typed(fe::graph::Graph &g, bool bf16) {
  return g.set_io_data_type(bf16 ? fe::DataType_t::BFLOAT16 : fe::DataType_t::HALF)
      .set_intermediate_data_type(fe::DataType_t::FLOAT)
      .set_compute_data_type(fe::DataType_t::FLOAT);
}

template <typename Attributes> Attributes &masked(Attributes &a, const CudnnAttentionShape &shape) {
  a.set_attn_scale(shape.scale);
  if (shape.causal) {
    if (shape.S == shape.T)
      a.set_causal_mask(true);
    else
      a.set_causal_mask_bottom_right(true); // the queries are the last S positions
    // A sliding window: cuDNN keeps key column c for query row r where
    // c + left bound > r (its diagonal band mask), parax's p - t < window.
    if (shape.window > 0)
      a.set_diagonal_band_left_bound(static_cast<int>(shape.window));
  }
  return a;
}

Status plan(fe::graph::Graph &g, cudnnHandle_t handle, int64_t &workspace) {
  fe::error_object e = g.build(handle, {fe::HeurMode_t::A});
  if (!e.is_good()) return failed("build", e);
  int64_t bytes = 0;
  e = g.get_workspace_size(bytes);
  if (!e.is_good()) return failed("workspace", e);
  workspace = std::max(workspace, bytes);
  return Status::ok();
}

} // namespace

struct CudnnAttention::Graphs {
  CudnnAttentionShape shape;
  fe::graph::Graph forward, backward;
  bool hasBackward = false;
  int64_t workspace = 0;
};

CudnnAttention::CudnnAttention(std::unique_ptr<Graphs> graphs) : graphs_(std::move(graphs)) {}
CudnnAttention::~CudnnAttention() = default;

std::string CudnnAttention::version() {
  if (!loadCudnn().empty()) return "";
  try {
    size_t v = fe::detail::get_backend_version(); // major * 10000 + minor * 100 + patch since cuDNN 9
    return std::to_string(v / 10000) + "." + std::to_string(v / 100 % 100) + "." + std::to_string(v % 100);
  } catch (const std::exception &) {
    return "";
  }
}

StatusOr<void *> CudnnAttention::createHandle(void *stream) {
  std::string missing = loadCudnn();
  if (!missing.empty()) return Status::error(missing);
  try {
    cudnnHandle_t handle = nullptr;
    cudnnStatus_t st = fe::detail::create_handle(&handle);
    if (st != CUDNN_STATUS_SUCCESS)
      return Status::error(std::string("cudnnCreate: ") + fe::detail::get_error_string(st));
    st = fe::detail::set_stream(handle, static_cast<cudaStream_t>(stream));
    if (st != CUDNN_STATUS_SUCCESS) {
      fe::detail::destroy_handle(handle);
      return Status::error(std::string("cudnnSetStream: ") + fe::detail::get_error_string(st));
    }
    return static_cast<void *>(handle);
  } catch (const std::exception &e) {
    return Status::error(std::string("cuDNN: ") + e.what());
  }
}

StatusOr<std::string> CudnnAttention::deviceProperties(void *handle) {
  try {
    fe::DeviceProperties properties;
    properties.set_handle(static_cast<cudnnHandle_t>(handle));
    fe::error_object e = properties.build();
    if (!e.is_good()) return failed("device properties", e);
    std::vector<uint8_t> json;
    e = properties.serialize(json);
    if (!e.is_good()) return failed("device properties", e);
    return std::string(json.begin(), json.end());
  } catch (const std::exception &e) {
    return Status::error(std::string("cuDNN device properties: ") + e.what());
  }
}

void CudnnAttention::destroyHandle(void *handle) {
  if (!handle) return;
  try {
    fe::detail::destroy_handle(static_cast<cudnnHandle_t>(handle));
  } catch (const std::exception &) {
  }
}

StatusOr<std::unique_ptr<CudnnAttention>> CudnnAttention::create(void *handle, const CudnnAttentionShape &shape,
                                                                  bool backward) {
  try {
    return build(static_cast<cudnnHandle_t>(handle), shape, backward);
  } catch (const std::exception &e) { // (the frontend's dynamic loading throws)
    return Status::error(std::string("cuDNN SDPA: ") + e.what());
  }
}

StatusOr<std::unique_ptr<CudnnAttention>> CudnnAttention::build(cudnnHandle_t handle, const CudnnAttentionShape &shape,
                                                                 bool backward) {
  auto graphs = std::make_unique<Graphs>();
  graphs->shape = shape;
  graphs->hasBackward = backward;
  const int64_t B = shape.B, S = shape.S, H = shape.H, D = shape.D, T = shape.T, KH = shape.KH, DV = shape.DV;
  {
    fe::graph::Graph &g = typed(graphs->forward, shape.bf16);
    auto q = input(g, "q", kQ, B, S, H, D);
    auto k = input(g, "k", kK, B, T, KH, D);
    auto v = input(g, "v", kV, B, T, KH, DV);
    auto attributes = fe::graph::SDPA_attributes().set_name("sdpa").set_generate_stats(backward);
    auto [y, stats] = g.sdpa(q, k, v, masked(attributes, shape));
    output(y, kY, B, S, H, DV);
    if (backward) stats->set_output(true).set_uid(kStats).set_data_type(fe::DataType_t::FLOAT);
    Status st = plan(g, handle, graphs->workspace);
    if (!st.isOk()) return st;
  }
  if (backward) {
    fe::graph::Graph &g = typed(graphs->backward, shape.bf16);
    auto q = input(g, "q", kQ, B, S, H, D);
    auto k = input(g, "k", kK, B, T, KH, D);
    auto v = input(g, "v", kV, B, T, KH, DV);
    auto y = input(g, "y", kY, B, S, H, DV);
    auto dy = input(g, "dy", kDy, B, S, H, DV);
    auto stats = g.tensor(fe::graph::Tensor_attributes()
                              .set_name("stats")
                              .set_uid(kStats)
                              .set_dim({B, H, S, 1})
                              .set_stride({H * S, S, 1, 1})
                              .set_data_type(fe::DataType_t::FLOAT));
    auto attributes = fe::graph::SDPA_backward_attributes().set_name("sdpa_backward");
    auto [dq, dk, dv] = g.sdpa_backward(q, k, v, y, dy, stats, masked(attributes, shape));
    output(dq, kDq, B, S, H, D);
    output(dk, kDk, B, T, KH, D);
    output(dv, kDv, B, T, KH, DV);
    Status st = plan(g, handle, graphs->workspace);
    if (!st.isOk()) return st;
  }
  return std::unique_ptr<CudnnAttention>(new CudnnAttention(std::move(graphs)));
}

int64_t CudnnAttention::workspaceBytes() const { return graphs_->workspace; }

int64_t CudnnAttention::outputBytes() const {
  const CudnnAttentionShape &s = graphs_->shape;
  return graphs_->hasBackward ? s.B * s.S * s.H * s.DV * 2 : 0;
}

int64_t CudnnAttention::statsBytes() const {
  const CudnnAttentionShape &s = graphs_->shape;
  return graphs_->hasBackward ? s.B * s.H * s.S * 4 : 0;
}

Status CudnnAttention::forward(void *handle, const void *q, const void *k, const void *v, void *y, float *stats,
                               void *workspace) const {
  if (graphs_->hasBackward && !stats)
    return Status::error("cuDNN SDPA forward: a graph built for the backward writes its statistics");
  std::unordered_map<int64_t, void *> pack = {
      {kQ, const_cast<void *>(q)}, {kK, const_cast<void *>(k)}, {kV, const_cast<void *>(v)}, {kY, y}};
  if (graphs_->hasBackward) pack[kStats] = stats;
  try {
    fe::error_object e = graphs_->forward.execute(static_cast<cudnnHandle_t>(handle), pack, workspace);
    return e.is_good() ? Status::ok() : failed("forward", e);
  } catch (const std::exception &e) {
    return Status::error(std::string("cuDNN SDPA forward: ") + e.what());
  }
}

Status CudnnAttention::backward(void *handle, const void *q, const void *k, const void *v, const void *y,
                                const float *stats, const void *dy, void *dq, void *dk, void *dv,
                                void *workspace) const {
  if (!graphs_->hasBackward) return Status::error("cuDNN SDPA: no backward graph was built");
  std::unordered_map<int64_t, void *> pack = {
      {kQ, const_cast<void *>(q)},      {kK, const_cast<void *>(k)},  {kV, const_cast<void *>(v)},
      {kY, const_cast<void *>(y)},      {kStats, const_cast<float *>(stats)},
      {kDy, const_cast<void *>(dy)},    {kDq, dq},                    {kDk, dk},
      {kDv, dv}};
  try {
    fe::error_object e = graphs_->backward.execute(static_cast<cudnnHandle_t>(handle), pack, workspace);
    return e.is_good() ? Status::ok() : failed("backward", e);
  } catch (const std::exception &e) {
    return Status::error(std::string("cuDNN SDPA backward: ") + e.what());
  }
}

} // namespace parax::runtime
