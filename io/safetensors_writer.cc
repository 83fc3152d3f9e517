#include "loadstone/writer.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <filesystem>
#include <set>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <nlohmann/json.hpp>

#include "io/posix_error.h"

namespace loadstone {
using io::ErrnoStatus;
}

namespace loadstone {
namespace {

constexpr size_t kChunk = 8 << 20;

class OutFile {
 public:
  ~OutFile() {
    if (fd_ >= 0) ::close(fd_);
  }
  Status Open(const std::string& path) {
    path_ = path;
    fd_ = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    return fd_ < 0 ? ErrnoStatus(errno, "cannot create", path) : Status::OK();
  }
  Status Write(std::span<const std::byte> bytes) {
    while (!bytes.empty()) {
      ssize_t n = ::write(fd_, bytes.data(), bytes.size());
      if (n < 0 && errno == EINTR) continue;
      if (n < 0) return ErrnoStatus(errno, "cannot write", path_);
      bytes = bytes.subspan(static_cast<size_t>(n));
    }
    return Status::OK();
  }
  Status Close() {
    int fd = std::exchange(fd_, -1);
    return ::close(fd) != 0 ? ErrnoStatus(errno, "cannot close", path_) : Status::OK();
  }

 private:
  int fd_ = -1;
  std::string path_;
};

Status CheckTensor(const TensorToWrite& t) {
  uint64_t numel = 1;
  for (uint64_t d : t.shape) {
    if (__builtin_mul_overflow(numel, d, &numel)) {
      return Status::InvalidArgument(fmt::format("tensor '{}': shape overflows", t.name));
    }
  }
  if ((numel * DTypeBits(t.dtype)) % 8 != 0) {
    return Status::InvalidArgument(
        fmt::format("tensor '{}': {} elements of {} are not whole bytes", t.name, numel,
                    SafetensorsName(t.dtype)));
  }
  if (!t.fill && t.data.size() != t.nbytes()) {
    return Status::InvalidArgument(fmt::format("tensor '{}': {} bytes given, shape needs {}",
                                               t.name, t.data.size(), t.nbytes()));
  }
  return Status::OK();
}

Status WriteData(const TensorToWrite& t, OutFile& out, std::vector<std::byte>& buffer) {
  if (!t.fill) return out.Write(t.data);
  const uint64_t total = t.nbytes();
  for (uint64_t done = 0; done < total;) {
    const size_t n = static_cast<size_t>(std::min<uint64_t>(kChunk, total - done));
    buffer.resize(n);
    t.fill(done, buffer);
    LOADSTONE_RETURN_IF_ERROR(out.Write(buffer));
    done += n;
  }
  return Status::OK();
}

}  // namespace

uint64_t TensorToWrite::nbytes() const {
  uint64_t numel = 1;
  for (uint64_t d : shape) numel *= d;
  return numel * DTypeBits(dtype) / 8;
}

Status WriteSafetensors(const std::string& path, const std::vector<TensorToWrite>& tensors,
                        const std::map<std::string, std::string>& metadata) {
  std::vector<const TensorToWrite*> order;
  std::set<std::string_view> names;
  for (const TensorToWrite& t : tensors) {
    LOADSTONE_RETURN_IF_ERROR(CheckTensor(t));
    if (!names.insert(t.name).second || t.name == "__metadata__") {
      return Status::InvalidArgument(fmt::format("tensor name '{}' used twice or reserved", t.name));
    }
    order.push_back(&t);
  }
  std::stable_sort(order.begin(), order.end(), [](const auto* a, const auto* b) {
    if (a->dtype != b->dtype) return a->dtype > b->dtype;
    return a->name < b->name;
  });
  // Built as text: a JSON object with 100k keys would cost a quadratic ordered insert.
  std::string text = "{";
  if (!metadata.empty()) text += "\"__metadata__\":" + nlohmann::json(metadata).dump() + ",";
  uint64_t offset = 0;
  for (const TensorToWrite* t : order) {
    fmt::format_to(std::back_inserter(text),
                   R"({}:{{"dtype":"{}","shape":[{}],"data_offsets":[{},{}]}},)",
                   nlohmann::json(t->name).dump(), SafetensorsName(t->dtype),
                   fmt::join(t->shape, ","), offset, offset + t->nbytes());
    offset += t->nbytes();
  }
  if (text.back() == ',') text.pop_back();
  text += "}";
  text.append((8 - text.size() % 8) % 8, ' ');
  std::byte prefix[8];
  for (int i = 0; i < 8; ++i) prefix[i] = static_cast<std::byte>((text.size() >> (8 * i)) & 0xFF);

  OutFile out;
  LOADSTONE_RETURN_IF_ERROR(out.Open(path));
  LOADSTONE_RETURN_IF_ERROR(out.Write(prefix));
  LOADSTONE_RETURN_IF_ERROR(out.Write(std::as_bytes(std::span<const char>(text))));
  std::vector<std::byte> buffer;
  for (const TensorToWrite* t : order) LOADSTONE_RETURN_IF_ERROR(WriteData(*t, out, buffer));
  return out.Close();
}

Result<std::vector<std::string>> WriteShardedSafetensors(const std::string& folder,
                                                         const std::vector<TensorToWrite>& tensors,
                                                         const ShardedWriteOptions& options) {
  std::error_code ec;
  std::filesystem::create_directories(folder, ec);
  if (ec) return ErrnoStatus(ec.value(), "cannot create folder", folder);

  std::vector<std::vector<TensorToWrite>> shards(1);
  uint64_t shard_bytes = 0, total = 0;
  for (const TensorToWrite& t : tensors) {
    if (!shards.back().empty() && shard_bytes + t.nbytes() > options.max_shard_size) {
      shards.emplace_back();
      shard_bytes = 0;
    }
    shards.back().push_back(t);
    shard_bytes += t.nbytes();
    total += t.nbytes();
  }
  std::vector<std::string> written;
  const std::filesystem::path dir(folder);
  if (shards.size() == 1) {
    written.push_back((dir / (options.prefix + ".safetensors")).string());
    LOADSTONE_RETURN_IF_ERROR(WriteSafetensors(written.back(), shards[0], options.metadata));
    return written;
  }
  nlohmann::ordered_json weight_map = nlohmann::ordered_json::object();
  for (size_t i = 0; i < shards.size(); ++i) {
    const std::string name =
        fmt::format("{}-{:05d}-of-{:05d}.safetensors", options.prefix, i + 1, shards.size());
    written.push_back((dir / name).string());
    LOADSTONE_RETURN_IF_ERROR(WriteSafetensors(written.back(), shards[i], options.metadata));
    for (const TensorToWrite& t : shards[i]) weight_map[t.name] = name;
  }
  nlohmann::ordered_json index = {{"metadata", {{"total_size", total}}},
                                  {"weight_map", weight_map}};
  written.push_back((dir / (options.prefix + ".safetensors.index.json")).string());
  OutFile out;
  LOADSTONE_RETURN_IF_ERROR(out.Open(written.back()));
  const std::string text = index.dump(2) + "\n";
  LOADSTONE_RETURN_IF_ERROR(out.Write(std::as_bytes(std::span<const char>(text))));
  LOADSTONE_RETURN_IF_ERROR(out.Close());
  return written;
}

}  // namespace loadstone
