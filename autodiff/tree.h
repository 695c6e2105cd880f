// autodiff/tree.h: trees' former path, kept so code that includes it still compiles. Trees live
// in runtime/tree.h (they depend on runtime/ only); new code includes that, or <meshrt/meshrt.h>.
#pragma once

#include "runtime/tree.h"
