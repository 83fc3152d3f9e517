#include "io/shard_reader.h"

#include <algorithm>
#include <filesystem>
#include <system_error>
#include <utility>

#include <fmt/format.h>

#include "io/http_reader.h"
#include "io/location.h"

namespace loadstone::io {
namespace {

// Appends `part` (a catalog of its own, files numbered from 0) to `impl`, after what it holds.
void Append(Checkpoint::Impl&& part, Checkpoint::Impl* impl) {
  const auto base = static_cast<uint32_t>(impl->files.size());
  for (CheckpointFile& f : part.files) impl->files.push_back(std::move(f));
  for (TensorInfo& t : part.tensors) {
    t.file += base;
    impl->tensors.push_back(std::move(t));
  }
  impl->total_bytes += part.total_bytes;
  for (auto& [key, value] : part.metadata) impl->metadata.emplace(key, std::move(value));
  for (std::string& w : part.warnings) impl->warnings.push_back(std::move(w));
}

}  // namespace

ShardReader::ShardReader(CheckpointFormat format, std::string folder, std::string index_path)
    : format_(format), folder_(std::move(folder)), index_path_(std::move(index_path)) {}

ShardReader::~ShardReader() {
  {
    std::lock_guard lock(mu_);
    closed_ = true;
    waiting_.clear();
  }
  work_.notify_all();
  for (std::thread& t : helpers_) t.join();
}

void ShardReader::Add(std::string_view name) {
  {
    std::lock_guard lock(mu_);
    auto [it, added] = by_name_.emplace(std::string(name), nullptr);
    if (!added) return;
    shards_.push_back(std::make_unique<Shard>());
    shards_.back()->name = it->first;
    it->second = shards_.back().get();
    waiting_.push_back(it->second);
  }
  work_.notify_one();
  // Remote shards wait on the network, not a core: as many helpers as kMaxHelpers.
  const unsigned cores = std::max(1u, std::thread::hardware_concurrency());
  const unsigned most = IsRemoteAddress(folder_) ? kMaxHelpers : std::min(cores - 1, kMaxHelpers);
  if (helpers_.size() < most && helpers_.size() < shards_.size()) {
    try {
      helpers_.emplace_back([this] { Help(); });
    } catch (const std::system_error&) {  // no more threads: Finish reads the rest
    }
  }
}

void ShardReader::Read(Shard& shard) const {
  const std::string path = JoinLocation(folder_, shard.name);
  shard.status =
      MayBeThere(path) ? AddCheckpointFile(format_, path, &shard.part) : Status::NotFound("");
  if (shard.status.code() == StatusCode::kNotFound) {
    shard.status = Status::NotFound(fmt::format("shard '{}' named by index '{}' does not exist{}",
                                                path, index_path_,
                                                shard.status.message().empty()
                                                    ? std::string()
                                                    : fmt::format(" ({})", shard.status.message())));
  }
}

bool ShardReader::ReadNext() {
  Shard* shard;
  {
    std::lock_guard lock(mu_);
    if (waiting_.empty()) return false;
    shard = waiting_.front();
    waiting_.pop_front();
  }
  Read(*shard);
  return true;
}

void ShardReader::Help() {
  while (true) {
    {
      std::unique_lock lock(mu_);
      work_.wait(lock, [this] { return closed_ || !waiting_.empty(); });
      if (waiting_.empty()) return;  // closed, nothing left
    }
    ReadNext();
  }
}

Status ShardReader::Finish(const std::vector<std::string>& shards, Checkpoint::Impl* impl) {
  for (const std::string& name : shards) Add(name);
  {
    std::lock_guard lock(mu_);
    closed_ = true;
  }
  work_.notify_all();
  while (ReadNext()) {
  }
  for (std::thread& t : helpers_) t.join();
  helpers_.clear();
  size_t tensors = impl->tensors.size();
  for (const auto& shard : shards_) tensors += shard->part.tensors.size();
  impl->tensors.reserve(tensors);
  for (const std::string& name : shards) {
    Shard& shard = *by_name_.at(name);
    LOADSTONE_RETURN_IF_ERROR(shard.status);
    Append(std::move(shard.part), impl);
  }
  return Status::OK();
}

}  // namespace loadstone::io
