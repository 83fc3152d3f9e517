// The trace renders in Perfetto as it should: every track named, the events of a track nested
// (never partly overlapping), reads named by file and tensors with their route, copies called
// copies and conversions conversions.
#include <map>
#include <set>

#include <catch2/catch.hpp>
#include <nlohmann/json.hpp>

#include "loadstone/loader.h"
#include "test_model.h"

namespace loadstone {
namespace {

using nlohmann::json;
using testing::TempDir;

json Traced(const Checkpoint& ckpt, const PlanOptions& po, const TempDir& dir,
            const LoaderOptions& lo = {}) {
  auto plan = Plan(ckpt, po);
  REQUIRE(plan.ok());
  Loader loader(lo);
  LoadOptions options;
  options.trace = true;
  LoadHandle load = loader.Load(ckpt, *plan, options);
  REQUIRE(load.Done().get().ok());
  return json::parse(testing::TraceText(load, dir));
}

// Complete events of one track either nest or follow each other (what Perfetto can draw).
void CheckNested(const std::vector<std::pair<double, double>>& spans_in, const std::string& track) {
  auto spans = spans_in;
  std::sort(spans.begin(), spans.end());
  std::vector<double> open;  // ends of the spans enclosing the current one
  for (const auto& [begin, end] : spans) {
    while (!open.empty() && open.back() <= begin + 1e-3) open.pop_back();
    INFO(track << ": [" << begin << ", " << end << ") inside one ending at "
               << (open.empty() ? -1 : open.back()));
    if (!open.empty()) CHECK(end <= open.back() + 1e-3);
    open.push_back(end);
  }
}

// `overlapping`: the load read several chunks at once (in-place reads, submitted in batches),
// which must then lie on more than one lane.
void CheckTrace(const json& doc, const Checkpoint& ckpt, bool overlapping) {
  std::map<uint64_t, std::string> names;
  for (const auto& e : doc["traceEvents"]) {
    if (e["ph"] == "M" && e["name"] == "thread_name") names[e["tid"]] = e["args"]["name"];
  }
  std::map<uint64_t, std::vector<std::pair<double, double>>> spans;
  std::set<std::string> files;
  for (const CheckpointFile& f : ckpt.files()) files.insert(f.path);
  size_t reads = 0, copies = 0;
  for (const auto& e : doc["traceEvents"]) {
    if (e["ph"] == "M") continue;
    const uint64_t tid = e["tid"];
    INFO(e.dump());
    CHECK(names.count(tid) == 1);  // no unnamed track
    if (e["ph"] != "X") continue;
    spans[tid].push_back({e["ts"].get<double>(), e["ts"].get<double>() + e["dur"].get<double>()});
    if (e["cat"] == "read") {
      ++reads;
      CHECK(names[tid].starts_with("reads in flight "));
      CHECK(files.count(e["args"]["file"].get<std::string>()) == 1);
      REQUIRE(e["args"]["tensors"].size() >= 1);
      for (const auto& t : e["args"]["tensors"]) CHECK(ckpt.Find(t.get<std::string>()) != nullptr);
      // Reads take one of the two routes that read into memory; the plan's route is kept too.
      const std::string route = e["args"]["route"];
      CHECK((route == "in place" || route == "staged"));
      const std::string planned = e["args"]["planned"];
      CHECK((planned == route || planned == "staged when cold" || planned == "fresh pages"));
      CHECK(e["name"].get<std::string>().starts_with("read "));
    }
    if (e["cat"] == "copy") {
      ++copies;
      CHECK(e["name"].get<std::string>().starts_with("copy "));
    }
    if (e["cat"] == "convert") {
      const std::string name = e["name"];
      CHECK((name.starts_with("cast ") || name.starts_with("fp8-block-dequant ")));
    }
  }
  CHECK(reads > 0);
  for (const auto& [tid, list] : spans) CheckNested(list, names[tid]);
  size_t lanes = 0;
  for (const auto& [tid, name] : names) lanes += name.starts_with("reads in flight ");
  if (overlapping) CHECK(lanes > 1);
  CHECK(std::any_of(names.begin(), names.end(), [](const auto& n) { return n.second == "event loop"; }));
  (void)copies;
}

TEST_CASE("trace: named tracks, nested events, reads by file and tensor, as stored and cast") {
  TempDir dir;
  Checkpoint ckpt = testing::WriteMixedCheckpoint(dir);
  {
    // Fresh pages off: the large tensors are read in place, many reads in flight at once.
    PlanOptions in_place;
    in_place.routes.fill_fresh_pages = false;
    const json plain = Traced(ckpt, in_place, dir);
    CheckTrace(plain, ckpt, /*overlapping=*/true);
    size_t converts = 0;
    for (const auto& e : plain["traceEvents"]) converts += e.value("cat", "") == "convert";
    CHECK(converts == 0);  // nothing is converted: nothing is called a conversion
  }
  PlanOptions cast;
  cast.dtype = DType::kF32;
  const json cast_trace = Traced(ckpt, cast, dir);
  CheckTrace(cast_trace, ckpt, /*overlapping=*/false);
  size_t casts = 0;
  for (const auto& e : cast_trace["traceEvents"]) casts += e.value("cat", "") == "convert";
  CHECK(casts > 0);
}

}  // namespace
}  // namespace loadstone
