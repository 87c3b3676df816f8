#!/usr/bin/env bash
# One device-machine call: the GPU tests, then the benchmarks, results under $OUT.
#   bash benchmarks/gpu_session.sh STEP [STEP ...]      (the steps are the case labels below)
# (the *tests steps are subsets of `tests`, which needs more than one call's time)
# pytest gets no -q: the repo's addopts has one, a second hides the summary line.
# Runs strata from the source tree on the image's torch/triton; gguf comes as a carried wheel.
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
# Python's bytecode where it can be written: a stop-56 profile of a fresh process late in a call
# found 6.7 of its 20 s compiling modules from source (3,281 compiles: the wheels installed below
# with --no-compile, fla-core's ~270 modules among them, the tree's strata, and whatever of the
# image's had no bytecode it could keep), where a pip-installed strata, torch and fla-core come
# with theirs. With the cache under /tmp the first process of a call compiles and the later ones
# read, as on a user's machine; gpu.txt records what the image set
pyc_env="image: PYTHONDONTWRITEBYTECODE=${PYTHONDONTWRITEBYTECODE:-unset} PYTHONPYCACHEPREFIX=${PYTHONPYCACHEPREFIX:-unset}"
unset PYTHONDONTWRITEBYTECODE
export PYTHONPYCACHEPREFIX=${PYTHONPYCACHEPREFIX:-/tmp/pycache}
# the device copy has no .git: the caller passes the commit (STRATA_COMMIT=$(git rev-parse --short HEAD))
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
T0=$(date +%s)   # the call's start: SUITE_T=left gives the suite what CALL_S (575 s) leaves
# fla-core (and einops): strata's optional fla backend of the delta rule. Where fla imports,
# transformers swaps its torch delta rule for fla's at import: tests/conftest.py imports those
# modules with fla hidden first, so the references stay transformers' torch path
if ls .whl/*.whl >/dev/null 2>&1; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site \
        .whl/*.whl && export PYTHONPATH=$PWD:/tmp/site
fi
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee "$OUT/gpu.txt"
echo "$pyc_env; torch's folder writable: $(python3 -c 'import os, torch; print(os.access(os.path.dirname(torch.__file__), os.W_OK))')" | tee -a "$OUT/gpu.txt"
python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)" | tee -a "$OUT/gpu.txt"
# the named columns of a `strata bench -o csv` file (by name: the columns grow)
bench_cols() {
    python3 -c 'import csv, sys
for r in csv.DictReader(open(sys.argv[1])):
    print(",".join(r.get(c, "") for c in sys.argv[2].split(",")))' "$1" "$2" 2>/dev/null
}
for step in "$@"; do
  case $step in
    # the whole GPU suite in one call (issue 36 item 7): each test's time in
    # test_times.txt as it finishes (a run stopped at its limit still names the slow ones);
    # SUITE_N workers (4, as the issue times it) stealing work from each other, the longest tests
    # first (tests/suite_order.py), SUITE_T seconds (left: what the call has left of CALL_S
    # after the steps before it), over SUITE_PATHS
    suite)   st=${SUITE_T:-300}; [ "$st" = left ] && st=$(( ${CALL_S:-575} - ($(date +%s) - T0) ))
             echo "suite: ${st} s"
             STRATA_TEST_TIMES="$OUT/test_times.txt" timeout -s INT $st python3 -m pytest -rfE -m gpu -n ${SUITE_N:-4} --dist worksteal -p no:cacheprovider ${SUITE_PATHS:-tests/test_*.py tests/kernels tests/models tests/engine tests/archs tests/instruments tests/memory tests/packs} 2>&1 | tail -60 > "$OUT/gpu_suite.log"; tail -25 "$OUT/gpu_suite.log"; sort -rn "$OUT/test_times.txt" | head -30
             # every test's outcome and time in the log too (a call brings back 8 files: this one may be cut), and their count
             { echo "== outcomes (test_times.txt)"; awk '$3 == "call" {print $2}' "$OUT/test_times.txt" | sort | uniq -c; sort -rn "$OUT/test_times.txt"; } >> "$OUT/gpu_suite.log" ;;
    tests)   timeout 300 python3 -m pytest -rfE -m gpu -p no:cacheprovider tests 2>&1 | tail -40 > "$OUT/gpu_tests.log"; tail -5 "$OUT/gpu_tests.log" ;;
    decodetests) timeout 280 python3 -m pytest -rfE -m gpu -p no:cacheprovider tests/test_decode.py tests/test_dequant.py tests/test_decode_codes.py tests/test_bench.py tests/test_roofline.py tests/memory 2>&1 | tail -30 > "$OUT/gpu_decode_tests.log"; tail -8 "$OUT/gpu_decode_tests.log" ;;
    kerneltests) timeout 280 python3 -m pytest -rfE -m gpu -p no:cacheprovider tests/kernels tests/test_kernel_lab.py tests/models 2>&1 | tail -30 > "$OUT/gpu_kernel_tests.log"; tail -8 "$OUT/gpu_kernel_tests.log" ;;
    enginetests) timeout 150 python3 -m pytest -rfE -m gpu -p no:cacheprovider tests/engine 2>&1 | tail -30 > "$OUT/gpu_engine_tests.log"; tail -8 "$OUT/gpu_engine_tests.log" ;;
    fmttests) timeout 280 python3 -m pytest -rfE -m gpu -p no:cacheprovider tests/test_decode.py tests/kernels/test_moe_ffn.py -k "Q4_1 or Q5_1 or Q2_K or Q3_K or Q5_K or IQ4_XS or IQ3_XXS or IQ2_XXS or IQ2_XS or IQ2_S or IQ1_S or IQ1_M" 2>&1 | tail -30 > "$OUT/gpu_fmt_tests.log"; tail -8 "$OUT/gpu_fmt_tests.log" ;;
    fmtdequant) timeout 280 python3 -m pytest -rfE -m gpu -p no:cacheprovider tests/test_dequant.py -k "Q4_1 or Q5_1 or Q2_K or Q3_K or Q5_K or IQ4_XS or IQ3_XXS or IQ2_XXS or IQ2_XS or IQ2_S or IQ1_S or IQ1_M" 2>&1 | tail -30 > "$OUT/gpu_fmt_dequant.log"; tail -8 "$OUT/gpu_fmt_dequant.log" ;;
    # issue 18 items 1-2: no host sync inside a chunk (set_sync_debug_mode "error"), and the overlap figure
    synctests) timeout 200 python3 -m pytest -rfE -m gpu -p no:cacheprovider tests/engine/test_syncs.py 2>&1 | tail -20 > "$OUT/gpu_sync_tests.log"; tail -5 "$OUT/gpu_sync_tests.log" ;;
    overlap8k)  timeout 230 python3 experiments/prefill_ab.py --no-gate --models qwen3-30b-a3b-Q8_0 --prompts 8192 --arms auto,resident --out "$OUT" 2>&1 | grep -v "it/s\]" | tail -12 | tee "$OUT/overlap8k.log" ;;
    # the same 8K read with one copy per blob (STRATA_COPY_RUNS=0): the A/B of the copy runs
    overlap8koff) STRATA_COPY_RUNS=0 timeout 230 python3 experiments/prefill_ab.py --no-gate --models qwen3-30b-a3b-Q8_0 --prompts 8192 --arms auto --out "$OUT" 2>&1 | grep -v "it/s\]" | tail -12 | tee "$OUT/overlap8k_runs_off.log" ;;
    # the 8K read two ways on one machine: prefill_ab's warm streamed read, then a fresh process's (cold_warm)
    h8k) timeout 100 python3 experiments/prefill_ab.py --no-gate --models qwen3-30b-a3b-Q8_0 --prompts 8192 --arms auto --out "$OUT" 2>&1 | grep -v "it/s\]" | tail -4 | tee "$OUT/h8k_prefill_ab.log"
         timeout 120 python3 experiments/cold_warm.py --prompts 8192 --arms warm --repeats 3 --out "$OUT" 2>&1 | grep -v "it/s\]" | grep -v "^pack " | tail -4 | tee "$OUT/h8k_cold_warm.log" ;;
    overlap32k) timeout 230 python3 experiments/prefill_ab.py --no-gate --models qwen3-30b-a3b-Q8_0 --prompts 32768 --arms auto,resident --out "$OUT" 2>&1 | grep -v "it/s\]" | tail -12 | tee "$OUT/overlap32k.log" ;;
    # issue 18 item 4: the all-resident read against its full compute floor (attention + experts + dense)
    floor32k) timeout 230 python3 experiments/prefill_ab.py --no-gate --models qwen3-30b-a3b-Q8_0 --prompts 8192,32768 --arms resident --out "$OUT" 2>&1 | grep -v "it/s\]" | tail -12 | tee "$OUT/floor32k.log"; timeout 60 python3 -m pytest -rfE -m gpu -p no:cacheprovider tests/test_roofline.py 2>&1 | tail -3 ;;
    prefill) timeout 420 python3 experiments/prefill_ab.py --no-gate --out "$OUT" 2>&1 | grep -v "it/s\]" | tail -30 ;;
    # issue 39 item 5: every stock mix (and Q8_0/Q5_0/Q4_0) of one synthesized model re-encoded from its
    # BF16 base, read with strata's perplexity instruments against the base's saved log-probs: PPL, mean/p99
    # KLD, top-1 agreement, bytes per weight, streamed tokens/s. 8 layers and 8192 tokens (16 windows of 512)
    # so the ten reads of each model fit ~300 s (the first GPU run, 7dfb85b: set-up and the BF16 read
    # ~31 / 42 s, an arm ~9 s; at 755962c both took 183 s with 4-5 arms each refused by the fallback
    # ring's count, fixed since: ~10 s more an arm); --vram leaves a cache smaller than the smallest mix, so every arm
    # streams (qwen3: dense ~1.9 GiB of 4; gpt-oss: ~2.8 GiB of 5). Each run's whole output (its
    # traceback, if any) in quantq_<preset>.full.log, the summary printed
    quantq) for a in "qwen3-30b-a3b 4GiB 180" "gpt-oss-20b 5GiB 220"; do read -r qp qv qt <<< "$a"
              timeout $qt python3 experiments/quant_quality.py --preset $qp --layers 8 --vram $qv --tokens 8192 --out "$OUT" > "$OUT/quantq_$qp.full.log" 2>&1
              grep -v "it/s\]" "$OUT/quantq_$qp.full.log" | grep "^\[quantq\]\|wrote\|Error" | tail -14 | tee "$OUT/quantq_$qp.log"; done ;;
    formats) timeout 480 python3 experiments/formats_ab.py --out "$OUT" 2>&1 | grep -v "it/s\]" | tail -40 ;;
    # issue 15's target where PCIe bounds Q8_0: short prompts, the streamed reads only
    formatspcie) timeout 400 python3 experiments/formats_ab.py --prompts 2048,4096,8192 --no-gemm --out "$OUT" 2>&1 | grep -v "it/s\]" | grep "^\[" | tail -20 | tee "$OUT/formats_pcie.log" ;;
    kernels) timeout 300 python3 experiments/kernel_bench.py --out "$OUT" 2>&1 | tail -40 | tee "$OUT/kernel_bench.log" ;;
    # the 8K read's pass apart from its ring's run-ahead (docs/kernel_notes.md, "The 8K read's
    # ring and passes"): RA_PACK a pack already made (e.g. `ONLY=synthpack bash
    # benchmarks/llama_cpp.sh files qwen3.5-35b-a3b "--mix Q4_K_M"`), RA_ARMS the arms beside the
    # plan's (ring/pass: Qwen3.5's by default)
    # the run-ahead rule's A/B (STRATA_RING_AHEAD, strata.memory.scan): an 8K read of RA_PACK
    # under RA_VRAM with the plan's ring, then with the rule on at RA_AHEAD bytes per FLOP
    ringahead) for a in 0 ${RA_AHEAD:-2.3e-4}; do STRATA_RING_AHEAD=$a timeout 200 python3 -m strata.cli bench "$RA_PACK" --vram ${RA_VRAM:-24GiB} -p 8192 -r 2 -o csv > "$OUT/ring_ahead-$(basename "$RA_PACK" .pack)-$a.csv" 2> "$OUT/ring_ahead-$a.err"; echo "[ahead $a] $(bench_cols "$OUT/ring_ahead-$(basename "$RA_PACK" .pack)-$a.csv" ring,tokens_per_s,of_bound,pcie_bound_tokens_per_s,bytes_streamed)"; done ;;
    ringpass) timeout 400 python3 benchmarks/ring_ab.py "$RA_PACK" --vram ${RA_VRAM:-12GiB} -p 8192 -r 2 --rings "${RA_ARMS:-plan/256,780/130,780}" --name "ring_pass-$(basename "$RA_PACK" .pack)" --out "$OUT" > "$OUT/ring_pass.log" 2>&1; grep "tok/s\|wrote\|error" "$OUT/ring_pass.log" ;;
    dequant) timeout 120 python3 benchmarks/dequant_bench.py --out-dir "$OUT" 2>&1 | tail -20 | tee "$OUT/dequant.log" ;;
    # issues 15/18: the decode-once path of the K-quants/IQ4_XS, byte path vs super-block words at
    # several tiles (Q8_0 bytes/words, MXFP4 bytes/stream beside), input and output GB/s against the
    # copy; then its GPU tests
    kdecode) timeout 230 python3 benchmarks/dequant_bench.py --mode experts --out-dir "$OUT" 2>&1 | grep -v "it/s\]" | tail -55 | tee "$OUT/dequant_experts.log" ;;
    # the decode-once path of MXFP4 (gpt-oss's experts, 128 x 2880 x 2880): the byte path vs the
    # stream of aligned words at each program size; then its GPU tests
    mxdecode) timeout 200 python3 benchmarks/dequant_bench.py --mode experts --formats MXFP4 --expert-shape 128,2880,2880 --out-dir "$OUT" 2>&1 | grep -v "it/s\]" | tail -12 | tee "$OUT/dequant_experts_mxfp4.log" ;;
    mxdecodetests) timeout 200 python3 -m pytest -rfE -m gpu -p no:cacheprovider tests/test_streams.py tests/kernels/test_expert_dequant.py 2>&1 | tail -20 > "$OUT/gpu_mxdecode_tests.log"; tail -5 "$OUT/gpu_mxdecode_tests.log" ;;
    kdecodetests) timeout 230 python3 -m pytest -rfE -m gpu -p no:cacheprovider tests/test_superblocks.py tests/kernels/test_expert_dequant.py tests/kernels/test_moe_decoded.py 2>&1 | tail -20 > "$OUT/gpu_kdecode_tests.log"; tail -5 "$OUT/gpu_kdecode_tests.log" ;;
    slab)    timeout 180 python3 experiments/slab_ab.py --out "$OUT" 2>&1 | tail -20 | tee "$OUT/slab.log" ;;
    reltests) timeout 220 python3 -m pytest -rfE -p no:cacheprovider tests/packs/test_cli.py tests/test_bad_inputs.py tests/test_fuzz_headers.py 2>&1 | tail -20 > "$OUT/gpu_rel_tests.log"; tail -5 "$OUT/gpu_rel_tests.log"
             timeout 200 python3 -m strata.cli synth --preset qwen3-30b-a3b --layers 8 --pack -o /tmp/v8.pack 2>&1 | tail -1
             ( time python3 -m strata.cli verify /tmp/v8.pack ) 2>&1 | tail -5 | tee "$OUT/verify_time.log"; rm -f /tmp/v8.pack ;;
    attn)    timeout 230 python3 experiments/attention_bench.py --out "$OUT" 2>&1 | tail -40 | tee "$OUT/attention_bench.log" ;;
    attntests) timeout 200 python3 -m pytest -rfE -m gpu -p no:cacheprovider tests/kernels/test_chunk_attention.py -k "not paths_agree and not pieces" 2>&1 | tail -20 > "$OUT/gpu_attn_tests.log"; tail -5 "$OUT/gpu_attn_tests.log" ;;
    # issue 14: the two int8 paths against each other, pieces of a long prefix, PromptKV on CUDA
    attnint8) timeout 220 python3 -m pytest -rfE -s -m gpu -p no:cacheprovider tests/kernels/test_chunk_attention.py tests/engine/test_kv_scratch.py -k "paths_agree or pieces" 2>&1 | grep -E "bit for bit|passed|failed|FAILED|Error|assert" | tail -25 > "$OUT/gpu_attn_int8_tests.log"; tail -12 "$OUT/gpu_attn_int8_tests.log" ;;
    long)    timeout 540 python3 experiments/long_prompt.py --out "$OUT" 2>&1 | grep -v "it/s\]" | tail -20 | tee "$OUT/long_prompt.log" ;;
    # issues 14/17: the warm-up covers a long prompt's launches (probes); the first long prompt compiles nothing
    warmvariants) timeout 200 python3 -m pytest -rfE -m gpu -p no:cacheprovider tests/engine/test_warm_variants.py 2>&1 | tail -8 > "$OUT/gpu_warm_variants.log"; tail -3 "$OUT/gpu_warm_variants.log" ;;
    long262) timeout 400 python3 experiments/long_prompt.py --cells 262144:bf16:32768,262144:int8:all,262144:bf16:all --out "$OUT" 2>&1 | grep -v "it/s\]" | tail -12 | tee "$OUT/long_prompt_262k.log" ;;
    long32)  timeout 200 python3 experiments/long_prompt.py --cells 32768:bf16:all,32768:int8:all,32768:bf16:32768,32768:int8:32768 --out "$OUT" 2>&1 | grep -v "it/s\]" | grep "^\[long\] T=" | tee "$OUT/long_prompt_32k.log" ;;
    longwarm) timeout 230 python3 experiments/long_prompt.py --cells 131072:int8:32768,131072:bf16:32768 --warm engine --out "$OUT" 2>&1 | grep -v "it/s\]" | tail -8 | tee "$OUT/long_prompt_warm.log" ;;
    kvtests) timeout 200 python3 -m pytest -rfE -p no:cacheprovider tests/engine/test_kv.py tests/test_long_prompt_smoke.py 2>&1 | tail -20 > "$OUT/gpu_kv_tests.log"; tail -5 "$OUT/gpu_kv_tests.log" ;;
    split)   timeout 200 python3 experiments/split_ab.py --out "$OUT" 2>&1 | grep -v "it/s\]" | tail -20 ;;
    # issue 21 item 4 (nvidia-h200, one GPU): two gloo ranks sharing the GPU against the one-process split
    # every architecture through two gloo ranks sharing the GPU, logits equal to the one-process read
    distarchs) timeout 230 python3 -m pytest -rfE -m gpu -p no:cacheprovider tests/engine/test_distributed_archs.py 2>&1 | tail -20 > "$OUT/gpu_dist_archs_tests.log"; tail -5 "$OUT/gpu_dist_archs_tests.log" ;;
    dist)    timeout 470 python3 experiments/dist_ab.py --out "$OUT" 2>&1 | grep -v "it/s\]" | tail -20 | tee "$OUT/dist_ab.log" ;;
    # issue 22 (nvidia-h200-x2 ONLY; documented, not yet run): two NCCL ranks, 32K and 131072,
    # sequential vs pipelined against the one-process split over cuda:0/cuda:1
    dist2)   timeout 590 python3 experiments/dist_ab.py --backend nccl --prompts 32768,131072 --out "$OUT" 2>&1 | grep -v "it/s\]" | tail -20 | tee "$OUT/dist2_ab.log" ;;
    coldpack) ( time timeout 560 python3 -m strata.cli synth --preset qwen3-30b-a3b --quant Q8_0 --pack -o /dev/shm/strata-coldwarm-qwen3-30b-a3b-Q8_0.pack ) 2>&1 | grep -v "it/s\]" | tail -5 | tee "$OUT/cold_pack.log" ;;
    # the full-size pack file (MemoryPack.save, seconds) stays in /dev/shm for benchfull; `packrm` removes it
    coldwarm32) ( time timeout 300 python3 experiments/cold_warm.py --prompts 32768 --arms warm --out "$OUT" ) 2>&1 | grep -v "it/s\]" | tail -20 | tee "$OUT/cold_warm32.log" ;;
    coldwarm32e) ( time timeout 300 python3 experiments/cold_warm.py --prompts 32768 --arms warm --prime --pin-methods "pread,early=1;pread" --out "$OUT" ) 2>&1 | grep -v "it/s\]" | grep -v "^pack " | tail -8 | tee "$OUT/cold_warm32e.log" ;;
    coldwarm5) ( time timeout 330 python3 experiments/cold_warm.py --prompts 32768 --arms warm --prime --keep --pin-methods "pread,early=1;pread;pread,early=1,threads=8;pread,early=1;pread" --out "$OUT" ) 2>&1 | grep -v "it/s\]" | grep -v "^pack " | tail -9 | tee "$OUT/cold_warm5.log" ;;
    ring8k)  for r in auto 160 256; do x=""; [ "$r" = auto ] || x="--ring $r"; timeout 100 python3 -m strata.cli bench /dev/shm/strata-coldwarm-qwen3-30b-a3b-Q8_0.pack -p 8192 -r 3 --vram 12GiB $x --trace "$OUT/ring8k_$r.json" -o csv 2>&1 | grep -v "it/s\]" | tee "$OUT/ring8k_$r.csv" | tail -3; done ;;
    mempack) python3 -c "from strata.packs.memory import MemoryPack; from strata.packs.synth import ExpertFormats; from strata.shapes import get_preset; MemoryPack(get_preset('qwen3-30b-a3b'), ExpertFormats.of('Q8_0'), seed=0, device='cpu').save('/dev/shm/strata-coldwarm-qwen3-30b-a3b-Q8_0.pack', tokenizer=False)" 2>&1 | grep -v "it/s\]" | tail -2 ;;
    gc8k)    for g in 1 0; do STRATA_GC_PAUSE=$g timeout 120 python3 -m strata.cli bench /dev/shm/strata-coldwarm-qwen3-30b-a3b-Q8_0.pack -p 8192,32768 -r 3 --vram 12GiB --trace "/tmp/gc8k_$g.json" -o csv 2>&1 | grep -v "it/s\]" | grep pp | sed "s/^/gc_pause=$g,/" | tee -a "$OUT/gc8k.csv"; cp /tmp/gc8k_$g.png "$OUT/" 2>/dev/null; done ;;
    coldwarmk) ( time timeout 200 python3 experiments/cold_warm.py --prompts 8192,32768 --arms warm --prime --keep --out "$OUT" ) 2>&1 | grep -v "it/s\]" | grep -v "^pack " | tail -8 | tee "$OUT/cold_warm_k.log" ;;
    coldwarm) ( time timeout 400 python3 experiments/cold_warm.py --keep --out "$OUT" ) 2>&1 | grep -v "it/s\]" | tail -20 | tee "$OUT/cold_warm.log" ;;
    # issue 37 item 6: start-up of a 60+ GB pack (gpt-oss-120b MXFP4, 61 GB, MemoryPack's few
    # distinct blobs: no pinning or copy cost depends on their bits) under --vram 24GiB, a fresh
    # process's ready time and first prompt at 8K after an untimed one (--prime: Triton's cache warm);
    # the pack stays for a later run. BIG_PIN: the pin methods, each a timed child (auto: the
    # engine's choice; register in place with one locking thread and with eight)
    bigfirst) ( time timeout 540 python3 experiments/cold_warm.py --preset gpt-oss-120b --quant MXFP4 --pack /dev/shm/strata-coldwarm-gpt-oss-120b-MXFP4.pack --keep --vram $((24 << 30)) --prompts ${BIG_FIRST:-8192} --arms warm --prime --pin-methods "${BIG_PIN:-auto;register;register,lockers=8}" --out "$OUT/bigfirst_${BIG_FIRST:-8192}" ) 2>&1 | grep -v "it/s\]" | tail -8 | tee "$OUT/cold_warm_big.log" ;;
    # the start-up pieces on the GPU: bulk dense upload through pinned staging, background pinning, warm layers
    readytests) timeout 200 python3 -m pytest -rfE -m gpu -p no:cacheprovider tests/engine/test_pinning.py tests/engine/test_host.py tests/engine/test_warm_trace.py tests/engine/test_start_imports.py tests/models/test_attention.py 2>&1 | tail -8 > "$OUT/gpu_ready.log"; tail -3 "$OUT/gpu_ready.log" ;;
    benchfull) timeout 200 python3 -m strata.cli bench /dev/shm/strata-coldwarm-qwen3-30b-a3b-Q8_0.pack -p 8192,32768 -r 3 --vram 12GiB --trace "$OUT/bench_trace.json" -o csv 2>&1 | grep -v "it/s\]" | tee "$OUT/bench_full.csv" | tail -12 ;;
    # issue 41 item 4: qwen3-30b-a3b Q8_0 under 12 GiB: a 131K prompt saved and resumed beside a full
    # re-read, ten questions on a 64K document (time to first token each), decode tokens/s
    # kvq: the ten questions alone (kv_resume --parts questions), each question's time taken apart
    # (open, restore, read, the rest), then the same through the CLI, one process for the ten
    # (`strata prefill --prompts-file Q --resume DOC` on mempack's pack file)
    kvq)     mkdir -p /dev/shm/kvr; ( time timeout 200 python3 experiments/kv_resume.py --parts questions --state-dir /dev/shm/kvr --out "$OUT" ) 2>&1 | grep -v "it/s\]" | grep "^\[kv\]\|wrote\|real\|Error" | tee "$OUT/kv_questions.log"; rm -rf /dev/shm/kvr
             pk=/dev/shm/strata-coldwarm-qwen3-30b-a3b-Q8_0.pack; kw="--vram 12GiB --kv int8 --kv-resident 32768 --max-prompt 65600"
             [ -f $pk ] || bash "$0" mempack
             python3 -c "import random; r=random.Random(1); print('\n'.join(','.join(str(r.randrange(151936)) for _ in range(64)) for _ in range(10)))" > /dev/shm/q10.txt
             timeout 120 python3 -m strata.cli prefill $pk --prompt-tokens 65536 $kw --save-kv /dev/shm/q64doc.kv --json 2>&1 | grep -v "it/s\]" | tail -1 > /dev/null
             timeout 150 python3 -m strata.cli prefill $pk --prompts-file /dev/shm/q10.txt --resume /dev/shm/q64doc.kv $kw --json 2>&1 | grep -v "it/s\]" > "$OUT/kv_questions_cli.jsonl"
             python3 -c "import json,sys; js=[json.loads(l) for l in open(sys.argv[1]) if l[:1] in '[{']; js=[x for j in js for x in (j if isinstance(j, list) else [j])]; [print('[cli] question', i, 'run', round(j['run_s'],3), 'setup', round(j['setup_s'],3), 'restore', round(j['kv_state']['restore_s'],3), 'read', round(j['seconds'],3), 'teardown', round(j['teardown_s'],3), 'GB/s', round(j['h2d_gbps'],1)) for i, j in enumerate(js)]" "$OUT/kv_questions_cli.jsonl" | tee -a "$OUT/kv_questions.log"; rm -f /dev/shm/q64doc.kv /dev/shm/q10.txt ;;
    kvresume) mkdir -p /dev/shm/kvr; ( time timeout 420 python3 experiments/kv_resume.py --state-dir /dev/shm/kvr --out "$OUT" ) 2>&1 | grep -v "it/s\]" | tail -30 | tee "$OUT/kv_resume.log"; rm -rf /dev/shm/kvr ;;
    # issue 41: where a question's 64 tokens after a saved 64K document go (strata's 1.0 s against
    # llama-server's 0.63 s at b6aff0d): the document read and saved once, then the same 64 tokens
    # resumed and read cold (no state), each with its lane trace (copy and compute lanes, JSON + PNG)
    # and the plan; MemoryPack's qwen3-30b-a3b Q8_0 (mempack) under 12 GiB, KV int8, 32K resident
    qtrace)  pk=/dev/shm/strata-coldwarm-qwen3-30b-a3b-Q8_0.pack; kw="--vram 12GiB --kv int8 --kv-resident 32768 --max-prompt 65600"
             [ -f $pk ] || bash "$0" mempack
             timeout 120 python3 -m strata.cli prefill $pk --prompt-tokens 65536 $kw --save-kv /dev/shm/q64doc.kv --json 2>&1 | grep -v "it/s\]" | tail -3 > "$OUT/qtrace_doc.log"
             for r in 1 2; do timeout 90 python3 -m strata.cli prefill $pk --resume /dev/shm/q64doc.kv --prompt-tokens 64 --seed $r $kw --trace "$OUT/qtrace_resume$r.json" --json 2>&1 | grep -v "it/s\]" | tail -40 > "$OUT/qtrace_resume$r.log"; done
             timeout 90 python3 -m strata.cli prefill $pk --prompt-tokens 64 --seed 1 $kw --trace "$OUT/qtrace_cold.json" --json 2>&1 | grep -v "it/s\]" | tail -40 > "$OUT/qtrace_cold.log"
             timeout 60 python3 -m strata.cli plan --pack $pk --prompt-tokens 64 $kw --device cuda 2>&1 | tail -12 | tee "$OUT/qtrace_plan.log"
             grep -h "tokens/s\|restore\|seconds" "$OUT"/qtrace_*.log | head -20; rm -f /dev/shm/q64doc.kv ;;
    # issue 40 item 3: the expert-FFN table `--experts auto` reads, remade on this GPU (kernel_bench
    # over the stock mixes' formats and T 64..32768, then derived): copy $OUT/ffn_table.json over
    # strata/kernels/moe/ffn_table.json with the CSV it names
    # FT_FORMATS="Q5_K Q4_0 BF16" measures only those (the rest of a run its budget cut short)
    ffntable) timeout 280 python3 experiments/ffn_table.py --budget 240 ${FT_FORMATS:+--formats $FT_FORMATS} --out "$OUT" --table "$OUT/ffn_table.json" 2>&1 | grep -v "it/s\]" | tail -12 | tee "$OUT/ffn_table.log" ;;
    # issue 40 item 4: the int8 GEMM's tile (strata.kernels.moe.int8.Int8Tile; the default 64x64/w4s2 ran
    # 15-29 TFLOP/s on the H100 at 47eafc3) swept beside decode-once and grouped_mm-bf16: INT8_TILES;
    # kK arms step K q8_1 blocks a reduction step: 64x64/w8s2 at k1, k2, k4, the tile whose gate/up
    # ptxas (sm_90, Q8_0) fits in registers at k1 and k2 (20 B spilled at k4); 4 warps spill at every k.
    # strata-plane-int8 (Q8_0, Q4_0, Q4_K): the same numbers over plane-layout codes (8/16-byte
    # cp.async code tiles where the ggml blocks load bytes; 4-bit nibbles unpacked in registers, Q4_K's
    # scales two 8-byte loads a row a step), at its default and at each INT8_TILES tile, after its GPU
    # tests (bit for bit against the ggml-layout int8 GEMM; 120 s: the Q4_K and Q4_K_M-mix cases
    # compile their own builds); KB_FMT="Q8_0 Q4_0" for the Q4_0 arms (not in the default: the step's 280 s)
    int8tiles) timeout 120 python3 -m pytest -rfE -m gpu -p no:cacheprovider tests/kernels/test_moe_plane_int8.py 2>&1 | tail -5 | tee "$OUT/gpu_plane_int8_tests.log"
             timeout 280 python3 experiments/kernel_bench.py --shapes qwen3-30b-a3b --T 2048 8192 32768 --formats ${KB_FMT:-Q8_0 Q4_K} --arms strata-decoded strata-int8 strata-plane-int8 --int8-tiles ${INT8_TILES:-64x128/w4s3 128x64/w4s3 128x128/w8s3 128x256/w8s3 64x256/w8s3 64x64/w8s2 64x64/w8s2k2 64x64/w8s2k4} --out "$OUT" 2>&1 | grep -v "it/s\]" | tail -20 | tee "$OUT/int8_tiles.log" ;;
    # issue 38 item 2: strata's chunked gated delta rule beside fla-core's on the same inputs
    # (time, peak memory, distance to fp64) at Qwen3.5's heads, T 512..32768, strata's fused and
    # split launches (strata.kernels.deltanet.launch) and a tf32 one beside fla-core: CSV + PNG
    fla)     timeout 240 python3 experiments/deltanet_fla.py --arms strata "strata[split,prec=tf32]" "strata[backend=fla]" fla-core --out "$OUT" 2>&1 | grep -E "^\[deltanet\]|wrote|Error" | tail -14 | tee "$OUT/fla_beside.log" ;;
    packrm)  rm -f /dev/shm/strata-coldwarm-qwen3-30b-a3b-Q8_0.pack ;;
    # issue 18: the fused combine (sum over K in one pass) at qwen3's K 8 / D 2048 against its reference bit for bit, then through its callers: no sync inside a chunk and streamed == resident (test_syncs), check on/off bit for bit (plane relayout)
    combinetests) timeout 230 python3 -m pytest -rfE -m gpu -p no:cacheprovider tests/kernels/test_combine.py tests/engine/test_syncs.py tests/kernels/test_plane_ffn.py -k "combine or syncs or relayout" 2>&1 | tail -20 > "$OUT/gpu_combine_tests.log"; tail -5 "$OUT/gpu_combine_tests.log" ;;
    moeffn)  timeout 280 python3 -m pytest -rfE -m gpu -p no:cacheprovider tests/kernels/test_moe_ffn.py 2>&1 | tail -20 > "$OUT/gpu_moe_ffn.log"; tail -5 "$OUT/gpu_moe_ffn.log" ;;
    benchcmd) timeout 120 python3 -m pytest -rfE -m gpu -p no:cacheprovider tests/engine/test_warm_trace.py 2>&1 | tail -8 > "$OUT/gpu_warm_trace.log"; tail -3 "$OUT/gpu_warm_trace.log"
             timeout 100 python3 -m strata.cli synth --preset qwen3-30b-a3b --layers 8 --pack -o /dev/shm/b8.pack 2>&1 | tail -1
             timeout 200 python3 -m strata.cli bench /dev/shm/b8.pack -p 8192,32768 -r 3 --vram 6GiB --trace "$OUT/bench_trace.json" 2>&1 | grep -v "it/s\]" | tail -8 | tee "$OUT/bench_cmd.md"; rm -f /dev/shm/b8.pack ;;
    # issue 19: GPT-OSS / Mixtral kernels' GPU twins (bias + clamped-SwiGLU epilogue, window + sinks)
    archtests) timeout 200 python3 -m pytest -rfE -m gpu -p no:cacheprovider tests/kernels/test_moe_epilogue.py tests/kernels/test_chunk_attention_window.py tests/models/test_parity_archs.py 2>&1 | tail -12 > "$OUT/gpu_arch_tests.log"; tail -5 "$OUT/gpu_arch_tests.log" ;;
    # issue 19 item 1: sliding layers keep only their window's KV (a ring of W - 1 in VRAM)
    swatests) timeout 200 python3 -m pytest -rfE -m gpu -p no:cacheprovider tests/models/test_kv_window.py tests/engine/test_kv_window.py 2>&1 | tail -12 > "$OUT/gpu_swa_tests.log"; tail -5 "$OUT/gpu_swa_tests.log" ;;
    # issue 19 item 4: gpt-oss-120b MXFP4 streamed under 24 GiB at 8K/32K vs PCIe, gpt-oss-20b resident
    arch)    timeout 470 python3 experiments/arch_ab.py --out "$OUT" 2>&1 | grep -v "it/s\]" | tail -20 | tee "$OUT/arch_ab.log" ;;
    # issue 20: the DeepSeek / GLM-4.5 family's GPU tests, MLA blocked vs all-at-once vs absorbed, and a
    # full-width DeepSeek-V3 pack (as many MoE layers as host memory holds) streamed at 8K/32K
    familytests) timeout 230 python3 -m pytest -rfE -m gpu -p no:cacheprovider tests/models/test_mla.py tests/models/test_mla_blocks.py tests/models/test_mla_int8.py tests/models/test_family.py 2>&1 | tail -20 > "$OUT/gpu_family_tests.log"; tail -5 "$OUT/gpu_family_tests.log" ;;
    # issue 14 x 20: MLA's latent KV beyond --kv-resident in pinned host memory, streamed back: the engine
    # streamed == resident (bf16, int8) and the blocked attention over [staged, resident] at DeepSeek widths
    mlakvtests) timeout 200 python3 -m pytest -rfE -m gpu -p no:cacheprovider tests/models/test_mla_kv_resident.py 2>&1 | tail -12 > "$OUT/gpu_mla_kv_tests.log"; tail -5 "$OUT/gpu_mla_kv_tests.log" ;;
    # a DeepSeek-V3-width pack (2 MoE layers) read at 64K, every latent token resident vs 16K a layer resident
    mlakv)   timeout 300 python3 experiments/deepseek_stream.py --moe-layers 2 --prompts 65536 --kv-resident all,16384 --out "$OUT" 2>&1 | grep -v "it/s\]" | tail -12 | tee "$OUT/deepseek_kv_resident.log" ;;
    mla)     timeout 200 python3 benchmarks/mla_bench.py --out "$OUT" 2>&1 | tail -20 | tee "$OUT/mla_bench.log" ;;
    # issue 38 item 5: the full-size Qwen3.5-35B-A3B Q4_K_M (synth's GGUF and its pack, made by
    # `llama_cpp.sh make` in the background, waited for) under --vram 12GiB: 8K and 32K (2 reps),
    # 131K and 262K (1 rep, lane trace), then 131K with the prefix through chunk_attention
    # (--prefix-attention triton) and FlashAttention-2's blocks (flash) beside the default's
    # (cuDNN's blocks on Hopper)
    # issue 38 item 5: Qwen3.5-35B-A3B Q4_K_M at --vram 12GiB, split so a call takes what fits:
    # q35make starts the GGUF + pack in the background (~2 min), the others wait for it.
    # HYB_PRESET=qwen3-next-80b-a3b HYB_TAG=qnext runs the same steps for another hybrid (its
    # GGUF on the disk: GGUF_DIR=$PWD/.models, as llama_cpp.sh's model_paths says)
    q35make) bash benchmarks/llama_cpp.sh make ${HYB_PRESET:-qwen3.5-35b-a3b} "--mix Q4_K_M" ;;
    q35short|q35long|q35prefix|q35first)
             n=${HYB_PRESET:-qwen3.5-35b-a3b}-mixQ4_K_M; t=${HYB_TAG:-q35}
             p=${PACK_DIR:-${MODELS:-/dev/shm}}/$n.pack; mk=${GGUF_DIR:-${MODELS:-/dev/shm}}/$n.gguf.making
             [ -f $p ] || [ -f $mk ] || bash benchmarks/llama_cpp.sh make ${HYB_PRESET:-qwen3.5-35b-a3b} "--mix Q4_K_M"
             while [ -f $mk ]; do sleep 3; done
             case $step in
               q35short) timeout 150 python3 -m strata.cli bench $p -p 8192,32768 -r 2 --vram 12GiB -o csv 2>&1 | grep -v "it/s\]" > "$OUT/bench_${t}_short.csv" ;;
               q35long) timeout 230 python3 -m strata.cli bench $p -p 131072,262144 -r 1 --vram 12GiB --trace "$OUT/trace_${t}_long.json" -o csv 2>&1 | grep -v "it/s\]" > "$OUT/bench_${t}_long.csv" ;;
               q35prefix) for r in ${Q35_ROUTES:-triton flash}; do timeout 120 python3 -m strata.cli bench $p -p 131072 -r 1 --vram 12GiB --prefix-attention $r -o csv 2>&1 | grep -v "it/s\]" > "$OUT/bench_${t}_131k_$r.csv"; done ;;
               # the first prompt of a fresh process beside its warm ones (and the time to ready),
               # each run's files in a folder named for its prompts (a second run in one call
               # would write over the first's cold_warm-<GPU>.csv)
               q35first) fp=${Q35_FIRST:-8192,32768}; fo="$OUT/first_${t}_${fp//,/_}"; mkdir -p "$fo"
                         timeout 200 python3 experiments/cold_warm.py --preset ${HYB_PRESET:-qwen3.5-35b-a3b} --quant Q4_K_M --pack $p --keep --prompts $fp --arms warm --out "$fo" 2>&1 | grep -v "it/s\]" | tail -12 | tee "$fo/cold_warm_$t.log" ;;
             esac
             for f in "$OUT"/bench_${t}_*.csv; do bench_cols "$f" test,chunk,ring,planned_for,tokens_per_s,pcie_bound_tokens_per_s,compute_floor_tokens_per_s,of_bound,warmup_s; done | tail -6 ;;
    q35)     bash "$0" q35short q35long q35prefix ;;
    # one call for a hybrid too big for two: its GGUF and pack made in the foreground, then the
    # four lengths in one process, one rep each (Qwen3-Next: GGUF_DIR=$PWD/.models puts the 48 GB
    # GGUF on the disk beside the pack in /dev/shm and its pinned copy)
    hybbench) n=${HYB_PRESET:-qwen3.5-35b-a3b}; t=${HYB_TAG:-q35}
             bash benchmarks/llama_cpp.sh files $n "--mix Q4_K_M" 2>&1 | tail -1
             timeout ${HYB_T:-330} python3 -m strata.cli bench ${PACK_DIR:-${MODELS:-/dev/shm}}/$n-mixQ4_K_M.pack -p ${HYB_P:-8192,32768,131072,262144} -r 1 --vram 12GiB -o csv 2>&1 | grep -v "it/s\]" > "$OUT/bench_${t}_all.csv"
             bench_cols "$OUT/bench_${t}_all.csv" model,test,chunk,ring,planned_for,tokens_per_s,pcie_bound_tokens_per_s,compute_floor_tokens_per_s,of_bound,warmup_s | tail -5 ;;
    # issue 38 items 2 and 5: a Qwen3.5-35B-A3B read (its first 8 layers: 6 linear, 2 full) all
    # resident at 8K and 32K with the delta rule on strata's kernels against fla-core's (--delta)
    flaab)   for d in "" "--delta backend=fla"; do t=$(echo "x $d" | tr -cd 'a-z0-9'); timeout 200 python3 benchmarks/profile_read.py --what resident --preset qwen3.5-35b-a3b --quant Q4_K_M --layers 8 --T 8192 32768 --top 12 $d --out "$OUT" 2>&1 | grep -v "it/s\]" > "$OUT/profile_q35_$t.log"; echo "[$d]"; grep "^T=\|^-- " "$OUT/profile_q35_$t.log"; done ;;
    # ... and what fla-core's bf16 intermediates cost in quality: the same BF16 weights read under
    # each launch, KLD against strata's (and a Q4_K_M re-encoding beside it for scale), streamed
    flakld)  timeout 280 python3 experiments/quant_quality.py --preset qwen3.5-35b-a3b --layers 8 --arms Q4_K_M --delta-arms backend=fla --vram 24GiB --tokens 16384 --out "$OUT" 2>&1 | grep "^\[quantq\]\|wrote\|Error" | tail -8 ;;
    # MLA's flash backend (V zero-padded to the q/k width) against the memory-efficient kernel, and the merge in
    # one Triton launch: their GPU tests (kernels, blocked path, transient, the engine's logits under each), then
    # one DeepSeek-V3 layer's blocked attention at T 8192 / 32768 in one chunk: efficient, flash, flash at
    # 4096-token blocks, each merge
    mlaflash) timeout 110 python3 -m pytest -rfE -m gpu -p no:cacheprovider tests/models/test_mla_flash.py tests/kernels/test_merge.py 2>&1 | tail -12 > "$OUT/gpu_mla_flash_tests.log"; tail -5 "$OUT/gpu_mla_flash_tests.log"
             timeout 90 python3 benchmarks/mla_bench.py --tokens 8192,32768 --prefix 0 --arms blocked,blocked:flash,blocked:flash:4096,blocked:efficient:2048:fused,blocked:flash:2048:fused,blocked:flash:4096:fused --out "$OUT" 2>&1 | tail -60 | tee "$OUT/mla_flash_bench.log" ;;
    # MLA's triton backend (strata's block kernel: q/k 192 as 128 + 64, V at 128, the softmax state carried
    # through the launches, no merge): its GPU tests (against efficient, flash and the reference; the blocked
    # path; the engine's logits), one DeepSeek-V3 layer's blocked attention at 8K / 32K in one chunk against
    # flash (the default) at the heuristic's tile and others, then the 5-layer resident profile A/B
    mlatriton) timeout 150 python3 -m pytest -rfE -m gpu -p no:cacheprovider tests/kernels/test_mla_block.py tests/models/test_mla_flash.py 2>&1 | tail -12 > "$OUT/gpu_mla_triton_tests.log"; tail -5 "$OUT/gpu_mla_triton_tests.log"
               timeout 150 python3 benchmarks/mla_bench.py --tokens 8192,32768 --prefix 0 --arms blocked,blocked:triton,blocked:triton:4096:fused:128x64/w8s2,blocked:triton:4096:fused:128x32/w8s2,blocked:triton:4096:fused:64x64/w4s3,blocked:triton:2048 --out "$OUT" 2>&1 | tail -60 | tee "$OUT/mla_triton_bench.log"
               for m in "" "--mla-backend triton"; do t=$(echo "x $m" | tr -cd 'a-z0-9'); timeout 150 python3 benchmarks/profile_read.py --what resident --preset deepseek-v3 --quant Q4_K_M --layers 5 --T 8192 32768 --top 12 $m --out "$OUT" 2>&1 | grep -v "it/s\]" > "$OUT/profile_ds_$t.log"; echo "[$m]"; grep "^T=\|^-- " "$OUT/profile_ds_$t.log"; done ;;
    # MLA on cuDNN (strata.models.mla_launch): its GPU tests, the blocked attention at B 4096 and
    # 8192 beside triton (every block through cuDNN since the square tiling, ce32a82; 4096/8192:
    # query blocks of 4096, the keys before them in launches of 8192), and the 5-layer resident
    # read at --mla-key-block 8192 and --mla-block 8192 against the default
    # the carve's GPU tests: MLA's q / o / latent projections and its launches over groups of
    # heads, the attention outputs in attn (head_groups), the delta rule's parts into given
    # buffers, the bench / prefill peaks, the unsettled rate test
    carvetests) timeout 150 python3 -m pytest -rfE -m gpu -p no:cacheprovider -n 4 tests/models/test_mla.py tests/models/test_mla_blocks.py tests/models/test_mla_carve.py tests/models/test_mla_flash.py tests/models/test_mla_heads.py tests/models/test_mla_kv_resident.py tests/models/test_deepseek_yarn.py tests/kernels/test_mla_block.py tests/kernels/test_attention_groups.py tests/kernels/test_deltanet_outs.py tests/engine/test_carve_norms.py tests/test_bench_cmd.py tests/test_roofline.py 2>&1 | tail -15 > "$OUT/gpu_carve_tests.log"; tail -12 "$OUT/gpu_carve_tests.log" ;;
    # MLA's block: DeepSeek's 5 resident layers at T 32768 under B 4096 (the default) and 32768
    mlablock) for m in "" "--mla-block 32768"; do t=$(echo "x $m" | tr -cd 'a-z0-9'); timeout 150 python3 benchmarks/profile_read.py --what resident --preset deepseek-v3 --quant Q4_K_M --layers 5 --T 32768 --reps 2 --top 6 $m --out "$OUT/mlablock$t" > "$OUT/profile_ds_$t.log" 2>&1; echo "[$m]"; grep -v "it/s\]" "$OUT/profile_ds_$t.log" | grep "^T=\|^-- " ; done ;;
    # what a read holds against its budget (bench's peak_vram): PEAK_PACK at PEAK_VRAM, 8K and 32K
    peaks)   timeout 300 python3 -m strata.cli bench "$PEAK_PACK" --vram ${PEAK_VRAM:-24GiB} -p 8192,32768 -r 1 -o csv > "$OUT/peaks-$(basename "$PEAK_PACK" .pack).csv" 2> "$OUT/peaks.err"; bench_cols "$OUT/peaks-$(basename "$PEAK_PACK" .pack).csv" n_tokens,chunk,ring,tokens_per_s,of_bound,vram,peak_vram,cache_bytes; grep "past its" "$OUT/peaks.err" ;;
    # where a read's VRAM goes at its peak: PEAK_PACK at PEAK_VRAM, one 32K read under the allocator's history
    peakwhere) timeout 200 python3 benchmarks/peak_where.py --out "$OUT" --top 30 -- "$PEAK_PACK" --vram ${PEAK_VRAM:-24GiB} -p ${PEAK_T:-32768} -r 1 -o csv > "$OUT/peak_where.log" 2> "$OUT/peak_where.err"; grep -v "^[a-z_]*,\|^[a-z0-9]* L[0-9]" "$OUT/peak_where.log" | head -34; grep "past its" "$OUT/peak_where.err" ;;
    # the streamed passes on torch's grouped GEMM (pin_decoded_gemm) beside the plan's choice (the
    # Triton GEMM: the carve counts no grouped buffers): whether the plan should count them
    groupedab) for arm in plan grouped; do timeout 150 python3 -c 'import sys
from strata.cli import main
from strata.kernels.moe.grouped import pin_decoded_gemm
if sys.argv[1] == "plan":
    sys.exit(main(sys.argv[2:]))
with pin_decoded_gemm("grouped"):
    sys.exit(main(sys.argv[2:]))' $arm bench "$PEAK_PACK" --vram ${PEAK_VRAM:-24GiB} -p ${PEAK_T:-32768} -r 2 -o csv > "$OUT/groupedab-$arm.csv" 2> "$OUT/groupedab-$arm.err"; bench_cols "$OUT/groupedab-$arm.csv" n_tokens,ring,tokens_per_s,of_bound,peak_vram; done ;;
    # attention outputs bounded beside the carve (flash.OUT_BYTES: MLA's launches over groups of
    # heads, a first chunk's SDPA in groups into attn) beside one launch each (the bound lifted):
    # PEAK_PACK's PEAK_T read, tok/s and the live peak of each arm
    outab) for arm in bounded whole; do timeout 150 python3 -c 'import sys
from strata.cli import main
if sys.argv[1] == "whole":
    import dataclasses
    import strata.kernels.attention.flash as fl
    import strata.models.mla_launch as ml      # the default launch, not a pin: the block grows
    fl.OUT_BYTES = 1 << 50
    ml.DEFAULT = dataclasses.replace(ml.DEFAULT, out_bytes=1 << 50)
sys.exit(main(sys.argv[2:]))' $arm bench "$PEAK_PACK" --vram ${PEAK_VRAM:-24GiB} -p ${PEAK_T:-32768} -r 2 -o csv > "$OUT/outab-$arm.csv" 2> "$OUT/outab-$arm.err"; echo "[$arm]"; bench_cols "$OUT/outab-$arm.csv" n_tokens,ring,tokens_per_s,of_bound,peak_vram; grep "past its" "$OUT/outab-$arm.err"; done ;;
    mlacudnn) timeout 150 python3 -m pytest -rfE -m gpu -p no:cacheprovider -n 4 tests/kernels/test_mla_block.py tests/models/test_mla_flash.py tests/models/test_mla_blocks.py 2>&1 | tail -12 > "$OUT/gpu_mla_cudnn_tests.log"; tail -5 "$OUT/gpu_mla_cudnn_tests.log"
               timeout 90 python3 benchmarks/cudnn_mla_probe.py --out "$OUT" 2>&1 | tail -12
               timeout 150 python3 benchmarks/mla_bench.py --tokens 4096,8192,32768 --prefix 0,28672 --arms blocked:triton,blocked:cudnn,blocked:cudnn:4096/8192,blocked:cudnn:8192 --out "$OUT" > "$OUT/mla_cudnn_bench.log" 2>&1; grep "^P=" "$OUT/mla_cudnn_bench.log"
               for m in "" "--mla-key-block 8192" "--mla-block 8192"; do t=$(echo "x $m" | tr -cd 'a-z0-9'); timeout 150 python3 benchmarks/profile_read.py --what resident --preset deepseek-v3 --quant Q4_K_M --layers 5 --T 8192 32768 --reps 2 --top 8 $m --out "$OUT" 2>&1 | grep -v "it/s\]" > "$OUT/profile_ds_$t.log"; echo "[$m]"; grep "^T=\|^-- " "$OUT/profile_ds_$t.log"; done ;;
    deepseek) timeout 560 python3 experiments/deepseek_stream.py --out "$OUT" 2>&1 | grep -v "it/s\]" | tail -20 | tee "$OUT/deepseek_stream.log" ;;
    # issue 17: the pinning thread's rate beside a busy interpreter (GIL hand-offs), pread vs map copy
    pinbg)   timeout 200 python3 benchmarks/pin_bench.py --gib 8 --options thp-8 pread-8 pread-16 bg-thp-8 bg-pread-8 bgsi-thp-8 bgsi-pread-8 bgsi-pread-16 --out-dir "$OUT" 2>&1 | grep "^pin_bench" | tee "$OUT/pin_bg.log" ;;
    # issue 18 item 3: the plane-layout Q8_0 GEMM against its reference at the qwen3 shape (every
    # table tile, TMA, no swap; T 1 / 77 / 2048; Q4_0 and Q4_K at T 77 / 2048, their decode bit-exact), then timed beside grouped_mm-bf16 and strata's BF16 and
    # fused Q8_0 kernels at T 512/2048/8192 (CSV + PNG); PLANE_TILES="128x128x64/w8s4/tma ..." adds one
    # strata-plane[tile] arm each (the sweep in the same call)
    planetests) timeout 230 python3 -m pytest -rfE -m gpu -p no:cacheprovider tests/kernels/test_plane_ffn.py tests/engine/test_plane_engine.py 2>&1 | tail -20 > "$OUT/gpu_plane_tests.log"; tail -5 "$OUT/gpu_plane_tests.log" ;;
    plane)   timeout 230 python3 experiments/kernel_bench.py --shapes qwen3-30b-a3b --T 512 2048 8192 --formats BF16 Q8_0 --arms strata-dp strata-plane ${PLANE_TILES:+--tiles $PLANE_TILES} --out "$OUT" 2>&1 | grep -v "it/s\]" | tail -20 | tee "$OUT/plane_bench.log" ;;
    # the engine with --experts plane (blobs re-laid as they land) beside auto: streamed 8K, qwen3-30b-a3b Q8_0, 12 GiB
    planeengine) timeout 230 python3 experiments/prefill_ab.py --no-gate --models qwen3-30b-a3b-Q8_0 --prompts 8192 --arms auto,plane --out "$OUT" 2>&1 | grep -v "it/s\]" | tail -12 | tee "$OUT/plane_engine8k.log" ;;
    # the same for Q4_0 (its plane arm beside the fused Q4_0 kernel and grouped_mm-bf16)
    plane4)  timeout 230 python3 experiments/kernel_bench.py --shapes qwen3-30b-a3b --T 512 2048 8192 --formats Q4_0 --arms strata-dp strata-plane ${PLANE_TILES:+--tiles $PLANE_TILES} --out "$OUT" 2>&1 | grep -v "it/s\]" | tail -20 | tee "$OUT/plane4_bench.log" ;;
    # Q4_K (Q4_K_M's expert format): its plane arm beside the fused Q4_K kernel, decode-once + strata's BF16
    # kernel and grouped_mm-bf16; plane4ktests: the Q4_K slice of the plane GPU tests alone (planetests runs it too)
    plane4k) timeout 230 python3 experiments/kernel_bench.py --shapes qwen3-30b-a3b --T 512 2048 8192 --formats Q4_K --arms strata-dp strata-decoded strata-plane ${PLANE_TILES:+--tiles $PLANE_TILES} --out "$OUT" 2>&1 | grep -v "it/s\]" | tail -20 | tee "$OUT/plane4k_bench.log" ;;
    plane4ktests) timeout 200 python3 -m pytest -rfE -m gpu -p no:cacheprovider tests/kernels/test_plane_ffn.py -k Q4_K 2>&1 | tail -20 > "$OUT/gpu_plane4k_tests.log"; tail -5 "$OUT/gpu_plane4k_tests.log" ;;
    # issue 18: the GPU sync cases with their whole tracebacks (where a sync is, if one is)
    syncdiag) timeout 200 python3 -m pytest -rfE --tb=long -m gpu -p no:cacheprovider tests/engine/test_syncs.py > "$OUT/gpu_sync_diag.log" 2>&1; tail -5 "$OUT/gpu_sync_diag.log" ;;
    # issue 18: where the device time goes, by kernel: the expert FFN arms at T 512/2048/8192 (host
    # overhead vs kernel time), then a whole all-resident qwen3-30b-a3b Q8_0 read at 8K and 32K
    profileffn) timeout 200 python3 benchmarks/profile_read.py --what ffn --T ${PF_T:-512 2048 8192} --out "$OUT" 2>&1 | tail -300 > "$OUT/profile_ffn.log"; grep "^T=" "$OUT/profile_ffn.log" ;;
    profileres) timeout 280 python3 benchmarks/profile_read.py --what resident --T 8192 32768 --top 40 --out "$OUT" 2>&1 | grep -v "it/s\]" | tail -120 > "$OUT/profile_resident.log"; grep -A3 "^T=" "$OUT/profile_resident.log" ;;
    # issue 37 item 3: where the time goes in the models people offload, before changing kernels: a
    # one-chunk all-resident read of gpt-oss-120b MXFP4 (4 layers: 2 sliding, 2 full) and DeepSeek-V3
    # Q4_K_M (5 layers: 3 dense, 2 MoE) at 8K and 32K, by kernel category beside the floor's parts
    profilebig) for spec in "gpt-oss-120b MXFP4 4" "deepseek-v3 Q4_K_M 5"; do read -r pm pq pl <<< "$spec"
                timeout ${PB_T:-200} python3 benchmarks/profile_read.py --what resident --preset $pm --quant $pq --layers $pl --T 8192 32768 --top 30 --out "$OUT" 2>&1 | grep -v "it/s\]" | tail -90 > "$OUT/profile_$pm.log"; grep -A2 "^T=\|resident in" "$OUT/profile_$pm.log"; done ;;
    # issue 37 item 3, the A/B after the profile: gpt-oss-120b's experts by the fused kernel against auto
    # (decode-once now takes biased experts), DeepSeek-V3's MLA blocks by the efficient kernel against
    # flash on padded V, the one-pass merge and a 4096 block (strata.models.mla_launch)
    profileab) for f in kernel auto; do timeout 150 python3 benchmarks/profile_read.py --what resident --preset gpt-oss-120b --quant MXFP4 --layers 4 --T 8192 32768 --ffn $f --top 12 --out "$OUT" 2>&1 | grep -v "it/s\]" > "$OUT/profile_gpt-oss_$f.log"; grep "^T=\|^-- " "$OUT/profile_gpt-oss_$f.log"; done
               for m in "" "--mla-backend flash" "--mla-backend flash --mla-merge fused" "--mla-backend flash --mla-block 4096 --mla-merge fused"; do t=$(echo "x $m" | tr -cd 'a-z0-9'); timeout 150 python3 benchmarks/profile_read.py --what resident --preset deepseek-v3 --quant Q4_K_M --layers 5 --T 32768 --top 12 $m --out "$OUT" 2>&1 | grep -v "it/s\]" > "$OUT/profile_ds_$t.log"; echo "[$m]"; grep "^T=\|^-- " "$OUT/profile_ds_$t.log"; done
               ( cd "$OUT" && tar czf profileab.tgz profile_gpt-oss_*.log profile_ds_*.log profile_resident_*.csv && rm -f profile_gpt-oss_*.log profile_ds_*.log profile_resident_*.csv ) ;;   # a call brings back 8 files
    # issue 18 item 4: the fused RMSNorm / q-k norm + NEOX RoPE kernels against their torch twins at the
    # real shapes, and bf16 reads (model + engine) fused vs torch; normab: profileres's 32K read with the
    # norms pinned to torch (the fused arm is profileres itself): profile_resident_norm_torch.{csv,log}
    normtests) timeout 230 python3 -m pytest -rfE -m gpu -p no:cacheprovider tests/kernels/test_norm.py tests/models/test_norm_wiring.py 2>&1 | tail -20 > "$OUT/gpu_norm_tests.log"; tail -5 "$OUT/gpu_norm_tests.log" ;;
    normab)  timeout 230 python3 benchmarks/profile_read.py --what resident --T 32768 --top 40 --norm torch --out "$OUT" 2>&1 | grep -v "it/s\]" | tail -60 > "$OUT/profile_resident_norm_torch.log"; grep -A3 "^T=" "$OUT/profile_resident_norm_torch.log" ;;
    # issue 18 item 4 on the seed-512e shape (12 layers): streamed (the grown ring at 32K) beside all-resident
    seed512e) timeout 230 python3 experiments/prefill_ab.py --no-gate --models seed-512e-Q8_0 --prompts 8192,32768 --arms auto,resident --out "$OUT" 2>&1 | grep -v "it/s\]" | grep -v "layer/s" | tail -12 | tee "$OUT/seed512e.log" ;;
    # issue 18: the decoded FFN's GEMMs through torch._grouped_mm (strata.kernels.moe.grouped): its GPU test (grouped ==
    # triton == reference at qwen3's shape, T 2048; check=False under the sync check; auto's pick) and the decoded
    # tests; groupedbench: decode-once + strata's BF16 GEMM vs + grouped_mm, Q8_0, T 2048/8192/32768 (CSV + PNG);
    # groupedres: profileres's 32K read with the decoded GEMM pinned to triton (profileres itself runs auto: grouped)
    groupedtests) timeout 200 python3 -m pytest -rfE -m gpu -p no:cacheprovider tests/kernels/test_moe_grouped.py tests/kernels/test_moe_decoded.py 2>&1 | tail -20 > "$OUT/gpu_grouped_tests.log"; tail -5 "$OUT/gpu_grouped_tests.log" ;;
    groupedbench) timeout 230 python3 experiments/kernel_bench.py --shapes qwen3-30b-a3b --T 2048 8192 32768 --formats Q8_0 --arms strata-decoded strata-decoded-grouped --out "$OUT" 2>&1 | grep -v "it/s\]" | tail -20 | tee "$OUT/grouped_bench.log" ;;
    groupedres) timeout 230 python3 benchmarks/profile_read.py --what resident --T 32768 --top 40 --decoded-gemm triton --out "$OUT" 2>&1 | grep -v "it/s\]" | tail -60 > "$OUT/profile_resident_gemm_triton.log"; grep -A3 "^T=" "$OUT/profile_resident_gemm_triton.log" ;;
    # issue 18 item 4: the fused softmax -> top-k router (strata.kernels.moe.router) on the GPU: its tests at the
    # real widths, then timed against the torch ops it replaces (fp32 GEMM, softmax, topk) at several tiles
    routertests) timeout 200 python3 -m pytest -rfE -m gpu -p no:cacheprovider tests/kernels/test_router.py 2>&1 | tail -12 > "$OUT/gpu_router_tests.log"; tail -3 "$OUT/gpu_router_tests.log" ;;
    routerbench) timeout 200 python3 benchmarks/router_bench.py --tiles ${ROUTER_TILES:-64x64/w8s3 32x64/w4s3} --out "$OUT" 2>&1 | grep -v "it/s\]" | tail -24 | tee "$OUT/router_bench.log" ;;
    # issue 18 item 4: the first chunk's SDPA as the engine calls it (v strided, o reshaped) against the floor's call
    sdpalayout) timeout 150 python3 benchmarks/sdpa_layout_bench.py --out "$OUT" 2>&1 | grep -v "it/s\]" | tail -14 | tee "$OUT/sdpa_layout.log" ;;
    # issue 18 item 4: the floor's rates as it measured them (a burst) against settled ones, and SDPA call by call
    floorrates) timeout 200 python3 benchmarks/floor_rates_bench.py --out "$OUT" 2>&1 | grep -v "it/s\]" | tail -16 | tee "$OUT/floor_rates.log" ;;
    # issue 18 item 3: the host's share of one expert FFN call (cProfile by function), T 512 / 2048
    hostprof) timeout 200 python3 benchmarks/host_profile.py --T ${PF_T:-512 2048} > "$OUT/host_profile.log" 2>&1; grep "^==" "$OUT/host_profile.log" ;;
    # issue 18 item 3: the grouping kernels (strata.kernels.moe._group_kernel) on the GPU at the real shapes, and the FFNs over them
    grouptests) timeout 230 python3 -m pytest -rfE -m gpu -p no:cacheprovider tests/kernels/test_group_kernel.py tests/kernels/test_moe_passes.py 2>&1 | tail -12 > "$OUT/gpu_group_tests.log"; tail -3 "$OUT/gpu_group_tests.log" ;;
    # issue 18 item 3: the expert FFN arms as the engine calls them (check=False) at T 512 / 2048, BF16, Q8_0, Q4_K
    itemthree) timeout 280 python3 experiments/kernel_bench.py --shapes qwen3-30b-a3b --T ${KB_T:-512 2048} --formats ${KB_FMT:-BF16 Q8_0 Q4_K} --arms strata-dp strata-plane strata-decoded strata-decoded-grouped --out "$OUT" 2>&1 | grep -v "it/s\]" | tail -20 | tee "$OUT/item3_bench.log" ;;
    # issue 18 item 3: the plane GEMM alone beside strata's BF16 kernel and grouped_mm-bf16 (KB_T, KB_FMT),
    # PLANE_TILES adding one strata-plane[tile] arm each
    planeab) timeout 280 python3 experiments/kernel_bench.py --shapes qwen3-30b-a3b --T ${KB_T:-512 2048} --formats ${KB_FMT:-BF16 Q8_0 Q4_0 Q4_K} --arms strata-dp strata-plane ${PLANE_TILES:+--tiles $PLANE_TILES} --out "$OUT" 2>&1 | grep -v "it/s\]" | tail -20 | tee "$OUT/plane_ab.log" ;;
    # issue 18: the hardware counters of the T = 512 expert GEMMs (BF16 fused, the plane GEMM's table
    # tile and NCU_TILES): memory throughput, issue slots, where warps stall (Firecracker: ncu reads them)
    ncuplane) timeout 280 ncu --clock-control none --kernel-name regex:"_plane_gemm|_moe_gemm" --section SpeedOfLight --section MemoryWorkloadAnalysis --section WarpStateStats --section SchedulerStats --section Occupancy --section LaunchStats python3 benchmarks/ncu_plane.py --T ${KB_T:-512} --formats ${KB_FMT:-BF16 Q8_0 Q4_K} --calls 1 ${NCU_TILES:+--tiles $NCU_TILES} > "$OUT/ncu_plane.txt" 2>&1; grep -E "^T|_gemm|Duration|Memory Throughput|DRAM Throughput|Compute \(SM\)|Issue Slots Busy|Warp Cycles Per Issued|Achieved Occupancy|Registers Per|No Eligible|Stall" "$OUT/ncu_plane.txt" | head -150 ;;
    # issue 18: the Q8_0/Q4_0 decode-once word path's program tile (TileConfig.word_tile), qwen3's gate
    wordtiles) timeout 200 python3 benchmarks/dequant_bench.py --mode experts --formats Q8_0,Q4_0 --paths words --word-tiles 64x64,32x128,32x256,64x128,64x256,16x512,128x64,16x1024,8x2048,32x512 --out-dir "$OUT" 2>&1 | grep -v "it/s\]" | tail -24 | tee "$OUT/word_tiles.log" ;;
  esac
done
