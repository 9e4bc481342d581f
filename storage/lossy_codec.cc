#include "storage/lossy_codec.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>
#include <iterator>
#include <limits>
#include <string_view>

#include "absl/strings/str_cat.h"
#include "base/little_endian.h"

namespace cake {
namespace {

constexpr std::string_view kLossyMagic = "CAKEKVQ1";
constexpr uint32_t kLossyVersion = 1;

int QuantMax(StoredPrecision precision) { return precision == StoredPrecision::kInt8 ? 127 : 7; }

// Bytes of one group's values.
uint64_t GroupValueBytes(StoredPrecision precision, uint32_t head_dim) {
  return precision == StoredPrecision::kInt8 ? head_dim : (uint64_t{head_dim} + 1) / 2;
}

float Bf16ToFloat(uint16_t bits) {
  const uint32_t wide = uint32_t{bits} << 16;
  float out;
  std::memcpy(&out, &wide, sizeof(out));
  return out;
}

float HalfToFloat(uint16_t h) {
  const uint32_t sign = uint32_t{h & 0x8000u} << 16;
  const uint32_t exponent = (h >> 10) & 0x1f;
  const uint32_t mantissa = h & 0x3ffu;
  float magnitude;
  if (exponent == 0) {
    magnitude = std::ldexp(static_cast<float>(mantissa), -24);  // zero or subnormal
  } else if (exponent == 31) {
    magnitude = mantissa == 0 ? INFINITY : NAN;
  } else {
    magnitude = std::ldexp(static_cast<float>(mantissa | 0x400u), static_cast<int>(exponent) - 25);
  }
  uint32_t bits;
  std::memcpy(&bits, &magnitude, sizeof(bits));
  bits |= sign;
  float out;
  std::memcpy(&out, &bits, sizeof(out));
  return out;
}

uint16_t FloatToHalf(float value) {  // round to nearest even, as torch's .to(torch.float16)
  uint32_t bits;
  std::memcpy(&bits, &value, sizeof(bits));
  const uint16_t sign = static_cast<uint16_t>((bits >> 16) & 0x8000u);
  bits &= 0x7fffffffu;
  if (bits >= 0x7f800000u) return sign | 0x7c00u | (bits > 0x7f800000u ? 0x200u : 0);  // inf, NaN
  if (bits >= 0x477ff000u) return sign | 0x7c00u;                                      // rounds past 65504
  if (bits < 0x38800000u) {                                                            // subnormal or zero
    float magnitude;
    std::memcpy(&magnitude, &bits, sizeof(magnitude));
    return sign | static_cast<uint16_t>(std::nearbyint(std::ldexp(magnitude, 24)));
  }
  const uint32_t rounded = bits + 0xfffu + ((bits >> 13) & 1);
  return sign | static_cast<uint16_t>((rounded - 0x38000000u) >> 13);
}

float LoadValue(DType dtype, const std::byte* at) {
  switch (dtype) {
    case DType::kFp32: {
      float out;
      std::memcpy(&out, at, sizeof(out));
      return out;
    }
    case DType::kFp16:
      return HalfToFloat(LoadLittleEndian<uint16_t>(at));
    default:
      return Bf16ToFloat(LoadLittleEndian<uint16_t>(at));
  }
}

// groups = layers * 2 * tokens * kv_heads, and the raw bytes, without wrapping; false when they would.
bool Sizes(const LossyFormat& f, uint64_t* groups, uint64_t* raw_bytes) {
  uint64_t g = 2;
  const uint32_t element = DTypeBytes(f.dtype);
  if (element == 0) return false;
  for (uint64_t factor : {uint64_t{f.layers}, uint64_t{f.tokens}, uint64_t{f.kv_heads}}) {
    if (__builtin_mul_overflow(g, factor, &g)) return false;
  }
  uint64_t raw = 0;
  if (__builtin_mul_overflow(g, uint64_t{f.head_dim} * element, &raw)) return false;
  *groups = g;
  *raw_bytes = raw;
  return true;
}

// The groups' decoded values, written as the dtype: first the quantized values times the scale into a float
// buffer, then the floats into the dtype, each a plain loop over non-aliasing arrays that the compiler vectorizes
// (a generic loop with a switch per value decoded at about a third of the disk's speed).
template <StoredPrecision kPrecision, DType kDType>
void DecodeGroups(const std::byte* scales, const std::byte* values, uint64_t groups, uint32_t dim, std::byte* dst) {
  const uint64_t value_bytes = GroupValueBytes(kPrecision, dim);
  const size_t element = kDType == DType::kFp32 ? 4 : 2;
  std::vector<float> buffer(dim);
  std::vector<uint16_t> halves(dim);
  float* __restrict f = buffer.data();
  uint16_t* __restrict h = halves.data();
  for (uint64_t g = 0; g < groups; ++g) {
    float scale;
    std::memcpy(&scale, scales + g * sizeof(float), sizeof(scale));
    const auto* __restrict q = reinterpret_cast<const uint8_t*>(values + g * value_bytes);
    if constexpr (kPrecision == StoredPrecision::kInt8) {
      for (uint32_t i = 0; i < dim; ++i) f[i] = static_cast<float>(static_cast<int8_t>(q[i])) * scale;
    } else {
      // Two values a byte, the even one low; a nibble is sign-extended by shifting it to the top of an int8.
      for (uint32_t j = 0; j < dim / 2; ++j) {
        f[2 * j] = static_cast<float>(static_cast<int8_t>(static_cast<uint8_t>(q[j] << 4)) >> 4) * scale;
        f[2 * j + 1] = static_cast<float>(static_cast<int8_t>(q[j] & 0xf0) >> 4) * scale;
      }
      if (dim % 2 == 1) f[dim - 1] = static_cast<float>(static_cast<int8_t>(q[dim / 2] << 4) >> 4) * scale;
    }
    auto* __restrict out = reinterpret_cast<uint8_t*>(dst) + g * dim * element;
    if constexpr (kDType == DType::kBf16) {
      for (uint32_t i = 0; i < dim; ++i) {
        uint32_t bits;
        std::memcpy(&bits, &f[i], sizeof(bits));
        h[i] = static_cast<uint16_t>((bits + 0x7fff + ((bits >> 16) & 1)) >> 16);  // nearest even
      }
      std::memcpy(out, h, dim * sizeof(uint16_t));  // little-endian, like every x86 and arm64 host
    } else if constexpr (kDType == DType::kFp32) {
      std::memcpy(out, f, dim * sizeof(float));
    } else {
      for (uint32_t i = 0; i < dim; ++i) h[i] = FloatToHalf(f[i]);
      std::memcpy(out, h, dim * sizeof(uint16_t));
    }
  }
}

template <StoredPrecision kPrecision>
void DecodeAll(DType dtype, const std::byte* scales, const std::byte* values, uint64_t groups, uint32_t dim,
               std::byte* dst) {
  switch (dtype) {
    case DType::kFp32:
      return DecodeGroups<kPrecision, DType::kFp32>(scales, values, groups, dim, dst);
    case DType::kFp16:
      return DecodeGroups<kPrecision, DType::kFp16>(scales, values, groups, dim, dst);
    default:
      return DecodeGroups<kPrecision, DType::kBf16>(scales, values, groups, dim, dst);
  }
}

}  // namespace

LossyFormat LossyFormat::Of(const NamespaceSpec& spec) {
  return LossyFormat{spec.stored_precision, spec.dtype,    spec.num_layers,
                     spec.num_kv_heads,     spec.head_dim, spec.chunk_tokens};
}

uint64_t LossyFormat::raw_bytes() const {
  uint64_t groups = 0, raw = 0;
  return Sizes(*this, &groups, &raw) ? raw : 0;
}

uint64_t LossyFormat::encoded_bytes() const {
  uint64_t groups = 0, raw = 0;
  if (!Sizes(*this, &groups, &raw)) return 0;
  return kLossyHeaderBytes + groups * (sizeof(float) + GroupValueBytes(precision, head_dim));
}

std::vector<std::byte> EncodeLossy(const LossyFormat& format, std::span<const std::byte> raw) {
  uint64_t groups = 0, raw_bytes = 0;
  if (!format.lossy() || !Sizes(format, &groups, &raw_bytes) || raw_bytes != raw.size()) return {};
  std::vector<std::byte> out(format.encoded_bytes(), std::byte{0});
  std::byte* h = out.data();
  std::memcpy(h, kLossyMagic.data(), kLossyMagic.size());
  StoreLittleEndian<uint32_t>(h + 8, kLossyVersion);
  StoreLittleEndian<uint32_t>(h + 12, static_cast<uint32_t>(format.precision));
  StoreLittleEndian<uint32_t>(h + 16, static_cast<uint32_t>(format.dtype));
  StoreLittleEndian<uint32_t>(h + 20, format.layers);
  StoreLittleEndian<uint32_t>(h + 24, format.kv_heads);
  StoreLittleEndian<uint32_t>(h + 28, format.head_dim);
  StoreLittleEndian<uint32_t>(h + 32, format.tokens);

  const uint32_t dim = format.head_dim;
  const size_t element = DTypeBytes(format.dtype);
  const int qmax = QuantMax(format.precision);
  const uint64_t value_bytes = GroupValueBytes(format.precision, dim);
  std::byte* scales = h + kLossyHeaderBytes;
  std::byte* values = scales + groups * sizeof(float);
  std::vector<float> group(dim);
  for (uint64_t g = 0; g < groups; ++g) {
    const std::byte* in = raw.data() + g * dim * element;
    float absmax = 0;
    for (uint32_t i = 0; i < dim; ++i) {
      group[i] = LoadValue(format.dtype, in + i * element);
      absmax = std::max(absmax, std::fabs(group[i]));
    }
    // A group holding inf or NaN (not KV a model produces) keeps no information: zeros.
    const float scale = std::isfinite(absmax) ? absmax / static_cast<float>(qmax) : 0.0f;
    std::memcpy(scales + g * sizeof(float), &scale, sizeof(scale));
    std::byte* q = values + g * value_bytes;
    for (uint32_t i = 0; i < dim; ++i) {
      int v = 0;
      if (scale > 0) v = static_cast<int>(std::clamp(std::nearbyint(group[i] / scale), -float(qmax), float(qmax)));
      if (format.precision == StoredPrecision::kInt8) {
        q[i] = static_cast<std::byte>(static_cast<int8_t>(v));
      } else {
        const auto nibble = static_cast<uint8_t>(v & 0xf);
        q[i / 2] |= static_cast<std::byte>(i % 2 == 0 ? nibble : nibble << 4);
      }
    }
  }
  return out;
}

absl::Status DecodeLossy(std::span<const std::byte> encoded, std::span<std::byte> dst) {
  if (encoded.size() < kLossyHeaderBytes || std::memcmp(encoded.data(), kLossyMagic.data(), kLossyMagic.size()) != 0) {
    return absl::DataLossError("not a quantized chunk (too short, or a bad magic)");
  }
  const std::byte* h = encoded.data();
  if (LoadLittleEndian<uint32_t>(h + 8) != kLossyVersion) {
    return absl::FailedPreconditionError(absl::StrCat(
        "a quantized chunk of version ", LoadLittleEndian<uint32_t>(h + 8), ", which this daemon does not know"));
  }
  LossyFormat format;
  const uint32_t precision = LoadLittleEndian<uint32_t>(h + 12);
  const uint32_t dtype = LoadLittleEndian<uint32_t>(h + 16);
  if (precision < 1 || precision > 2) return absl::DataLossError(absl::StrCat("unknown precision ", precision));
  if (dtype != static_cast<uint32_t>(DType::kFp32) && dtype != static_cast<uint32_t>(DType::kFp16) &&
      dtype != static_cast<uint32_t>(DType::kBf16)) {
    return absl::DataLossError(absl::StrCat("a quantized chunk of dtype ", dtype, " (only floats are quantized)"));
  }
  format.precision = static_cast<StoredPrecision>(precision);
  format.dtype = static_cast<DType>(dtype);
  format.layers = LoadLittleEndian<uint32_t>(h + 20);
  format.kv_heads = LoadLittleEndian<uint32_t>(h + 24);
  format.head_dim = LoadLittleEndian<uint32_t>(h + 28);
  format.tokens = LoadLittleEndian<uint32_t>(h + 32);
  for (size_t at = 36; at < kLossyHeaderBytes; ++at) {
    if (h[at] != std::byte{0}) return absl::DataLossError("a quantized chunk's reserved bytes are not zero");
  }
  uint64_t groups = 0, raw_bytes = 0;
  // An empty shape (no layer, token or head) decodes to nothing, however large a head_dim it names: the decode's
  // buffers are a head_dim each, so it is refused before they are sized by it (the fuzz target found a 5 GB one).
  if (!Sizes(format, &groups, &raw_bytes) || format.head_dim == 0 || groups == 0) {
    return absl::DataLossError("a quantized chunk's shape is empty or too large");
  }
  if (raw_bytes != dst.size()) {
    return absl::InvalidArgumentError(
        absl::StrCat("the quantized chunk decodes to ", raw_bytes, " bytes; the destination has ", dst.size()));
  }
  // raw_bytes equals dst.size(), which is memory the caller holds: this cannot wrap.
  if (encoded.size() != format.encoded_bytes()) {
    return absl::DataLossError(absl::StrCat("a quantized chunk of this shape is ", format.encoded_bytes(),
                                            " bytes; this one is ", encoded.size(), " (truncated?)"));
  }
  const std::byte* scales = h + kLossyHeaderBytes;
  // Every value decodes to q * scale in fp32 (|q| <= Q), then rounds to the dtype: a scale with Q * scale at or past
  // the value that rounds to inf (fp16: 65520; bf16: half an ulp past its largest; fp32: inf) would hand the engine
  // an inf, or a NaN later. An honest encoding never has one: its scale is a group's largest magnitude over Q.
  const float q_max = format.precision == StoredPrecision::kInt8 ? 127.0f : 7.0f;
  const float rounds_to_inf = format.dtype == DType::kFp16   ? 65520.0f
                              : format.dtype == DType::kBf16 ? std::bit_cast<float>(uint32_t{0x7F7F8000})
                                                             : std::numeric_limits<float>::infinity();
  for (uint64_t g = 0; g < groups; ++g) {
    float scale;
    std::memcpy(&scale, scales + g * sizeof(float), sizeof(scale));
    if (!(scale >= 0) || !std::isfinite(scale)) {
      return absl::DataLossError(absl::StrCat("group ", g, " has the scale ", scale));
    }
    if (!(q_max * scale < rounds_to_inf)) {
      return absl::DataLossError(
          absl::StrCat("group ", g, " has the scale ", scale, ", whose values would decode past the dtype's range"));
    }
  }
  const std::byte* values = scales + groups * sizeof(float);
  if (format.precision == StoredPrecision::kInt8) {
    DecodeAll<StoredPrecision::kInt8>(format.dtype, scales, values, groups, format.head_dim, dst.data());
  } else {
    DecodeAll<StoredPrecision::kInt4>(format.dtype, scales, values, groups, format.head_dim, dst.data());
  }
  return absl::OkStatus();
}

absl::Status DecodeLossy(std::span<const std::byte> encoded, std::span<std::byte> dst, const LossyFormat& expected) {
  if (encoded.size() >= kLossyHeaderBytes && std::memcmp(encoded.data(), kLossyMagic.data(), kLossyMagic.size()) == 0 &&
      LoadLittleEndian<uint32_t>(encoded.data() + 8) == kLossyVersion) {
    const std::byte* h = encoded.data();
    const uint32_t said[] = {LoadLittleEndian<uint32_t>(h + 12), LoadLittleEndian<uint32_t>(h + 16),
                             LoadLittleEndian<uint32_t>(h + 20), LoadLittleEndian<uint32_t>(h + 24),
                             LoadLittleEndian<uint32_t>(h + 28), LoadLittleEndian<uint32_t>(h + 32)};
    const uint32_t want[] = {static_cast<uint32_t>(expected.precision),
                             static_cast<uint32_t>(expected.dtype),
                             expected.layers,
                             expected.kv_heads,
                             expected.head_dim,
                             expected.tokens};
    static constexpr const char* kField[] = {"precision", "dtype", "layers", "kv_heads", "head_dim", "tokens"};
    for (size_t i = 0; i < std::size(said); ++i) {
      if (said[i] != want[i]) {
        return absl::DataLossError(absl::StrCat("a quantized chunk whose header says ", kField[i], " ", said[i],
                                                "; the namespace's is ", want[i]));
      }
    }
  }
  return DecodeLossy(encoded, dst);
}

}  // namespace cake
