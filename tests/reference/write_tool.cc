// reference_write_tool MANIFEST.json: writes the files a manifest describes with
// loadstone::WriteSafetensors, for crosscheck.py to compare with the reference writer's bytes.
//   [{"out": path, "metadata": {str: str} | null,
//     "tensors": [{"name": str, "dtype": "F32"|..., "shape": [int], "hex": "00ff..."}]}]
#include <fstream>
#include <iostream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "loadstone/writer.h"

namespace {

std::vector<std::byte> FromHex(const std::string& hex) {
  std::vector<std::byte> out(hex.size() / 2);
  for (size_t i = 0; i < out.size(); ++i) {
    out[i] = static_cast<std::byte>(std::stoi(hex.substr(2 * i, 2), nullptr, 16));
  }
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::cerr << "usage: reference_write_tool MANIFEST.json\n";
    return 2;
  }
  std::ifstream in(argv[1]);
  const nlohmann::json manifest = nlohmann::json::parse(in);
  for (const auto& file : manifest) {
    std::vector<std::vector<std::byte>> data;
    std::vector<loadstone::TensorToWrite> tensors;
    for (const auto& t : file.at("tensors")) {
      auto dtype = loadstone::DTypeFromSafetensorsName(t.at("dtype").get<std::string>());
      if (!dtype) {
        std::cerr << "unknown dtype " << t.at("dtype") << "\n";
        return 2;
      }
      data.push_back(FromHex(t.at("hex").get<std::string>()));
      tensors.push_back({t.at("name").get<std::string>(), *dtype,
                         t.at("shape").get<std::vector<uint64_t>>(), {}, {}});
    }
    for (size_t i = 0; i < tensors.size(); ++i) tensors[i].data = data[i];
    std::map<std::string, std::string> metadata;
    if (!file.at("metadata").is_null()) metadata = file.at("metadata");
    const std::string out = file.at("out").get<std::string>();
    if (auto status = loadstone::WriteSafetensors(out, tensors, metadata); !status.ok()) {
      std::cerr << "error: " << out << ": " << status.ToString() << "\n";
      return 1;
    }
  }
  return 0;
}
