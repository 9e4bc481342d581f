// The lossy codecs (storage/lossy_codec.h): int8 and int4 with one scale per (layer, K/V, token, head) group, for
// bf16, fp16 and fp32; what they lose is bounded by half a quantization step, and forged encodings are refused
// without a byte written outside the destination.
#include "storage/lossy_codec.h"

#include <catch2/catch.hpp>
#include <cmath>
#include <cstring>
#include <fstream>
#include <iterator>
#include <limits>
#include <string>
#include <vector>

#include "tests/storage/tier_test_util.h"

namespace cake {
namespace {

LossyFormat SmallFormat(StoredPrecision precision, DType dtype) {
  return LossyFormat{precision, dtype, /*layers=*/3, /*kv_heads=*/2, /*head_dim=*/64, /*tokens=*/16};
}

// Values of `dtype` with a different magnitude per group, as KV has.
std::vector<std::byte> KvValues(const LossyFormat& f, uint32_t seed) {
  std::vector<std::byte> raw(f.raw_bytes());
  const size_t element = DTypeBytes(f.dtype);
  uint64_t x = seed * 0x9E3779B97F4A7C15ull + 3;
  for (size_t i = 0; i < raw.size() / element; ++i) {
    x ^= x << 13, x ^= x >> 7, x ^= x << 17;
    const double uniform = (static_cast<double>(x >> 11) + 0.5) / 9007199254740992.0;
    const float value = static_cast<float>((uniform - 0.5) * (1 + (i / f.head_dim) % 17));
    uint32_t bits;
    std::memcpy(&bits, &value, 4);
    if (f.dtype == DType::kFp32) {
      std::memcpy(raw.data() + i * 4, &value, 4);
    } else if (f.dtype == DType::kBf16) {
      raw[i * 2] = static_cast<std::byte>(bits >> 16);
      raw[i * 2 + 1] = static_cast<std::byte>(bits >> 24);
    } else {  // fp16 of small values: exact from a float with 10 mantissa bits
      const float rounded = std::ldexp(std::nearbyint(std::ldexp(value, 8)), -8);
      const uint16_t half =
          rounded == 0 ? 0
                       : static_cast<uint16_t>(
                             (rounded < 0 ? 0x8000 : 0) | ((std::ilogb(rounded) + 15) << 10) |
                             (static_cast<uint32_t>(std::ldexp(std::fabs(rounded), 10 - std::ilogb(rounded))) & 0x3ff));
      raw[i * 2] = static_cast<std::byte>(half & 0xff);
      raw[i * 2 + 1] = static_cast<std::byte>(half >> 8);
    }
  }
  return raw;
}

float Value(const std::vector<std::byte>& raw, DType dtype, size_t i) {
  if (dtype == DType::kFp32) {
    float v;
    std::memcpy(&v, raw.data() + 4 * i, 4);
    return v;
  }
  const uint16_t bits = static_cast<uint16_t>(static_cast<uint8_t>(raw[2 * i])) |
                        static_cast<uint16_t>(static_cast<uint8_t>(raw[2 * i + 1])) << 8;
  if (dtype == DType::kBf16) {
    const uint32_t wide = uint32_t{bits} << 16;
    float v;
    std::memcpy(&v, &wide, 4);
    return v;
  }
  const int exponent = (bits >> 10) & 0x1f;
  const float magnitude =
      exponent == 0 ? std::ldexp(float(bits & 0x3ff), -24) : std::ldexp(float((bits & 0x3ff) | 0x400), exponent - 25);
  return (bits & 0x8000) ? -magnitude : magnitude;
}

}  // namespace

TEST_CASE("lossy codec: int8 and int4 lose at most half a step per group (plus the dtype's rounding)") {
  for (DType dtype : {DType::kBf16, DType::kFp16, DType::kFp32}) {
    for (StoredPrecision precision : {StoredPrecision::kInt8, StoredPrecision::kInt4}) {
      const LossyFormat f = SmallFormat(precision, dtype);
      const auto raw = KvValues(f, 1);
      const auto encoded = EncodeLossy(f, raw);
      REQUIRE(encoded.size() == f.encoded_bytes());
      CHECK(encoded.size() < raw.size());
      std::vector<std::byte> out(raw.size());
      REQUIRE(DecodeLossy(encoded, out).ok());
      const int qmax = precision == StoredPrecision::kInt8 ? 127 : 7;
      const double dtype_epsilon = dtype == DType::kBf16 ? 1.0 / 256 : dtype == DType::kFp16 ? 1.0 / 2048 : 1e-7;
      for (uint64_t g = 0; g < f.raw_bytes() / DTypeBytes(dtype) / f.head_dim; ++g) {
        float absmax = 0;
        for (uint32_t i = 0; i < f.head_dim; ++i) absmax = std::max(absmax, std::fabs(Value(raw, dtype, g * 64 + i)));
        const double step = absmax / qmax;
        for (uint32_t i = 0; i < f.head_dim; ++i) {
          const double x = Value(raw, dtype, g * 64 + i);
          const double y = Value(out, dtype, g * 64 + i);
          INFO("dtype " << int(dtype) << " precision " << int(precision) << " group " << g << " value " << i);
          REQUIRE(std::fabs(x - y) <= step / 2 * (1 + 1e-6) + std::fabs(y) * dtype_epsilon);
        }
      }
      // What decodes re-encodes to itself (for int8 and int4 alike, the absmax value is exact).
      std::vector<std::byte> again(raw.size());
      REQUIRE(DecodeLossy(EncodeLossy(f, out), again).ok());
    }
  }
}

TEST_CASE("lossy codec: sizes: int8 about 1.9x and int4 about 3.6x smaller than bf16 at head_dim 64") {
  const LossyFormat int8 = SmallFormat(StoredPrecision::kInt8, DType::kBf16);
  const LossyFormat int4 = SmallFormat(StoredPrecision::kInt4, DType::kBf16);
  const uint64_t groups = 2 * 3 * 16 * 2;
  CHECK(int8.encoded_bytes() == kLossyHeaderBytes + groups * (4 + 64));
  CHECK(int4.encoded_bytes() == kLossyHeaderBytes + groups * (4 + 32));
  CHECK(static_cast<double>(int8.raw_bytes()) / static_cast<double>(int8.encoded_bytes()) > 1.85);
  CHECK(static_cast<double>(int4.raw_bytes()) / static_cast<double>(int4.encoded_bytes()) > 3.4);
}

TEST_CASE("lossy codec: a group of zeros and one of equal values decode exactly") {
  LossyFormat f = SmallFormat(StoredPrecision::kInt4, DType::kFp32);
  std::vector<std::byte> raw(f.raw_bytes(), std::byte{0});
  const float half = 0.5f;
  for (uint32_t i = 0; i < 64; ++i) std::memcpy(raw.data() + 4 * (64 + i), &half, 4);  // group 1: all 0.5
  std::vector<std::byte> out(raw.size(), std::byte{0x7f});
  REQUIRE(DecodeLossy(EncodeLossy(f, raw), out).ok());
  CHECK(out == raw);
}

TEST_CASE("lossy codec: forged or truncated encodings are refused and nothing is written outside the destination") {
  const LossyFormat f = SmallFormat(StoredPrecision::kInt8, DType::kBf16);
  const auto encoded = EncodeLossy(f, KvValues(f, 2));
  auto decode = [&](const std::vector<std::byte>& e, size_t dst_bytes) {
    std::vector<std::byte> guarded(dst_bytes + 8192, std::byte{0xA5});
    const absl::Status status = DecodeLossy(e, std::span(guarded).subspan(4096, dst_bytes));
    for (size_t i = 0; i < 4096; ++i) {
      REQUIRE(guarded[i] == std::byte{0xA5});
      REQUIRE(guarded[guarded.size() - 1 - i] == std::byte{0xA5});
    }
    return status;
  };
  const size_t raw = f.raw_bytes();
  REQUIRE(decode(encoded, raw).ok());
  CHECK(decode(encoded, raw - 2).code() == absl::StatusCode::kInvalidArgument);
  for (size_t keep : {size_t{0}, size_t{10}, size_t{63}, size_t{64}, encoded.size() / 2, encoded.size() - 1}) {
    CHECK(decode(std::vector(encoded.begin(), encoded.begin() + static_cast<long>(keep)), raw).code() ==
          absl::StatusCode::kDataLoss);
  }
  auto forged = [&](size_t at, uint32_t value) {
    auto e = encoded;
    for (int i = 0; i < 4; ++i) e[at + i] = static_cast<std::byte>(value >> (8 * i));
    return e;
  };
  CHECK(decode(forged(8, 2), raw).code() == absl::StatusCode::kFailedPrecondition);  // version
  CHECK(decode(forged(12, 3), raw).code() == absl::StatusCode::kDataLoss);           // precision
  CHECK(decode(forged(16, 5), raw).code() == absl::StatusCode::kDataLoss);           // dtype int8
  CHECK(decode(forged(40, 1), raw).code() == absl::StatusCode::kDataLoss);           // reserved
  // A shape that says more than the destination holds, and one whose product would wrap.
  CHECK(decode(forged(32, 17), raw).code() == absl::StatusCode::kInvalidArgument);
  auto huge = forged(20, 0xffffffffu);
  for (size_t at : {24u, 28u, 32u}) {
    for (int i = 0; i < 4; ++i) huge[at + i] = std::byte{0xff};
  }
  CHECK_FALSE(decode(huge, raw).ok());
  // An empty shape that names a huge head_dim: refused before any buffer is sized by it (the fuzz target found
  // a 5 GB allocation for one, decoding into a destination of 0 bytes).
  auto empty = forged(32, 0);  // no tokens
  const uint32_t huge_dim = uint32_t{1} << 30;
  for (int i = 0; i < 4; ++i) empty[28 + i] = static_cast<std::byte>(huge_dim >> (8 * i));
  CHECK(decode(empty, 0).code() == absl::StatusCode::kDataLoss);
  // A scale that is NaN, infinite or negative.
  for (float scale : {std::numeric_limits<float>::quiet_NaN(), std::numeric_limits<float>::infinity(), -1.0f}) {
    auto e = encoded;
    std::memcpy(e.data() + kLossyHeaderBytes + 4 * 7, &scale, 4);
    CHECK(decode(e, raw).code() == absl::StatusCode::kDataLoss);
  }
}

TEST_CASE(
    "lossy codec: a header of another dtype or shape than the namespace's, or a scale past the dtype, is refused") {
  // Issue 46 (lows): at 4054af8 a bf16 encoding was decoded into an fp16 namespace's chunk of the same size, and a
  // finite scale whose values overflow fp16 reached the engine as inf.
  const LossyFormat fp16 = SmallFormat(StoredPrecision::kInt8, DType::kFp16);
  const LossyFormat bf16 = SmallFormat(StoredPrecision::kInt8, DType::kBf16);
  const auto as_bf16 = EncodeLossy(bf16, KvValues(bf16, 4));
  std::vector<std::byte> dst(fp16.raw_bytes());
  REQUIRE(DecodeLossy(as_bf16, dst).ok());  // the same size: only the namespace can tell
  const absl::Status other_dtype = DecodeLossy(as_bf16, dst, fp16);
  CHECK(other_dtype.code() == absl::StatusCode::kDataLoss);
  CHECK_THAT(std::string(other_dtype.message()), Catch::Contains("dtype"));
  LossyFormat wider = bf16;
  wider.head_dim = 32;
  wider.tokens = 32;  // the same raw size, another shape
  CHECK(DecodeLossy(as_bf16, dst, wider).code() == absl::StatusCode::kDataLoss);
  CHECK(DecodeLossy(as_bf16, dst, bf16).ok());

  auto encoded = EncodeLossy(fp16, KvValues(fp16, 5));
  REQUIRE(DecodeLossy(encoded, dst, fp16).ok());
  const float overflowing = 1000.0f;  // 127 * 1000 is past fp16's 65504
  std::memcpy(encoded.data() + kLossyHeaderBytes + 4 * 3, &overflowing, 4);
  CHECK(DecodeLossy(encoded, dst, fp16).code() == absl::StatusCode::kDataLoss);
  const float largest_honest = 65504.0f / 127.0f;
  std::memcpy(encoded.data() + kLossyHeaderBytes + 4 * 3, &largest_honest, 4);
  CHECK(DecodeLossy(encoded, dst, fp16).ok());
  for (size_t i = 0; i < dst.size() / 2; ++i) REQUIRE(std::isfinite(Value(dst, DType::kFp16, i)));
}

}  // namespace cake

namespace cake {

// Vectors written by the research's reference quantizer (docs/research/lossy-kv: torch and NumPy, which agree),
// one [2][K,V][4][2][8] chunk each: random bf16, fp16 and fp32, and bf16 edge cases (zeros and -0, ties at .5,
// subnormals, values near bf16's largest), which catch a reciprocal instead of a division and a flush to zero.
TEST_CASE("lossy codec: decodes bit for bit as the Python reference quantizer") {
  auto read = [](const std::string& name) {
    std::ifstream in(std::string(CAKE_SOURCE_DIR) + "/tests/golden/lossy_kv/" + name, std::ios::binary);
    REQUIRE(in);
    std::vector<char> bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    std::vector<std::byte> out(bytes.size());
    std::memcpy(out.data(), bytes.data(), bytes.size());
    return out;
  };
  for (const auto& [vector, dtype] : {std::pair{"random-bf16", DType::kBf16}, std::pair{"random-fp16", DType::kFp16},
                                      std::pair{"random-fp32", DType::kFp32}, std::pair{"edge-bf16", DType::kBf16}}) {
    const auto input = read(std::string(vector) + ".input.bin");
    for (const auto& [precision, name] :
         {std::pair{StoredPrecision::kInt8, "int8"}, std::pair{StoredPrecision::kInt4, "int4"}}) {
      INFO(vector << " " << name);
      const LossyFormat format{precision, dtype, 2, 2, 8, 4};
      REQUIRE(format.raw_bytes() == input.size());
      std::vector<std::byte> decoded(input.size());
      REQUIRE(DecodeLossy(EncodeLossy(format, input), decoded).ok());
      CHECK(decoded == read(std::string(vector) + "." + name + ".bin"));
    }
  }
}

}  // namespace cake
