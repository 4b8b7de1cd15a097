# Other people's guest toolchains, pinned, installed once under the tools cache ($TOOLS,
# default ~/.cache/tern-tools) so a fresh clone reuses them. Sourced by scripts/test (the e2e
# suite builds guests with them: server/tests/e2e/support/guests.rs) and loadtest/bench.sh (the
# JavaScript and Python components of `bench.sh kinds`). Needs node/npm and python3.

TOOLS="${TERN_TOOLS:-$HOME/.cache/tern-tools}"
COMPONENTIZE_JS_VERSION=0.23.0
COMPONENTIZE_PY_VERSION=0.25.1
# Where each lives once installed.
CJS="$TOOLS/componentize-js-$COMPONENTIZE_JS_VERSION"
CPY="$TOOLS/componentize-py-$COMPONENTIZE_PY_VERSION"

# componentize-js (npm) into $CJS/node_modules, unless it is there.
install_componentize_js() {
    [ -x "$CJS/node_modules/.bin/componentize-js" ] && return
    mkdir -p "$CJS"
    (cd "$CJS" && npm install --no-audit --no-fund --silent \
        "@bytecodealliance/componentize-js@$COMPONENTIZE_JS_VERSION")
}

# componentize-py (PyPI) into $CPY, unless it is there.
install_componentize_py() {
    [ -x "$CPY/bin/componentize-py" ] && return
    python3 -m pip install --quiet --target "$CPY" "componentize-py==$COMPONENTIZE_PY_VERSION"
}
