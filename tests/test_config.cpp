// core/config: the table of MESHRT_* variables (config::variables(), what the docs print) agrees
// with the getters that parse them: every value a row lists is accepted by the getters, its
// default is one of them (the getter's own, where the getter names its choices), and a value it
// does not list is an Error naming the variable (and, where it names the choices, exactly the
// row's).
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdlib>
#include <functional>
#include <string>
#include <vector>

#include "core/config.h"
#include "core/error.h"

namespace meshrt {
namespace {

// Every getter of core/config.h; each reads its variable when called.
const std::vector<std::function<void()>>& getters() {
  static const std::vector<std::function<void()>> all = {
      [] { (void)config::cpu_devices(); },           [] { (void)config::platform(); },
      [] { (void)config::cpu_executor(); },          [] { (void)config::collective_algo(); },
      [] { (void)config::deterministic(); },         [] { (void)config::collective_timeout(); },
      [] { (void)config::mpi_max_message_bytes(); }, [] { (void)config::cuda_devices_per_gpu(); },
      [] { (void)config::cuda_cache_bytes(); },      [] { (void)config::cuda_sync_copies(); },
      [] { (void)config::cuda_matmul_lt(); },        [] { (void)config::cuda_graphs(); },
      [] { (void)config::cuda_fusion_chains(); },    [] { (void)config::jit_fusion(); },
      [] { (void)config::cuda_fibers(); },           [] { (void)config::explicit_sharding(); },
      [] { (void)config::matmul_placement(); },      [] { (void)config::keep_rows(); },
      [] { (void)config::cpu_stream_stores(); },     [] { (void)config::log_collectives(); },
      [] { (void)config::require_cuda(); },          [] { (void)config::prng_legacy_stream(); },
      [] { (void)config::matmul_tf32(); },           [] { (void)config::plugin_dir(); },
  };
  return all;
}

// The errors the getters raise for the environment as it is now.
std::vector<std::string> errors() {
  std::vector<std::string> out;
  for (const auto& get : getters()) {
    try {
      get();
    } catch (const Error& e) {
      out.emplace_back(e.what());
    }
  }
  return out;
}

// A row's values when they are a list of words ("auto, direct, ring"), else empty (ranges such as
// "1..4096", "seconds > 0", "a folder").
std::vector<std::string> listed(std::string_view values) {
  std::vector<std::string> words;
  size_t at = 0;
  while (at <= values.size()) {
    const size_t end = std::min(values.find(", ", at), values.size());
    const std::string w(values.substr(at, end - at));
    if (w.empty() || w.find_first_of(" .>") != std::string::npos) return {};
    words.push_back(w);
    at = end + 2;
  }
  return words;
}

TEST(Config, EveryListedValueIsAcceptedAndNothingElse) {
  int rows = 0;
  for (const config::Variable& v : config::variables()) {
    const std::vector<std::string> words = listed(v.values);
    if (words.empty()) continue;
    ++rows;
    const std::string name(v.name);
    const char* before = std::getenv(name.c_str());
    const std::string saved = before != nullptr ? before : "";
    for (const std::string& w : words) {
      setenv(name.c_str(), w.c_str(), 1);
      for (const std::string& e : errors()) {
        EXPECT_EQ(e.find(name), std::string::npos) << name << "=" << w << " listed, but: " << e;
      }
    }
    // The default is a listed value (where it is a word: "cuda if usable, else cpu" is not).
    if (listed(v.default_value).size() == 1) {
      EXPECT_NE(std::find(words.begin(), words.end(), std::string(v.default_value)), words.end())
          << name << "'s default " << v.default_value << " is not among " << v.values;
    }
    setenv(name.c_str(), "not-a-listed-value", 1);
    bool named = false;
    for (const std::string& e : errors()) {
      if (e.find(name) == std::string::npos) continue;
      named = true;
      // "... is not one of auto, cheapest, jax": the getter's own list, first its default.
      const size_t at = e.find("is not one of ");
      if (at == std::string::npos) continue;
      std::vector<std::string> accepted = listed(e.substr(at + 14));
      ASSERT_FALSE(accepted.empty()) << e;
      if (listed(v.default_value).size() == 1) {
        EXPECT_EQ(accepted.front(), v.default_value) << name << ": the getter's default";
      }
      std::vector<std::string> table = words;
      std::sort(accepted.begin(), accepted.end());
      std::sort(table.begin(), table.end());
      EXPECT_EQ(accepted, table) << name << ": the table lists " << v.values << ", the getter "
                                 << e;
    }
    EXPECT_TRUE(named) << name << "=not-a-listed-value: no getter refused it";
    if (before != nullptr) {
      setenv(name.c_str(), saved.c_str(), 1);
    } else {
      unsetenv(name.c_str());
    }
  }
  EXPECT_GE(rows, 15);
}

}  // namespace
}  // namespace meshrt
