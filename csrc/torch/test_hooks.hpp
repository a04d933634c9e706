// roce_pg._C.testing: pure functions of the torch-free core that the Python
// tests call with made-up inputs (verdict wording, NIC choice rules, the
// GPUDirect path decision, the verbs memory formula). Kept out of the
// product's bindings (bindings.cpp), which define only what roce_pg uses.
#pragma once
#include <pybind11/pybind11.h>

namespace roce::adapter {

// Adds the submodule `testing` to `parent` (the extension module).
void defineTestHooks(pybind11::module_& parent);

}  // namespace roce::adapter
