// The one place that knows which concrete backends this build contains.
#include <mutex>
#include <utility>

#include "hybridtb/backend.h"
#include "hybridtb/per_layer.h"
#include "hybridtb/reference/reference_backend.h"
#ifdef HYBRIDTB_HAVE_CUDA
#include "hybridtb/cuda/cuda_backend.h"
#endif

namespace hybridtb {

void register_builtin_backends() {
  static std::once_flag once;
  std::call_once(once, [] {
    auto& registry = BackendRegistry::instance();
    registry.add("reference", "CPU ground truth: plain C++ on Eigen, float64 arithmetic, deterministic",
                 [](const BackendSettings& settings) { return reference::make_reference_backend(settings); });
#ifdef HYBRIDTB_HAVE_CUDA
    cuda::register_cuda_backend(registry);
#endif
  });
}

std::unique_ptr<Backend> create_backend(const std::string& name, const BackendSettings& settings) {
  register_builtin_backends();
  return BackendRegistry::instance().create(name, settings);
}

std::unique_ptr<PerLayerBackend> create_per_layer_backend(const std::string& name, const PerLayerSettings& settings) {
  // One model: the linear layers' backend shares the attention backend's device resources.
  std::unique_ptr<Backend> attention = create_backend(name, settings.attention);
  std::unique_ptr<Backend> linear = attention->create_sibling(settings.linear);
  return std::make_unique<PerLayerBackend>(std::move(attention), std::move(linear), settings);
}

}  // namespace hybridtb
