// The "tide" namespace of torch ops: its one definition. Each source adds its own ops with
// TORCH_LIBRARY_FRAGMENT and TORCH_LIBRARY_IMPL (kernels/cpu.py builds them as one extension).

#include <torch/library.h>

TORCH_LIBRARY(tide, m) {}
