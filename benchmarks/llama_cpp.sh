#!/usr/bin/env bash
# llama.cpp on the device machine, beside strata (issues 37 item 4, 38 item 5, 39 item 6, 41 item 4).
#   bash benchmarks/llama_cpp.sh build                       # llama-bench, llama-perplexity, llama-server for sm_90
#   bash benchmarks/llama_cpp.sh side PRESET "SYNTH FLAGS" BUDGET PROMPTS
#       e.g. side qwen3-30b-a3b "--mix Q4_K_M" 12GiB 8192,32768: synth a GGUF, its pack, then both
#       benches on them (experiments/llama_side.py), CSV + PNG under $OUT
#   bash benchmarks/llama_cpp.sh cache PRESET "SYNTH FLAGS" BUDGET
#       e.g. cache qwen3-30b-a3b "--quant Q8_0" 12GiB: synth a GGUF and its pack, strata's ten
#       questions on one document (experiments/kv_resume.py --pack, its resume cell on a KVP-token
#       prompt) and llama-server's prompt cache on the same tokens (experiments/llama_server_cache.py),
#       one PNG of both; DOC (65536) NQ (10) QT (64) KVP (4096) change the sizes, KVR_TIMEOUT
#       (360 s) bounds strata's part; llama.cpp's runs when strata's fails, drawn alone
#   bash benchmarks/llama_cpp.sh ppl PRESET "SYNTH FLAGS" BUDGET
#       e.g. ppl qwen3-30b-a3b "--quant Q8_0" 12GiB: synth a GGUF and its pack, then one text of TOKENS
#       (300000) tokens read by strata perplexity and llama-perplexity at --ctx CTX (512) under BUDGET,
#       -ncmoe fitted to it (experiments/ppl_side.py): both PPLs, their distance, each tool's tokens/s,
#       CSV + PNG under $OUT; UB (2048) is llama.cpp's -b/-ub, PPL_TIMEOUT (240 s) bounds each tool's
#       run. Sized for one call with build: the GGUF and pack (~32 GiB each for 30B Q8_0), made
#       in ~3 s a layer each on the CPU machine (~5 min for 48 layers; the step prints its phases'
#       seconds), strata's read (~20 s at ~16K tok/s) and llama.cpp's (60-150 s at 2-6K tok/s);
#       the CSV is written after each tool, so a call cut short keeps strata's rows
#   bash benchmarks/llama_cpp.sh make PRESET "SYNTH FLAGS"
#       the GGUF and pack that side/cache/ppl with the same two arguments read, made in the
#       background (setsid) so the rest of the call, and the next on the same warm machine, use
#       the GPU meanwhile: e.g. `make gpt-oss-120b "--quant MXFP4 --layers 16"` (30 GB each: synth
#       ~2 min, pack ~40 s on the H100 machine), then the suite, then `side ...` waits for them
# The models live in MODELS (/dev/shm; the disk holds 64 GiB) as PRESET-FLAGS.{gguf,pack}; side,
# cache and ppl make them when absent and remove them after, unless KEEP=1 (a later call on the same
# machine then reuses them). SIDE_ARGS go to experiments/llama_side.py (e.g. "--ub 8192 --reps 2";
# they are split on spaces, so a strata arm's flags join with '=': "--strata-arms=;--delta=backend=fla").
#   bash benchmarks/llama_cpp.sh prebuild SRC                # on the CPU machine: makes the prebuilt tarball
# build unpacks the prebuilt tools, .lcp/llama.cpp-cuda-sm90.tar.xz (bin/llama-{bench,perplexity,server},
# sm_90 machine code, made on the CPU machine so a call skips the ~5 min compile), into $LCP/build and
# prints the GPU they see; without the tarball, or when its tools do not load or see no GPU, it compiles
# .lcp/llama.cpp-src.tar.xz there instead. The tools load the CUDA 13 runtime and cuBLAS
# (libcudart.so.13, libcublas.so.13, libcublasLt.so.13) from torch's pip-installed nvidia wheels, found
# at run time (cuda_lib_dirs) for every step, the driver's libcuda.so.1, and glibc >= 2.34,
# libstdc++ >= GLIBCXX_3.4.30 (gcc 12), libgomp.
# The prebuilt tarball, on the CPU machine (2 cores shared: 30-45 min under nice -n 19, -j2):
#   bash benchmarks/llama_cpp.sh prebuild SDIST/vendor/llama.cpp
# SDIST the llama-cpp-python 0.3.36 sdist (its vendored ggml-org/llama.cpp@0c1e57098). It fetches a CUDA
# 13.0 toolkit as pip wheels into $CUDA13 (/tmp/cuda13: nvcc, nvvm, crt 13.0.88, cudart 13.0.96, cuBLAS
# 13.1.0.3, CCCL 13.0.85), makes a link stub for libcuda, configures as `compile` does plus
# GGML_NATIVE=OFF (AVX2 CPU kernels: any x86_64 host) and BUILD_SHARED_LIBS=OFF (one binary per tool),
# builds in $LCP_BUILD (/tmp/lcpcuda/build), strips the tools and writes $PREBUILT. Carry the one file
# (run's carry: [".lcp/llama.cpp-cuda-sm90.tar.xz", ".whl", ".whl-text"]): the tree (32 MiB) with both tarballs is
# past the 64 MiB a call takes; carry the source tarball instead only where the prebuilt tools fail.
# The source tarball: the same vendored llama.cpp less the other backends, docs and models (6 MB; the
# whole sdist is 76 MB, past what a call carries). Make it on the CPU machine:
#   tar -C SDIST/vendor/llama.cpp --exclude=ggml/src/ggml-{sycl,vulkan,opencl,hexagon,metal,et,cann,musa} \
#       -cJf .lcp/llama.cpp-src.tar.xz CMakeLists.txt LICENSE licenses app cmake include src common ggml \
#       tools vendor scripts/ui-assets.cmake
# (llama-server's build runs scripts/ui-assets.cmake). The build goes to /dev/shm/lcp (the device's
# fresh machine keeps it for the rest of the call only): build and measure in one call.
set -u
# strata from the source tree, gguf from the carried wheels (as gpu_session.sh)
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
# bytecode where it can be written, as gpu_session.sh says why
unset PYTHONDONTWRITEBYTECODE
export PYTHONPYCACHEPREFIX=${PYTHONPYCACHEPREFIX:-/tmp/pycache}
if ls .whl/gguf*.whl >/dev/null 2>&1 && ! python3 -c "import gguf" 2>/dev/null; then
    python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/gguf*.whl \
        && export PYTHONPATH=$PYTHONPATH:/tmp/site
fi
# transformers >= 5.24 reads a GGUF's tokenizer (strata.tokenize): synth and pack write one into the
# pack only with it, and ppl_side and kv_resume tokenize text through it. The image has an older one
# (5.17): carry .whl-text/ (the transformers 5.24.0 wheel cut to the tokenizers its GGUF
# integration imports, 2.3 MB, so it fits a call's carry beside the prebuilt tools; its other needs
# are on the image; made on the CPU machine by `pip download --no-deps -d /tmp/tw transformers==5.24.0`
# then `python benchmarks/text_wheel.py /tmp/tw/transformers-5.24.0-py3-none-any.whl .whl-text/`)
# and it goes first on the path of these steps only (the GPU suite keeps the image's)
if ls .whl-text/*.whl >/dev/null 2>&1 && ! python3 -c "import transformers.integrations.gguf as g; g.convert_gguf_tokenizer" 2>/dev/null; then
    python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site-text .whl-text/*.whl \
        && export PYTHONPATH=/tmp/site-text:$PYTHONPATH
fi
LCP=${LCP:-/dev/shm/lcp}
PREBUILT=${PREBUILT:-.lcp/llama.cpp-cuda-sm90.tar.xz}
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
TOOLS="llama-bench llama-perplexity llama-server"

# the folders of the CUDA 13 runtime and cuBLAS the prebuilt tools link, among the nvidia wheels
# torch installed (their place differs between images, so it is looked up, not written down)
cuda_lib_dirs() {
    python3 - <<'EOF' 2>/dev/null
import glob, os, site
roots = site.getsitepackages() + [site.getusersitepackages()]
dirs = []
for root in roots:
    for name in ("libcudart.so.13", "libcublas.so.13", "libcublasLt.so.13"):
        for f in sorted(glob.glob(os.path.join(root, "nvidia", "**", name), recursive=True)):
            d = os.path.dirname(os.path.realpath(f))
            if d not in dirs:
                dirs.append(d)
print(":".join(dirs))
EOF
}
dirs=$(cuda_lib_dirs)
[ -n "$dirs" ] && export LD_LIBRARY_PATH=$dirs${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}

# one line: the first CUDA device llama.cpp sees (fails when the tools do not load or see none)
gpu_seen() {
    "$LCP/build/bin/llama-bench" --list-devices 2>&1 | grep -m1 "CUDA0:"
}

# configure and build the three tools; $1 the source, $2 the build folder, then extra cmake flags.
# One architecture, sm_90's machine code only (its PTX, for other GPUs to JIT, would double the
# kernels' bytes), every layer's kernels; no curl, no tests or examples.
configure_build() {
    local src=$1 build=$2; shift 2
    cmake -S "$src" -B "$build" -DCMAKE_BUILD_TYPE=Release -DGGML_CUDA=ON \
        -DCMAKE_CUDA_ARCHITECTURES=90-real -DLLAMA_CURL=OFF -DLLAMA_BUILD_TESTS=OFF \
        -DLLAMA_BUILD_EXAMPLES=OFF "$@" > "$OUT/llama_cpp_configure.log" 2>&1 && \
    cmake --build "$build" -j "$(nproc)" --target $TOOLS > "$OUT/llama_cpp_build.log" 2>&1
}

compile() {
    rm -rf "$LCP/build"
    mkdir -p "$LCP/src" && tar -C "$LCP/src" -xJf .lcp/llama.cpp-src.tar.xz || exit 2
    ( time configure_build "$LCP/src" "$LCP/build" ) 2>&1 | tail -3 | tee "$OUT/llama_cpp_build_time.log"
}

# the prebuilt tools into $LCP/build; fails (saying why) when absent, or when they do not load or see no GPU
unpack_prebuilt() {
    [ -f "$PREBUILT" ] || { echo "no $PREBUILT: compiling"; return 1; }
    rm -rf "$LCP/build" && mkdir -p "$LCP/build" && tar -C "$LCP/build" -xJf "$PREBUILT" || return 1
    gpu_seen > /dev/null && return 0
    echo "prebuilt llama.cpp does not run here or sees no GPU, compiling:"
    "$LCP/build/bin/llama-bench" --list-devices 2>&1 | head -3
    return 1
}

# the GGUF and pack of PRESET "SYNTH FLAGS" in $MODELS (/dev/shm): their paths in g and p. Each is
# made only when absent (synth and pack write a temp file and rename it whole, so one that exists is
# complete); a `make` of the same files still running in the background is waited for first.
# MODELS: where the GGUF and the pack go (default /dev/shm); GGUF_DIR / PACK_DIR split them, e.g.
# Qwen3-Next-80B Q4_K_M: its GGUF (~51 GB) on the disk, its pack (~56 GB) in /dev/shm, beside
# the ~46 GB of pinned experts strata holds: all three in /dev/shm would pass the 128 GiB host
model_paths() {
    local tag; tag=$(echo "$2" | tr -cd 'A-Za-z0-9_')
    g=${GGUF_DIR:-${MODELS:-/dev/shm}}/$1-$tag.gguf p=${PACK_DIR:-${MODELS:-/dev/shm}}/$1-$tag.pack
    mkdir -p "$(dirname "$g")" "$(dirname "$p")"
}
model_files() {
    model_paths "$1" "$2"
    local t0=$SECONDS
    [ -n "${MAKING:-}" ] || while [ -f "$g.making" ]; do sleep 2; done   # MAKING: it is the maker
    case ${ONLY:-both} in   # ONLY=gguf: the GGUF alone; ONLY=synthpack: synth's pack, no GGUF
      synthpack)
        [ -f "$p" ] || python3 -m strata.cli synth --preset "$1" $2 --pack -o "$p" 2>&1 | grep -v "it/s\]" | tail -1
        echo "[models] $p (synth --pack) ready in $((SECONDS - t0)) s" ;;
      *)
        [ -f "$g" ] || python3 -m strata.cli synth --preset "$1" $2 -o "$g" 2>&1 | grep -v "it/s\]" | tail -1
        [ "${ONLY:-both}" = gguf ] || [ -f "$p" ] || python3 -m strata.cli pack "$g" -o "$p" 2>&1 | grep -v "it/s\]" | tail -1
        echo "[models] $g${ONLY:+ ($ONLY only)} ready in $((SECONDS - t0)) s" ;;
    esac
}

case ${1:-} in
  # make PRESET "SYNTH FLAGS": the GGUF and pack made in the background (a new process session, so
  # they go on after the call that started them, on a machine held warm), while the call's
  # foreground runs GPU work, e.g. the suite; `side`/`cache`/`ppl` with the same two arguments on
  # that machine wait for them and use them. Its log: $g.log
  make)
    model_paths "$2" "$3"
    touch "$g.making"
    setsid nohup bash -c "MAKING=1 ONLY=${ONLY:-} bash '$0' files '$2' '$3'; rm -f '$g.making'" > "$g.log" 2>&1 < /dev/null &
    echo "[models] making $g and its pack in the background (log $g.log)" ;;
  files)
    model_files "$2" "$3" ;;
  # bigllama / bigstrata PRESET "SYNTH FLAGS" BUDGET PROMPTS: a model whose GGUF and pack do not
  # both fit the machine (GLM-4.5-Air Q4_K_M, 70 GB each), read in two steps (llama_side.py's
  # doc): llama.cpp on the GGUF (made when absent; `ONLY=gguf bash $0 make ...` makes it in the
  # background), its CSV kept in $MODELS, the GGUF removed; then `synth --pack` with the same flags
  # (the pack `strata pack` would make of that GGUF), strata on it, one CSV + PNG of both in $OUT.
  # SIDE_ARGS go to both runs (e.g. "--ub 8192 --reps 1 --load-mode none --llama-max 32768")
  bigllama)
    preset=$2 synth=$3 budget=$4 prompts=$5
    ONLY=gguf model_files "$preset" "$synth"
    rm -rf "$g.side" && mkdir -p "$g.side"
    python3 experiments/llama_side.py --gguf "$g" --bin "$LCP/build/bin" --budget "$budget" \
        --prompts "$prompts" ${SIDE_ARGS:-} --out "$g.side" 2>&1 | grep -v "it/s\]" | tail -14
    cp "$g.side"/* "$OUT"/ 2>/dev/null
    [ "${KEEP:-0}" = 1 ] || rm -f "$g" ;;
  # big PRESET "SYNTH FLAGS" BUDGET PROMPTS: both steps in one call (GLM-4.5-Air Q4_K_M: synth
  # ~2 min a file on the device, llama.cpp at 8K+32K ~2 min, strata's 8K+32K ~3 min with the pack
  # locked in place; 131K, when reached, last). LLAMA_ARGS go to the llama.cpp step (default
  # SIDE_ARGS), LLAMA_PROMPTS (default PROMPTS) are the prompts it reads
  big)
    SIDE_ARGS=${LLAMA_ARGS:-${SIDE_ARGS:-}} KEEP=0 bash "$0" bigllama "$2" "$3" "$4" "${LLAMA_PROMPTS:-$5}"
    echo "[big] llama.cpp's step done at $SECONDS s"
    bash "$0" bigstrata "$2" "$3" "$4" "$5" ;;
  bigstrata)
    preset=$2 synth=$3 budget=$4 prompts=$5
    ONLY=synthpack model_files "$preset" "$synth"
    rows=$(ls "$g.side"/llama_side-*.csv 2>/dev/null | head -1)
    [ -n "$rows" ] || echo "[bigstrata] no llama.cpp rows in $g.side: strata's rows alone"
    python3 experiments/llama_side.py ${rows:+--llama-rows "$rows"} \
        --pack "$p" --budget "$budget" --prompts "$prompts" ${SIDE_ARGS:-} --out "$OUT" 2>&1 \
        | grep -v "it/s\]" | tail -12
    [ "${KEEP:-0}" = 1 ] || rm -f "$p" ;;
  build)
    unpack_prebuilt || compile
    echo "llama.cpp sees: $(gpu_seen || echo 'no CUDA device')" | tee -a "$OUT/llama_cpp_build_time.log"
    ls -la "$LCP/build/bin" | tee -a "$OUT/llama_cpp_build_time.log" ;;
  side)
    preset=$2 synth=$3 budget=$4 prompts=$5
    model_files "$preset" "$synth"
    python3 experiments/llama_side.py --gguf "$g" --pack "$p" --bin "$LCP/build/bin" \
        --budget "$budget" --prompts "$prompts" ${SIDE_ARGS:-} --out "$OUT" 2>&1 | grep -v "it/s\]" | tail -12
    [ "${KEEP:-0}" = 1 ] || rm -f "$g" "$p" ;;
  cache)
    preset=$2 synth=$3 budget=$4
    DOC=${DOC:-65536} NQ=${NQ:-10} QT=${QT:-64} KVP=${KVP:-4096}
    st=/tmp/kvr-cache
    model_files "$preset" "$synth"
    vram=$(python3 -c "from strata.units import parse_size; print(parse_size('$budget'))")
    mkdir -p "$st" "$OUT/kv_resume"
    # strata first: its CSV is drawn beside llama.cpp's; --skip draws past its KVP + QT prompt
    timeout "${KVR_TIMEOUT:-360}" python3 experiments/kv_resume.py --pack "$p" --vram "$vram" --prompt "$KVP" --question "$QT" \
        --doc "$DOC" --questions "$NQ" --state-dir "$st" --out "$OUT/kv_resume" 2>&1 \
        | grep -v "it/s\]" | tail -16
    scsv=$(ls -t "$OUT"/kv_resume/kv_resume-*.csv 2>/dev/null | grep -v partial | head -1)
    python3 experiments/llama_server_cache.py --gguf "$g" --bin "$LCP/build/bin" --budget "$budget" \
        --doc-tokens "$DOC" --questions "$NQ" --question-tokens "$QT" --skip $((KVP + QT)) \
        ${scsv:+--strata-csv "$scsv"} --out "$OUT" 2>&1 | grep -v "it/s\]" | grep -v "^\[llama.cpp\]" | tail -16
    rm -rf "$st"; [ "${KEEP:-0}" = 1 ] || rm -f "$g" "$p" ;;
  ppl)
    preset=$2 synth=$3 budget=$4
    t0=$SECONDS
    model_files "$preset" "$synth"
    python3 experiments/ppl_side.py --gguf "$g" --pack "$p" --bin "$LCP/build/bin" --budget "$budget" \
        --tokens "${TOKENS:-300000}" --ctx "${CTX:-512}" --ub "${UB:-2048}" --timeout "${PPL_TIMEOUT:-240}" \
        --out "$OUT" 2>&1 | grep -v "it/s\]" | tail -12
    echo "[ppl] step done in $((SECONDS - t0)) s"
    [ "${KEEP:-0}" = 1 ] || rm -f "$g" "$p" ;;
  prebuild)
    src=${2:?usage: prebuild SRC, the llama.cpp source of the sdist}
    T=${CUDA13:-/tmp/cuda13} B=${LCP_BUILD:-/tmp/lcpcuda/build}
    renice -n 19 -p $$ > /dev/null      # the CPU machine's cores are shared
    python3 -m pip download -q --no-deps -d "$T/whl" nvidia-cuda-nvcc==13.0.88 nvidia-nvvm==13.0.88 \
        nvidia-cuda-crt==13.0.88 nvidia-cuda-runtime==13.0.96 nvidia-cublas==13.1.0.3 \
        nvidia-cuda-cccl==13.0.85 || exit 2
    for w in "$T"/whl/*.whl; do unzip -qo "$w" -d "$T/pkg"; done
    ln -sfn pkg/nvidia/cu13 "$T/root" && R=$T/root   # the wheels fill one tree: bin nvvm include lib
    mkdir -p "$R/lib/stubs" "$R/targets/x86_64-linux"
    ln -sfn lib "$R/lib64"
    ln -sfn ../../include "$R/targets/x86_64-linux/include"   # where nvcc.profile looks
    ln -sfn ../../lib "$R/targets/x86_64-linux/lib"
    for l in cudart cublas cublasLt; do ln -sfn "lib$l.so.13" "$R/lib/lib$l.so"; done
    # no wheel holds libcuda's link stub: an empty function per driver entry point cuda.h declares
    # (the driver's own libcuda.so.1 answers at run time)
    echo '#include <cuda.h>' | gcc -E -P -x c -I "$R/include" - | grep -oE '\bcu[A-Z][A-Za-z0-9_]*\s*\(' \
        | sed 's/\s*($//' | sort -u | awk '{print "void " $1 "(void){}"}' > "$T/libcuda-stub.c"
    gcc -shared -fPIC -Wl,-soname,libcuda.so.1 -o "$R/lib/stubs/libcuda.so" "$T/libcuda-stub.c" || exit 2
    export PATH=$R/bin:$PATH
    ( time configure_build "$src" "$B" -DGGML_NATIVE=OFF -DGGML_CUDA_FA_ALL_QUANTS=OFF \
        -DBUILD_SHARED_LIBS=OFF -DLLAMA_OPENSSL=OFF -DLLAMA_USE_PREBUILT_UI=OFF -DCUDAToolkit_ROOT="$R" \
        -DCMAKE_CUDA_COMPILER="$R/bin/nvcc" -DCMAKE_CUDA_HOST_COMPILER="$(command -v g++)" \
        -DCMAKE_SKIP_BUILD_RPATH=ON ) 2>&1 | tail -3
    rm -rf "$B/../pkg" && mkdir -p "$B/../pkg/bin" || exit 2
    for t in $TOOLS; do strip -o "$B/../pkg/bin/$t" "$B/bin/$t" || exit 2; done
    # a window wider than one tool (~50 MB), so the kernels the three share are packed once
    XZ_OPT="--lzma2=preset=9,dict=192MiB -T1" tar -C "$B/../pkg" -cJf "$PREBUILT" bin && ls -la "$PREBUILT" ;;
  *) echo "usage: bash benchmarks/llama_cpp.sh build | side|bigllama|bigstrata|big PRESET 'SYNTH FLAGS' BUDGET PROMPTS | cache PRESET 'SYNTH FLAGS' BUDGET | ppl PRESET 'SYNTH FLAGS' BUDGET | prebuild SRC" >&2
     exit 2 ;;
esac
