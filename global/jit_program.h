// meshrt/jit_program.h: jit's engine: a recorded program of global-view steps, its replay, and
// its printable forms. The public front (jit, JitOptions, trees) is autodiff/jit.h.
//
// A trace runs the function once, eagerly, with a recorder on the calling thread: every
// per-device launch the global view makes (ops computed block by block, ops with collectives,
// reshards) is appended as a step, its operands found by the names (trace ids) the trace gave the
// blocks they read: an input's blocks, or a launch's results. Blocks that no step made and no
// input holds are constants of the program (creation ops, captured Arrays).
// A replay runs the steps on new inputs: steps without collectives from the caller's thread,
// device after device, consecutive steps with collectives as one task per device, reshards
// between meshes from the caller; unused steps are removed and intermediate blocks are dropped
// after their last use.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "runtime/array.h"

namespace meshrt::detail {

class JitProgram;
class JitRecorder;

// Records one trace while it lives (on the calling thread): installs the recorder and a tracer
// (to refuse host reads of traced values and shard_map inside the trace). `inputs` are the
// function's Array leaves (they get fresh trace ids), `paths` name them in the program's text.
class JitTrace {
 public:
  JitTrace(std::vector<Array>& inputs, std::vector<std::string> paths, std::string name);
  JitTrace(const JitTrace&) = delete;
  JitTrace& operator=(const JitTrace&) = delete;
  ~JitTrace();
  // Ends the trace: the program that makes `outputs` (the function's Array leaves, named by
  // `paths`) from the inputs. Call once, after the function returned.
  std::shared_ptr<const JitProgram> build_program(const std::vector<Array>& outputs,
                                                  std::vector<std::string> paths);

 private:
  std::unique_ptr<JitRecorder> rec_;
};

// Runs `program` on `inputs` (the signature it was traced with). `donated[i]`: the program may
// drop its reference to input i as soon as the last step reading it ran.
std::vector<Array> jit_replay(const JitProgram& program, std::vector<Array> inputs,
                              const std::vector<bool>& donated);

// One line per op: the op, its operands' and results' shapes and shardings, the collectives it
// inserted (with bytes per device), "(unused: not replayed)" for an op whose results nothing
// reads; then how the replay runs (launches per call) and, where `donated` (per input leaf, as
// jit_replay's) lets it, how many steps write into donated inputs' buffers.
std::string jit_text(const JitProgram& program, const std::vector<bool>& donated = {});
// The same as a Graphviz digraph: ops as boxes, collectives as red nodes on their op's input.
std::string jit_dot(const JitProgram& program);

// True when a call made now would be traced by an enclosing transform (a jit trace, a tape):
// a jitted function then runs eagerly so that the enclosing transform sees its ops.
bool jit_inside_transform();

// A signature of `x` for jit's cache: shape, dtype, sharding (mesh devices included), pending
// sums.
std::string jit_signature(const Array& x);

}  // namespace meshrt::detail
