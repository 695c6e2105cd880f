// examples/mlp/mlp.h: the MLP of JAX's shard_map tutorial, trained with hand-written backward
// passes under five strategies that must agree with the single-device computation.
//
//   layer sizes [784, 128, 128, 128, 128, 128, 8], batch 32, init as the tutorial's init/init_layer
//   (split(key, len(sizes)), W = normal / sqrt(n_in), b = normal), predict = relu MLP (linear
//   last layer), loss = mean over the batch of the sum of squared errors.
#pragma once

#include <meshrt/meshrt.h>

#include <cstdint>
#include <string>
#include <vector>

namespace mlp {

struct Problem {
  std::vector<int64_t> sizes;
  int64_t batch = 0;
  std::vector<std::vector<float>> W, b;  // host, W[l] row-major (n_in, n_out), b[l] (n_out)
  std::vector<float> x, y;               // (batch, sizes.front()), (batch, sizes.back())
};

// init(key, layer_sizes, batch_size) of the tutorial, with meshrt's JAX-compatible PRNG.
Problem init(const meshrt::random::Key& key, std::vector<int64_t> sizes, int64_t batch);

struct Grads {
  double loss = 0;
  std::vector<std::vector<float>> dW, db;
};

enum class Strategy { single, data_parallel, fsdp, tensor_parallel, data_tensor_2d };
const char* name(Strategy s);

// Loss and gradients. single runs on mesh.devices()[0]; data_parallel and fsdp shard the batch
// over the mesh's first axis; tensor_parallel shards features over it; data_tensor_2d shards the
// batch over the first axis and features over the second.
Grads loss_and_grad(const Problem& p, Strategy s, const meshrt::Mesh& mesh);

// params -= lr * grads.
void sgd_step(Problem& p, const Grads& g, float lr);

// Largest |a - b| / (1 + |b|) over the loss and every gradient entry.
double max_rel_diff(const Grads& a, const Grads& b);

}  // namespace mlp
