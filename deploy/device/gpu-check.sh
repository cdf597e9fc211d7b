#!/bin/bash
# One prepared run on a lent NVIDIA machine that has no Rust toolchain and no network
# (../shared/device/README.md): `cargo xtask bench gpu`, the llama2.c golden tests on the NVIDIA
# adapter, and one SmolLM2-shaped evaluation timed on wgpu. Everything it prints goes to
# $OUT/log.txt too (or ./gpu-check.log without $OUT), and the figures to one JSON file,
# $OUT/gpu-check.json (or ./gpu-check.json): every `bench gpu` case as qdrift's own timing line
# (seconds per decode step, first token, the warm-up run of a first and of a second process,
# kernel launches per step and per layer, bytes read back per step), the same request through the
# composed attention and through Burn's fused attention op (`QDRIFT_ATTENTION`), and each step's
# exit status and seconds.
#
# Prepare here, from the checkout root (.gl/ and .dev/ are listed in .git/info/exclude):
#   .gl/   the Vulkan/EGL loader packages (../shared/device/README.md, step 1)
#   .dev/  xtask, qdrift.gz and golden.gz (stripped and gzipped release builds of qdrift, with
#          `--features qdrift-cli/autotune-cache` so that the second process's warm-up shows what
#          a kept autotune cache saves, and of the `golden` test binary,
#          target/release/deps/golden-*), and shared/models/stories260K
#          (a copy of ../shared/models/stories260K, 1 MB)
# then run `bash deploy/device/gpu-check.sh` there, carrying .gl and .dev (about 32 MB).
# It needs at most 8 minutes; each step has its own time limit so that a hang costs only that step.
set -u
for f in .gl/*.deb; do dpkg -x "$f" /; done
ldconfig
export VK_DRIVER_FILES=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json
export __EGL_VENDOR_LIBRARY_FILENAMES=/usr/local/nvidia/share/glvnd/egl_vendor.d/10_nvidia.json
export PATH=$PATH:/usr/local/nvidia/bin
gunzip -f .dev/qdrift.gz .dev/golden.gz
chmod +x .dev/qdrift .dev/golden .dev/xtask
log=${OUT:+$OUT/log.txt}
log=${log:-./gpu-check.log}
json=${OUT:+$OUT/gpu-check.json}
json=${json:-./gpu-check.json}
steps=$(mktemp)
now() { date +%s; }
# step NAME SECONDS-START: records the exit status of the command just run.
step() { echo "\"$1\": {\"rc\": $2, \"s\": $(($(now) - $3))}" >> "$steps"; echo "$1: rc $2 in $(($(now) - $3)) s"; }
{
    date -u
    nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv
    echo "cpus $(nproc)"
    echo "== bench gpu =="
    t=$(now)
    QDRIFT_BIN=.dev/qdrift timeout 300 .dev/xtask bench gpu
    step bench_gpu $? "$t"
    # bench gpu ran with the hardware GPU's default, Burn's fused attention op; the same request
    # through qdrift's composed attention, and again through the op, side by side.
    prompts=()
    for i in $(seq 16); do prompts+=(--prompt "Once upon a time, story $i"); done
    for attention in composed fused; do
        echo "== attention $attention: synthetic:smollm2-135m, f16, 16 prompts x 32 tokens, batch 16 =="
        t=$(now)
        QDRIFT_ATTENTION=$attention timeout 25 .dev/qdrift generate --model synthetic:smollm2-135m \
            --backend wgpu --dtype f16 --batch-size 16 "${prompts[@]}" --max-new-tokens 32 \
            --timing-json 2>&1 >/dev/null | sed -n "s/^{/bench gpu json: {\"attention\": \"$attention\", /p"
        step "attention_$attention" "${PIPESTATUS[0]}" "$t"
    done
    echo "== golden tests on wgpu (stories260K against llama2.c) =="
    t=$(now)
    QDRIFT_SHARED=.dev/shared timeout 45 .dev/golden wgpu
    step golden_wgpu $? "$t"
    echo "== eval synthetic:smollm2-135m, wgpu, f16, 16 prompts x 10/100/1000, 3 schemes =="
    t=$(now)
    timeout 90 .dev/qdrift eval --model synthetic:smollm2-135m --backend wgpu --dtype f16 --prompts 16 \
        --horizons 10,100,1000 --schemes int8,fp8-e4m3,int4-g128 --phase-times --out /tmp/gpu-check-eval 2>&1 | tail -25
    step eval "${PIPESTATUS[0]}" "$t"
    nvidia-smi --query-gpu=name,memory.used --format=csv
} 2>&1 | tee "$log"
{
    echo '{"gpu": "'"$(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | head -1)"'",'
    echo '"bench_gpu": ['
    sed -n 's/^bench gpu json: //p' "$log" | paste -sd, -
    echo '],'
    paste -sd, "$steps"
    echo '}'
} > "$json"
