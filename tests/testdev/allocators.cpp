// The device allocator and the host ("pinned") allocator: both hand out
// host memory from a BlockCache. Device blocks belong to the current stream
// of the current device; pinned blocks belong to no stream.

#include "block_cache.h"

#include <ATen/core/CachingHostAllocator.h>

#include <cstring>

namespace testdev {
namespace {

BlockCache& device_cache() {
  static auto* cache = new BlockCache; // leaked: freed tensors outlive statics
  return *cache;
}

BlockCache& host_cache() {
  static auto* cache = new BlockCache;
  return *cache;
}

void free_device_block(void* ptr) {
  device_cache().free(ptr);
}

void free_host_block(void* ptr) {
  host_cache().free(ptr);
}

// The context is the data pointer itself, which makes raw_allocate /
// raw_deleter usable and lets a DataPtr be looked up by its pointer.
struct DeviceAllocator final : c10::Allocator {
  c10::DataPtr allocate(size_t nbytes) override {
    const c10::DeviceIndex device = current_device();
    void* ptr =
        nbytes ? device_cache().allocate(nbytes, &current_queue(device))
               : nullptr;
    return {
        ptr, ptr, &free_device_block, {c10::DeviceType::PrivateUse1, device}};
  }

  c10::DeleterFnPtr raw_deleter() const override {
    return &free_device_block;
  }

  // Used for storage copies made on the host (copy-on-write); it does not
  // wait for queued kernels, like the host-side memcpy it stands for.
  void copy_data(void* dest, const void* src, std::size_t count)
      const override {
    std::memcpy(dest, src, count);
  }
};

struct HostAllocator final : at::HostAllocator {
  c10::DataPtr allocate(size_t nbytes) override {
    void* ptr = nbytes ? host_cache().allocate(nbytes, nullptr) : nullptr;
    return {ptr, ptr, &free_host_block, c10::Device(c10::DeviceType::CPU)};
  }

  c10::DeleterFnPtr raw_deleter() const override {
    return &free_host_block;
  }

  void copy_data(void* dest, const void* src, std::size_t count)
      const override {
    std::memcpy(dest, src, count);
  }

  // As in CUDA: a stream that reads or writes a pinned buffer keeps it from
  // being reused until the stream's work queued at free time is done.
  bool record_event(void* /*ptr*/, void* ctx, c10::Stream stream) override {
    return host_cache().record_stream(ctx, queue_of(stream));
  }

  void empty_cache() override {
    testdev::empty_cache();
  }

  // Tests read testdev.counters() instead; these stats stay empty.
  at::HostStats get_stats() override {
    return {};
  }
  void reset_accumulated_stats() override {}
  void reset_peak_stats() override {}
};

DeviceAllocator device_allocator;
HostAllocator host_allocator;

REGISTER_ALLOCATOR(c10::DeviceType::PrivateUse1, &device_allocator);
REGISTER_HOST_ALLOCATOR(at::kPrivateUse1, &host_allocator);

} // namespace

void record_stream(const c10::DataPtr& data, const c10::Stream& stream) {
  if (data.get_deleter() == &free_device_block) {
    device_cache().record_stream(data.get(), queue_of(stream));
  }
}

bool is_pinned(const void* ptr) {
  return host_cache().owns(ptr);
}

std::map<std::string, int64_t> device_counters() {
  return device_cache().counters();
}

std::map<std::string, int64_t> host_counters() {
  return host_cache().counters();
}

void reset_counters() {
  device_cache().reset_counters();
  host_cache().reset_counters();
}

uint64_t device_buffer_id(const void* ptr, int /*device: ids are process-wide*/) {
  return device_cache().buffer_id(ptr);
}

void empty_cache() {
  for (c10::DeviceIndex device = 0; device < device_count(); ++device) {
    synchronize_device(device);
  }
  device_cache().release_cached();
  host_cache().release_cached();
}

} // namespace testdev
