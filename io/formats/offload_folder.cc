#include "io/formats/offload_folder.h"

#include <climits>
#include <filesystem>

#include <fmt/format.h>

#include "io/formats/json_util.h"

namespace loadstone::io {

std::optional<std::string_view> OffloadDTypeName(DType dtype) {
  switch (dtype) {
    case DType::kBool: return "bool";
    case DType::kU8: return "uint8";
    case DType::kI8: return "int8";
    case DType::kI16: return "int16";
    case DType::kU16: return "uint16";
    case DType::kF16: return "float16";
    case DType::kBF16: return "bfloat16";
    case DType::kI32: return "int32";
    case DType::kU32: return "uint32";
    case DType::kF32: return "float32";
    case DType::kC64: return "complex64";
    case DType::kF64: return "float64";
    case DType::kI64: return "int64";
    case DType::kU64: return "uint64";
    default: return std::nullopt;
  }
}

namespace {

using Json = nlohmann::ordered_json;

std::optional<DType> DTypeFromOffloadName(std::string_view name) {
  for (int d = 0; d < kNumDTypes; ++d) {
    const auto dtype = static_cast<DType>(d);
    if (OffloadDTypeName(dtype) == name) return dtype;
  }
  return std::nullopt;
}

// An entry's "dtype", when it has one, into e->dtype: a .dat entry names its numpy dtype; an
// in-place (safetensors) entry the torch dtype accelerate casts it to (getattr(torch, dtype)).
Status ParseEntryDType(const std::string& what, const std::string& name, const Json& value,
                       bool in_place, OffloadIndexEntry* e) {
  const auto d = value.find("dtype");
  if (d == value.end()) return Status::OK();
  if (!d->is_string()) {
    return Status::Corruption(fmt::format("{}: entry '{}' has a dtype that is {}", what, name,
                                          DescribeJsonValue(*d)));
  }
  const std::string dtype = d->get<std::string>();
  e->dtype = in_place ? ParseDType(dtype) : DTypeFromOffloadName(dtype);
  if (!e->dtype) {
    return Status::Corruption(fmt::format(
        "{}: entry '{}' has dtype '{}', which is not a {} dtype accelerate writes", what, name,
        dtype, in_place ? "torch" : "numpy"));
  }
  return Status::OK();
}

// An in-place entry's file (`file`, its "safetensors_file": a non-empty string) and the tensor
// it names there: "weight_name", else the entry's own name.
Status ParseInPlace(const std::string& what, const std::string& name, const Json& value,
                    const Json& file, OffloadIndexEntry* e) {
  if (!file.is_string() || file.get<std::string>().empty()) {
    return Status::Corruption(fmt::format("{}: entry '{}' has a safetensors_file that is {}",
                                          what, name, DescribeJsonValue(file)));
  }
  e->safetensors_file = file.get<std::string>();
  e->weight_name = name;
  if (auto w = value.find("weight_name"); w != value.end()) {
    if (!w->is_string()) {
      return Status::Corruption(fmt::format("{}: entry '{}' has a weight_name that is {}",
                                            what, name, DescribeJsonValue(*w)));
    }
    e->weight_name = w->get<std::string>();
  }
  return Status::OK();
}

// A .dat entry's "shape": a list of non-negative integers (its dtype read before).
Status ParseShape(const std::string& what, const std::string& name, const Json& value,
                  OffloadIndexEntry* e) {
  const auto shape = value.find("shape");
  if (!e->dtype || shape == value.end() || !shape->is_array()) {
    return Status::Corruption(fmt::format(
        "{}: entry '{}' has neither a safetensors_file nor a dtype and a shape list", what,
        name));
  }
  for (const auto& dim : *shape) {
    if (!dim.is_number_unsigned()) {
      return Status::Corruption(fmt::format("{}: entry '{}' has a dimension that is {}",
                                            what, name, DescribeJsonValue(dim)));
    }
    e->shape.push_back(dim.get<uint64_t>());
  }
  return Status::OK();
}

// The index's entry `name` → `value`: a name that can name a file, an object, its dtype, and
// either its safetensors file or its shape. `what` names the index in errors.
Result<OffloadIndexEntry> ParseEntry(const std::string& what, const std::string& name,
                                     const Json& value) {
  if (Status s = CheckOffloadName(name); !s.ok()) {
    return Status::Corruption(fmt::format("{}: {}", what, s.message()));
  }
  if (!value.is_object()) {
    return Status::Corruption(fmt::format("{}: entry '{}' is {}, not an object", what, name,
                                          DescribeJsonValue(value)));
  }
  OffloadIndexEntry e;
  e.name = name;
  const auto f = value.find("safetensors_file");
  const bool in_place = f != value.end() && !f->is_null();
  LOADSTONE_RETURN_IF_ERROR(ParseEntryDType(what, name, value, in_place, &e));
  if (in_place) {
    LOADSTONE_RETURN_IF_ERROR(ParseInPlace(what, name, value, *f, &e));
  } else {
    LOADSTONE_RETURN_IF_ERROR(ParseShape(what, name, value, &e));
  }
  return e;
}

}  // namespace

Status CheckOffloadName(std::string_view name) {
  if (name.empty() || name == "." || name == ".." || name.find('/') != std::string_view::npos ||
      name.find('\0') != std::string_view::npos) {
    return Status::InvalidArgument(fmt::format(
        "tensor name '{}' cannot name a file NAME.dat in an offload folder (it is empty, '.', "
        "'..', or holds '/' or NUL)",
        name));
  }
  // NAME.dat, and NAME.dat.tmp while it is written, must fit a file name.
  if (name.size() + 8 > NAME_MAX) {
    return Status::InvalidArgument(fmt::format(
        "tensor name '{}...' ({} bytes) is too long for a file NAME.dat in an offload folder "
        "(at most {} bytes)",
        name.substr(0, 32), name.size(), NAME_MAX - 8));
  }
  return Status::OK();
}

std::string OffloadDataPath(std::string_view folder, std::string_view name) {
  return (std::filesystem::path(folder) / fmt::format("{}.dat", name)).string();
}

Result<std::vector<OffloadIndexEntry>> ReadOffloadIndex(const std::string& folder) {
  const std::string path = (std::filesystem::path(folder) / "index.json").string();
  const std::string what = fmt::format("offload index '{}'", path);
  LOADSTONE_ASSIGN_OR_RETURN(const std::string text,
                             ReadSmallFile(path, what, kMaxOffloadIndexBytes,
                                           "kMaxOffloadIndexBytes"));
  LOADSTONE_ASSIGN_OR_RETURN(const nlohmann::ordered_json doc, ParseJsonStrictOrdered(text, what));
  return InterpretJson(what, [&]() -> Result<std::vector<OffloadIndexEntry>> {
    if (!doc.is_object()) return Status::Corruption(what + " is not a JSON object");
    std::vector<OffloadIndexEntry> out;
    out.reserve(doc.size());
    for (const auto& [name, value] : doc.items()) {
      LOADSTONE_ASSIGN_OR_RETURN(OffloadIndexEntry e, ParseEntry(what, name, value));
      out.push_back(std::move(e));
    }
    return out;
  });
}

}  // namespace loadstone::io
