// The shards of an index read into a catalog while the index itself is still being read: each
// shard's header parsed on a helper thread from the moment the index first names it, then the
// shards added in the index's order, with the first error that reading them one after the
// other would meet. Internal to io/checkpoint_files.cc.
#ifndef LOADSTONE_IO_SHARD_READER_H_
#define LOADSTONE_IO_SHARD_READER_H_

#include <condition_variable>
#include <cstddef>
#include <deque>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <thread>
#include <unordered_map>
#include <vector>

#include "io/checkpoint_impl.h"

namespace loadstone::io {

class ShardReader {
 public:
  // Shards of `format` in `folder`, named by the index at `index_path`.
  ShardReader(CheckpointFormat format, std::string folder, std::string index_path);
  ~ShardReader();  // waits for the helpers (a shard being read is finished, the rest dropped)
  ShardReader(const ShardReader&) = delete;
  ShardReader& operator=(const ShardReader&) = delete;

  // Starts reading shard `name` (a file name inside the folder, checked by the caller), once
  // however often it is given.
  void Add(std::string_view name);
  // Reads what is left of `shards` (every shard of the index, sorted), waits for the helpers,
  // and appends the shards to `impl` in that order; the first shard's error in that order
  // (NotFound for a shard that does not exist).
  Status Finish(const std::vector<std::string>& shards, Checkpoint::Impl* impl);

 private:
  struct Shard {
    std::string name;
    Checkpoint::Impl part;  // its files and tensors, files numbered from 0
    Status status;
  };
  static constexpr unsigned kMaxHelpers = 7;

  void Read(Shard& shard) const;
  bool ReadNext();  // false once no shard waits
  void Help();

  const CheckpointFormat format_;
  const std::string folder_;
  const std::string index_path_;
  std::mutex mu_;
  std::condition_variable work_;
  std::vector<std::unique_ptr<Shard>> shards_;  // in order of first mention
  std::unordered_map<std::string, Shard*> by_name_;
  std::deque<Shard*> waiting_;
  bool closed_ = false;  // no shard comes any more: helpers leave once none waits
  std::vector<std::thread> helpers_;
};

}  // namespace loadstone::io

#endif  // LOADSTONE_IO_SHARD_READER_H_
