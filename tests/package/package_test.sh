#!/usr/bin/env bash
# `cmake --install` gives a package a program can use: the CLI, the headers, libloadstone.so and
# loadstoneConfig.cmake. examples/hello_load is configured against the installed tree only,
# built, and run on a fixture; nothing CUDA is needed by it or by the library.
#   package_test.sh SOURCE_DIR BUILD_DIR
set -euo pipefail
src=$1 build=$2
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
prefix=$work/prefix

cmake --install "$build" --prefix "$prefix" >/dev/null
for f in bin/loadstone include/loadstone/loader.h include/loadstone/version.h \
         lib/cmake/loadstone/loadstoneConfig.cmake lib/cmake/loadstone/loadstoneConfigVersion.cmake \
         lib/cmake/loadstone/loadstoneTargets.cmake; do
  [ -e "$prefix/$f" ] || { echo "FAIL: $f was not installed"; exit 1; }
done
ls "$prefix"/lib/libloadstone.so.* >/dev/null || { echo "FAIL: no libloadstone.so installed"; exit 1; }
# No private header, no internal static library in the package.
if find "$prefix" -name '*.a' -o -path '*include/io*' -o -path '*include/runtime*' | grep -q .; then
  echo "FAIL: internal files installed:"; find "$prefix" -name '*.a' -o -path '*include/io*'; exit 1
fi

# The installed CLI runs from its own tree (RUNPATH $ORIGIN/../lib).
env -u LD_LIBRARY_PATH "$prefix/bin/loadstone" --version | grep -q '^loadstone ' || { echo "FAIL: installed CLI"; exit 1; }

# The example, from the installed package only (the build tree is not on any search path).
cmake -S "$src/examples/hello_load" -B "$work/hello" -DCMAKE_PREFIX_PATH="$prefix" \
      -DCMAKE_BUILD_TYPE=Release >"$work/configure.log" 2>&1 || { cat "$work/configure.log"; exit 1; }
cmake --build "$work/hello" >"$work/build.log" 2>&1 || { cat "$work/build.log"; exit 1; }
out=$("$work/hello/hello_load" "$src/tests/fixtures/safetensors/sharded" f16)
echo "$out"
echo "$out" | grep -q '^first: model.embed.weight F16 64 bytes$' || { echo "FAIL: first tensor"; exit 1; }
echo "$out" | grep -q '^loaded [0-9]* tensors, ' || { echo "FAIL: load"; exit 1; }
# A missing model: the error comes back as a Status, caught across the library's edge.
if "$work/hello/hello_load" /nonexistent 2>"$work/err"; then echo "FAIL: no error"; exit 1; fi
grep -q '^error: NotFound: ' "$work/err" || { cat "$work/err"; exit 1; }

# Nothing CUDA is needed: neither the program nor the library asks for libcudart or libcuda.
for elf in "$work/hello/hello_load" "$prefix"/lib/libloadstone.so.*.*.*; do
  if readelf -d "$elf" | grep NEEDED | grep -qi cuda; then
    echo "FAIL: $elf needs CUDA:"; readelf -d "$elf" | grep NEEDED; exit 1
  fi
done
# The library exports loadstone's symbols only (no fmt, no CUDA runtime).
if nm -D --defined-only "$prefix"/lib/libloadstone.so.*.*.* | awk '{print $3}' | c++filt |
   grep -v -e '^loadstone::' -e '^typeinfo for loadstone::' -e '^typeinfo name for loadstone::' \
        -e '^vtable for loadstone::' | grep -q .; then
  echo "FAIL: symbols beyond loadstone's:"; nm -D --defined-only "$prefix"/lib/libloadstone.so.*.*.* |
    awk '{print $3}' | c++filt | grep -v '^loadstone::\|for loadstone::' | head; exit 1
fi
# The LibTorch face, when the package has it: examples/load_module fills a torch::nn::Module
# from the installed tree (find_package(loadstone COMPONENTS torch)).
if [ -e "$prefix/include/loadstone/torch.h" ]; then
  ls "$prefix"/lib/libloadstone_torch.so.* >/dev/null || { echo "FAIL: no libloadstone_torch.so"; exit 1; }
  cmake -S "$src/examples/load_module" -B "$work/module" -DCMAKE_PREFIX_PATH="$prefix" \
        -DCMAKE_BUILD_TYPE=Release >"$work/configure-module.log" 2>&1 || { cat "$work/configure-module.log"; exit 1; }
  cmake --build "$work/module" >"$work/build-module.log" 2>&1 || { cat "$work/build-module.log"; exit 1; }
  for ckpt in offload/model/pytorch_model.bin offload/model/model.safetensors; do
    out=$("$work/module/load_module" "$src/tests/fixtures/$ckpt")
    echo "$out"
    echo "$out" | grep -q '^loaded 9 tensors into the module; 0 missing, 0 unexpected' ||
      { echo "FAIL: load_module $ckpt"; exit 1; }
    echo "$out" | grep -q '^blocks.1.scale = 1.5,' || { echo "FAIL: values of $ckpt"; exit 1; }
  done
  # examples/forward_while_loading: a Llama's forward pass layer by layer as each layer lands.
  cmake -S "$src/examples/forward_while_loading" -B "$work/fwl" -DCMAKE_PREFIX_PATH="$prefix" \
        -DCMAKE_BUILD_TYPE=Release >"$work/configure-fwl.log" 2>&1 ||
    { cat "$work/configure-fwl.log"; exit 1; }
  cmake --build "$work/fwl" >"$work/build-fwl.log" 2>&1 || { cat "$work/build-fwl.log"; exit 1; }
  out=$("$work/fwl/forward_while_loading" "$src/tests/fixtures/tp/models/llama")
  echo "$out"
  echo "$out" | grep -q '^model.embed_tokens ready at ' ||
    { echo "FAIL: forward_while_loading order"; exit 1; }
  echo "$out" | grep -q '^identical to the forward pass after a whole load' ||
    { echo "FAIL: forward_while_loading logits"; exit 1; }
else
  echo "package: built without LibTorch; the load_module example is not built"
fi

# A version the package does not provide is refused at configure time.
sed 's/find_package(loadstone 0.1 REQUIRED)/find_package(loadstone 1.0 REQUIRED)/' \
  "$src/examples/hello_load/CMakeLists.txt" >"$work/v.txt"
mkdir -p "$work/newer" && cp "$work/v.txt" "$work/newer/CMakeLists.txt" && cp "$src/examples/hello_load/main.cc" "$work/newer/"
if cmake -S "$work/newer" -B "$work/newer/build" -DCMAKE_PREFIX_PATH="$prefix" >/dev/null 2>&1; then
  echo "FAIL: loadstone 1.0 was accepted from a 0.1 package"; exit 1
fi
echo "package: ok"
