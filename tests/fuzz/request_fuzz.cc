// libFuzzer target: the fields of a Load or Store request are an engine's word. Whatever message arrives, the
// namespace and prompt checks answer with keys within the limits or a status, never a crash.
#include <cstddef>
#include <cstdint>

#include "cake/v1/kv.pb.h"
#include "server/edge/requests.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const cake::DaemonConfig config = [] {
    cake::DaemonConfig c = cake::DefaultConfig();
    c.max_prompt_tokens = 1 << 16;  // the fuzzer's prompts stay small; the limit is what is under test
    return c;
  }();
  cake::v1::LoadStart start;
  if (!start.ParseFromArray(data, static_cast<int>(size))) return 0;
  (void)cake::CheckClientId(start.client_id());
  auto ns = cake::ParseNamespace(start.namespace_(), config, start.namespace_().tenant());
  if (!ns.ok()) return 0;
  auto keys = cake::PromptKeys(*ns, start.prompt(), config);
  if (keys.ok() && keys->size() * ns->chunk_tokens() > config.max_prompt_tokens + ns->chunk_tokens() &&
      start.prompt().chunk_keys_size() == 0) {
    __builtin_trap();  // more full chunks than the token limit allows
  }
  return 0;
}
