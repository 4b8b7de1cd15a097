#!/bin/sh
# Builds {{name}}.wasm with Zig (https://ziglang.org).
set -e
cd "$(dirname "$0")"
zig build-exe main.zig -target wasm32-wasi -O ReleaseSmall --stack 65536 -femit-bin={{name}}.wasm
echo "built {{name}}.wasm"
