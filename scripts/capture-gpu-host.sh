#!/usr/bin/env bash
# Capture every probe `invoke doctor` runs on this host, raw bytes and exit codes, into one tarball:
#   bash scripts/capture-gpu-host.sh OUT.tar.gz
# Twice: idle, and while a process holds VRAM (python + torch, if importable), so the squatter row can be
# checked against a real --query-compute-apps. Attach the tarball to a bug report about a misread rig.
set -uo pipefail
out=${1:?usage: capture-gpu-host.sh OUT.tar.gz}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
gpu_fields=index,uuid,name,memory.total,memory.used,driver_version,pci.bus_id
app_fields=pid,process_name,gpu_uuid,used_memory

probe() {  # probe DIR NAME ARGV... -> DIR/cmd/NAME.txt (stdout+stderr as printed) and DIR/codes
  local dir=$1 name=$2; shift 2
  mkdir -p "$dir/cmd"
  "$@" >"$dir/cmd/$name.txt" 2>"$dir/cmd/$name.stderr" </dev/null
  echo "$name: $?" >>"$dir/codes"
}

capture() {  # capture DIR
  local d=$1
  probe "$d" gpu_list nvidia-smi -L
  probe "$d" gpus nvidia-smi "--query-gpu=$gpu_fields" --format=csv,noheader,nounits
  probe "$d" apps nvidia-smi "--query-compute-apps=$app_fields" --format=csv,noheader,nounits
  probe "$d" topo nvidia-smi topo -m
  probe "$d" p2p nvidia-smi topo -p2p r
  probe "$d" memlock sh -c 'ulimit -H -l; (ulimit -l unlimited && echo raise-ok) 2>&1 || echo raise-failed'
  probe "$d" podman_version podman --version
  probe "$d" containers podman ps --all --no-trunc --format json
  probe "$d" query nvidia-smi -q
  probe "$d" smi nvidia-smi
  probe "$d" nvlink nvidia-smi nvlink --status
  mkdir -p "$d/files/proc/driver/nvidia"
  cp /proc/driver/nvidia/version "$d/files/proc/driver/nvidia/version" 2>/dev/null
  cp /proc/meminfo "$d/files/proc/meminfo"
  ls -l /dev/nvidia* >"$d/dev-nodes.txt" 2>&1
  ls -la /etc/cdi /var/run/cdi >"$d/cdi-dirs.txt" 2>&1
}

capture "$work/idle"
holder=
if python3 -c 'import torch; assert torch.cuda.is_available()' 2>/dev/null; then
  # 2 GiB on every GPU, held until killed
  python3 -c '
import time, torch
xs = [torch.empty(2 << 30, dtype=torch.uint8, device=f"cuda:{i}") for i in range(torch.cuda.device_count())]
print("holding", flush=True)
time.sleep(600)
' >"$work/holder.log" 2>&1 &
  holder=$!
  for _ in $(seq 120); do grep -q holding "$work/holder.log" 2>/dev/null && break; sleep 0.5; done
  echo "holder pid: $holder" >>"$work/holder.log"
  capture "$work/busy"
  kill "$holder" 2>/dev/null; wait "$holder" 2>/dev/null
fi
uname -a >"$work/uname.txt"
tar -C "$work" -czf "$out" .
echo "wrote $out"
