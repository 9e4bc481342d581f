// The metrics a scrape reads: the histogram's buckets, the capped (tenant, model) series, responses by code.
#include "server/core/load_metrics.h"

#include <catch2/catch.hpp>
#include <thread>
#include <vector>

#include "server/core/counters.h"

namespace cake {

TEST_CASE("metrics: a histogram counts each observation in the first bucket that holds it", "[metrics]") {
  const double bounds[] = {1.0, 2.0, 5.0};
  Histogram h(bounds);
  for (double v : {0.5, 1.0, 1.5, 4.0, 9.0, 9.0}) h.Observe(v);
  const Histogram::Snapshot s = h.Read();
  CHECK(s.counts == std::vector<uint64_t>{2, 1, 1, 2});  // <=1, <=2, <=5, above
  CHECK(s.count == 6);
  CHECK(s.sum == Approx(25.0));
}

TEST_CASE("metrics: concurrent observations are all counted", "[metrics]") {
  Histogram h(Histogram::LatencyBounds());
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&h] {
      for (int i = 0; i < 10000; ++i) h.Observe(0.001);
    });
  }
  for (auto& t : threads) t.join();
  CHECK(h.Read().count == 40000);
  CHECK(h.Read().sum == Approx(40.0));
}

TEST_CASE("metrics: (tenant, model) series are capped, the rest share one", "[metrics]") {
  LoadMetrics metrics(2);
  LoadMetrics::Series& a = metrics.For("t", "a");
  CHECK(&metrics.For("t", "a") == &a);
  metrics.For("t", "b");
  LoadMetrics::Series& overflow = metrics.For("t", "c");
  CHECK(&metrics.For("u", "d") == &overflow);
  Bump(overflow.loads[static_cast<size_t>(Strategy::kCake)], 2);
  std::vector<std::pair<std::string, std::string>> seen;
  metrics.ForEach([&](const std::string& tenant, const std::string& model, const LoadMetrics::Series& s) {
    seen.emplace_back(tenant, model);
    if (model == "other") CHECK(s.loads[static_cast<size_t>(Strategy::kCake)].load() == 2);
  });
  CHECK(seen == std::vector<std::pair<std::string, std::string>>{{"t", "a"}, {"t", "b"}, {"other", "other"}});
}

TEST_CASE("metrics: responses are counted by method and code, within bounds", "[metrics]") {
  RpcMetrics rpcs;
  rpcs.Count("cake.v1.KvService/Lookup", 0);
  rpcs.Count("cake.v1.KvService/Lookup", 3);
  rpcs.Count("cake.v1.KvService/Lookup", 3);
  rpcs.Count("cake.v1.KvService/Lookup", 99);  // not a code: UNKNOWN
  for (int i = 0; i < 100; ++i) rpcs.Count("method-" + std::to_string(i), 0);
  uint64_t invalid = 0, unknown = 0;
  size_t methods = 0;
  rpcs.ForEach([&](const std::string& method, int code, uint64_t count) {
    if (method == "cake.v1.KvService/Lookup" && code == 3) invalid = count;
    if (method == "cake.v1.KvService/Lookup" && code == 2) unknown = count;
    if (code == 0) ++methods;
  });
  CHECK(invalid == 2);
  CHECK(unknown == 1);
  CHECK(methods <= 65);  // 64 names and "other"
}

}  // namespace cake
