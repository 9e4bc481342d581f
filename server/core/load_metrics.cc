#include "server/core/load_metrics.h"

namespace cake {

LoadMetrics::Series& LoadMetrics::For(std::string_view tenant, std::string_view model) {
  MutexLock lock(&mu_);
  auto key = std::make_pair(std::string(tenant), std::string(model));
  auto it = series_.find(key);
  if (it != series_.end()) return *it->second;
  if (series_.size() >= max_series_) return overflow_;
  return *series_.emplace(std::move(key), std::make_unique<Series>()).first->second;
}

void LoadMetrics::ForEach(
    const std::function<void(const std::string& tenant, const std::string& model, const Series&)>& fn) const {
  MutexLock lock(&mu_);
  for (const auto& [labels, series] : series_) fn(labels.first, labels.second, *series);
  static const std::string kOther = "other";
  if (series_.size() >= max_series_) fn(kOther, kOther, overflow_);
}

void RpcMetrics::Count(std::string_view method, int code) {
  if (code < 0 || code >= static_cast<int>(kCodes)) code = 2;  // UNKNOWN
  PerCode* counts = nullptr;
  {
    MutexLock lock(&mu_);
    auto it = methods_.find(method);
    if (it == methods_.end()) {
      it = methods_
               .emplace(methods_.size() < kMaxMethods ? std::string(method) : std::string("other"),
                        std::make_unique<PerCode>())
               .first;
    }
    counts = it->second.get();
  }
  (*counts)[code].fetch_add(1, std::memory_order_relaxed);
}

void RpcMetrics::ForEach(const std::function<void(const std::string& method, int code, uint64_t count)>& fn) const {
  MutexLock lock(&mu_);
  for (const auto& [method, counts] : methods_) {
    for (size_t code = 0; code < kCodes; ++code) {
      const uint64_t n = (*counts)[code].load(std::memory_order_relaxed);
      if (n > 0) fn(method, static_cast<int>(code), n);
    }
  }
}

}  // namespace cake
