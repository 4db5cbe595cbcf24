#!/usr/bin/env bash
# Loads libnccl-net-dmx.so into the NCCL that PyTorch ships and checks NCCL's own log: one rank on
# cuda:0, a torch.distributed NCCL process group (env:// rendezvous), one all_reduce. Passes when
# NCCL says it loaded net plugin dmx, uses it, and the plugin listed its devices. For the GPU
# machine (docs/nccl-plugin.md); needs python3 with torch and a GPU.
#   scripts/nccl-plugin-check.sh [BUILD_DIR]     (default: build; the plugin is built if missing)
# The whole NCCL log goes to $OUT/nccl-plugin-check.log when OUT is set, else BUILD_DIR.
set -euo pipefail
cd "$(dirname "$0")/.."
build="${1:-build}"
plugin="$build/lib/libnccl-net-dmx.so"
if [ ! -f "$plugin" ]; then
  [ -f "$build/CMakeCache.txt" ] || cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo
  cmake --build "$build" --target dmx_nccl_plugin
fi
python3 -c 'import torch' 2>/dev/null || { echo "nccl-plugin-check: python3 cannot import torch" >&2; exit 2; }
log="${OUT:-$build}/nccl-plugin-check.log"
mkdir -p "$(dirname "$log")"

# The NCCL inside the torch wheel (nvidia-nccl-cu*), for the record; torch loads it by itself.
nccl_dir=$(python3 -c 'import nvidia.nccl, os; print(os.path.join(list(nvidia.nccl.__path__)[0], "lib"))' 2>/dev/null || true)
echo "nccl-plugin-check: plugin $plugin; torch's NCCL in ${nccl_dir:-(not a separate wheel)}"

status=0
env LD_LIBRARY_PATH="$PWD/$build/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" \
  NCCL_NET_PLUGIN=dmx NCCL_NET=dmx NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=INIT,NET \
  MASTER_ADDR=127.0.0.1 MASTER_PORT="${MASTER_PORT:-29533}" RANK=0 WORLD_SIZE=1 \
  python3 - > "$log" 2>&1 <<'EOF' || status=$?
import torch
import torch.distributed as dist

dev = torch.device("cuda:0")
torch.cuda.set_device(dev)
dist.init_process_group("nccl", init_method="env://", device_id=dev)
x = torch.arange(1 << 20, dtype=torch.float32, device=dev)
dist.all_reduce(x)
torch.cuda.synchronize()
assert torch.equal(x, torch.arange(1 << 20, dtype=torch.float32, device=dev)), "all_reduce changed the data"
print("torch", torch.__version__, "NCCL", ".".join(map(str, torch.cuda.nccl.version())))
for line in open("/proc/self/maps"):
    if "libnccl" in line:
        print("mapped:", line.split()[-1])
dist.destroy_process_group()
print("all_reduce done")
EOF

fail=0
check() {  # check WHAT PATTERN
  if grep -q -- "$2" "$log"; then echo "  ok: $1"; else echo "  MISSING: $1 (no '$2' in the log)"; fail=1; fi
}
echo "nccl-plugin-check: python exit $status; NCCL's log: $log"
check "NCCL loaded the plugin" "NET/Plugin: Loaded net plugin dmx"
check "NCCL uses it" "Using network dmx"
check "the plugin listed its devices" "NET/dmx: device 0:"
check "the all_reduce ran" "all_reduce done"
grep -E "Loaded net plugin|Using network|NET/dmx|NCCL version|^torch |^mapped:" "$log" | sort -u | head -40
[ "$status" -eq 0 ] && [ "$fail" -eq 0 ] && { echo "nccl-plugin-check: PASS"; exit 0; }
echo "nccl-plugin-check: FAIL"
exit 1
