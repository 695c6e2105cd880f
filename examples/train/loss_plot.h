// examples/train/loss_plot.h: a loss curve as a standalone SVG document (no dependency): one
// polyline with one point per step, axes with tick labels, a title.
#pragma once

#include <string>
#include <vector>

namespace train {

// The SVG text for losses[i] at step first_step + i; an empty or non-finite curve still gives
// a well-formed document (axes only).
std::string loss_svg(const std::vector<double>& losses, int first_step, const std::string& title);

// Writes `text` to `path`; false (errno set) when the file cannot be written.
bool write_text(const std::string& path, const std::string& text);

}  // namespace train
