// visualize_sharding: the layout of jax.debug.visualize_array_sharding (rich, no colour), in
// three parts: the grid of distinct blocks, their labels and padding, and the table drawing.
#include "runtime/visualize.h"

#include <algorithm>
#include <map>
#include <set>

#include "core/error.h"
#include "core/strings.h"
#include "runtime/array.h"
#include "runtime/detail/access.h"
#include "runtime/detail/sharding_impl.h"

namespace meshrt {

namespace {

constexpr int kConsoleWidth = 80;
constexpr int kMinWidth = 9;
constexpr int kMaxWidth = 80;
constexpr int kBaseHeight = 10;
constexpr double kHeightToWidth = 2.5;

// One distinct block: the devices holding it, its share of each dimension, its label and the
// padding around the label (in characters and lines).
struct Cell {
  std::set<int> ids;
  double frac_h = 0;  // < 0 for 1-D (one text line)
  double frac_w = 0;
  std::string text;
  int left = 0, right = 0, top = 0, bottom = 0;
};

int64_t chunk_of(const std::pair<int64_t, int64_t>& r) {
  int64_t size = r.second - r.first;
  return size > 0 ? r.first / size : 0;
}

std::string repeat(const char* s, int n) {
  std::string out;
  for (int i = 0; i < n; ++i) out += s;
  return out;
}

// The table's cells, keyed by (row, column); each holds one distinct block.
struct Grid {
  std::map<std::pair<int64_t, int64_t>, Cell> cells;
  int rows = 0, cols = 0;
  Cell& at(int r, int c) { return cells.at({r, c}); }
  const Cell& at(int r, int c) const { return cells.at({r, c}); }
};

// Grid layout: one cell per distinct block, at its chunk index along each dimension (a 1-D shape
// is one row), with the devices that hold it and its share of the global shape.
Grid layout_grid(const Sharding& sharding, const Shape& shape) {
  std::vector<Index> idx = detail::indices(sharding, shape, "visualize");
  const auto& devs = sharding.device_list();
  Grid g;
  for (size_t i = 0; i < devs.size(); ++i) {
    const Index& ix = idx[i];
    std::pair<int64_t, int64_t> key;
    Cell proto;
    if (shape.size() == 2) {
      key = {chunk_of(ix[0]), chunk_of(ix[1])};
      proto.frac_h = static_cast<double>(ix[0].second - ix[0].first) / shape[0];
      proto.frac_w = static_cast<double>(ix[1].second - ix[1].first) / shape[1];
    } else {
      key = {0, chunk_of(ix[0])};
      proto.frac_h = -1;
      proto.frac_w = static_cast<double>(ix[0].second - ix[0].first) / shape[0];
    }
    auto [it, fresh] = g.cells.emplace(key, proto);
    it->second.ids.insert(devs[i].local_index());
  }
  for (auto& [k, c] : g.cells) {
    g.rows = std::max<int>(g.rows, static_cast<int>(k.first) + 1);
    g.cols = std::max<int>(g.cols, static_cast<int>(k.second) + 1);
  }
  return g;
}

// Labels: "CPU 0,1" centred in a box sized by the block's share of the shape, as rich pads it
// (JAX scales a base height of 10 lines by the aspect ratio; widths are clamped to 9..80).
void label_cells(Grid& g, const std::string& kind, const Shape& shape) {
  const double aspect = (shape.size() == 2 ? static_cast<double>(shape[1]) : 1.0) / shape[0];
  const int base_width = static_cast<int>(kBaseHeight * aspect);
  for (auto& [k, c] : g.cells) {
    c.text = kind + " " + detail::join(c.ids, ",", [](int id) { return std::to_string(id); });
    int width = static_cast<int>(c.frac_w * base_width * kHeightToWidth);
    int height = c.frac_h < 0 ? 1 : static_cast<int>(c.frac_h * kBaseHeight);
    width = std::min(std::max(width, kMinWidth), kMaxWidth);
    // Python's divmod floors; so does this for the negative case.
    int hpad = width - static_cast<int>(c.text.size()) - 2;
    int l = hpad >= 0 ? hpad / 2 : -((-hpad + 1) / 2);
    c.left = std::max(l, 0);
    c.right = std::max(l + (hpad - 2 * l), 0);
    int vpad = height - 2;
    int t = vpad >= 0 ? vpad / 2 : -((-vpad + 1) / 2);
    c.top = std::max(t, 0);
    c.bottom = std::max(t + (vpad - 2 * t), 0);
  }
}

// Each column as wide as its widest padded label.
std::vector<int> column_widths(const Grid& g) {
  std::vector<int> w(static_cast<size_t>(g.cols), 0);
  for (int j = 0; j < g.cols; ++j) {
    for (int i = 0; i < g.rows; ++i) {
      const Cell& c = g.at(i, j);
      w[static_cast<size_t>(j)] =
          std::max(w[static_cast<size_t>(j)], c.left + static_cast<int>(c.text.size()) + c.right);
    }
  }
  return w;
}

// Column widths that fit the console. Where JAX's table overflows the 80-column console, rich
// squeezes the labels away; meshrt trims the horizontal padding instead (one space, then none)
// so the labels stay readable.
std::vector<int> fit_console(Grid& g) {
  std::vector<int> widths = column_widths(g);
  auto total = [&] {
    int t = g.cols + 1;
    for (int w : widths) t += w;
    return t;
  };
  for (int pad : {1, 0}) {
    if (total() <= kConsoleWidth) break;
    for (auto& [k, c] : g.cells) c.left = c.right = pad;
    widths = column_widths(g);
  }
  return widths;
}

// Table drawing: box-drawing rules between rows, each label on its cell's top padding line.
std::string draw_table(const Grid& g, const std::vector<int>& widths) {
  auto rule = [&](const char* l, const char* m, const char* r) {
    std::string s = l;
    for (int j = 0; j < g.cols; ++j) {
      if (j) s += m;
      s += repeat("─", widths[static_cast<size_t>(j)]);
    }
    return s + r + "\n";
  };
  std::string out = rule("┌", "┬", "┐");
  for (int i = 0; i < g.rows; ++i) {
    int h = 0;
    for (int j = 0; j < g.cols; ++j) h = std::max(h, g.at(i, j).top + 1 + g.at(i, j).bottom);
    for (int line = 0; line < h; ++line) {
      out += "│";
      for (int j = 0; j < g.cols; ++j) {
        if (j) out += "│";
        const Cell& c = g.at(i, j);
        int w = widths[static_cast<size_t>(j)];
        if (line != c.top) {
          out += std::string(static_cast<size_t>(w), ' ');
          continue;
        }
        int inner = w - c.left - c.right, len = static_cast<int>(c.text.size());
        int lp = (inner - len) / 2;
        out += std::string(static_cast<size_t>(c.left + lp), ' ') + c.text +
               std::string(static_cast<size_t>(inner - len - lp + c.right), ' ');
      }
      out += "│\n";
    }
    if (i + 1 < g.rows) out += rule("├", "┼", "┤");
  }
  out += rule("└", "┴", "┘");
  return out;
}

}  // namespace

std::string visualize_sharding(const Sharding& sharding, const Shape& shape) {
  if (shape.empty() || shape.size() > 2) {
    throw Error(
        detail::cat("[visualize] `visualize_sharding` only works for shapes with 1 and 2 "
                    "dimensions, but got shape ",
                    shape_str(shape), "; visualize a 1-D or 2-D array (reshape it first)"));
  }
  for (int64_t d : shape) {
    if (d <= 0) {
      throw Error(detail::cat("[visualize] cannot draw shape ", shape_str(shape),
                              ": every dimension must be >= 1"));
    }
  }
  Grid grid = layout_grid(sharding, shape);
  label_cells(grid, sharding.device_list().front().platform() == "cpu" ? "CPU" : "GPU", shape);
  return draw_table(grid, fit_console(grid));
}

std::string visualize_sharding(const Array& x) {
  if (detail::ArrayAccess::blocks(x).empty())
    throw Error("[visualize] cannot visualize an empty (default-constructed) Array");
  return visualize_sharding(x.sharding(), x.shape());
}

}  // namespace meshrt
