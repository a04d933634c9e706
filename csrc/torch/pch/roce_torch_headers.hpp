// The torch headers that most of csrc/torch/ needs, included first by those
// files. setup.py compiles this header once per build into a precompiled
// header (in the build directory, found before this file on the include
// path): parsing these headers was ~10 s of the ~18 s each such file took to
// compile. Where no precompiled header is there or usable (another compiler,
// other flags), it is an ordinary header and the build only takes longer.
#ifndef ROCE_TORCH_HEADERS_HPP
#define ROCE_TORCH_HEADERS_HPP

#include <ATen/ATen.h>
#include <torch/csrc/distributed/c10d/Backend.hpp>
#include <torch/csrc/distributed/c10d/Store.hpp>
#include <torch/csrc/distributed/c10d/Types.hpp>
#include <torch/csrc/distributed/c10d/Work.hpp>

#endif
