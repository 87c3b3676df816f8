#!/usr/bin/env bash
# llama.cpp on the device machine, beside strata (issues 37 item 4, 38 item 5, 39 item 6, 41 item 4).
#   bash benchmarks/llama_cpp.sh build                       # llama-bench, llama-perplexity, llama-server for sm_90
#   bash benchmarks/llama_cpp.sh side PRESET "SYNTH FLAGS" BUDGET PROMPTS
#       e.g. side qwen3-30b-a3b "--mix Q4_K_M" 12GiB 8192,32768: synth a GGUF, its pack, then both
#       benches on them (experiments/llama_side.py), CSV + PNG under $OUT
# The source: .lcp/llama.cpp-src.tar.xz, the llama-cpp-python 0.3.36 sdist's vendored llama.cpp
# (ggml-org/llama.cpp@0c1e57098) less the other backends, docs and models (6 MB; the whole sdist is
# 76 MB, past what a call carries). Make it on the CPU machine:
#   tar -C SDIST/vendor/llama.cpp --exclude=ggml/src/ggml-{sycl,vulkan,opencl,hexagon,metal,et,cann,musa} \
#       -cJf .lcp/llama.cpp-src.tar.xz CMakeLists.txt LICENSE licenses app cmake include src common ggml tools vendor
# and carry .lcp (run's carry). The build goes to /dev/shm/lcp (the device's fresh machine keeps it for
# the rest of the call only): build and measure in one call.
set -u
# strata from the source tree, gguf from the carried wheels (as gpu_session.sh)
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
if ls .whl/gguf*.whl >/dev/null 2>&1 && ! python3 -c "import gguf" 2>/dev/null; then
    python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/gguf*.whl \
        && export PYTHONPATH=$PYTHONPATH:/tmp/site
fi
LCP=${LCP:-/dev/shm/lcp}
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
case ${1:-} in
  build)
    mkdir -p "$LCP/src" && tar -C "$LCP/src" -xJf .lcp/llama.cpp-src.tar.xz || exit 2
    # one architecture (sm_90), every layer's kernels; no curl, no tests or examples
    ( time ( cmake -S "$LCP/src" -B "$LCP/build" -DCMAKE_BUILD_TYPE=Release -DGGML_CUDA=ON \
        -DCMAKE_CUDA_ARCHITECTURES=90 -DLLAMA_CURL=OFF -DLLAMA_BUILD_TESTS=OFF \
        -DLLAMA_BUILD_EXAMPLES=OFF > "$OUT/llama_cpp_configure.log" 2>&1 && \
      cmake --build "$LCP/build" -j "$(nproc)" --target llama-bench llama-perplexity llama-server \
        > "$OUT/llama_cpp_build.log" 2>&1 ) ) 2>&1 | tail -3 | tee "$OUT/llama_cpp_build_time.log"
    ls -la "$LCP/build/bin" | tee -a "$OUT/llama_cpp_build_time.log" ;;
  side)
    preset=$2 synth=$3 budget=$4 prompts=$5
    tag=$(echo "$synth" | tr -cd 'A-Za-z0-9_')
    g=/dev/shm/side-$preset-$tag.gguf p=/dev/shm/side-$preset-$tag.pack
    python3 -m strata.cli synth --preset "$preset" $synth -o "$g" 2>&1 | grep -v "it/s\]" | tail -1
    python3 -m strata.cli pack "$g" -o "$p" 2>&1 | grep -v "it/s\]" | tail -1
    python3 experiments/llama_side.py --gguf "$g" --pack "$p" --bin "$LCP/build/bin" \
        --budget "$budget" --prompts "$prompts" --out "$OUT" 2>&1 | grep -v "it/s\]" | tail -12
    rm -f "$g" "$p" ;;
  *) echo "usage: bash benchmarks/llama_cpp.sh build | side PRESET 'SYNTH FLAGS' BUDGET PROMPTS" >&2; exit 2 ;;
esac
