// examples/mlp/mlp.h: the MLP of JAX's shard_map tutorial under five strategies that must agree
// with the single-device computation, its gradient taken three ways: value_and_grad of the
// forward pass written with global-view Array ops, value_and_grad of the forward pass written as
// a shard_map body with collectives, and the hand-written backward pass (kept as an independent
// cross-check).
//
//   layer sizes [784, 128, 128, 128, 128, 128, 8], batch 32, init as the tutorial's init/init_layer
//   (split(key, len(sizes)), W = normal / sqrt(n_in), b = normal), predict = relu MLP (linear
//   last layer), loss = mean over the batch of the sum of squared errors.
//
// Precision::bf16 is JAX's usual mixed-precision recipe on the same model: float32 master
// parameters, the loss casts them and the inputs to bfloat16 (astype), runs the layers in
// bfloat16 and takes the loss of the predictions cast back to float32; value_and_grad gives
// float32 gradients through the casts, and the update is applied to the float32 parameters.
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

// How the gradient is taken: value_and_grad of global-view ops, value_and_grad of a shard_map,
// or the hand-written backward pass.
enum class Style { global_view, shard_map, hand_written };
const char* name(Style s);

// The parameters as a tree: value_and_grad returns the gradients in the same structure,
// sharded like the parameters.
struct Params {
  std::vector<meshrt::Array> W, b;
};
MESHRT_TREE(Params, W, b);

// The dtype the layers compute in: float32, or bfloat16 with float32 master parameters and a
// float32 loss (mixed precision).
enum class Precision { f32, bf16 };
const char* name(Precision p);

// The loss of the tutorial (mean over the batch of the sum of squared errors), written once
// with global-view ops: the shardings of params, x and y decide what each device computes.
// Float32 throughout (Loss{Precision::f32}).
meshrt::Array loss(const Params& params, const meshrt::Array& x, const meshrt::Array& y);

// The same loss in a chosen precision, as a function object for value_and_grad and jit:
//
//   auto [l, g] = value_and_grad(mlp::Loss{mlp::Precision::bf16})(params, x, y);
//
// bf16 casts params (float32) and x to bfloat16 inside, so l and every leaf of g are float32.
struct Loss {
  Precision precision = Precision::f32;
  meshrt::Array operator()(const Params& params, const meshrt::Array& x,
                           const meshrt::Array& y) const;
};

// Where a strategy puts the batch and the parameters (single: a one-device mesh).
struct Placement {
  meshrt::PartitionSpec x, w, b;
};
Placement placement(Strategy s, const meshrt::Mesh& mesh);
Params device_put_params(const Problem& p, Strategy s, const meshrt::Mesh& mesh);

// Loss and gradients. single runs on mesh.devices()[0]; data_parallel and fsdp shard the batch
// over the mesh's first axis; tensor_parallel shards features over it; data_tensor_2d shards the
// batch over the first axis and features over the second. Each call places the parameters and
// the batch on the devices and reads the loss and gradients back to the host. Precision::bf16
// runs the global-view and shard_map styles in mixed precision (the hand-written backward pass
// is float32 only: an error).
Grads loss_and_grad(const Problem& p, Strategy s, const meshrt::Mesh& mesh,
                    Style style = Style::global_view, Precision precision = Precision::f32);

// Training as a loop runs it: the parameters and the batch placed for s on mesh once, then
// `steps` SGD steps (params -= lr * grads, on the devices) of value_and_grad(Loss{precision});
// returns the loss before each update. Mixed precision updates the float32 master parameters.
std::vector<double> train_losses(const Problem& p, Strategy s, const meshrt::Mesh& mesh,
                                 Precision precision, int steps, float lr);

// params -= lr * grads.
void sgd_step(Problem& p, const Grads& g, float lr);

// Largest |a - b| / (1 + |b|) over the loss and every gradient entry.
double max_rel_diff(const Grads& a, const Grads& b);

// FLOPs of one loss-and-gradient step of the MLP with layer widths `sizes` on `batch` rows:
// forward 2*B*sum(n_in*n_out); backward the weight gradients the same, the input gradients the
// same but the first layer's (nothing needs the gradient of x).
double step_flops(const std::vector<int64_t>& sizes, int64_t batch);

// GFLOP/s of the machine's matmul as meshrt drives it: every device of `mesh` (one axis, "batch")
// multiplies its own (m / devices, k) x (k, n) block of `dtype` at once (one shard_map), timed to
// completion; median of `repeats`.
double matmul_gflops(const meshrt::Mesh& mesh, int64_t m, int64_t k, int64_t n, int repeats,
                     meshrt::DType dtype = meshrt::DType::f32);

}  // namespace mlp
