// shard_map: JAX's checks, then the launch's steps in order (runtime/detail/launch.h).
#include "runtime/shard_map.h"

#include <cxxabi.h>

#include <cstdlib>
#include <memory>

#include "core/error.h"
#include "core/strings.h"
#include "runtime/detail/launch.h"
#include "runtime/detail/trace.h"

namespace meshrt {

namespace {
std::vector<Array> run_untraced(const detail::ErasedBody& body, const Mesh& mesh,
                                const std::vector<PartitionSpec>& in_specs,
                                const std::vector<PartitionSpec>& out_specs,
                                const std::vector<Array>& args, const ShardMapOptions& options) {
  detail::check_call(mesh, in_specs, out_specs, args.size());
  std::vector<Array> inputs = detail::place_inputs(mesh, in_specs, args, options);
  std::vector<std::vector<Tensor>> outputs = detail::run_bodies(mesh, body, inputs);
  return detail::assemble_outputs(mesh, out_specs, std::move(outputs), options);
}

// Under a jit trace: jit's tracer (the first) records the call, with `body` as given (a tape's
// tracing body, when a tape inside the jitted function differentiates it).
std::vector<Array> run_in_jit(const detail::ErasedBody& body, const Mesh& mesh,
                              const std::vector<PartitionSpec>& in_specs,
                              const std::vector<PartitionSpec>& out_specs,
                              const std::vector<Array>& args, const ShardMapOptions& options) {
  detail::TraceState* s = detail::trace_state();
  std::optional<std::vector<Array>> out;
  if (s != nullptr && s->jit && !s->tracers.empty()) {
    out = s->tracers.front()->shard_map(&run_untraced, body, mesh, in_specs, out_specs, args,
                                        options);
  }
  if (!out) throw Error("[jit] internal: a shard_map under jit that jit's tracer did not record");
  return std::move(*out);
}
}  // namespace

std::vector<Array> detail::run_shard_map(const ErasedBody& body, const Mesh& mesh,
                                         const std::vector<PartitionSpec>& in_specs,
                                         const std::vector<PartitionSpec>& out_specs,
                                         const std::vector<Array>& args,
                                         const ShardMapOptions& options) {
  // A shard_map the runtime makes for itself (the global view's, under Untraced) is no op of the
  // user's: it runs as it is (jit records its launches through the global view's observer).
  if (tracing()) {
    // Differentiated: the innermost tracer following an argument runs it. Under jit, through
    // jit's tracer (the outermost), which records it: it is the last tracer asked, and the `run`
    // the others get.
    check_call(mesh, in_specs, out_specs, args.size());
    const bool jit = trace_state()->jit;
    const std::vector<Tracer*> tracers = trace_state()->tracers;
    const RunShardMap run = jit ? &run_in_jit : &run_untraced;
    for (auto t = tracers.rbegin(); t != tracers.rend(); ++t) {
      std::optional<std::vector<Array>> out =
          (*t)->shard_map(run, body, mesh, in_specs, out_specs, args, options);
      if (out) return std::move(*out);
    }
  }
  return run_untraced(body, mesh, in_specs, out_specs, args, options);
}

namespace {

// `name` split at its top-level "::" (not inside (), <>, [] or {}).
std::vector<std::string> scope_parts(const std::string& name) {
  std::vector<std::string> parts(1);
  int depth = 0;
  for (size_t i = 0; i < name.size(); ++i) {
    const char c = name[i];
    if (c == '(' || c == '<' || c == '[' || c == '{') ++depth;
    if (c == ')' || c == '>' || c == ']' || c == '}') --depth;
    if (depth == 0 && c == ':' && i + 1 < name.size() && name[i + 1] == ':') {
      parts.emplace_back();
      ++i;
      continue;
    }
    parts.back() += c;
  }
  return parts;
}

// "bar(int) const" -> "bar", "Step<float, 2>" -> "Step", "void run<int>(int)" -> "run".
std::string bare(std::string part) {
  int depth = 0;
  for (size_t i = 0; i < part.size(); ++i) {  // cut at the first top-level ( or <
    const char c = part[i];
    if ((c == '(' || c == '<') && depth == 0 && i > 0) {
      part.resize(i);
      break;
    }
    if (c == '(' || c == '<') ++depth;
    if (c == ')' || c == '>') --depth;
  }
  const size_t space = part.rfind(' ');  // a template function's return type
  return space == std::string::npos ? part : part.substr(space + 1);
}

}  // namespace

std::string detail::body_type_name(const std::type_info& type) {
  int status = 0;
  std::unique_ptr<char, void (*)(void*)> demangled(
      abi::__cxa_demangle(type.name(), nullptr, nullptr, &status), std::free);
  const std::string full = status == 0 && demangled ? demangled.get() : type.name();
  // Function pointers and std::function carry no name in their type.
  if (full.find("(*)") != std::string::npos || full.rfind("std::function<", 0) == 0) return "body";
  std::vector<std::string> parts = scope_parts(full);
  auto is_lambda = [](const std::string& p) { return p.rfind("{lambda(", 0) == 0; };
  if (!is_lambda(parts.back())) return bare(parts.back());
  // A lambda: named after the innermost enclosing function that is not itself a lambda's call.
  for (size_t i = parts.size() - 1; i-- > 0;) {
    if (is_lambda(parts[i]) || parts[i].rfind("operator()", 0) == 0) continue;
    const std::string fn = bare(parts[i]);
    if (!fn.empty() && fn != "(anonymous namespace)") return cat("<lambda in ", fn, ">");
    break;
  }
  return "<lambda>";
}

void detail::throw_single_output_braced(size_t count, const ShardMapOptions& options) {
  throw Error(cat("[shard_map] out_specs is a list of ", count, " PartitionSpecs but the function ",
                  quote(options.name),
                  " returns one Tensor; return std::vector<Tensor> (one per out_spec), or give "
                  "out_specs as one PartitionSpec"));
}

}  // namespace meshrt
