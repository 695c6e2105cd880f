// examples/jit_demo.h: jit in the demo (included by examples/demo.cpp after
// `using namespace meshrt;`; demo part 7 calls jit_demo()). Prints lower().as_text() of
// the seed's jitted 2*sin(x)+1 and of a data-parallel training step (loss and gradients of a
// small MLP under value_and_grad), then checks the replay against the eager run.
#pragma once

struct JitDemoParams {
  Array w1, b1, w2;
};
MESHRT_TREE(JitDemoParams, w1, b1, w2);

inline void jit_demo() {
  std::printf("\n== jit: trace once, replay many ==\n");
  Mesh mesh = make_mesh({8}, {"x"});
  NamedSharding dp(mesh, P("x"));
  NamedSharding rep(mesh, P());

  auto f = jit([](const Array& x) { return 2.0 * sin(x) + 1.0; }, {.name = "sin_affine"});
  Array x = device_put(std::vector<float>(32, 0.5f), {8, 4}, dp);
  std::printf("%s", f.lower(x).as_text().c_str());
  Array y = f(x);  // traced here; the next calls replay
  Array y2 = f(x);
  std::printf("replayed == eager: %s\n",
              y2.to_vector<float>() == (2.0 * sin(x) + 1.0).to_vector<float>() ? "yes" : "NO");

  // The training step: loss and gradients, data parallel over the 8 devices (the batch sharded,
  // the parameters replicated): the gradients' psums show as the collectives.
  auto loss = [](const JitDemoParams& p, const Array& xb, const Array& yb) {
    Array h = relu(matmul(xb, p.w1) + p.b1);
    Array d = matmul(h, p.w2) - yb;
    return mean(d * d);
  };
  auto step = jit(value_and_grad(loss), {.name = "train_step"});
  JitDemoParams p{random::normal(random::key(1), {4, 16}, rep), zeros({16}, DType::f32, rep),
                  random::normal(random::key(2), {16, 1}, rep)};
  Array xb = random::normal(random::key(3), {64, 4}, dp);
  Array yb = random::normal(random::key(4), {64, 1}, dp);
  std::printf("%s", step.lower(p, xb, yb).as_text().c_str());
  for (int i = 0; i < 3; ++i) {
    auto [l, g] = step(p, xb, yb);
    p.w1 = p.w1 - 0.01 * g.w1;
    p.b1 = p.b1 - 0.01 * g.b1;
    p.w2 = p.w2 - 0.01 * g.w2;
    std::printf("step %d: loss %.6f\n", i, static_cast<double>(l.to_vector<float>()[0]));
  }
  std::printf("traces: %zu (one signature)\n", step.trace_count());
}
