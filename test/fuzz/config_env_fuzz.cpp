// Fuzz target: every RSOCK_* variable through parse_config. The input is
// the variables' values separated by NUL bytes, in the order of kVars (a
// missing value is an unset variable, an empty one counts as unset too);
// whatever follows the last separator is the rule file's text when
// RSOCK_CONF is set. Checks the Config invariants and that every error line
// is short and printable (fuzz_check.h).
// fuzz-sources: src/config/config.cpp

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "config/config.h"
#include "fuzz_check.h"

namespace {

constexpr const char* kVars[] = {
    "RSOCK_PEERS",     "RSOCK_RING_SIZE", "RSOCK_SPIN_US", "RSOCK_CONNECT_TIMEOUT_MS",
    "RSOCK_LOG_LEVEL", "RSOCK_LOG_FILE",  "RSOCK_STATS",   "RSOCK_DISABLE",
    "RSOCK_CONF",
};
constexpr size_t kVarCount = sizeof(kVars) / sizeof(kVars[0]);

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string input(reinterpret_cast<const char*>(data), size);
  std::vector<std::string> values;
  size_t pos = 0;
  while (values.size() < kVarCount && pos <= input.size()) {
    size_t nul = input.find('\0', pos);
    if (nul == std::string::npos) nul = input.size();
    values.push_back(input.substr(pos, nul - pos));
    pos = nul + 1;
  }
  const std::string conf_text = pos < input.size() ? input.substr(pos) : std::string();

  auto env = [&values](const char* name) -> const char* {
    for (size_t i = 0; i < values.size(); ++i)
      if (std::string(kVars[i]) == name) return values[i].c_str();
    return nullptr;
  };
  std::vector<rsock::ConfigError> errors;
  // An odd-length tail stands for a rule file that could not be read.
  const bool readable = conf_text.size() % 2 == 0;
  const rsock::Config c = rsock::parse_config(env, readable ? &conf_text : nullptr, &errors);

  bool disable = false;
  if (values.size() > 7) {
    const std::string& d = values[7];
    const size_t first = d.find_first_not_of(" \t\r\n\v\f");
    const size_t last = d.find_last_not_of(" \t\r\n\v\f");
    disable = first != std::string::npos && d.substr(first, last - first + 1) == "1";
  }
  rsock::fuzz::check_config(c, errors, disable);
  return 0;
}
