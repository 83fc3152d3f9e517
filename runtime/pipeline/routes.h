// The route rules: where a fact the plan cannot know changes the route it gave a read, the memory
// it gave a tensor or the site of its conversion. There are two moments, and these are the only
// places the executor departs from the plan: when the load starts (what this Loader and its
// devices can do) and when a read's turn comes (where its bytes are). Everything else carries
// the plan out as it is.
#ifndef LOADSTONE_RUNTIME_PIPELINE_ROUTES_H_
#define LOADSTONE_RUNTIME_PIPELINE_ROUTES_H_

#include "loadstone/plan.h"

namespace loadstone::pipeline {

// What the Loader can do, known once the load has started.
struct StartFacts {
  bool fresh_pages = false;  // userfaultfd opened (FreshPages::Open)
  bool direct_io = false;    // LoaderOptions::direct_io: reads may bypass the page cache
};

// The route `planned` becomes for this load:
// - kFreshPages without fresh pages: the route the read has without them (kStagedWhenCold, or
//   kInPlace when cold reads are not staged), then the next rule;
// - kStagedWhenCold without direct I/O: kInPlace (every read comes through the page cache, so
//   staging would only add a copy).
ReadRoute RouteAtStart(ReadRoute planned, const ReadRouteOptions& options, const StartFacts& facts);

// Where a read's bytes are when its turn comes; each is asked only of the reads that need it.
struct TurnFacts {
  // The reader offers a view of them in the page cache. Asked of kFreshPages reads, and of reads
  // into memory that exists (TensorPlan::memory_given) that are not cold, when this load's
  // copies from a mapping are guarded (io/mapped_copy.h): the workers copy those with streaming
  // stores, which a read into existing memory cannot match.
  bool cached = false;
  bool cold = false;  // kStagedWhenCold: the reader would fetch them from the device
};

// The route taken: kFreshPages → kPageCacheCopy when cached, else kStaged; kStagedWhenCold →
// kStaged when cold, else as kInPlace; kInPlace → kPageCacheCopy when cached; any other route as
// it is.
ReadRoute RouteAtTurn(ReadRoute route, const TurnFacts& facts);

// Where a tensor's conversion runs in this load: a quantized weight planned for its device's
// decode (ConversionSite::kDevice) on a device that lacks the kernels (`device_decodes` false,
// Accelerator::DecodesQuantized) is decoded by the workers first (kCpuThenDevice); every other
// site as planned.
ConversionSite SiteAtStart(ConversionSite planned, Conversion conversion, bool device_decodes);

// The memory a tensor planned into `planned` gets in this load: fresh pages without fresh pages
// (userfaultfd refused) are a host buffer of its own; every other kind as planned.
TensorMemory MemoryAtStart(TensorMemory planned, const StartFacts& facts);

}  // namespace loadstone::pipeline

#endif  // LOADSTONE_RUNTIME_PIPELINE_ROUTES_H_
