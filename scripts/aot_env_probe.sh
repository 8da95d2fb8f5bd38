#!/usr/bin/env bash
# Why do AOTInductor CUDA packages crash while loading on this machine (issue 15)? The crash is in
# std::regex's locale lookup inside the package's wrapper.so (benchmarks/2026-11-23-h100-aot-debug.md):
# which C++ runtime does the wrapper carry and which does the process load? Builds a toy package
# (no load) and inspects its .so; prints torch's C++ build flags for AOTInductor.
set -uo pipefail
cd "$(dirname "$0")/.."
source scripts/device_env.sh
echo "== compilers"; for c in g++ c++ gcc clang++; do command -v $c >/dev/null && echo "$c: $($c --version | head -1)"; done
echo "== libstdc++ / libgcc in a process that imported torch"
$PY -c "import torch; print(open('/proc/self/maps').read())" | awk '{print $6}' | grep -E "stdc\+\+|libgcc|libc\+\+" | sort -u
ldconfig -p | grep -E "libstdc\+\+" | head
echo "== torch's cpp_builder lines about static linking / libstdc++"
$PY - <<'PY'
import inspect, torch._inductor.cpp_builder as cb
for i, l in enumerate(inspect.getsource(cb).splitlines(), 1):
    if any(k in l for k in ("static-lib", "stdc++", "-static", "Bsymbolic", "visibility")):
        print(i, l.strip()[:160])
PY
echo "== toy package (build only)"
$PY - <<'PY'
import logging, os, torch
logging.getLogger("torch._inductor.cpp_builder").setLevel(logging.DEBUG)
class Toy(torch.nn.Module):
    def __init__(self):
        super().__init__(); self.lin = torch.nn.Linear(64, 32)
    def forward(self, x): return torch.relu(self.lin(x))
m = Toy().cuda().eval(); x = torch.randn(4, 64, device="cuda")
with torch.no_grad():
    ep = torch.export.export(m, (x,), strict=False)
    torch._inductor.aoti_compile_and_package(ep, package_path="/tmp/toy.pt2")
print("built /tmp/toy.pt2", os.path.getsize("/tmp/toy.pt2"))
PY
rm -rf /tmp/toy && mkdir -p /tmp/toy && cd /tmp/toy && $PY -m zipfile -e /tmp/toy.pt2 . && cd - >/dev/null
so=$(find /tmp/toy -name "*.so" | head -1); echo "so: $so"
echo "== NEEDED"; readelf -d "$so" | grep -E "NEEDED|RPATH|RUNPATH|FLAGS"
echo "== ldd"; ldd "$so" | head -20
echo "== defined dynamic symbols from the C++ runtime (a static libstdc++ defines these)"
nm -D --defined-only "$so" | c++filt | grep -cE "std::locale|codecvt|__cxa_|std::ios_base" 
nm -D --defined-only "$so" | c++filt | grep -E "locale::id|codecvt<char16_t" | head -5
echo "== compilers that built it"; strings -a "$so" | grep -E "^GCC: \(" | sort | uniq -c
echo "== wrapper compile flags (from the package's .cpp or a json of flags)"
find /tmp/toy -name "*.json" | head -5 | while read f; do echo "-- $f"; head -c 1500 "$f"; echo; done
