// Checks caked's C++ lossy codec (storage/lossy_codec.cc) against the Python reference's test vectors: for each
// testvectors/<name>.input.bin, EncodeLossy then DecodeLossy must give testvectors/<name>.<int8|int4>.bin byte for
// byte. Built outside the repository's build tree (see README.md, "C++ check"):
//   g++ -std=c++20 -O2 -I/work/main check_cpp_codec.cc /work/main/storage/lossy_codec.cc -o /tmp/check_cpp_codec \
//       -labsl_strings -labsl_status -labsl_cord ...   (whatever the local abseil needs)
//   /tmp/check_cpp_codec testvectors
// or, to decode(encode()) a whole chunk file for a comparison with kv_codec.py (compare_cpp_on_real_kv.py):
//   /tmp/check_cpp_codec --roundtrip IN.bin bf16|fp16|fp32 LAYERS KV_HEADS HEAD_DIM TOKENS int8|int4 OUT.bin
#include <cstdio>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "storage/lossy_codec.h"

namespace cake {
// keys/namespace.cc's, copied so that the check links without the rest of the daemon.
uint32_t DTypeBytes(DType dtype) {
  return dtype == DType::kFp32 ? 4 : dtype == DType::kFp8 || dtype == DType::kInt8 ? 1 : 2;
}
}  // namespace cake

static std::vector<std::byte> Read(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::vector<char> c((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  std::vector<std::byte> out(c.size());
  for (size_t i = 0; i < c.size(); ++i) out[i] = static_cast<std::byte>(c[i]);
  return out;
}

int main(int argc, char** argv) {
  if (argc == 10 && std::string(argv[1]) == "--roundtrip") {
    const std::string d = argv[3];
    cake::LossyFormat f;
    f.dtype = d == "fp32" ? cake::DType::kFp32 : d == "fp16" ? cake::DType::kFp16 : cake::DType::kBf16;
    f.layers = std::stoul(argv[4]);
    f.kv_heads = std::stoul(argv[5]);
    f.head_dim = std::stoul(argv[6]);
    f.tokens = std::stoul(argv[7]);
    f.precision = std::string(argv[8]) == "int8" ? cake::StoredPrecision::kInt8 : cake::StoredPrecision::kInt4;
    const auto input = Read(argv[2]);
    const auto encoded = cake::EncodeLossy(f, input);
    std::vector<std::byte> decoded(input.size());
    const absl::Status st = cake::DecodeLossy(encoded, decoded);
    if (!st.ok() || encoded.empty()) {
      std::fprintf(stderr, "failed: %s\n", st.ToString().c_str());
      return 1;
    }
    std::ofstream(argv[9], std::ios::binary).write(reinterpret_cast<const char*>(decoded.data()), decoded.size());
    return 0;
  }
  const std::string dir = argc > 1 ? argv[1] : "testvectors";
  struct V {
    const char* name;
    cake::DType dtype;
  };
  const V vectors[] = {{"random-bf16", cake::DType::kBf16},
                       {"random-fp16", cake::DType::kFp16},
                       {"random-fp32", cake::DType::kFp32},
                       {"edge-bf16", cake::DType::kBf16}};
  int passed = 0, failed = 0;
  for (const V& v : vectors) {
    const auto input = Read(dir + "/" + v.name + ".input.bin");
    for (auto [codec, precision] :
         {std::pair{"int8", cake::StoredPrecision::kInt8}, std::pair{"int4", cake::StoredPrecision::kInt4}}) {
      const auto expected = Read(dir + "/" + v.name + "." + codec + ".bin");
      cake::LossyFormat f;
      f.precision = precision;
      f.dtype = v.dtype;
      f.layers = 2;
      f.kv_heads = 2;
      f.head_dim = 8;
      f.tokens = 4;
      const auto encoded = cake::EncodeLossy(f, input);
      std::vector<std::byte> decoded(input.size());
      const absl::Status st = cake::DecodeLossy(encoded, decoded);
      size_t diff = 0;
      for (size_t i = 0; i < decoded.size() && i < expected.size(); ++i) diff += decoded[i] != expected[i];
      const bool ok = st.ok() && !encoded.empty() && expected.size() == input.size() && diff == 0;
      std::printf("%-12s %s: %s (encoded %zu bytes, %zu of %zu bytes differ)%s\n", v.name, codec, ok ? "ok" : "FAIL",
                  encoded.size(), diff, decoded.size(), st.ok() ? "" : (" " + st.ToString()).c_str());
      (ok ? passed : failed)++;
    }
  }
  std::printf("%d passed, %d failed\n", passed, failed);
  return failed ? 1 : 0;
}
