// A load's progress and read statistics as Python dicts (LoadHandle.progress, read_stats).
#include <string>

#include <nanobind/nanobind.h>
#include <nanobind/stl/string.h>

#include "bindings.h"
#include "loadstone/loader.h"

namespace nb = nanobind;

namespace loadstone::python {

nb::dict ProgressDict(const Progress& p) {
  nb::dict d;
  d["bytes_total"] = p.bytes_total;
  d["bytes_read"] = p.bytes_read;
  d["bytes_to_place"] = p.bytes_to_place;
  d["bytes_placed"] = p.bytes_placed;
  d["tensors_total"] = p.tensors_total;
  d["tensors_done"] = p.tensors_done;
  d["seconds"] = p.seconds;
  d["read_gbps"] = p.read_gbps;
  d["eta_seconds"] = p.eta_seconds;
  return d;
}

nb::dict ReadStatsDict(const ReadStats& s) {
  nb::dict d;
  d["direct_bytes"] = s.direct_bytes;
  d["buffered_bytes"] = s.buffered_bytes;
  d["bounced_bytes"] = s.bounced_bytes;
  d["resubmits"] = s.resubmits;
  d["network_bytes"] = s.network_bytes;
  d["conversions_moved"] = s.conversions_moved;
  nb::dict routes;
  for (size_t i = 0; i < kReadRouteCount; ++i) {
    const RouteCount& r = s.routes[i];
    if (r.reads == 0) continue;
    routes[std::string(ReadRouteName(static_cast<ReadRoute>(i))).c_str()] =
        nb::make_tuple(r.reads, r.bytes);
  }
  d["routes"] = routes;
  return d;
}

}  // namespace loadstone::python
