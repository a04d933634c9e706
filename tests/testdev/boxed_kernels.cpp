// Operators without a kernel of their own (kernels.cpp) run aten's CPU
// kernel on CPU aliases of the device memory, in one of two ways:
// - on_stream, for a few ops that tests and DDP's buckets use on hot paths
//   (fill_, zero_, add, mul, div_): queued on the current stream, so the
//   call returns before the op ran, as a GPU kernel launch does;
// - fallback, for all the rest: the current streams of the tensors' devices
//   are drained and the op runs at once on the calling thread. Correct but
//   synchronous: that host wait can make a missing wait between streams
//   harmless when the op happens to sit between producer and consumer, so
//   stream-semantics tests should use the queued ops and copies.

#include "testdev.h"

#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/ExpandUtils.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/empty_like.h>
#include <ATen/ops/result_type.h>
#include <torch/library.h>

#include <optional>
#include <vector>

namespace testdev {
namespace {

constexpr c10::DispatchKeySet kCpu(c10::DispatchKey::CPU);

// Replaces each tensor among `values` (alone or in a list) by fn(tensor).
template <typename Fn>
void map_tensors(std::vector<c10::IValue>& values, const Fn& fn) {
  for (c10::IValue& value : values) {
    if (value.isTensor()) {
      value = fn(value.toTensor());
    } else if (value.isTensorList()) {
      c10::List<at::Tensor> mapped;
      for (at::Tensor t : value.toTensorList()) {
        mapped.push_back(fn(t));
      }
      value = mapped;
    } else if (value.isOptionalTensorList()) {
      c10::List<std::optional<at::Tensor>> mapped;
      for (std::optional<at::Tensor> t : value.toOptionalTensorList()) {
        mapped.push_back(t ? std::optional<at::Tensor>(fn(*t)) : t);
      }
      value = mapped;
    }
  }
}

template <typename Fn>
void map_device_tensors(std::vector<c10::IValue>& values, const Fn& fn) {
  map_tensors(values, [&](const at::Tensor& t) -> at::Tensor {
    return t.defined() && t.is_privateuseone() ? fn(t) : t;
  });
}

// Not validated on the host (aten's meta kernels are partly Python and
// would make a kernel launch need the GIL): shape and dtype errors surface
// at the next synchronize of the stream, like asynchronous CUDA errors.
void on_stream(const c10::OperatorHandle& op, torch::jit::Stack* stack) {
  auto args = torch::jit::pop(*stack, op.schema().arguments().size());
  std::optional<c10::Device> device;
  map_device_tensors(args, [&](const at::Tensor& t) {
    TORCH_CHECK(
        !device || *device == t.device(),
        "Expected all tensors to be on the same device, but found ",
        device->str(),
        " and ",
        t.device().str());
    device = t.device();
    return t;
  });
  const at::Tensor& self = args[0].toTensor();
  // In place: the result is self. Otherwise a pointwise op of two tensors
  // (add, mul), whose result has the broadcast shape and promoted dtype.
  const bool in_place = op.schema().returns()[0].alias_info() != nullptr;
  const at::Tensor result = in_place
      ? self
      : at::empty(
            at::infer_size(self.sizes(), args[1].toTensor().sizes()),
            self.options()
                .device(*device)
                .dtype(at::result_type(self, args[1].toTensor())));
  map_device_tensors(args, [](const at::Tensor& t) { return cpu_alias(t); });
  current_queue(device->index())
      .enqueue([op,
                args = std::move(args),
                out = in_place ? at::Tensor() : cpu_alias(result)]() mutable {
        op.redispatchBoxed(kCpu, &args);
        if (out.defined()) {
          out.copy_(args[0].toTensor());
        }
      });
  torch::jit::push(*stack, result);
}

// Fills device memory from the host, now. A block just taken from the cache
// may still have its poisoning queued on the current stream: it drains first.
void write_now(const at::Tensor& dst, const at::Tensor& src) {
  current_queue(dst.device().index()).synchronize();
  cpu_alias(dst).copy_(src);
}

// A CPU result of the fallback, back on the device: an input itself, a view
// of an input's memory, or new device memory holding a copy.
at::Tensor to_device(
    const at::Tensor& result,
    const std::vector<at::Tensor>& inputs,
    const std::vector<at::Tensor>& aliases,
    c10::DeviceIndex device) {
  if (!result.defined() || !result.is_cpu()) {
    return result;
  }
  for (size_t i = 0; i < aliases.size(); ++i) {
    if (result.is_same(aliases[i])) {
      return inputs[i];
    }
  }
  const void* data = result.storage().data();
  for (size_t i = 0; i < aliases.size(); ++i) {
    if (data != nullptr && aliases[i].storage().data() == data) {
      return inputs[i].as_strided(
          result.sizes(), result.strides(), result.storage_offset());
    }
  }
  at::Tensor copy = at::empty_like(
      result, result.options().device(c10::DeviceType::PrivateUse1, device));
  write_now(copy, result);
  return copy;
}

void fallback(const c10::OperatorHandle& op, torch::jit::Stack* stack) {
  auto values = torch::jit::pop(*stack, op.schema().arguments().size());
  std::vector<at::Tensor> inputs;
  std::vector<at::Tensor> aliases;
  map_device_tensors(values, [&](const at::Tensor& t) {
    current_queue(t.device().index()).synchronize();
    inputs.push_back(t);
    aliases.push_back(cpu_alias(t));
    return aliases.back();
  });
  const c10::DeviceIndex device =
      inputs.empty() ? current_device() : inputs[0].device().index();

  op.redispatchBoxed(kCpu, &values);

  // An out= argument the CPU kernel resized (its alias got new memory or a
  // new shape): the device tensor is resized too and receives the output.
  for (size_t i = 0; i < inputs.size(); ++i) {
    if (aliases[i].storage().data() != inputs[i].storage().data() ||
        !aliases[i].sizes().equals(inputs[i].sizes())) {
      inputs[i].resize_(aliases[i].sizes());
      write_now(inputs[i], aliases[i]);
    }
  }
  map_tensors(values, [&](const at::Tensor& t) {
    return to_device(t, inputs, aliases, device);
  });
  stack->insert(stack->end(), values.begin(), values.end());
}

} // namespace

TORCH_LIBRARY_IMPL(aten, PrivateUse1, m) {
  for (const char* name :
       {"fill_.Scalar",
        "zero_",
        "add.Tensor",
        "add_.Tensor",
        "mul.Tensor",
        "mul_.Tensor",
        "div_.Tensor"}) {
    m.impl(name, torch::CppFunction::makeFromBoxedFunction<&on_stream>());
  }
}

TORCH_LIBRARY_IMPL(_, PrivateUse1, m) {
  m.fallback(torch::CppFunction::makeFromBoxedFunction<&fallback>());
}

} // namespace testdev
