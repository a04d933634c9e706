// The choice settings that code past the parser tests, as enums: a typo in a
// comparison is then a compile error, not a branch that never runs. Each enum
// has one table of its names (SettingNames below), which the parser accepts
// (EnvReader::choice) and the logs print (settingName).
#pragma once
#include <array>
#include <cstdint>
#include <string_view>
#include <utility>

namespace roce {

enum class NetTransport : uint8_t { Auto, Verbs, Tcp };  // ROCE_PG_NET_TRANSPORT
enum class ConnectMode : uint8_t { Lazy, Eager };        // ROCE_PG_CONNECT
enum class SubgroupMode : uint8_t { Join, Parent };      // ROCE_PG_SUBGROUPS
enum class DeviceReduce : uint8_t { Auto, Host, Device };  // ROCE_PG_DEVICE_REDUCE
enum class GpudirectMode : uint8_t { Auto, Off };        // ROCE_PG_GPUDIRECT
enum class TorchRecorder : uint8_t { Native, Hook };     // ROCE_PG_TORCH_FR
// The shapes of the collectives other than allreduce (whose algorithms are
// the allreduce registry's names): auto, the shared-memory route, or one
// point-to-point algorithm forced.
enum class AllgatherShape : uint8_t { Auto, Shm, Ring, Bruck, Hier };  // ROCE_PG_ALGO_ALLGATHER
enum class ReduceScatterShape : uint8_t { Auto, Shm, Ring, Hier };     // ROCE_PG_ALGO_REDUCE_SCATTER
enum class BroadcastShape : uint8_t { Auto, Shm, Binomial, Chain };    // ROCE_PG_ALGO_BROADCAST

template <class E>
struct SettingNames;
template <>
struct SettingNames<NetTransport> {
  static constexpr std::array<std::pair<const char*, NetTransport>, 3> table{
      {{"auto", NetTransport::Auto}, {"verbs", NetTransport::Verbs}, {"tcp", NetTransport::Tcp}}};
};
template <>
struct SettingNames<ConnectMode> {
  static constexpr std::array<std::pair<const char*, ConnectMode>, 2> table{
      {{"lazy", ConnectMode::Lazy}, {"eager", ConnectMode::Eager}}};
};
template <>
struct SettingNames<SubgroupMode> {
  static constexpr std::array<std::pair<const char*, SubgroupMode>, 2> table{
      {{"join", SubgroupMode::Join}, {"parent", SubgroupMode::Parent}}};
};
template <>
struct SettingNames<DeviceReduce> {
  static constexpr std::array<std::pair<const char*, DeviceReduce>, 3> table{
      {{"auto", DeviceReduce::Auto}, {"host", DeviceReduce::Host}, {"device", DeviceReduce::Device}}};
};
template <>
struct SettingNames<GpudirectMode> {
  static constexpr std::array<std::pair<const char*, GpudirectMode>, 2> table{
      {{"auto", GpudirectMode::Auto}, {"off", GpudirectMode::Off}}};
};
template <>
struct SettingNames<TorchRecorder> {
  static constexpr std::array<std::pair<const char*, TorchRecorder>, 2> table{
      {{"native", TorchRecorder::Native}, {"hook", TorchRecorder::Hook}}};
};

template <>
struct SettingNames<AllgatherShape> {
  static constexpr std::array<std::pair<const char*, AllgatherShape>, 5> table{
      {{"auto", AllgatherShape::Auto},
       {"shm", AllgatherShape::Shm},
       {"ring", AllgatherShape::Ring},
       {"bruck", AllgatherShape::Bruck},
       {"hier", AllgatherShape::Hier}}};
};
template <>
struct SettingNames<ReduceScatterShape> {
  static constexpr std::array<std::pair<const char*, ReduceScatterShape>, 4> table{
      {{"auto", ReduceScatterShape::Auto},
       {"shm", ReduceScatterShape::Shm},
       {"ring", ReduceScatterShape::Ring},
       {"hier", ReduceScatterShape::Hier}}};
};
template <>
struct SettingNames<BroadcastShape> {
  static constexpr std::array<std::pair<const char*, BroadcastShape>, 4> table{
      {{"auto", BroadcastShape::Auto},
       {"shm", BroadcastShape::Shm},
       {"binomial", BroadcastShape::Binomial},
       {"chain", BroadcastShape::Chain}}};
};

template <class E>
constexpr const char* settingName(E value) {
  for (const auto& [name, v] : SettingNames<E>::table)
    if (v == value) return name;
  return "?";
}

// The value called `name`, or false (for callers that parse outside Config).
template <class E>
constexpr bool settingValue(std::string_view name, E& out) {
  for (const auto& [n, v] : SettingNames<E>::table)
    if (name == n) {
      out = v;
      return true;
    }
  return false;
}

}  // namespace roce
