#!/bin/sh
# Builds {{name}}.wasm. Debian: apt-get install clang lld wasi-libc libclang-rt-14-dev-wasm32
set -e
cd "$(dirname "$0")"
clang --target=wasm32-wasi -O2 -Wl,-z,stack-size=65536 -o {{name}}.wasm main.c
echo "built {{name}}.wasm"
