// kvfleet's RoPE against transformers' own: each case of tests/data/model/rope_reference.json
// (tests/gpu/make_reference.py --rope, on a machine with transformers) holds a config.json, a
// sequence length, and the inv_freq and attention_scaling HF's rotary embedding had after a
// forward pass of that length. kvfleet parses the config (model_config.h) and computes both
// (kernels/rope.h). Until the fixture exists the comparison is skipped with a message;
// tests/kernels/rope_test.cc checks the same functions against hand-derived values meanwhile.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <sstream>
#include <string>

#include <nlohmann/json.hpp>

#include "kernels/rope.h"
#include "tests/worker/model/test_models.h"
#include "worker/model/model_config.h"

namespace kvfleet::model {
namespace {

// HF computes in float32 like kernels/rope.h, but its pow and ours may differ in the last
// bit, and the dynamic base goes through one more pow: a few float ulps at most.
constexpr double kRelativeTolerance = 1e-5;

TEST_CASE("RoPE frequencies and attention scaling equal transformers' for every fixture case") {
  const std::string path = testing::TestDataDir() + "/model/rope_reference.json";
  std::ifstream in(path);
  if (!in) {
    MESSAGE(path << " is missing: kvfleet's RoPE is not compared with transformers' (make it with "
                    "python3 tests/gpu/make_reference.py --rope --out " << path << " where transformers is installed)");
    return;
  }
  std::stringstream ss;
  ss << in.rdbuf();
  const nlohmann::json fixture = nlohmann::json::parse(ss.str());
  REQUIRE(fixture["cases"].size() > 0);
  int compared = 0;
  double worst_all = 0;
  for (const nlohmann::json& c : fixture["cases"]) {
    const std::string name = c["name"].get<std::string>();
    const int64_t seq_len = c["seq_len"].get<int64_t>();
    CAPTURE(name);
    CAPTURE(seq_len);
    auto config = ParseModelConfig(c["config"].dump());
    REQUIRE_MESSAGE(config.ok(), config.status().ToString());
    const kernels::RopeConfig rope = config->rope();
    const std::vector<float> ours = kernels::RopeInvFreq(rope, seq_len);
    const std::vector<double> theirs = c["inv_freq"].get<std::vector<double>>();
    REQUIRE(ours.size() == theirs.size());
    double worst = 0;
    for (size_t i = 0; i < ours.size(); ++i) {
      worst = std::max(worst, std::fabs(ours[i] - theirs[i]) / std::fabs(theirs[i]));
    }
    CHECK(worst <= kRelativeTolerance);
    worst_all = std::max(worst_all, worst);
    CHECK(kernels::RopeAttentionScaling(rope) ==
          doctest::Approx(c["attention_scaling"].get<double>()).epsilon(1e-9));
    ++compared;
  }
  MESSAGE(compared << " RoPE cases compared with transformers " << fixture.value("transformers", "?")
                   << ": largest relative difference of a frequency " << worst_all);
}

}  // namespace
}  // namespace kvfleet::model
