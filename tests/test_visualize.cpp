// visualize_sharding against jax.debug.visualize_sharding output recorded from JAX itself
// (tests/data/gen_visualize.py): byte-for-byte wherever JAX's table fits its 80-column console.
#include <gtest/gtest.h>

#include <map>
#include <set>

#include "tests/test_util.h"

namespace meshrt {
namespace {

using test::split;

struct Case {
  std::string header;
  Mesh mesh;
  Shape shape;
  PartitionSpec spec;
  bool jax_drops_labels;
  std::string expected;
};

std::vector<Case> load_cases() {
  std::string text = test::read_data_file("visualize_expected.txt");
  std::vector<Case> cases;
  size_t pos = 0;
  while ((pos = text.find("=== ", pos)) != std::string::npos) {
    size_t eol = text.find('\n', pos);
    size_t next = text.find("\n=== ", eol);
    std::string header = text.substr(pos + 4, eol - pos - 4);
    std::string body =
        text.substr(eol + 1, (next == std::string::npos ? text.size() : next + 1) - eol - 1);
    std::map<std::string, std::string> kv;
    bool drops = false;
    for (const std::string& tok : split(header, ' ')) {
      size_t eq = tok.find('=');
      if (eq == std::string::npos)
        drops |= tok == "jax_drops_labels";
      else
        kv[tok.substr(0, eq)] = tok.substr(eq + 1);
    }
    cases.push_back({header, make_mesh(test::parse_shape(kv["mesh"]), split(kv["names"], ',')),
                     test::parse_shape(kv["shape"]), test::parse_spec(kv["spec"]), drops, body});
    pos = eol;
  }
  return cases;
}

size_t display_width(const std::string& line) {
  size_t n = 0;
  for (unsigned char c : line) n += (c & 0xC0) != 0x80;  // count UTF-8 code points
  return n;
}

TEST(Visualize, MatchesJaxExactly) {
  int exact = 0;
  for (const Case& c : load_cases()) {
    if (c.jax_drops_labels) continue;
    EXPECT_EQ(visualize_sharding(NamedSharding(c.mesh, c.spec), c.shape), c.expected) << c.header;
    ++exact;
  }
  EXPECT_GT(exact, 450);
}

// Where JAX's own table is wider than 80 columns rich squeezes the labels out; meshrt keeps the
// same grid but trims padding so every label is printed.
TEST(Visualize, WideTablesKeepLabels) {
  int wide = 0;
  for (const Case& c : load_cases()) {
    if (!c.jax_drops_labels) continue;
    ++wide;
    NamedSharding s(c.mesh, c.spec);
    std::string got = visualize_sharding(s, c.shape);
    std::vector<std::string> want_lines = split(c.expected, '\n'), got_lines = split(got, '\n');
    // Same grid: the same borders in the same places of the first line's structure.
    auto count = [](const std::string& text, const std::string& sym) {
      size_t n = 0;
      for (size_t p = text.find(sym); p != std::string::npos; p = text.find(sym, p + 1)) ++n;
      return n;
    };
    EXPECT_EQ(count(got_lines[0], "┬"), count(want_lines[0], "┬")) << c.header;
    EXPECT_EQ(count(got, "├"), count(c.expected, "├")) << c.header;
    // JAX's squeezed table also loses each row's text line; meshrt's has one more per row.
    EXPECT_EQ(got_lines.size(), want_lines.size() + count(c.expected, "├") + 1) << c.header;
    std::map<Index, std::set<int>> cells;
    for (auto& [d, idx] : s.devices_indices_map(c.shape)) cells[idx].insert(d.id());
    for (auto& [idx, ids] : cells) {
      std::string label = "CPU ";
      for (int id : ids) label += (label.size() > 4 ? "," : "") + std::to_string(id);
      EXPECT_NE(got.find(label), std::string::npos) << c.header << " lacks " << label << "\n"
                                                    << got;
    }
    for (const std::string& line : got_lines)
      EXPECT_LE(display_width(line), 80u) << c.header << "\n" << got;
  }
  EXPECT_GT(wide, 20);
}

TEST(Visualize, ArrayAndDocExamples) {
  Mesh mesh = make_mesh({4, 2}, {"x", "y"});
  Array a = device_put(std::vector<float>(32), {8, 4}, NamedSharding(mesh, P("x", "y")));
  EXPECT_EQ(visualize_sharding(a),
            "┌───────┬───────┐\n"
            "│ CPU 0 │ CPU 1 │\n"
            "├───────┼───────┤\n"
            "│ CPU 2 │ CPU 3 │\n"
            "├───────┼───────┤\n"
            "│ CPU 4 │ CPU 5 │\n"
            "├───────┼───────┤\n"
            "│ CPU 6 │ CPU 7 │\n"
            "└───────┴───────┘\n");
  Array single = device_put(std::vector<float>(8), {8}, SingleDeviceSharding(devices("cpu")[5]));
  EXPECT_EQ(visualize_sharding(single),
            "┌───────┐\n"  // as jax.debug.visualize_sharding((8,), SingleDeviceSharding(d5))
            "│ CPU 5 │\n"
            "└───────┘\n");
}

TEST(Visualize, Errors) {
  Mesh mesh = make_mesh({2, 2, 2}, {"x", "y", "z"});
  NamedSharding s(mesh, P("x", "y", "z"));
  EXPECT_MESHRT_ERROR(visualize_sharding(s, {2, 2, 2}), "[visualize]",
                      "only works for shapes with 1 and 2 dimensions", "(2, 2, 2)");
  EXPECT_MESHRT_ERROR(visualize_sharding(s, {}), "[visualize]");
  EXPECT_MESHRT_ERROR(visualize_sharding(NamedSharding(mesh, P("x")), {3}), "partitioned 2 times");
  EXPECT_MESHRT_ERROR(visualize_sharding(Array()), "[visualize]");
}

}  // namespace
}  // namespace meshrt
