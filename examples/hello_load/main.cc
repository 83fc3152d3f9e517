// hello_load MODEL [DTYPE]: opens a checkpoint, plans it for the CPU, streams it in, and prints
// what arrived. Uses only the installed public headers and loadstone::loadstone.
#include <cstdio>
#include <iostream>

#include <loadstone/checkpoint.h>
#include <loadstone/loader.h>
#include <loadstone/plan.h>
#include <loadstone/version.h>

int main(int argc, char** argv) {
  if (argc < 2) {
    std::cerr << "usage: hello_load MODEL [DTYPE]\n";
    return 2;
  }
  auto ckpt = loadstone::Checkpoint::Open(argv[1]);  // headers only
  if (!ckpt.ok()) {
    std::cerr << "error: " << ckpt.status() << "\n";
    return 1;
  }
  loadstone::PlanOptions options;
  if (argc > 2) options.dtype = loadstone::ParseDType(argv[2]);
  auto plan = loadstone::Plan(*ckpt, options);
  if (!plan.ok()) {
    std::cerr << "error: " << plan.status() << "\n";
    return 1;
  }
  loadstone::Loader loader;
  loadstone::LoadHandle load = loader.Load(*ckpt, *plan);
  const std::string& first = ckpt->tensors().front().name;
  try {
    const loadstone::Tensor& t = load.Tensor(first).get();  // ready before the rest
    std::cout << "first: " << t.name() << " " << loadstone::SafetensorsName(t.dtype()) << " "
              << t.nbytes() << " bytes\n";
  } catch (const loadstone::Error& e) {  // a failed load, caught across the library's edge
    std::cerr << "error: " << e.status() << "\n";
    return 1;
  }
  if (loadstone::Status done = load.Done().get(); !done.ok()) {
    std::cerr << "error: " << done << "\n";
    return 1;
  }
  uint64_t bytes = 0;
  for (const loadstone::Tensor& t : load.Tensors()) bytes += t.nbytes();
  std::cout << "loaded " << load.Tensors().size() << " tensors, " << bytes << " bytes, with loadstone "
            << LOADSTONE_VERSION_STRING << "\n";
  return 0;
}
