#include "runtime/pipeline/routes.h"

#include "runtime/plan/schedule.h"

namespace loadstone::pipeline {

ReadRoute RouteAtStart(ReadRoute planned, const ReadRouteOptions& options,
                       const StartFacts& facts) {
  ReadRoute route = planned;
  if (route == ReadRoute::kFreshPages && !facts.fresh_pages) {
    route = planning::RouteWithoutFreshPages(options);
  }
  if (route == ReadRoute::kStagedWhenCold && !facts.direct_io) route = ReadRoute::kInPlace;
  return route;
}

ConversionSite SiteAtStart(ConversionSite planned, Conversion conversion, bool device_decodes) {
  if (planned == ConversionSite::kDevice && Unpacks(conversion) && !device_decodes) {
    return ConversionSite::kCpuThenDevice;
  }
  return planned;
}

TensorMemory MemoryAtStart(TensorMemory planned, const StartFacts& facts) {
  if (planned == TensorMemory::kFreshPages && !facts.fresh_pages) return TensorMemory::kHost;
  return planned;
}

ReadRoute RouteAtTurn(ReadRoute route, const TurnFacts& facts) {
  switch (route) {
    case ReadRoute::kFreshPages:
      return facts.cached ? ReadRoute::kPageCacheCopy : ReadRoute::kStaged;
    case ReadRoute::kStagedWhenCold:
      if (facts.cold) return ReadRoute::kStaged;
      [[fallthrough]];
    case ReadRoute::kInPlace:
      return facts.cached ? ReadRoute::kPageCacheCopy : ReadRoute::kInPlace;
    default:
      return route;
  }
}

}  // namespace loadstone::pipeline
