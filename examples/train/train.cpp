// meshrt-train: the seed MLP (examples/mlp) trained for real: adamw with a warmup-cosine
// schedule behind global-norm clipping, the whole step jitted (value_and_grad + update +
// apply_updates, params and optimizer state donated), under data parallelism, FSDP or 2-D
// (data x tensor), with checkpoints every N steps that a later run resumes on any mesh.
//
//   MESHRT_CPU_DEVICES=8 build/examples/meshrt-train --strategy fsdp --dir /tmp/ckpt
//   MESHRT_CPU_DEVICES=8 build/examples/meshrt-train --strategy 2d --mesh 4x2 --dir /tmp/ckpt
//   --resume
//
// The data is a deterministic function of the step (batch k is drawn from random::key(k)), so a
// resumed run sees the batches the interrupted one would have. Process 0 prints; the same program
// runs under mpirun. --precision bf16 trains in mixed precision (mlp::Precision::bf16): the
// parameters, optimizer state and checkpoints stay float32, the layers run in bfloat16.
#include <meshrt/meshrt.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <map>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include "examples/mlp/mlp.h"
#include "examples/train/loss_plot.h"

using namespace meshrt;

namespace train {

struct Batch {
  Array x, y;
};
MESHRT_TREE(Batch, x, y);

// What a checkpoint holds (the step is the checkpoint's number).
struct TrainState {
  mlp::Params params;
  optim::State<mlp::Params> opt_state;
};
MESHRT_TREE(TrainState, params, opt_state);

struct Options {
  std::string strategy = "fsdp";
  std::string mesh;  // "8", "4x2"; default: every device (2d: n/2 x 2)
  int64_t steps = 50, batch = 64, hidden = 128, depth = 5;
  double lr = 1e-2, weight_decay = 1e-4, clip = 1.0;
  int64_t warmup = 5;
  int64_t save_every = 10, keep = 0;
  std::string dir = "train_ckpt";
  bool resume = false, async_save = false;
  int64_t kill_after_save = -1;
  std::string plot = "train_loss.svg";
  std::string compare_with;
  mlp::Precision precision = mlp::Precision::f32;
};

const char* kUsage = R"(usage: meshrt-train [flags]
  --strategy S        dp | fsdp | 2d (data x tensor)                  [fsdp]
  --mesh M            the mesh over the first devices: 8, 4, 4x2 ...  [every device; 2d: n/2 x 2]
  --steps N           training steps (the schedule spans them)        [50]
  --batch B           examples per step (divisible by the batch axis) [64]
  --hidden H          width of each hidden layer                      [128]
  --depth D           hidden layers                                   [5]
  --lr LR             peak learning rate (warmup_cosine_decay)        [1e-2]
  --warmup W          warmup steps                                    [5]
  --weight-decay WD   adamw's decoupled weight decay                  [1e-4]
  --clip C            clip_by_global_norm's max norm                  [1.0]
  --save-every K      checkpoint every K steps (0: never)             [10]
  --keep N            keep the N newest checkpoints (0: all)          [0]
  --dir DIR           checkpoint folder                               [train_ckpt]
  --async-save        write checkpoints in the background
  --resume            continue from DIR's newest checkpoint (any mesh and strategy)
  --kill-after-save K exit at once with status 137 after step K's save (a crash stand-in)
  --compare-with DIR2 at the end, compare params and state with DIR2's checkpoint of the last step
  --plot FILE         loss plot, SVG                                  [train_loss.svg]
  --precision P       f32 | bf16 (mixed: f32 parameters and optimizer
                      state, bf16 layers, f32 loss and gradients)     [f32]
  --help
Sizes: the MLP is [784, H x D, 8] (examples/mlp), the synthetic data x ~ N(0, 1) and
y = x @ T (a fixed random teacher T), batch k drawn from random::key(k).
Numbers are bit-reproducible with MESHRT_DETERMINISTIC=1 (collectives fold in device order).
)";

Options parse(int argc, char** argv) {
  Options o;
  auto value = [&](int& i) -> std::string {
    if (i + 1 >= argc) throw std::runtime_error(std::string(argv[i]) + " needs a value");
    return argv[++i];
  };
  auto integer = [&](int& i) {
    const std::string flag = argv[i], v = value(i);
    char* end = nullptr;
    const long long n = std::strtoll(v.c_str(), &end, 10);
    if (v.empty() || *end != '\0') throw std::runtime_error(flag + " " + v + ": not an integer");
    return static_cast<int64_t>(n);
  };
  auto real = [&](int& i) {
    const std::string flag = argv[i], v = value(i);
    char* end = nullptr;
    const double d = std::strtod(v.c_str(), &end);
    if (v.empty() || *end != '\0') throw std::runtime_error(flag + " " + v + ": not a number");
    return d;
  };
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--help" || a == "-h") {
      std::fputs(kUsage, stdout);
      std::exit(0);
    } else if (a == "--strategy") {
      o.strategy = value(i);
    } else if (a == "--mesh") {
      o.mesh = value(i);
    } else if (a == "--steps") {
      o.steps = integer(i);
    } else if (a == "--batch") {
      o.batch = integer(i);
    } else if (a == "--hidden") {
      o.hidden = integer(i);
    } else if (a == "--depth") {
      o.depth = integer(i);
    } else if (a == "--lr") {
      o.lr = real(i);
    } else if (a == "--warmup") {
      o.warmup = integer(i);
    } else if (a == "--weight-decay") {
      o.weight_decay = real(i);
    } else if (a == "--clip") {
      o.clip = real(i);
    } else if (a == "--save-every") {
      o.save_every = integer(i);
    } else if (a == "--keep") {
      o.keep = integer(i);
    } else if (a == "--dir") {
      o.dir = value(i);
    } else if (a == "--async-save") {
      o.async_save = true;
    } else if (a == "--resume") {
      o.resume = true;
    } else if (a == "--kill-after-save") {
      o.kill_after_save = integer(i);
    } else if (a == "--compare-with") {
      o.compare_with = value(i);
    } else if (a == "--plot") {
      o.plot = value(i);
    } else if (a == "--precision") {
      const std::string v = value(i);
      if (v != "f32" && v != "bf16") throw std::runtime_error("--precision takes f32 or bf16");
      o.precision = v == "bf16" ? mlp::Precision::bf16 : mlp::Precision::f32;
    } else {
      throw std::runtime_error("unknown flag '" + a + "' (--help lists them)");
    }
  }
  if (o.steps < 1 || o.batch < 1 || o.hidden < 1 || o.depth < 1 || o.warmup < 0 ||
      o.warmup > o.steps || o.save_every < 0 || o.keep < 0) {
    throw std::runtime_error(
        "--steps, --batch, --hidden, --depth must be positive, 0 <= --warmup <= --steps, "
        "--save-every and --keep >= 0");
  }
  return o;
}

mlp::Strategy strategy_of(const std::string& s) {
  if (s == "dp") return mlp::Strategy::data_parallel;
  if (s == "fsdp") return mlp::Strategy::fsdp;
  if (s == "2d") return mlp::Strategy::data_tensor_2d;
  throw std::runtime_error("--strategy " + s + ": one of dp, fsdp, 2d");
}

Mesh make_train_mesh(const Options& o) {
  const auto n = static_cast<int64_t>(devices().size());
  Shape shape;
  if (o.mesh.empty()) {
    shape = o.strategy == "2d" ? Shape{n / 2, 2} : Shape{n};
  } else {
    std::stringstream in(o.mesh);
    std::string part;
    while (std::getline(in, part, 'x')) {
      char* end = nullptr;
      const long long v = std::strtoll(part.c_str(), &end, 10);
      if (part.empty() || *end != '\0' || v < 1) {
        throw std::runtime_error("--mesh " + o.mesh + ": sizes separated by 'x', e.g. 8 or 4x2");
      }
      shape.push_back(v);
    }
  }
  if (shape.empty() || shape.size() > 2) throw std::runtime_error("--mesh: one or two axes");
  if (o.strategy == "2d" && shape.size() != 2) {
    throw std::runtime_error("--strategy 2d needs a 2-D mesh (batch x feats), e.g. --mesh 4x2");
  }
  std::vector<std::string> names{"batch"};
  if (shape.size() == 2) names.push_back("feats");
  return make_mesh(shape, names);
}

std::string mesh_str(const Mesh& m) {
  std::string s;
  for (const std::string& a : m.axis_names()) {
    s += (s.empty() ? "" : "x") + std::to_string(m.axis_size(a));
  }
  return s;
}

// The synthetic regression task: x ~ N(0, 1) from random::key(step), y = x @ T for a fixed
// teacher T ~ N(0, 1/n_in). A pure function of the step: every run sees the same batch k.
class Dataset {
 public:
  Dataset(int64_t n_in, int64_t n_out) : n_in_(n_in), n_out_(n_out) {
    const std::vector<double> t =
        random::normal_values(random::key(0x7eac4e7), {n_in, n_out}, DType::f32);
    teacher_.resize(t.size());
    for (size_t i = 0; i < t.size(); ++i) teacher_[i] = t[i] / std::sqrt(double(n_in));
  }

  Batch at(int64_t step, int64_t batch, const NamedSharding& sharding) const {
    const std::vector<random::Key> k = random::split(random::key(static_cast<uint64_t>(step)));
    const std::vector<double> xd = random::normal_values(k[0], {batch, n_in_}, DType::f32);
    std::vector<float> x(xd.begin(), xd.end()), y(static_cast<size_t>(batch * n_out_));
    for (int64_t r = 0; r < batch; ++r) {
      for (int64_t c = 0; c < n_out_; ++c) {
        double acc = 0;
        for (int64_t i = 0; i < n_in_; ++i) acc += xd[r * n_in_ + i] * teacher_[i * n_out_ + c];
        y[r * n_out_ + c] = static_cast<float>(acc);
      }
    }
    return Batch{device_put(x, {batch, n_in_}, sharding), device_put(y, {batch, n_out_}, sharding)};
  }

 private:
  int64_t n_in_, n_out_;
  std::vector<double> teacher_;  // (n_in, n_out), row-major
};

// An Array's values on this process (gathered from the other processes when it spans them).
std::vector<float> host_floats(const Array& a) {
  bool local = true;
  for (const Device& d : a.sharding().device_list())
    local = local && d.process_index() == process_index();
  const Tensor t = local ? Tensor() : process_allgather(a);
  if (a.dtype() == DType::f32) return local ? a.to_vector<float>() : t.to_vector<float>();
  const std::vector<int32_t> v = local ? a.to_vector<int32_t>() : t.to_vector<int32_t>();
  return std::vector<float>(v.begin(), v.end());
}

// FNV-1a (64-bit) over the bytes of every leaf's values, in tree order.
template <class Tree>
uint64_t checksum(const Tree& tree, size_t* count) {
  uint64_t h = 1469598103934665603ull;
  *count = 0;
  for (const Array& a : tree_leaves(tree)) {
    std::vector<unsigned char> bytes;
    if (a.dtype() == DType::f32) {
      const std::vector<float> v = host_floats(a);
      bytes.resize(v.size() * sizeof(float));
      if (!v.empty()) std::memcpy(bytes.data(), v.data(), bytes.size());
      *count += v.size();
    } else {
      const std::vector<float> v = host_floats(a);  // int32 counts, exact in float
      for (float f : v) {
        const auto i = static_cast<int32_t>(f);
        const auto* p = reinterpret_cast<const unsigned char*>(&i);
        bytes.insert(bytes.end(), p, p + sizeof(i));
      }
      *count += v.size();
    }
    for (unsigned char b : bytes) h = (h ^ b) * 1099511628211ull;
  }
  return h;
}

std::string join(const std::vector<double>& v) {
  std::string s;
  char buf[32];
  for (double x : v) {
    std::snprintf(buf, sizeof(buf), "%.9g", x);  // round-trips a float
    s += (s.empty() ? "" : " ") + std::string(buf);
  }
  return s;
}

std::vector<double> split_numbers(const std::string& s) {
  std::vector<double> out;
  std::stringstream in(s);
  double v;
  while (in >> v) out.push_back(v);
  return out;
}

int run(const Options& o) {
  const bool printer = process_index() == 0;
  const mlp::Strategy strategy = strategy_of(o.strategy);
  const Mesh mesh = make_train_mesh(o);
  const mlp::Placement at = mlp::placement(strategy, mesh);
  const NamedSharding data_sharding(mesh, at.x);

  std::vector<int64_t> sizes{784};
  for (int64_t i = 0; i < o.depth; ++i) sizes.push_back(o.hidden);
  sizes.push_back(8);
  // The parameters as the seed initialises them (its x, y unused: the data comes per step).
  const mlp::Problem init = mlp::init(random::key(0), sizes, 1);
  mlp::Params params = mlp::device_put_params(init, strategy, mesh);

  const optim::Schedule schedule = optim::warmup_cosine_decay(0.0, o.lr, o.warmup, o.steps);
  const optim::GradientTransformation opt = optim::chain(
      optim::clip_by_global_norm(o.clip), optim::adamw(schedule, 0.9, 0.999, 1e-8, o.weight_decay));
  optim::State<mlp::Params> opt_state = opt.init(params);

  // Resume: the newest complete step, restored onto this run's mesh and shardings.
  int64_t start = 0;
  std::vector<double> losses;
  const std::optional<int64_t> found = checkpoint::latest(o.dir);
  if (found && !o.resume) {
    throw std::runtime_error(o.dir + " holds checkpoints (newest: step " + std::to_string(*found) +
                             "); pass --resume to continue it or another --dir");
  }
  if (o.resume && found) {
    const std::map<std::string, std::string> meta = checkpoint::metadata(o.dir, *found);
    if (meta.count("steps") && meta.at("steps") != std::to_string(o.steps)) {
      throw std::runtime_error(o.dir + " was saved by a run of --steps " + meta.at("steps") +
                               "; resume with the same --steps (the schedule spans them)");
    }
    TrainState restored = checkpoint::restore(o.dir, TrainState{params, opt_state}, *found);
    params = std::move(restored.params);
    opt_state = std::move(restored.opt_state);
    start = *found;
    if (meta.count("losses")) losses = split_numbers(meta.at("losses"));
    losses.resize(static_cast<size_t>(start), std::nan(""));
    if (printer) {
      std::printf("resumed %s/%lld (saved under %s on mesh %s) onto %s on mesh %s\n", o.dir.c_str(),
                  static_cast<long long>(start),
                  meta.count("strategy") ? meta.at("strategy").c_str() : "?",
                  meta.count("mesh") ? meta.at("mesh").c_str() : "?", o.strategy.c_str(),
                  mesh_str(mesh).c_str());
    }
  } else if (o.resume && printer) {
    std::printf("no checkpoint in %s: starting at step 0\n", o.dir.c_str());
  }
  if (printer) {
    std::printf(
        "meshrt-train: MLP [784, %lld x %lld, 8], %s on mesh %s (%d process(es)), batch %lld, "
        "steps %lld..%lld; %s; %s\n",
        static_cast<long long>(o.hidden), static_cast<long long>(o.depth), mlp::name(strategy),
        mesh_str(mesh).c_str(), process_count(), static_cast<long long>(o.batch),
        static_cast<long long>(start + 1), static_cast<long long>(o.steps),
        "adamw(warmup_cosine_decay) after clip_by_global_norm", mlp::name(o.precision));
    std::fflush(stdout);
  }

  // One jitted step; params and state are donated, so each replay updates them in place.
  auto step = jit(
      [&opt, loss_fn = mlp::Loss{o.precision}](const mlp::Params& p,
                                               const optim::State<mlp::Params>& s, const Batch& b) {
        auto [loss, grads] = value_and_grad(loss_fn)(p, b.x, b.y);
        auto [updates, new_state] = opt.update(grads, s, p);
        return std::make_tuple(optim::apply_updates(p, updates), new_state, loss);
      },
      {.donate_argnums = {0, 1}});

  const Dataset data(sizes.front(), sizes.back());
  double replay_seconds = 0;
  int64_t replays = 0;
  for (int64_t k = start + 1; k <= o.steps; ++k) {
    const auto t0 = std::chrono::steady_clock::now();
    const Batch batch = data.at(k, o.batch, data_sharding);
    const size_t traced = step.trace_count();
    auto [p, s, loss] = step(params, opt_state, batch);
    params = std::move(p);
    opt_state = std::move(s);
    const float l = loss.to_vector<float>()[0];
    const double dt = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    const bool replayed = step.trace_count() == traced;
    if (replayed) replay_seconds += dt, ++replays;
    losses.push_back(l);
    if (printer) {
      std::printf("step %3lld/%lld  loss %.6f  lr %.3e  %7.2f ms  %8.0f examples/s%s\n",
                  static_cast<long long>(k), static_cast<long long>(o.steps), l, schedule.at(k - 1),
                  dt * 1e3, static_cast<double>(o.batch) / dt, replayed ? "" : "  (traced)");
      std::fflush(stdout);
    }
    if (o.save_every > 0 && (k % o.save_every == 0 || k == o.steps)) {
      const auto s0 = std::chrono::steady_clock::now();
      checkpoint::save(o.dir, TrainState{params, opt_state}, k,
                       {.async = o.async_save,
                        .keep = static_cast<int>(o.keep),
                        .metadata = {{"strategy", o.strategy},
                                     {"mesh", mesh_str(mesh)},
                                     {"steps", std::to_string(o.steps)},
                                     {"losses", join(losses)}}});
      if (printer) {
        std::printf(
            "saved %s/%lld (%s) in %.1f ms\n", o.dir.c_str(), static_cast<long long>(k),
            o.async_save ? "async" : "sync",
            1e3 * std::chrono::duration<double>(std::chrono::steady_clock::now() - s0).count());
        std::fflush(stdout);
      }
      if (k == o.kill_after_save) {
        checkpoint::wait_until_finished();
        if (printer)
          std::printf("killed after step %lld's save (exit 137)\n", static_cast<long long>(k));
        std::fflush(stdout);
        std::fflush(stderr);
        _exit(137);  // no destructors, no further saves: a crash stand-in
      }
    }
  }
  checkpoint::wait_until_finished();

  size_t n_params = 0, n_state = 0;
  const uint64_t hp = checksum(params, &n_params);
  const uint64_t hs = checksum(opt_state, &n_state);
  if (printer) {
    if (replays > 0) {
      std::printf("mean replayed step: %.2f ms, %.0f examples/s (%lld steps)\n",
                  1e3 * replay_seconds / double(replays),
                  double(o.batch) * double(replays) / replay_seconds,
                  static_cast<long long>(replays));
    }
    std::printf("final loss %.6f\n", losses.empty() ? std::nan("") : losses.back());
    std::printf("params checksum 0x%016llx (fnv1a-64 over %zu float32)\n",
                static_cast<unsigned long long>(hp), n_params);
    std::printf("optimizer state checksum 0x%016llx (%zu values)\n",
                static_cast<unsigned long long>(hs), n_state);
  }

  if (!o.compare_with.empty()) {
    // The other run's checkpoint of the same step, restored onto this run's shardings.
    TrainState other = checkpoint::restore(o.compare_with, TrainState{params, opt_state}, o.steps);
    const std::vector<Array> mine = tree_leaves(TrainState{params, opt_state});
    const std::vector<Array> theirs = tree_leaves(other);
    size_t differ = 0, total = 0;
    double worst_params = 0, worst_state = 0;
    const size_t n_param_leaves = tree_leaves(params).size();
    for (size_t i = 0; i < mine.size(); ++i) {
      const std::vector<float> a = host_floats(mine[i]), b = host_floats(theirs[i]);
      double scale = 0;  // differences relative to the leaf's largest value (as test_optim)
      for (float v : b) scale = std::max(scale, std::fabs(double(v)));
      for (size_t j = 0; j < a.size(); ++j) {
        ++total;
        if (std::memcmp(&a[j], &b[j], sizeof(float)) != 0) ++differ;
        const double d = std::fabs(double(a[j]) - b[j]) / (scale > 0 ? scale : 1.0);
        double& worst = i < n_param_leaves ? worst_params : worst_state;
        worst = std::max(worst, d);
      }
    }
    if (printer) {
      std::printf(
          "vs %s/%lld: %zu of %zu values differ; max |a-b| / max|leaf|: params %.3e, "
          "state %.3e\n",
          o.compare_with.c_str(), static_cast<long long>(o.steps), differ, total, worst_params,
          worst_state);
    }
  }

  if (printer && !o.plot.empty()) {
    const std::string title = "meshrt-train: MLP [784, " + std::to_string(o.hidden) + " x " +
                              std::to_string(o.depth) + ", 8], " + o.strategy + " on " +
                              mesh_str(mesh) + ", batch " + std::to_string(o.batch);
    if (!write_text(o.plot, loss_svg(losses, 1, title))) {
      throw std::runtime_error("cannot write " + o.plot + ": " + std::strerror(errno));
    }
    size_t points = 0;
    for (double v : losses) points += std::isfinite(v) ? 1 : 0;
    std::printf("wrote %s (%zu points)\n", o.plot.c_str(), points);
  }
  return 0;
}

}  // namespace train

int main(int argc, char** argv) {
  try {
    const train::Options o = train::parse(argc, argv);
    distributed::initialize();  // a no-op without mpirun
    return train::run(o);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "meshrt-train (process %d): error: %s\n", process_index(), e.what());
    return 1;
  }
}
