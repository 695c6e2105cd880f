#include "examples/mlp/mlp.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <functional>
#include <stdexcept>

namespace mlp {

using namespace meshrt;

namespace {

Tensor relu_mask(const Tensor& z, const Tensor& dh) {
  Tensor zero = zeros({}, z.dtype(), z.device());
  return where(z > zero, dh, zero);
}

// Several processes: gradients sharded over other processes' devices are gathered first (an
// Array on this process's devices alone, as the single-device reference, is read as it is).
std::vector<float> host(const Array& a) {
  bool local = true;
  for (const Device& d : a.sharding().device_list())
    local = local && d.process_index() == process_index();
  if (local) return a.to_vector<float>();
  return process_allgather(a).to_vector<float>();
}

// Forward and backward on one device's blocks. `gather` turns a layer's parameter blocks into
// what the local matmul needs (FSDP: all_gather); `mix` turns the local matmul into the layer's
// pre-activation (TP: psum_scatter over features); `spread` gathers dz back (TP: all_gather).
struct Hooks {
  std::function<Tensor(const Tensor&)> gather_w = [](const Tensor& t) { return t; };
  std::function<Tensor(const Tensor&)> gather_b = [](const Tensor& t) { return t; };
  std::function<Tensor(const Tensor&)> mix = [](const Tensor& t) { return t; };
  std::function<Tensor(const Tensor&)> spread = [](const Tensor& t) { return t; };
  std::function<Tensor(const Tensor&)> total = [](const Tensor& t) {
    return t;
  };  // sum over shards
};

// Returns {local loss contribution, dW_0, db_0, ...} (gradients of the local loss w.r.t. the
// full-size parameters the device computed with).
std::vector<Tensor> forward_backward(const std::vector<Tensor>& W, const std::vector<Tensor>& b,
                                     const Tensor& x, const Tensor& y,
                                     int64_t global_batch_of_shard, const Hooks& h) {
  const size_t L = W.size();
  std::vector<Tensor> hs{x}, zs;
  for (size_t l = 0; l < L; ++l) {
    Tensor z = h.mix(matmul(hs.back(), h.gather_w(W[l]))) + h.gather_b(b[l]);
    zs.push_back(z);
    if (l + 1 < L) hs.push_back(relu(z));
  }
  const Tensor diff = zs.back() - y;
  const double inv_b = 1.0 / static_cast<double>(global_batch_of_shard);
  // loss = mean over the batch of sum over features of diff^2 (features may be sharded: total).
  Tensor loss = h.total(sum(diff * diff)) * inv_b;
  Tensor dz = diff * (2.0 * inv_b);
  std::vector<Tensor> dW(L), db(L);
  for (size_t l = L; l-- > 0;) {
    const Tensor dz_full = h.spread(dz);
    // h^T @ dz and dz @ W^T, the transposes read by the products (no copies).
    dW[l] = matmul_transposed(hs[l], dz_full, true, false);
    db[l] = sum(dz, 0);
    if (l > 0) {
      dz = relu_mask(zs[l - 1], matmul_transposed(dz_full, h.gather_w(W[l]), false, true));
    }
  }
  std::vector<Tensor> out{loss};
  for (size_t l = 0; l < L; ++l) {
    out.push_back(dW[l]);
    out.push_back(db[l]);
  }
  return out;
}

DType compute_dtype(Precision p) { return p == Precision::bf16 ? DType::bf16 : DType::f32; }

// astype, but no op at all when the dtype already matches (astype copies): the float32 loss
// records exactly the ops it did before precisions existed.
template <class T>
T cast(const T& a, DType dtype) {
  return a.dtype() == dtype ? a : astype(a, dtype);
}

// The forward pass alone (value_and_grad takes the backward pass from it). Mixed precision casts
// each device's blocks: the gathers and collectives move bfloat16.
Tensor forward_loss(const std::vector<Tensor>& W, const std::vector<Tensor>& b, const Tensor& x,
                    const Tensor& y, int64_t global_batch_of_shard, const Hooks& h,
                    Precision precision) {
  const DType c = compute_dtype(precision);
  Tensor a = cast(x, c);
  for (size_t l = 0; l < W.size(); ++l) {
    Tensor z = h.mix(matmul(a, h.gather_w(cast(W[l], c)))) + h.gather_b(cast(b[l], c));
    a = l + 1 < W.size() ? relu(z) : z;
  }
  const Tensor diff = cast(a, DType::f32) - y;
  return h.total(sum(diff * diff)) * (1.0 / static_cast<double>(global_batch_of_shard));
}

Grads to_grads(const std::vector<Array>& r) {
  Grads g;
  g.loss = host(r[0])[0];
  for (size_t i = 1; i < r.size(); i += 2) {
    g.dW.push_back(host(r[i]));
    g.db.push_back(host(r[i + 1]));
  }
  return g;
}

}  // namespace

const char* name(Style s) {
  switch (s) {
    case Style::global_view:
      return "value_and_grad, global view";
    case Style::shard_map:
      return "value_and_grad, shard_map";
    case Style::hand_written:
      return "hand-written backward";
  }
  return "?";
}

const char* name(Strategy s) {
  switch (s) {
    case Strategy::single:
      return "single device";
    case Strategy::data_parallel:
      return "data parallel";
    case Strategy::fsdp:
      return "FSDP";
    case Strategy::tensor_parallel:
      return "tensor parallel";
    case Strategy::data_tensor_2d:
      return "data x tensor (2-D)";
  }
  return "?";
}

Problem init(const random::Key& key0, std::vector<int64_t> sizes, int64_t batch) {
  Problem p;
  p.sizes = sizes;
  p.batch = batch;
  // key, *keys = split(key, len(layer_sizes)); params = map(init_layer, keys, sizes[:-1],
  // sizes[1:])
  std::vector<random::Key> keys = random::split(key0, static_cast<int>(sizes.size()));
  for (size_t l = 0; l + 1 < sizes.size(); ++l) {
    auto k12 = random::split(keys[l + 1]);
    std::vector<double> w = random::normal_values(k12[0], {sizes[l], sizes[l + 1]}, DType::f32);
    std::vector<double> bb = random::normal_values(k12[1], {sizes[l + 1]}, DType::f32);
    const float scale = std::sqrt(static_cast<float>(sizes[l]));
    std::vector<float> wf(w.size());
    for (size_t i = 0; i < w.size(); ++i) wf[i] = static_cast<float>(w[i]) / scale;
    p.W.push_back(std::move(wf));
    p.b.emplace_back(bb.begin(), bb.end());
  }
  // key, *keys = split(key, 3); inputs = normal(keys[0], ...); targets = normal(keys[1], ...)
  std::vector<random::Key> k3 = random::split(keys[0], 3);
  std::vector<double> x = random::normal_values(k3[1], {batch, sizes.front()}, DType::f32);
  std::vector<double> y = random::normal_values(k3[2], {batch, sizes.back()}, DType::f32);
  p.x.assign(x.begin(), x.end());
  p.y.assign(y.begin(), y.end());
  return p;
}

namespace {

Grads hand_written(const Problem& p, Strategy s, const Mesh& mesh) {
  const size_t L = p.W.size();
  if (s == Strategy::single) {
    Device d = mesh.devices().front();
    std::vector<Tensor> W, b;
    for (size_t l = 0; l < L; ++l) {
      W.push_back(tensor(p.W[l], {p.sizes[l], p.sizes[l + 1]}, d));
      b.push_back(tensor(p.b[l], {p.sizes[l + 1]}, d));
    }
    std::vector<Tensor> r =
        forward_backward(W, b, tensor(p.x, {p.batch, p.sizes.front()}, d),
                         tensor(p.y, {p.batch, p.sizes.back()}, d), p.batch, Hooks{});
    Grads g;
    g.loss = r[0].to_vector<float>()[0];
    for (size_t l = 0; l < L; ++l) {
      g.dW.push_back(r[1 + 2 * l].to_vector<float>());
      g.db.push_back(r[2 + 2 * l].to_vector<float>());
    }
    return g;
  }
  const std::string a0 = mesh.axis_names()[0];
  const std::string a1 = mesh.axis_names().size() > 1 ? mesh.axis_names()[1] : a0;
  const int64_t n0 = mesh.axis_size(a0);
  PartitionSpec x_spec, w_spec, b_spec, g_w_spec, g_b_spec;
  switch (s) {
    case Strategy::data_parallel:
      x_spec = P(a0), w_spec = P(), b_spec = P(), g_w_spec = P(), g_b_spec = P();
      break;
    case Strategy::fsdp:
      x_spec = P(a0), w_spec = P(a0), b_spec = P(a0), g_w_spec = P(a0), g_b_spec = P(a0);
      break;
    case Strategy::tensor_parallel:
      x_spec = P(None, a0), w_spec = P(a0), b_spec = P(a0), g_w_spec = P(a0), g_b_spec = P(a0);
      break;
    default:  // 2-D: batch over a0, features over a1
      x_spec = P(a0, a1), w_spec = P(a1), b_spec = P(a1), g_w_spec = P(a1), g_b_spec = P(a1);
      break;
  }
  Device d0 = mesh.devices().front();
  std::vector<Array> args{device_put(p.x, {p.batch, p.sizes.front()}, NamedSharding(mesh, x_spec)),
                          device_put(p.y, {p.batch, p.sizes.back()}, NamedSharding(mesh, x_spec))};
  std::vector<PartitionSpec> in_specs{x_spec, x_spec}, out_specs{P()};
  for (size_t l = 0; l < L; ++l) {
    args.push_back(device_put(p.W[l], {p.sizes[l], p.sizes[l + 1]}, NamedSharding(mesh, w_spec)));
    args.push_back(device_put(p.b[l], {p.sizes[l + 1]}, NamedSharding(mesh, b_spec)));
    in_specs.push_back(w_spec);
    in_specs.push_back(b_spec);
    out_specs.push_back(g_w_spec);
    out_specs.push_back(g_b_spec);
  }
  (void)d0;
  auto body = [&, s](Context& ctx, const std::vector<Tensor>& xs) {
    std::vector<Tensor> W, b;
    for (size_t l = 0; l < L; ++l) {
      W.push_back(xs[2 + 2 * l]);
      b.push_back(xs[3 + 2 * l]);
    }
    const int64_t local_batch = xs[0].shape()[0];
    Hooks h;
    std::vector<Tensor> r;
    switch (s) {
      case Strategy::data_parallel: {
        r = forward_backward(W, b, xs[0], xs[1], local_batch, h);
        for (Tensor& t : r) t = ctx.pmean(t, a0);  // mean of the shards' losses and gradients
        break;
      }
      case Strategy::fsdp: {
        // Weights gathered just before use, in the forward pass and again in the backward pass.
        h.gather_w = [&](const Tensor& t) { return ctx.all_gather(t, a0, 0, true); };
        h.gather_b = [&](const Tensor& t) { return ctx.all_gather(t, a0, 0, true); };
        r = forward_backward(W, b, xs[0], xs[1], local_batch, h);
        r[0] = ctx.pmean(r[0], a0);
        for (size_t i = 1; i < r.size(); ++i)
          r[i] = ctx.psum_scatter(r[i], a0, 0, true) * (1.0 / static_cast<double>(n0));
        break;
      }
      default: {  // tensor parallel, alone or with data parallelism over a0
        const std::string f = s == Strategy::tensor_parallel ? a0 : a1;
        h.mix = [&](const Tensor& t) { return ctx.psum_scatter(t, f, 1, true); };
        h.spread = [&](const Tensor& t) { return ctx.all_gather(t, f, 1, true); };
        h.total = [&](const Tensor& t) { return ctx.psum(t, f); };
        r = forward_backward(W, b, xs[0], xs[1], local_batch, h);
        if (s == Strategy::data_tensor_2d) {
          for (Tensor& t : r) t = ctx.pmean(t, a0);
        }
        break;
      }
    }
    return r;
  };
  return to_grads(shard_map(body, mesh, in_specs, out_specs)(args));
}

Grads from_autodiff(const Array& loss_value, const Params& g) {
  Grads out;
  out.loss = loss_value.to_vector<float>()[0];
  for (size_t l = 0; l < g.W.size(); ++l) {
    out.dW.push_back(host(g.W[l]));
    out.db.push_back(host(g.b[l]));
  }
  return out;
}

Mesh single_device_mesh(const Mesh& mesh) {
  return Mesh({mesh.devices().front()}, {1}, {mesh.axis_names().front()});
}

// value_and_grad of the loss written with global-view ops.
Grads global_view(const Problem& p, Strategy s, const Mesh& mesh0, Precision precision) {
  const Mesh mesh = s == Strategy::single ? single_device_mesh(mesh0) : mesh0;
  const Placement at = placement(s, mesh);
  const Params params = device_put_params(p, s, mesh);
  const Array x = device_put(p.x, {p.batch, p.sizes.front()}, NamedSharding(mesh, at.x));
  const Array y = device_put(p.y, {p.batch, p.sizes.back()}, NamedSharding(mesh, at.x));
  auto [l, g] = value_and_grad(Loss{precision})(params, x, y);
  return from_autodiff(l, g);
}

// value_and_grad of the same forward pass written as a shard_map body with collectives.
Grads shard_mapped(const Problem& p, Strategy s, const Mesh& mesh0, Precision precision) {
  const Mesh mesh = s == Strategy::single ? single_device_mesh(mesh0) : mesh0;
  const Placement at = placement(s, mesh);
  const size_t L = p.W.size();
  const std::string a0 = mesh.axis_names()[0];
  const std::string a1 = mesh.axis_names().size() > 1 ? mesh.axis_names()[1] : a0;
  std::vector<PartitionSpec> in_specs{at.x, at.x};
  for (size_t l = 0; l < L; ++l) {
    in_specs.push_back(at.w);
    in_specs.push_back(at.b);
  }
  auto body = [&, s, precision](Context& ctx, const std::vector<Tensor>& xs) {
    std::vector<Tensor> W, b;
    for (size_t l = 0; l < L; ++l) {
      W.push_back(xs[2 + 2 * l]);
      b.push_back(xs[3 + 2 * l]);
    }
    const int64_t local_batch = xs[0].shape()[0];
    Hooks h;
    Tensor loss_value;
    switch (s) {
      case Strategy::single:
        loss_value = forward_loss(W, b, xs[0], xs[1], local_batch, h, precision);
        break;
      case Strategy::data_parallel:
        loss_value = ctx.pmean(forward_loss(W, b, xs[0], xs[1], local_batch, h, precision), a0);
        break;
      case Strategy::fsdp:
        h.gather_w = [&](const Tensor& t) { return ctx.all_gather(t, a0, 0, true); };
        h.gather_b = [&](const Tensor& t) { return ctx.all_gather(t, a0, 0, true); };
        loss_value = ctx.pmean(forward_loss(W, b, xs[0], xs[1], local_batch, h, precision), a0);
        break;
      default: {  // tensor parallel, alone or with data parallelism over a0
        const std::string f = s == Strategy::tensor_parallel ? a0 : a1;
        h.mix = [&](const Tensor& t) { return ctx.psum_scatter(t, f, 1, true); };
        h.total = [&](const Tensor& t) { return ctx.psum(t, f); };
        loss_value = forward_loss(W, b, xs[0], xs[1], local_batch, h, precision);
        if (s == Strategy::data_tensor_2d) loss_value = ctx.pmean(loss_value, a0);
        break;
      }
    }
    return std::vector<Tensor>{loss_value};
  };
  auto step = shard_map(body, mesh, in_specs, std::vector<PartitionSpec>{P()});
  const Array x = device_put(p.x, {p.batch, p.sizes.front()}, NamedSharding(mesh, at.x));
  const Array y = device_put(p.y, {p.batch, p.sizes.back()}, NamedSharding(mesh, at.x));
  auto sharded_loss = [&](const Params& prm) {
    std::vector<Array> args{x, y};
    for (size_t l = 0; l < L; ++l) {
      args.push_back(prm.W[l]);
      args.push_back(prm.b[l]);
    }
    return step(args).front();
  };
  auto [l, g] = value_and_grad(sharded_loss)(device_put_params(p, s, mesh));
  return from_autodiff(l, g);
}

}  // namespace

const char* name(Precision p) { return p == Precision::bf16 ? "bf16 (mixed)" : "float32"; }

Array Loss::operator()(const Params& params, const Array& x, const Array& y) const {
  const DType c = compute_dtype(precision);
  Array a = cast(x, c);
  for (size_t l = 0; l < params.W.size(); ++l) {
    Array z = matmul(a, cast(params.W[l], c)) + cast(params.b[l], c);
    a = l + 1 < params.W.size() ? relu(z) : z;
  }
  const Array diff = cast(a, DType::f32) - y;  // the loss in float32
  return sum(diff * diff) / static_cast<double>(x.shape()[0]);
}

Array loss(const Params& params, const Array& x, const Array& y) {
  return Loss{Precision::f32}(params, x, y);
}

Placement placement(Strategy s, const Mesh& mesh) {
  const std::string a0 = mesh.axis_names()[0];
  const std::string a1 = mesh.axis_names().size() > 1 ? mesh.axis_names()[1] : a0;
  switch (s) {
    case Strategy::single:
      return {P(), P(), P()};
    case Strategy::data_parallel:
      return {P(a0), P(), P()};
    case Strategy::fsdp:
      return {P(a0), P(a0), P(a0)};
    case Strategy::tensor_parallel:
      return {P(None, a0), P(a0), P(a0)};
    case Strategy::data_tensor_2d:
      break;
  }
  return {P(a0, a1), P(a1), P(a1)};
}

Params device_put_params(const Problem& p, Strategy s, const Mesh& mesh) {
  const Placement at = placement(s, mesh);
  Params params;
  for (size_t l = 0; l < p.W.size(); ++l) {
    params.W.push_back(device_put(p.W[l], {p.sizes[l], p.sizes[l + 1]}, NamedSharding(mesh, at.w)));
    params.b.push_back(device_put(p.b[l], {p.sizes[l + 1]}, NamedSharding(mesh, at.b)));
  }
  return params;
}

Grads loss_and_grad(const Problem& p, Strategy s, const Mesh& mesh, Style style,
                    Precision precision) {
  switch (style) {
    case Style::global_view:
      return global_view(p, s, mesh, precision);
    case Style::shard_map:
      return shard_mapped(p, s, mesh, precision);
    case Style::hand_written:
      break;
  }
  if (precision != Precision::f32) {
    throw std::invalid_argument("[mlp] the hand-written backward pass is float32 only");
  }
  return hand_written(p, s, mesh);
}

std::vector<double> train_losses(const Problem& p, Strategy s, const Mesh& mesh,
                                 Precision precision, int steps, float lr) {
  const Placement at = placement(s, mesh);
  Params params = device_put_params(p, s, mesh);
  const Array x = device_put(p.x, {p.batch, p.sizes.front()}, NamedSharding(mesh, at.x));
  const Array y = device_put(p.y, {p.batch, p.sizes.back()}, NamedSharding(mesh, at.x));
  auto step = value_and_grad(Loss{precision});
  std::vector<double> losses;
  for (int i = 0; i < steps; ++i) {
    auto [l, g] = step(params, x, y);
    params =
        tree_map([lr](const Array& w, const Array& d) { return w - double(lr) * d; }, params, g);
    losses.push_back(l.to_vector<float>()[0]);
  }
  return losses;
}

void sgd_step(Problem& p, const Grads& g, float lr) {
  for (size_t l = 0; l < p.W.size(); ++l) {
    for (size_t i = 0; i < p.W[l].size(); ++i) p.W[l][i] -= lr * g.dW[l][i];
    for (size_t i = 0; i < p.b[l].size(); ++i) p.b[l][i] -= lr * g.db[l][i];
  }
}

double max_rel_diff(const Grads& a, const Grads& b) {
  double worst = std::fabs(a.loss - b.loss) / (1 + std::fabs(b.loss));
  for (size_t l = 0; l < a.dW.size(); ++l) {
    for (size_t i = 0; i < a.dW[l].size(); ++i) {
      worst = std::max(
          worst, std::fabs(double(a.dW[l][i]) - b.dW[l][i]) / (1 + std::fabs(double(b.dW[l][i]))));
    }
    for (size_t i = 0; i < a.db[l].size(); ++i) {
      worst = std::max(
          worst, std::fabs(double(a.db[l][i]) - b.db[l][i]) / (1 + std::fabs(double(b.db[l][i]))));
    }
  }
  return worst;
}

double step_flops(const std::vector<int64_t>& sizes, int64_t batch) {
  double per_pass = 0;
  for (size_t l = 0; l + 1 < sizes.size(); ++l)
    per_pass += 2.0 * static_cast<double>(batch * sizes[l] * sizes[l + 1]);
  return 3 * per_pass - 2.0 * static_cast<double>(batch * sizes[0] * sizes[1]);
}

double matmul_gflops(const Mesh& mesh, int64_t m, int64_t k, int64_t n, int repeats, DType dtype) {
  Array a = ones({m, k}, dtype, NamedSharding(mesh, P("batch")));
  Array b = ones({k, n}, dtype, NamedSharding(mesh, P()));
  auto mm = shard_map([](Context&, const Tensor& x, const Tensor& y) { return matmul(x, y); }, mesh,
                      {P("batch"), P()}, P("batch"));
  mm(a, b).block_until_ready();
  std::vector<double> t;
  for (int i = 0; i < repeats; ++i) {
    auto t0 = std::chrono::steady_clock::now();
    mm(a, b).block_until_ready();  // on cuda the product is queued: time it to completion
    t.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
  std::sort(t.begin(), t.end());
  return 2.0 * static_cast<double>(m * k * n) / t[t.size() / 2] / 1e9;
}

}  // namespace mlp
