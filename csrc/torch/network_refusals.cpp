#include "network_refusals.hpp"

#include "../runtime/front_desk.hpp"
#include "../runtime/process_links.hpp"
#include "../runtime/process_runtime.hpp"
#include "../transport/tcp/tcp_mux.hpp"

namespace roce::adapter {

NetworkRefusals networkRefusals() {
  auto& rt = roce::runtime::ProcessRuntime::get();
  const auto links = rt.links().parkedStats();
  return {
      {"net_unauthenticated", rt.desk().unauthenticated()},
      {"net_refused_busy", rt.desk().refusedBusy()},
      {"net_links_refused", links.linksRefused},
      {"net_records_dropped", links.dropped},
      {"net_records_misrouted", links.recordsMisrouted},
      {"net_records_forged", links.recordsForged},
      {"net_streams_refused", rt.service<roce::transport::tcp::TcpMux>().refusals()},
  };
}

}  // namespace roce::adapter
