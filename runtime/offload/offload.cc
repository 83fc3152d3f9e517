#include "loadstone/offload.h"

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <functional>
#include <map>
#include <optional>
#include <unordered_set>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "io/formats/json_util.h"
#include "io/file.h"
#include "io/formats/offload_folder.h"
#include "io/out_file.h"
#include "runtime/pipeline/load_hooks.h"

namespace loadstone {
namespace {

namespace fs = std::filesystem;

// The offloaded tensors of `plan` in the checkpoint's order (a .bin's state-dict order, which
// is the order accelerate writes them in).
std::vector<const OffloadPlan*> InSourceOrder(const LoadPlan& plan) {
  std::vector<const OffloadPlan*> out;
  out.reserve(plan.offloaded.size());
  for (const OffloadPlan& o : plan.offloaded) out.push_back(&o);
  std::sort(out.begin(), out.end(),
            [](const OffloadPlan* a, const OffloadPlan* b) { return a->source < b->source; });
  return out;
}

// A NAME.dat written under a new name beside it (never a file that existed), renamed over it
// once every file is written (RenameWritten), else removed.
struct WrittenFile {
  std::string temp, path;
};
// The NAME.dat files of one WriteOffload call, written so far.
struct WrittenFiles {
  const LoadHooks* hooks = nullptr;  // the Loader's (LoadHooks::create_offload_file), or null
  std::vector<WrittenFile> files;
};

// Writes tensor `name`'s NAME.dat through `fill` (which appends its `nbytes` bytes), into a new
// file beside the final name: RenameWritten renames every file once all are written, so that a
// failure never leaves an existing NAME.dat half-rewritten, nor touches a file it did not make.
Status WriteDat(const std::string& folder, const std::string& name, uint64_t nbytes,
                const std::function<Status(io::OutFile&)>& fill, WrittenFiles* written,
                OffloadSummary* summary) {
  const std::string path = io::OffloadDataPath(folder, name);
  io::OutFile out;
  const int given = written->hooks && written->hooks->create_offload_file
                        ? written->hooks->create_offload_file(path)
                        : -1;
  if (given >= 0) {
    out.Adopt(given, path);
  } else {
    std::string temp;
    LOADSTONE_RETURN_IF_ERROR(out.OpenBeside(path, &temp));
    written->files.push_back({std::move(temp), path});
  }
  LOADSTONE_RETURN_IF_ERROR(fill(out));
  LOADSTONE_RETURN_IF_ERROR(out.Close());
  ++summary->written;
  summary->bytes_written += nbytes;
  return Status::OK();
}

// One batch of tensors to write, loading into host memory (StartBatch), then written as NAME.dat
// files (FinishBatch). BatchedWrites starts the next batch's load before it writes this one's,
// so the reads of one overlap the writes of the other.
struct PendingBatch {
  std::unordered_set<std::string_view> names;
  LoadHandle load;
};

Result<PendingBatch> StartBatch(Loader& loader, const Checkpoint& checkpoint,
                                const std::vector<const OffloadPlan*>& batch,
                                const OffloadOptions& options) {
  PendingBatch pending;
  PlanOptions opt;
  for (const OffloadPlan* o : batch) {
    const TensorInfo& t = checkpoint.tensors()[o->source];
    pending.names.insert(t.name);
    if (o->conversion != Conversion::kNone) opt.special_dtypes.emplace(t.name, o->dtype);
  }
  const auto* names = &pending.names;  // asked by Plan() below only, before `pending` moves
  opt.include = [names](const TensorInfo& t) { return names->contains(t.name); };
  opt.platform = loader.platform();
  LOADSTONE_ASSIGN_OR_RETURN(const LoadPlan plan, Plan(checkpoint, opt));
  pending.load = loader.Load(checkpoint, plan, options.load);
  return pending;
}

Status FinishBatch(PendingBatch& pending, const std::string& folder, const OffloadOptions& options,
                   WrittenFiles* written, OffloadSummary* summary) {
  LoadHandle& load = pending.load;
  if (options.cancelled) {
    while (load.Done().wait_for(std::chrono::milliseconds(50)) != std::future_status::ready) {
      if (options.cancelled()) load.Cancel();
    }
  }
  LOADSTONE_RETURN_IF_ERROR(load.Done().get());
  summary->bytes_read += load.progress().bytes_read;
  for (const Tensor& t : load.Tensors()) {
    if (!pending.names.contains(t.name())) continue;  // a float8 weight's scales, loaded with it
    LOADSTONE_RETURN_IF_ERROR(WriteDat(
        folder, t.name(), t.nbytes(),
        [&](io::OutFile& out) { return out.Write(std::span<const std::byte>(t.data(), t.nbytes())); },
        written, summary));
  }
  return Status::OK();
}

// The source files WriteAll copies tensors out of, each opened once and checked against its
// catalog entry (a file changed since the header was read is refused, as a load refuses it).
class SourceFiles {
 public:
  explicit SourceFiles(const Checkpoint& checkpoint) : checkpoint_(checkpoint) {}
  Result<const io::File*> Get(uint32_t index) {
    auto it = open_.find(index);
    if (it == open_.end()) {
      const CheckpointFile& catalogued = checkpoint_.files()[index];
      LOADSTONE_ASSIGN_OR_RETURN(io::File file, io::File::OpenForRead(catalogued.path));
      LOADSTONE_RETURN_IF_ERROR(io::CheckUnchanged(file, catalogued));
      it = open_.emplace(index, std::move(file)).first;
    }
    return &it->second;
  }

 private:
  const Checkpoint& checkpoint_;
  std::map<uint32_t, io::File> open_;
};

// A tensor whose NAME.dat is its bytes in the file as they are: copied file to file inside the
// kernel, never through memory.
bool CopiedAsStored(const OffloadPlan& o, const TensorInfo& t) {
  return o.conversion == Conversion::kNone && t.plain_layout() && !t.packed && t.nbytes == o.nbytes;
}

Status CopyAsStored(SourceFiles& sources, const TensorInfo& t, const std::string& folder,
                    WrittenFiles* written, OffloadSummary* summary) {
  LOADSTONE_ASSIGN_OR_RETURN(const io::File* source, sources.Get(t.file));
  summary->bytes_read += t.nbytes;
  return WriteDat(
      folder, t.name, t.nbytes,
      [&](io::OutFile& out) {
        return out.CopyFrom(*source, t.offset, t.nbytes).WithContext(fmt::format("tensor '{}'", t.name));
      },
      written, summary);
}

// folder/index.json with `entries` merged in (Python dict.update: an existing key keeps its
// place, a new one goes last), written as json.dump(indent=2) writes it, through a rename.
Status MergeIndex(const std::string& folder, const nlohmann::ordered_json& entries) {
  const std::string path = (fs::path(folder) / "index.json").string();
  nlohmann::ordered_json index = nlohmann::ordered_json::object();
  std::error_code ec;
  if (fs::exists(path, ec)) {
    const std::string what = fmt::format("offload index '{}'", path);
    LOADSTONE_ASSIGN_OR_RETURN(const std::string text,
                               io::ReadSmallFile(path, what, io::kMaxOffloadIndexBytes,
                                                 "kMaxOffloadIndexBytes"));
    LOADSTONE_ASSIGN_OR_RETURN(index, io::ParseJsonStrictOrdered(text, what));
    if (!index.is_object()) {
      return Status::Corruption(fmt::format("{} is not a JSON object; remove it or give another "
                                            "offload folder",
                                            what));
    }
  }
  for (const auto& [name, value] : entries.items()) index[name] = value;
  io::OutFile out;
  LOADSTONE_RETURN_IF_ERROR(out.OpenReplacing(path));
  LOADSTONE_RETURN_IF_ERROR(out.Write(index.dump(2, ' ', /*ensure_ascii=*/true)));
  return out.Commit();
}

// The tensors written through memory, batch by batch: a batch (up to options.batch_bytes, or
// one larger tensor) loads while the one before it is written (FinishBatch), so that reads
// overlap writes. Every argument must outlive it.
class BatchedWrites {
 public:
  BatchedWrites(Loader& loader, const Checkpoint& checkpoint, const std::string& folder,
                const OffloadOptions& options, WrittenFiles* written,
                OffloadSummary* summary)
      : loader_(loader), checkpoint_(checkpoint), folder_(folder), options_(options),
        written_(written), summary_(summary) {}

  // Adds `o` to the batch; a batch that `o` would take past options.batch_bytes starts first.
  Status Add(const OffloadPlan* o) {
    if (batch_bytes_ > 0 && batch_bytes_ + o->nbytes > options_.batch_bytes) {
      LOADSTONE_RETURN_IF_ERROR(Flush());
    }
    batch_.push_back(o);
    batch_bytes_ += o->nbytes;
    return Status::OK();
  }

  // Starts the last batch, and writes every batch not written yet.
  Status Finish() {
    LOADSTONE_RETURN_IF_ERROR(Flush());
    return WriteLoading();
  }

 private:
  // Writes the batch whose load runs, if there is one.
  Status WriteLoading() {
    if (!loading_) return Status::OK();
    PendingBatch done = std::move(*loading_);
    loading_.reset();
    return FinishBatch(done, folder_, options_, written_, summary_);
  }

  // Starts the batch's load (Cancelled when options.cancelled asks), then writes the one before.
  Status Flush() {
    if (batch_.empty()) return Status::OK();
    if (options_.cancelled && options_.cancelled()) {
      return Status::Cancelled("writing the offload folder was cancelled");
    }
    LOADSTONE_ASSIGN_OR_RETURN(PendingBatch next,
                               StartBatch(loader_, checkpoint_, batch_, options_));
    batch_.clear();
    batch_bytes_ = 0;
    LOADSTONE_RETURN_IF_ERROR(WriteLoading());
    loading_ = std::move(next);
    return Status::OK();
  }

  Loader& loader_;
  const Checkpoint& checkpoint_;
  const std::string& folder_;
  const OffloadOptions& options_;
  WrittenFiles* written_;
  OffloadSummary* summary_;
  std::vector<const OffloadPlan*> batch_;
  uint64_t batch_bytes_ = 0;
  std::optional<PendingBatch> loading_;  // loads while the batch before it is written
};

// Each written file renamed to its NAME.dat; then none is left for the caller to remove.
Status RenameWritten(WrittenFiles* written) {
  for (const WrittenFile& file : written->files) {
    if (::rename(file.temp.c_str(), file.path.c_str()) != 0) {
      return io::ErrnoStatus(errno, fmt::format("cannot rename '{}' to", file.temp), file.path);
    }
  }
  written->files.clear();  // in place now: a failure of the index after leaves them
  return Status::OK();
}

Status WriteAll(Loader& loader, const Checkpoint& checkpoint, const LoadPlan& plan,
                const std::vector<const OffloadPlan*>& order, const OffloadOptions& options,
                WrittenFiles* written, OffloadSummary* summary) {
  const std::string& folder = plan.offload_folder;
  std::error_code ec;
  fs::create_directories(folder, ec);
  if (ec) return io::ErrnoStatus(ec.value(), "cannot create the offload folder", folder);
  nlohmann::ordered_json entries = nlohmann::ordered_json::object();
  SourceFiles sources(checkpoint);
  BatchedWrites batches(loader, checkpoint, folder, options, written, summary);
  for (const OffloadPlan* o : order) {
    const TensorInfo& t = checkpoint.tensors()[o->source];
    nlohmann::ordered_json entry = nlohmann::ordered_json::object();
    if (o->in_place) {
      entry["safetensors_file"] = fs::absolute(checkpoint.files()[t.file].path, ec).string();
      entry["weight_name"] = t.name;
      entry["dtype"] = std::string(TorchName(o->dtype));
      ++summary->in_place;
    } else if (CopiedAsStored(*o, t)) {
      entry["dtype"] = std::string(*io::OffloadDTypeName(o->dtype));
      entry["shape"] = o->shape;
      if (options.cancelled && options.cancelled()) {
        return Status::Cancelled("writing the offload folder was cancelled");
      }
      LOADSTONE_RETURN_IF_ERROR(CopyAsStored(sources, t, folder, written, summary));
    } else {
      entry["dtype"] = std::string(*io::OffloadDTypeName(o->dtype));
      entry["shape"] = o->shape;
      LOADSTONE_RETURN_IF_ERROR(batches.Add(o));
    }
    entries[t.name] = std::move(entry);
  }
  LOADSTONE_RETURN_IF_ERROR(batches.Finish());
  LOADSTONE_RETURN_IF_ERROR(RenameWritten(written));
  LOADSTONE_RETURN_IF_ERROR(MergeIndex(folder, entries));
  summary->index_path = (fs::path(folder) / "index.json").string();
  return Status::OK();
}

}  // namespace

Result<OffloadSummary> WriteOffload(Loader& loader, const Checkpoint& checkpoint,
                                    const LoadPlan& plan, const OffloadOptions& options) {
  if (plan.checkpoint_fingerprint != checkpoint.fingerprint()) {
    return Status::InvalidArgument("WriteOffload: the plan was made for another checkpoint");
  }
  OffloadSummary summary;
  if (plan.offloaded.empty() || plan.offload_folder.empty()) {
    // Plan() refuses a tensor that needs a folder when none is given: all are in place.
    for (const OffloadPlan& o : plan.offloaded) summary.in_place += o.in_place;
    return summary;
  }
  const std::vector<const OffloadPlan*> order = InSourceOrder(plan);  // Plan checked the names
  WrittenFiles written{LoaderAccess::Hooks(loader)};
  Status s = WriteAll(loader, checkpoint, plan, order, options, &written, &summary);
  if (!s.ok()) {
    std::error_code ec;
    for (const WrittenFile& file : written.files) fs::remove(file.temp, ec);
    return s;
  }
  return summary;
}

}  // namespace loadstone
