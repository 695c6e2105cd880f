#include "examples/train/loss_plot.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>

namespace train {

namespace {

std::string num(double v, const char* fmt = "%.2f") {
  char buf[64];
  std::snprintf(buf, sizeof(buf), fmt, v);
  return buf;
}

std::string escape(const std::string& s) {
  std::string out;
  for (char c : s) {
    switch (c) {
      case '&':
        out += "&amp;";
        break;
      case '<':
        out += "&lt;";
        break;
      case '>':
        out += "&gt;";
        break;
      case '"':
        out += "&quot;";
        break;
      default:
        out += c;
    }
  }
  return out;
}

// Tick positions covering [lo, hi]: 1, 2 or 5 times a power of ten apart, about five of them.
std::vector<double> ticks(double lo, double hi) {
  const double raw = (hi - lo) / 5.0;
  const double p = std::pow(10.0, std::floor(std::log10(raw)));
  const double step = raw / p < 1.5 ? p : raw / p < 3.5 ? 2 * p : raw / p < 7.5 ? 5 * p : 10 * p;
  std::vector<double> out;
  for (double t = std::ceil(lo / step) * step; t <= hi + step * 1e-9; t += step) out.push_back(t);
  return out;
}

}  // namespace

std::string loss_svg(const std::vector<double>& losses, int first_step, const std::string& title) {
  constexpr double kW = 640, kH = 400, kLeft = 70, kRight = 20, kTop = 40, kBottom = 50;
  const double pw = kW - kLeft - kRight, ph = kH - kTop - kBottom;
  double lo = 0, hi = 1;
  bool any = false;
  for (double v : losses) {
    if (!std::isfinite(v)) continue;
    lo = any ? std::min(lo, v) : v;
    hi = any ? std::max(hi, v) : v;
    any = true;
  }
  lo = std::min(lo, 0.0);  // the loss axis starts at 0 (losses here are sums of squares)
  if (hi <= lo) hi = lo + 1;
  const double x0 = first_step, x1 = first_step + std::max<double>(1, double(losses.size()) - 1);
  auto sx = [&](double x) { return kLeft + (x - x0) / (x1 - x0) * pw; };
  auto sy = [&](double y) { return kTop + (hi - y) / (hi - lo) * ph; };

  std::string s;
  s += "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n";
  s += "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"" + num(kW, "%.0f") + "\" height=\"" +
       num(kH, "%.0f") + "\" viewBox=\"0 0 " + num(kW, "%.0f") + " " + num(kH, "%.0f") +
       "\" font-family=\"sans-serif\" font-size=\"12\">\n";
  s += "<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n";
  s += "<text x=\"" + num(kW / 2) + "\" y=\"24\" text-anchor=\"middle\" font-size=\"14\">" +
       escape(title) + "</text>\n";
  // Grid and tick labels, then the axes over them.
  s += "<g fill=\"black\">\n";
  for (double t : ticks(x0, x1)) {
    const double x = sx(t);
    s += "<line x1=\"" + num(x) + "\" y1=\"" + num(kTop + ph) + "\" x2=\"" + num(x) + "\" y2=\"" +
         num(kTop + ph + 5) + "\" stroke=\"black\"/>\n";
    s += "<text x=\"" + num(x) + "\" y=\"" + num(kTop + ph + 18) + "\" text-anchor=\"middle\">" +
         num(t, "%g") + "</text>\n";
  }
  for (double t : ticks(lo, hi)) {
    const double y = sy(t);
    s += "<line x1=\"" + num(kLeft) + "\" y1=\"" + num(y) + "\" x2=\"" + num(kLeft + pw) +
         "\" y2=\"" + num(y) + "\" stroke=\"#dddddd\"/>\n";
    s += "<text x=\"" + num(kLeft - 6) + "\" y=\"" + num(y + 4) + "\" text-anchor=\"end\">" +
         num(t, "%g") + "</text>\n";
  }
  s += "<text x=\"" + num(kLeft + pw / 2) + "\" y=\"" + num(kH - 10) +
       "\" text-anchor=\"middle\">step</text>\n";
  s += "<text x=\"18\" y=\"" + num(kTop + ph / 2) +
       "\" text-anchor=\"middle\" transform=\"rotate(-90 18 " + num(kTop + ph / 2) +
       ")\">loss</text>\n";
  s += "</g>\n";
  s += "<g stroke=\"black\" stroke-width=\"1\">\n";
  s += "<line x1=\"" + num(kLeft) + "\" y1=\"" + num(kTop + ph) + "\" x2=\"" + num(kLeft + pw) +
       "\" y2=\"" + num(kTop + ph) + "\"/>\n";
  s += "<line x1=\"" + num(kLeft) + "\" y1=\"" + num(kTop) + "\" x2=\"" + num(kLeft) + "\" y2=\"" +
       num(kTop + ph) + "\"/>\n";
  s += "</g>\n";
  // The curve: one point per finite loss.
  s += "<polyline fill=\"none\" stroke=\"#1f77b4\" stroke-width=\"1.5\" points=\"";
  bool first = true;
  for (size_t i = 0; i < losses.size(); ++i) {
    if (!std::isfinite(losses[i])) continue;
    if (!first) s += ' ';
    s += num(sx(first_step + double(i))) + "," + num(sy(losses[i]));
    first = false;
  }
  s += "\"/>\n</svg>\n";
  return s;
}

bool write_text(const std::string& path, const std::string& text) {
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  f << text;
  f.close();
  return static_cast<bool>(f);
}

}  // namespace train
