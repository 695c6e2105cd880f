// The steps of one shard_map call (runtime/detail/launch.h): JAX's checks on specs and
// arguments, placing inputs, running the bodies on the devices' executors, assembling outputs.
#include "runtime/detail/launch.h"

#include <algorithm>
#include <condition_variable>
#include <cstring>
#include <exception>
#include <mutex>

#include "backends/backend.h"
#include "core/config.h"
#include "core/error.h"
#include "core/strings.h"
#include "core/threads/executor.h"
#include "core/threads/wait.h"
#include "runtime/detail/access.h"
#include "runtime/detail/copy.h"
#include "runtime/detail/platform.h"
#include "runtime/detail/spec_error.h"

namespace meshrt::detail {

namespace {

// Serialises run_bodies (see there).
std::mutex& launch_mutex() {
  static std::mutex* mu = new std::mutex;  // leaked: may be held while static destructors run
  return *mu;
}

// The mesh's axes as a set: "{'x', 'y'}".
std::string axis_set(const Mesh& mesh) {
  std::string s = "{";
  for (size_t i = 0; i < mesh.axis_names().size(); ++i)
    s += cat(i ? ", " : "", quote(mesh.axis_names()[i]));
  return s + "}";
}

// JAX's shard_map errors, worded as JAX words them: unknown axes, duplicates, rank, divisibility.
// `kind` is "in_specs" or "out_specs", `i` the entry; messages are built only on failure (a
// launch checks every spec).
void check_spec_axes(const Mesh& mesh, const PartitionSpec& spec, SpecList list, size_t i) {
  const char* kind = list == SpecList::in ? "in_specs" : "out_specs";
  bool dup = false;
  const std::vector<std::string>& axes = spec.axes();
  for (size_t k = 0; k < axes.size(); ++k) {
    const std::string& a = axes[k];
    if (mesh.axis_position(a) < 0) {
      throw SpecError(list, i,
                      cat("[shard_map] ", kind, "[", i, "] refers to mesh axis ", quote(a),
                          ", but the mesh's axes are ", axis_set(mesh), " (", kind,
                          " may name only those: inside the body every one is manual); check the ",
                          kind, " passed to shard_map"));
    }
    for (size_t j = 0; j < k; ++j) dup = dup || axes[j] == a;
  }
  if (dup) NamedSharding(mesh, spec);  // duplicate axes: DuplicateSpecError's text
}

std::string aval_str(DType dtype, const Shape& shape) {
  std::string s = cat(dtype_name(dtype), "[");
  for (size_t i = 0; i < shape.size(); ++i) s += cat(i ? "," : "", shape[i]);
  return s + "]";
}

// The function's name in JAX's messages: ShardMapOptions::name ("body" when none was given).
std::string fn_name(const ShardMapOptions& options) {
  return quote(options.name.empty() ? std::string("body") : options.name);
}

void check_rank(const PartitionSpec& spec, const Shape& shape, DType dtype, size_t i, bool output,
                const ShardMapOptions& options) {
  if (spec.size() <= shape.size()) return;
  const std::string fn = fn_name(options);
  const std::string what = cat(output ? "out_specs[" : "in_specs[", i, "]");
  std::string msg =
      cat("[shard_map] shard_map applied to the function ", fn, " was given an ",
          output ? "out_specs" : "in_specs",
          " entry which is too long to be compatible with the corresponding ",
          output ? "output value from the function" : "input value from the function", ": ", what,
          " is ", spec.str(), " which has length ", spec.size(), ", but the ",
          output ? "output value" : "passed arg", " has shape ", aval_str(dtype, shape),
          ", which has rank ", shape.size(), " (and ", shape.size(), " < ", spec.size(),
          "). Entries in ", output ? "out_specs" : "in_specs",
          " must be of length no greater than the number of axes in the corresponding ",
          output ? "output" : "input", " value. Either revise the spec to be shorter, or modify ",
          fn, " so that its ", output ? "outputs have" : "inputs have", " sufficient rank.");
  if (shape.empty()) {
    msg += output ? " For scalar values (rank 0), consider using an out_specs entry of `P()`. In "
                    "particular, for "
                    "rank 0 outputs which are not constant over the mesh, add at least one "
                    "(singleton) axis to "
                    "them so that they can be concatenated using out_specs."
                  : " For scalar values (rank 0), consider using an in_specs entry of `P()`.";
  }
  throw SpecError(output ? SpecList::out : SpecList::in, i, msg);
}

void check_divisible(const Mesh& mesh, const PartitionSpec& spec, const Array& x, size_t i,
                     const ShardMapOptions& options) {
  for (size_t d = 0; d < x.shape().size(); ++d) {
    const auto& names = spec[d];
    if (names.empty()) continue;
    int64_t t = 1;
    for (const std::string& a : names) t *= mesh.axis_size(a);
    if (x.shape()[d] % t == 0) continue;
    const std::string fn = fn_name(options);
    std::string to = names.size() == 1
                         ? cat("mesh axis ", quote(names[0]), " (of size ", t, ")")
                         : cat("mesh axes ", names_tuple(names), " (of total size ", t, ")");
    throw SpecError(
        SpecList::in, i,
        cat("[shard_map] shard_map applied to the function ", fn,
            " was given argument arrays with axis "
            "sizes that are not evenly divisible by the corresponding mesh axis sizes: The mesh "
            "given "
            "has shape ",
            shape_str(mesh.shape()), " with corresponding axis names ",
            names_tuple(mesh.axis_names()), ". The passed args[", i, "] of shape ",
            aval_str(x.dtype(), x.shape()), " corresponds to in_specs[", i, "] of value ",
            spec.str(), ", which maps array axis ", d, " (of size ", x.shape()[d], ") to ", to,
            ", but ", t, " does not evenly divide ", x.shape()[d],
            ". Array arguments' axis sizes must be evenly "
            "divisible by the mesh axis or axes indicated by the corresponding elements of the "
            "argument's in_specs entry. Consider checking that in_specs are correct, and if so "
            "consider "
            "changing the mesh axis sizes or else padding the input and adapting ",
            fn, " appropriately."));
  }
}

// a and b: `n` elements of `dtype` in host memory.
std::string first_difference(DType dtype, int64_t n, const char* pa, const char* pb) {
  const size_t elem = dtype_size(dtype);
  for (int64_t i = 0; i < n; ++i) {
    if (std::memcmp(pa + i * elem, pb + i * elem, elem) == 0) continue;
    auto val = [&](const char* p) -> std::string {
      switch (dtype) {
        case DType::f32: {
          float v;
          std::memcpy(&v, p, 4);
          return cat(v);
        }
        case DType::f64: {
          double v;
          std::memcpy(&v, p, 8);
          return cat(v);
        }
        case DType::i32: {
          int32_t v;
          std::memcpy(&v, p, 4);
          return cat(v);
        }
        case DType::i64: {
          int64_t v;
          std::memcpy(&v, p, 8);
          return cat(v);
        }
        case DType::bool_:
          return cat(*p != 0 ? "True" : "False");
        case DType::bf16:
        case DType::f16: {
          uint16_t b;
          std::memcpy(&b, p, 2);
          return cat(dtype == DType::bf16 ? static_cast<float>(bfloat16::from_bits(b))
                                          : static_cast<float>(float16::from_bits(b)));
        }
      }
      return "?";
    };
    return cat("first difference at flat index ", i, ": ", val(pa + i * elem), " vs ",
               val(pb + i * elem));
  }
  return "";
}

// An out_spec that leaves out a mesh axis promises the blocks are equal along it.
void check_replication(const Mesh& mesh, const PartitionSpec& spec,
                       const std::vector<Tensor>& blocks, size_t k) {
  std::vector<std::string> used = spec.axes();
  std::vector<bool> free_axis(mesh.shape().size(), false);
  std::vector<std::string> free_names;
  for (size_t a = 0; a < mesh.shape().size(); ++a) {
    if (mesh.shape()[a] > 1 &&
        std::find(used.begin(), used.end(), mesh.axis_names()[a]) == used.end()) {
      free_axis[a] = true;
      free_names.push_back(mesh.axis_names()[a]);
    }
  }
  if (free_names.empty()) return;
  // Device memory (cuda) is compared in host copies, made once per block that needs it.
  const bool host = backend_of(mesh.devices().front().kind()).host_addressable();
  std::vector<std::vector<char>> copies(host ? 0 : blocks.size());
  auto bytes = [&](size_t i) -> const char* {
    const Tensor& t = blocks[i];
    if (host) return static_cast<const char*>(t.data());
    if (copies[i].empty() && t.nbytes() > 0) {
      copies[i].resize(static_cast<size_t>(t.nbytes()));
      copy_box({copies[i].data(), t.shape(), Shape(t.shape().size(), 0), Device(), true},
               {t.data(), t.shape(), Shape(t.shape().size(), 0), t.device(), false}, t.shape(),
               dtype_size(t.dtype()));
    }
    return copies[i].data();
  };
  for (int64_t pos = 0; pos < mesh.size(); ++pos) {
    std::vector<int64_t> c = mesh.coords(pos);
    int64_t rep = 0;  // same coordinates, 0 on every free axis
    for (size_t a = 0; a < c.size(); ++a) rep = rep * mesh.shape()[a] + (free_axis[a] ? 0 : c[a]);
    if (rep == pos) continue;
    // Several processes: each checks the pairs it holds (the representative may be remote).
    if (!blocks[static_cast<size_t>(pos)].valid() || !blocks[static_cast<size_t>(rep)].valid())
      continue;
    const Tensor& x = blocks[static_cast<size_t>(pos)];
    const char* xb = bytes(static_cast<size_t>(pos));
    const char* rb = bytes(static_cast<size_t>(rep));
    if (std::memcmp(xb, rb, x.nbytes()) == 0) continue;
    std::string axis;  // the first free axis along which the two differ
    std::vector<int64_t> rc = mesh.coords(rep);
    for (size_t a = 0; a < c.size(); ++a) {
      if (c[a] != rc[a]) {
        axis = mesh.axis_names()[a];
        break;
      }
    }
    throw SpecError(
        SpecList::out, k,
        cat("[shard_map] out_specs[", k, "] is ", spec.str(),
            " which implies that the corresponding output value is replicated across mesh axis ",
            quote(axis), ", but ", mesh.devices()[static_cast<size_t>(rep)].str(), " and ",
            mesh.devices()[static_cast<size_t>(pos)].str(), " hold different values (",
            first_difference(x.dtype(), x.size(), rb, xb),
            "). Reduce over that axis first (psum/pmean), name the axis in "
            "out_specs, or pass ShardMapOptions{.check_replication = false}"));
  }
}

// What the devices' tasks report back to run_bodies.
struct Outcome {
  std::mutex mu;
  std::condition_variable cv;
  int64_t remaining = 0;                     // guarded by mu
  std::atomic<uint32_t> done{0};             // 1 once remaining == 0; set under mu
  std::vector<std::exception_ptr> errors;    // guarded by mu
  std::vector<int64_t> order;                // guarded by mu: positions in the order they failed
  std::vector<std::vector<Tensor>> outputs;  // slot `pos` written by device pos's task only
};

[[noreturn]] void rethrow_named(std::exception_ptr ep, const Device& d) {
  try {
    std::rethrow_exception(ep);
  } catch (const Error& e) {
    std::throw_with_nested(Error(cat("[shard_map] body on ", d.str(), " failed: ", e.what())));
  } catch (const std::exception& e) {
    std::throw_with_nested(Error(cat("[shard_map] body on ", d.str(), " threw: ", e.what())));
  } catch (...) {
    std::throw_with_nested(
        Error(cat("[shard_map] body on ", d.str(), " threw a non-std exception")));
  }
}

// Whether x's blocks are already those of NamedSharding(mesh, spec) (specs equal up to trailing
// unsharded dimensions), with nothing pending.
bool placed_as(const Array& x, const Mesh& mesh, const PartitionSpec& spec) {
  const std::optional<NamedSharding> named = x.sharding().as_named();
  return named && x.pending_sum_axes().empty() && named->mesh() == mesh &&
         same_placement(named->spec(), spec);
}

}  // namespace

void check_call(const Mesh& mesh, const std::vector<PartitionSpec>& in_specs,
                const std::vector<PartitionSpec>& out_specs, size_t arg_count) {
  if (core::on_executor()) {  // only bodies run on device executors
    throw Error(
        "[shard_map] shard_map called inside a shard_map body; nesting is not supported: call "
        "it from the host, or use collectives inside the one body");
  }
  if (in_specs.size() != arg_count) {
    throw Error(cat("[shard_map] in_specs has ", in_specs.size(), " entries but the call passed ",
                    arg_count,
                    " arguments; give one PartitionSpec per argument (in_specs[i] for args[i])"));
  }
  for (size_t i = 0; i < in_specs.size(); ++i) check_spec_axes(mesh, in_specs[i], SpecList::in, i);
  for (size_t i = 0; i < out_specs.size(); ++i)
    check_spec_axes(mesh, out_specs[i], SpecList::out, i);
}

std::vector<Array> place_inputs(const Mesh& mesh, const std::vector<PartitionSpec>& in_specs,
                                const std::vector<Array>& args, const ShardMapOptions& options) {
  std::vector<Array> placed;
  placed.reserve(args.size());
  for (size_t i = 0; i < args.size(); ++i) {
    const Array& x = args[i];
    if (ArrayAccess::blocks(x).empty())
      throw Error(cat("[shard_map] args[", i, "] is an empty (default-constructed) Array"));
    if (x.sharding().platform() != mesh.platform()) {
      throw SpecError(SpecList::in, i,
                      cat("[shard_map] args[", i, "] lives on the ", x.sharding().platform(),
                          " platform but the mesh is on ", mesh.platform(),
                          "; move it explicitly with "
                          "device_put(x, NamedSharding(mesh, in_specs[",
                          i, "]))"));
    }
    check_rank(in_specs[i], x.shape(), x.dtype(), i, false, options);
    check_divisible(mesh, in_specs[i], x, i, options);
    if (placed_as(x, mesh, in_specs[i]))
      placed.push_back(x);  // already there (the common case): no sharding to build or compare
    else
      placed.push_back(device_put(x, NamedSharding(mesh, in_specs[i])));
  }
  return placed;
}

std::vector<std::vector<Tensor>> run_bodies(const Mesh& mesh, const ErasedBody& body,
                                            const std::vector<Array>& inputs) {
  // Executors run tasks in order: two runs interleaved could each wait on a device busy with the
  // other's body.
  std::lock_guard<std::mutex> serial(launch_mutex());
  const auto n = static_cast<size_t>(mesh.size());
  // Several processes: this one runs the bodies of its own devices only.
  int64_t local = 0;
  for (const Device& d : mesh.devices()) local += is_local(d) ? 1 : 0;
  auto launch = std::make_shared<Launch>(mesh, config::collective_timeout(), oversubscribed(local));
  Outcome outcome;
  outcome.remaining = local;
  outcome.errors.resize(n);
  outcome.outputs.resize(n);
  // The caller runs the first local device's executor while it waits, where the executor allows
  // it (see below); claimed before the submissions so that they do not wake its thread.
  const auto first = std::find_if(mesh.devices().begin(), mesh.devices().end(), is_local);
  backend::Backend* const driven = local > 0 ? &backend_of(*first) : nullptr;
  const bool claimed = driven != nullptr && driven->claim(first->local_index());
  for (size_t pos = 0; pos < n; ++pos) {
    const Device dev = mesh.devices()[pos];
    if (!is_local(dev)) continue;
    backend_of(dev).submit(dev.local_index(), [&, pos] {
      bool threw = false;
      try {
        std::vector<Tensor> blocks;
        blocks.reserve(inputs.size());
        for (const Array& a : inputs) blocks.push_back(ArrayAccess::blocks(a)[pos]);
        BodyState state{launch, static_cast<int64_t>(pos), {}};
        Context ctx = state.context();
        outcome.outputs[pos] = body(ctx, blocks);
      } catch (...) {
        threw = true;
        std::lock_guard<std::mutex> lock(outcome.mu);
        outcome.errors[pos] = std::current_exception();
        outcome.order.push_back(static_cast<int64_t>(pos));
      }
      // Record first, then release peers: their errors come after this device's own.
      launch->session.device_finished(static_cast<int64_t>(pos), threw);
      std::lock_guard<std::mutex> lock(outcome.mu);
      if (--outcome.remaining == 0) {
        outcome.done.store(1, std::memory_order_release);
        outcome.cv.notify_all();
      }
    });
  }
  if (local > 0) {
    // A short body ends within microseconds, sooner than a futex sleep and wake-up: the caller
    // runs the first local device's fibers itself where it could claim them, else waits
    // without sleeping for a while, then sleeps. Taking the lock at the end also waits for the
    // last task to leave its critical section before `outcome` goes.
    if (!(claimed && driven->drive(first->local_index(), outcome.done)))
      core::spin_while(outcome.done, 0, core::kSpinBudget, true);
    std::unique_lock<std::mutex> lock(outcome.mu);
    outcome.cv.wait(lock, [&] { return outcome.remaining == 0; });
  }
  if (!outcome.order.empty()) {
    const auto first = static_cast<size_t>(outcome.order.front());
    rethrow_named(outcome.errors[first], mesh.devices()[first]);
  }
  return std::move(outcome.outputs);
}

std::vector<Array> assemble_outputs(const Mesh& mesh, const std::vector<PartitionSpec>& out_specs,
                                    std::vector<std::vector<Tensor>> outputs,
                                    const ShardMapOptions& options) {
  const auto n = static_cast<size_t>(mesh.size());
  std::vector<Array> results;
  results.reserve(out_specs.size());
  for (size_t k = 0; k < out_specs.size(); ++k) {
    std::vector<Tensor> blocks;
    blocks.reserve(n);
    const Tensor* first = nullptr;  // the first local block: shape and dtype
    for (size_t pos = 0; pos < n; ++pos) {
      std::vector<Tensor>& outs = outputs[pos];
      const Device dev = mesh.devices()[pos];
      if (!is_local(dev)) {  // another process's device: its block lives there
        blocks.emplace_back();
        continue;
      }
      if (outs.size() != out_specs.size()) {
        throw Error(cat("[shard_map] the body on ", dev.str(), " returned ", outs.size(),
                        " outputs but out_specs "
                        "has ",
                        out_specs.size(), " entries"));
      }
      Tensor& t = outs[k];
      if (!t.valid())
        throw Error(cat("[shard_map] output ", k, " on ", dev.str(), " is an empty Tensor"));
      if (t.device() != dev) {
        throw Error(cat("[shard_map] output ", k, " of the body on ", dev.str(), " lives on ",
                        t.device().str(),
                        "; a body returns tensors of its own device (ctx.device())"));
      }
      if (first != nullptr && (t.shape() != first->shape() || t.dtype() != first->dtype())) {
        throw Error(cat("[shard_map] output ", k, " is ", aval_str(first->dtype(), first->shape()),
                        " on ", first->device().str(), " but ", aval_str(t.dtype(), t.shape()),
                        " on ", dev.str(),
                        "; every device must return blocks of one shape and dtype"));
      }
      blocks.push_back(std::move(t));
      if (first == nullptr) first = &blocks.back();
    }
    if (first == nullptr) {
      throw Error(cat("[shard_map] this process (", process_layout().rank,
                      ") holds no device of the mesh, so it cannot run the call; make every "
                      "process's mesh include some of its devices"));
    }
    const Tensor ref = *first;
    const PartitionSpec& spec = out_specs[k];
    check_rank(spec, ref.shape(), ref.dtype(), k, true, options);
    if (options.check_replication) check_replication(mesh, spec, blocks, k);
    Shape global = ref.shape();
    for (size_t d = 0; d < global.size(); ++d) {
      for (const std::string& a : spec[d]) global[d] *= mesh.axis_size(a);
    }
    results.push_back(
        ArrayAccess::make(global, ref.dtype(), NamedSharding(mesh, spec), std::move(blocks)));
  }
  return results;
}

}  // namespace meshrt::detail
