// ParseModelDescription: the model description JSON of specs/model-json.md.
#include <span>
#include <unordered_set>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "io/formats/json_util.h"
#include "io/formats/limits.h"
#include "runtime/device_map/module_sizes.h"
#include "runtime/device_map/module_tree.h"

namespace loadstone {
namespace {

using nlohmann::json;

// The "tied" groups of a description name at most this many tensors in all. Real models tie a
// handful (embeddings and heads; a few hundred where layers share weights); accelerate's
// placement loop costs (tied names x modules), so the bound keeps a hostile file's planning short.
constexpr size_t kMaxTiedNames = 4096;

Status Invalid(std::string message) {
  return Status::InvalidArgument("model description: " + std::move(message));
}

Result<std::string> StringField(const json& object, const char* key, std::string_view where,
                                bool required) {
  auto it = object.find(key);
  if (it == object.end() || (it->is_null() && !required)) {
    if (required) return Invalid(fmt::format("{} has no \"{}\"", where, key));
    return std::string();
  }
  if (!it->is_string()) return Invalid(fmt::format("\"{}\" of {} must be a string", key, where));
  return it->get<std::string>();
}

Result<device_map::ElemType> ParseTypeName(const std::string& name, std::string_view where) {
  std::optional<device_map::ElemType> type = device_map::ParseElemType(name);
  if (!type) return Invalid(fmt::format("unknown dtype '{}' for {}", name, where));
  return *type;
}

struct Parser {
  ModuleTree::Impl* impl;
  std::unordered_set<std::string_view> seen_names;  // full names, views into impl->names
  std::vector<int32_t> storage_root;                 // union-find over storages, for "tied"

  Status AddTensor(int32_t node, const json& spec, bool is_buffer) {
    std::string_view kind = is_buffer ? "buffer" : "parameter";
    if (!spec.is_object()) return Invalid(fmt::format("a {} must be an object", kind));
    LOADSTONE_ASSIGN_OR_RETURN(std::string name, StringField(spec, "name", kind, true));
    const std::string_view module = impl->nodes[static_cast<size_t>(node)].name;
    std::string where = fmt::format("{} '{}' of module '{}'", kind, name, module);
    LOADSTONE_ASSIGN_OR_RETURN(std::string_view full, NewName(node, name, where));
    auto shape = spec.find("shape");
    if (shape == spec.end() || !shape->is_array()) {
      return Invalid(where + " needs a \"shape\" array");
    }
    device_map::Storage storage;
    storage.numel = 1;
    for (const json& dim : *shape) {
      if (!dim.is_number_unsigned()) return Invalid(where + ": shape entries must be integers >= 0");
      if (__builtin_mul_overflow(storage.numel, dim.get<uint64_t>(), &storage.numel) ||
          storage.numel > (1ULL << 62)) {
        return Invalid(where + ": the shape has too many elements");
      }
    }
    LOADSTONE_ASSIGN_OR_RETURN(std::string dtype, StringField(spec, "dtype", where, true));
    LOADSTONE_ASSIGN_OR_RETURN(storage.type, ParseTypeName(dtype, where));
    bool persistent = true;
    if (auto p = spec.find("persistent"); p != spec.end() && !p->is_null()) {
      if (!p->is_boolean()) return Invalid(where + ": \"persistent\" must be true or false");
      persistent = p->get<bool>();
    }
    impl->storages.push_back(storage);
    impl->AddTensor(node, full, static_cast<int32_t>(impl->storages.size() - 1), is_buffer,
                    persistent);
    return Status::OK();
  }

  // The full name of `local` under `node`, refused when malformed, too long or used before.
  Result<std::string_view> NewName(int32_t node, const std::string& local,
                                   const std::string& where) {
    if (local.empty() || local.find('.') != std::string::npos) {
      return Invalid(where + ": names must be non-empty and contain no '.'");
    }
    auto full = impl->ChildName(node, local, where);
    if (!full.ok()) return Invalid(std::string(full.status().message()));
    if (!seen_names.insert(*full).second) return Invalid(where + ": the name is used twice");
    return *full;
  }

  // Children are walked with an explicit stack of (module, its JSON), never by recursion.
  Status AddModules(const json& root) {
    std::vector<std::pair<int32_t, const json*>> pending = {{0, &root}};
    while (!pending.empty()) {
      auto [node, spec] = pending.back();
      pending.pop_back();
      std::vector<std::pair<int32_t, const json*>> children;
      LOADSTONE_RETURN_IF_ERROR(AddModule(node, *spec, &children));
      pending.insert(pending.end(), children.rbegin(), children.rend());
    }
    return Status::OK();
  }

  // The module's parameters, children (returned in *children to be filled next) and buffers.
  Status AddModule(int32_t node, const json& spec,
                   std::vector<std::pair<int32_t, const json*>>* children) {
    if (!spec.is_object()) return Invalid("a module must be an object");
    const std::string module(impl->nodes[static_cast<size_t>(node)].name);
    for (const char* key : {"params", "buffers", "children"}) {
      auto it = spec.find(key);
      if (it != spec.end() && !it->is_array()) {
        return Invalid(fmt::format("\"{}\" of module '{}' must be an array", key, module));
      }
    }
    if (auto it = spec.find("params"); it != spec.end()) {
      for (const json& p : *it) LOADSTONE_RETURN_IF_ERROR(AddTensor(node, p, false));
    }
    if (auto it = spec.find("children"); it != spec.end()) {
      for (const json& child : *it) {
        if (!child.is_object()) return Invalid(fmt::format("a child of '{}' must be an object", module));
        LOADSTONE_ASSIGN_OR_RETURN(std::string name, StringField(child, "name", "a module", true));
        LOADSTONE_ASSIGN_OR_RETURN(
            std::string_view full,
            NewName(node, name, fmt::format("child '{}' of module '{}'", name, module)));
        LOADSTONE_ASSIGN_OR_RETURN(std::string class_name,
                                   StringField(child, "class", "module " + name, false));
        impl->has_classes = impl->has_classes || !class_name.empty();
        children->push_back({impl->AddNode(node, full, class_name), &child});
      }
    }
    if (auto it = spec.find("buffers"); it != spec.end()) {
      for (const json& b : *it) LOADSTONE_RETURN_IF_ERROR(AddTensor(node, b, true));
    }
    return Status::OK();
  }

  int32_t Root(int32_t storage) {
    while (storage_root[static_cast<size_t>(storage)] != storage) {
      int32_t& up = storage_root[static_cast<size_t>(storage)];
      up = storage_root[static_cast<size_t>(up)];  // path halving
      storage = up;
    }
    return storage;
  }

  // The first name is the source; the others become the same tensor object (their storages
  // are merged into the source's: union-find, so that a group of n names costs O(n)).
  Status Tie(const json& group) {
    if (!group.is_array() || group.size() < 2) {
      return Invalid("each \"tied\" entry must be an array of at least two names");
    }
    for (const json& name : group) {
      if (!name.is_string()) return Invalid("tied names must be strings");
    }
    const std::string& source = group[0].get_ref<const std::string&>();
    int32_t src = impl->FindTensor(source);
    if (src < 0 || impl->tensors[static_cast<size_t>(src)].is_buffer) {
      return Invalid(fmt::format("tied source '{}' is not a declared parameter", source));
    }
    while (storage_root.size() < impl->storages.size()) {
      storage_root.push_back(static_cast<int32_t>(storage_root.size()));
    }
    const int32_t storage = Root(impl->tensors[static_cast<size_t>(src)].storage);
    for (size_t i = 1; i < group.size(); ++i) {
      const std::string& target = group[i].get_ref<const std::string&>();
      int32_t t = impl->FindTensor(target);
      if (t >= 0) {
        if (impl->tensors[static_cast<size_t>(t)].is_buffer) {
          return Invalid(fmt::format("tied name '{}' is a buffer", target));
        }
        const int32_t old = Root(impl->tensors[static_cast<size_t>(t)].storage);
        if (old != storage) storage_root[static_cast<size_t>(old)] = storage;
        continue;
      }
      size_t dot = target.rfind('.');
      std::string module = dot == std::string::npos ? "" : target.substr(0, dot);
      std::string local = dot == std::string::npos ? target : target.substr(dot + 1);
      int32_t node = impl->FindNode(module);
      if (node < 0) {
        return Invalid(fmt::format("tied name '{}': there is no module '{}'", target, module));
      }
      LOADSTONE_ASSIGN_OR_RETURN(std::string_view full,
                                 NewName(node, local, "tied name '" + target + "'"));
      impl->AddTensor(node, full, storage, /*is_buffer=*/false, /*persistent=*/true);
    }
    return Status::OK();
  }

  // After the last Tie: every tensor points at its storage's root.
  void ResolveTies() {
    if (storage_root.empty()) return;
    for (device_map::TreeTensor& tensor : impl->tensors) tensor.storage = Root(tensor.storage);
  }
};

Result<SizeValue> ParseSizeValue(const json& value, const std::string& key) {
  if (value.is_number_integer()) return SizeValue(value.get<int64_t>());
  if (value.is_number_float()) return SizeValue(value.get<double>());
  if (value.is_string()) return SizeValue(value.get<std::string>());
  return Invalid(fmt::format("max_memory['{}'] must be a number or a size string", key));
}

Result<std::vector<std::string>> StringList(const json& value, const char* field) {
  if (!value.is_array()) return Invalid(fmt::format("\"{}\" must be an array of strings", field));
  std::vector<std::string> out;
  for (const json& v : value) {
    if (!v.is_string()) return Invalid(fmt::format("\"{}\" must be an array of strings", field));
    out.push_back(v.get<std::string>());
  }
  return out;
}

Result<bool> BoolField(const json& value, const char* field) {
  if (!value.is_boolean()) return Invalid(fmt::format("\"{}\" must be true or false", field));
  return value.get<bool>();
}

Result<DType> PlanDType(const json& value, const std::string& where) {
  if (!value.is_string()) return Invalid(where + " must be a dtype name");
  std::optional<DType> dtype = ParseDType(value.get<std::string>());
  if (!dtype) return Invalid(fmt::format("unknown dtype '{}' for {}", value.get<std::string>(), where));
  return *dtype;
}

Status ParseOptions(const json& doc, DeviceMapOptions* options) {
  for (const auto& [key, value] : doc.items()) {
    if (key == "modules" || key == "tied") continue;
    if (key == "max_memory") {
      if (value.is_null()) continue;
      if (!value.is_object()) return Invalid("\"max_memory\" must be an object");
      MaxMemory mm;
      for (const auto& [device, size] : value.items()) {
        LOADSTONE_ASSIGN_OR_RETURN(mm[device], ParseSizeValue(size, device));
      }
      options->max_memory = std::move(mm);
    } else if (key == "no_split") {
      if (value.is_null()) continue;
      LOADSTONE_ASSIGN_OR_RETURN(options->no_split, StringList(value, "no_split"));
    } else if (key == "keep_in_fp32") {
      LOADSTONE_ASSIGN_OR_RETURN(options->keep_in_fp32, StringList(value, "keep_in_fp32"));
    } else if (key == "dtype") {
      if (value.is_null()) continue;
      LOADSTONE_ASSIGN_OR_RETURN(options->dtype, PlanDType(value, "\"dtype\""));
    } else if (key == "special_dtypes") {
      if (value.is_null()) continue;
      if (!value.is_object()) return Invalid("\"special_dtypes\" must be an object");
      for (const auto& [name, dtype] : value.items()) {
        LOADSTONE_ASSIGN_OR_RETURN(options->special_dtypes[name],
                                   PlanDType(dtype, "special_dtypes['" + name + "']"));
      }
    } else if (key == "mode") {
      if (!value.is_string()) return Invalid("\"mode\" must be a string");
      options->device_map = value.get<std::string>();
    } else if (key == "offload_buffers") {
      LOADSTONE_ASSIGN_OR_RETURN(options->offload_buffers, BoolField(value, "offload_buffers"));
    } else if (key == "fallback_allocation") {
      LOADSTONE_ASSIGN_OR_RETURN(options->fallback_allocation,
                                 BoolField(value, "fallback_allocation"));
    } else {
      return Invalid(fmt::format("unknown field \"{}\"", key));
    }
  }
  return Status::OK();
}

}  // namespace

Result<ModelDescription> ParseModelDescription(std::string_view json_text) {
  LOADSTONE_ASSIGN_OR_RETURN(json doc, io::ParseJsonStrict(json_text, "model description"));
  return io::InterpretJson("model description", [&]() -> Result<ModelDescription> {
    if (!doc.is_object()) return Invalid("the document must be a JSON object");
    auto modules = doc.find("modules");
    if (modules == doc.end()) return Invalid("there is no \"modules\" object");
    auto impl = std::make_shared<ModuleTree::Impl>();
    Parser parser{impl.get(), {}, {}};
    std::string root_class;
    if (modules->is_object()) {
      LOADSTONE_ASSIGN_OR_RETURN(root_class,
                                 StringField(*modules, "class", "the root module", false));
    }
    impl->has_classes = !root_class.empty();
    impl->AddNode(-1, std::string_view(), root_class);
    LOADSTONE_RETURN_IF_ERROR(parser.AddModules(*modules));
    impl->Finish();
    if (auto tied = doc.find("tied"); tied != doc.end() && !tied->is_null()) {
      if (!tied->is_array()) return Invalid("\"tied\" must be an array of name arrays");
      size_t names = 0;
      for (const json& group : *tied) names += group.is_array() ? group.size() : 0;
      if (names > kMaxTiedNames) {
        return Invalid(fmt::format("\"tied\" names {} tensors, more than the {} a description may tie",
                                   names, kMaxTiedNames));
      }
      for (const json& group : *tied) LOADSTONE_RETURN_IF_ERROR(parser.Tie(group));
      parser.ResolveTies();
      impl->Finish();  // number the tied names added to their modules
    }
    ModelDescription description{ModuleTreeAccess::Make(std::move(impl)), DeviceMapOptions{}};
    LOADSTONE_RETURN_IF_ERROR(ParseOptions(doc, &description.options));
    return description;
  });
}

Result<ModelDescription> ReadModelDescription(const std::string& path) {
  LOADSTONE_ASSIGN_OR_RETURN(std::string text,
                             io::ReadSmallFile(path, fmt::format("model description '{}'", path),
                                               io::kMaxModelDescriptionBytes,
                                               "kMaxModelDescriptionBytes"));
  auto description = ParseModelDescription(text);
  if (!description.ok()) return description.status().WithContext(path);
  return description;
}

}  // namespace loadstone
