// Fuzz target: the rule file (RSOCK_CONF) through parse_config. The whole
// input is the file's text, read from a path named by RSOCK_CONF; no other
// variable is set. Checks the Config invariants and that every error line
// is short and printable (fuzz_check.h).
// fuzz-sources: src/config/config.cpp

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "config/config.h"
#include "fuzz_check.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  auto env = [](const char* name) -> const char* {
    return std::strcmp(name, "RSOCK_CONF") == 0 ? "/etc/rsock.conf" : nullptr;
  };
  std::vector<rsock::ConfigError> errors;
  const rsock::Config c = rsock::parse_config(env, &text, &errors);
  rsock::fuzz::check_config(c, errors, false);
  // A file without errors yields one rule per rule line at most.
  size_t rule_lines = 0;
  for (size_t p = 0; (p = text.find("rule", p)) != std::string::npos; p += 4) ++rule_lines;
  FUZZ_CHECK(c.rules.size() <= rule_lines);
  return 0;
}
