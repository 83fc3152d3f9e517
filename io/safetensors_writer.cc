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

#include "io/out_file.h"
#include "io/posix_error.h"

namespace loadstone {
using io::ErrnoStatus;
using io::OutFile;
}

namespace loadstone {
namespace {

constexpr size_t kChunk = 8 << 20;

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
    LOADSTONE_RETURN_IF_ERROR(t.fill(done, buffer));
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

std::vector<size_t> LayoutOrder(const std::vector<TensorToWrite>& tensors) {
  std::vector<size_t> order(tensors.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) {
    if (tensors[a].dtype != tensors[b].dtype) return tensors[a].dtype > tensors[b].dtype;
    return tensors[a].name < tensors[b].name;
  });
  return order;
}

std::vector<std::vector<size_t>> SplitIntoShards(const std::vector<TensorToWrite>& tensors,
                                                 uint64_t max_shard_size) {
  std::vector<std::vector<size_t>> shards;
  std::vector<size_t> current;
  uint64_t current_bytes = 0;
  for (size_t i = 0; i < tensors.size(); ++i) {
    const uint64_t bytes = tensors[i].nbytes();
    if (bytes > max_shard_size) {  // a shard of its own, now; the current one goes on
      shards.push_back({i});
      continue;
    }
    if (current_bytes + bytes > max_shard_size) {
      shards.push_back(std::move(current));
      current.clear();
      current_bytes = 0;
    }
    current.push_back(i);
    current_bytes += bytes;
  }
  if (!current.empty() || shards.empty()) shards.push_back(std::move(current));
  return shards;
}

Status WriteSafetensors(const std::string& path, const std::vector<TensorToWrite>& tensors,
                        const std::map<std::string, std::string>& metadata) {
  std::set<std::string_view> names;
  for (const TensorToWrite& t : tensors) {
    LOADSTONE_RETURN_IF_ERROR(CheckTensor(t));
    if (!names.insert(t.name).second || t.name == "__metadata__") {
      return Status::InvalidArgument(fmt::format("tensor name '{}' used twice or reserved", t.name));
    }
  }
  std::vector<const TensorToWrite*> order;
  for (size_t i : LayoutOrder(tensors)) order.push_back(&tensors[i]);
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
  LOADSTONE_RETURN_IF_ERROR(out.OpenReplacing(path));
  LOADSTONE_RETURN_IF_ERROR(out.Write(prefix));
  LOADSTONE_RETURN_IF_ERROR(out.Write(std::as_bytes(std::span<const char>(text))));
  std::vector<std::byte> buffer;
  for (const TensorToWrite* t : order) LOADSTONE_RETURN_IF_ERROR(WriteData(*t, out, buffer));
  return out.Commit();
}

namespace {

void RemoveAll(const std::vector<std::string>& paths) {
  for (const std::string& p : paths) ::unlink(p.c_str());
}

}  // namespace

Result<std::vector<std::string>> WriteShardedSafetensors(const std::string& folder,
                                                         const std::vector<TensorToWrite>& tensors,
                                                         const ShardedWriteOptions& options) {
  std::error_code ec;
  std::filesystem::create_directories(folder, ec);
  if (ec) return ErrnoStatus(ec.value(), "cannot create folder", folder);

  uint64_t total = 0;
  for (const TensorToWrite& t : tensors) total += t.nbytes();
  const std::string v = options.variant.empty() ? "" : "." + options.variant;
  std::vector<std::string> written;
  auto fail = [&](Status status) {
    RemoveAll(written);
    return status;
  };
  const std::filesystem::path dir(folder);
  const std::vector<std::vector<size_t>> split = SplitIntoShards(tensors, options.max_shard_size);
  std::vector<std::vector<TensorToWrite>> shards;
  for (const auto& indices : split) {
    shards.emplace_back();
    for (size_t i : indices) shards.back().push_back(tensors[i]);
  }
  if (shards.size() == 1) {
    written.push_back((dir / fmt::format("{}{}.safetensors", options.prefix, v)).string());
    Status status = WriteSafetensors(written.back(), shards[0], options.metadata);
    if (!status.ok()) return fail(status);
    return written;
  }
  nlohmann::ordered_json weight_map = nlohmann::ordered_json::object();
  for (size_t i = 0; i < shards.size(); ++i) {
    const std::string name = fmt::format("{}{}-{:05d}-of-{:05d}.safetensors", options.prefix, v,
                                         i + 1, shards.size());
    written.push_back((dir / name).string());
    Status status = WriteSafetensors(written.back(), shards[i], options.metadata);
    if (!status.ok()) return fail(status);
    for (const TensorToWrite& t : shards[i]) weight_map[t.name] = name;
  }
  nlohmann::ordered_json index = {{"metadata", {{"total_size", total}}},
                                  {"weight_map", weight_map}};
  written.push_back((dir / fmt::format("{}.safetensors.index{}.json", options.prefix, v)).string());
  OutFile out;
  const std::string text = index.dump(2) + "\n";
  Status status = out.OpenReplacing(written.back());
  if (status.ok()) status = out.Write(std::as_bytes(std::span<const char>(text)));
  if (status.ok()) status = out.Commit();
  if (!status.ok()) return fail(status);
  return written;
}

}  // namespace loadstone
