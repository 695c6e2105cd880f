#include "examples/mlp/mlp.h"

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

// Several processes: gradients sharded over other processes' devices are gathered first.
std::vector<float> host(const Array& a) {
  if (process_count() == 1) return a.to_vector<float>();
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
    dW[l] = matmul(transpose(hs[l]), dz_full);
    db[l] = sum(dz, 0);
    if (l > 0) dz = relu_mask(zs[l - 1], matmul(dz_full, transpose(h.gather_w(W[l]))));
  }
  std::vector<Tensor> out{loss};
  for (size_t l = 0; l < L; ++l) {
    out.push_back(dW[l]);
    out.push_back(db[l]);
  }
  return out;
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

Grads loss_and_grad(const Problem& p, Strategy s, const Mesh& mesh) {
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

}  // namespace mlp
