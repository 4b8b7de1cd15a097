//! ABI.md and tern.h describe exactly the ABI that `tern_sdk::abi` defines and the server links,
//! and a C guest built from the header runs.

use http::StatusCode;
use tern_sdk::abi;

use crate::support::TestServer;

fn repo_file(path: &str) -> String {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    std::fs::read_to_string(root.join(path)).unwrap_or_else(|e| panic!("{path}: {e}"))
}

#[test]
fn abi_doc_and_c_header_match_the_definition_and_the_linker() {
    let doc = repo_file("guest-sdk/ABI.md");
    let header = repo_file("guest-sdk/include/tern.h");
    let engine = tern::engine::build(&tern::config::PoolConfig {
        instances: 1,
        ..Default::default()
    })
    .unwrap();
    // The linkers the server pre-links tenants against (the kinds' own functions and the
    // capabilities' host APIs, composed in `guest::link`).
    let linkers = tern::guest::Linkers::new(&engine, false).unwrap();
    let linker = linkers.module(false, false);
    let mut imports = String::new();
    for name in abi::func::ALL {
        // The doc states each signature.
        let line = doc
            .lines()
            .find(|l| l.starts_with(&format!("- `{name}(")))
            .unwrap_or_else(|| panic!("ABI.md does not document `{name}`"));
        let doc_params = line[..line.find(')').unwrap()].matches(": i32").count();
        // The table the server checks imports against says the same.
        let table = abi::func::SIGNATURES
            .iter()
            .find(|(n, _)| *n == name)
            .map(|(_, params)| *params);
        assert_eq!(
            table,
            Some(doc_params),
            "abi::func::SIGNATURES and ABI.md: {name}"
        );
        assert!(line.contains(") -> i32`"), "{name} returns one i32");
        imports.push_str(&format!(
            "(import \"{}\" \"{name}\" (func{} (result i32)))\n",
            abi::IMPORT_MODULE,
            " (param i32)".repeat(doc_params)
        ));
        // The C header declares the same number of parameters.
        assert!(
            header.contains(&format!("TERN_IMPORT(\"{name}\")")),
            "tern.h lacks {name}"
        );
        let c_params = header
            .split(&format!("TERN_IMPORT(\"{name}\")"))
            .nth(1)
            .and_then(|rest| rest.split(';').next())
            .map(|decl| decl[decl.find('(').unwrap()..].matches(',').count() + 1)
            .unwrap();
        assert_eq!(c_params, doc_params, "{name}: tern.h and ABI.md disagree");
    }
    // A module importing every function with the documented signature links against the server:
    // instantiate_pre type-checks each import.
    let wat =
        format!("(module {imports} (memory (export \"memory\") 1) (func (export \"_start\")))");
    let module = wasmtime::Module::new(&engine, wat::parse_str(&wat).unwrap()).unwrap();
    linker
        .instantiate_pre(&module)
        .expect("documented signatures match the server's");
    for (name, code) in abi::errno::ALL {
        assert!(
            doc.contains(&format!("| `{name}` | {code} |")),
            "ABI.md: {name} = {code}"
        );
        assert!(
            header.contains(&format!("#define TERN_E{name} ({code})")),
            "tern.h: {name} = {code}"
        );
    }
    for (name, key) in abi::info::ALL {
        assert!(
            doc.contains(&format!("| `{name}` | {key} |")),
            "ABI.md: info key {name} = {key}"
        );
        assert!(
            header.contains(&format!("#define TERN_INFO_{name} {key} ")),
            "tern.h: TERN_INFO_{name} = {key}"
        );
    }
    assert!(doc.contains(&format!("`{}`", abi::HANDLER_EXPORT)));
    assert!(doc.contains(&abi::STREAM_THRESHOLD.to_string()));
    assert!(header.contains(&format!(
        "#define TERN_STREAM_THRESHOLD {}",
        abi::STREAM_THRESHOLD
    )));
    assert!(header.contains(&format!("#define TERN_ABI_VERSION {}", abi::VERSION)));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn c_hello_built_with_clang_and_wasi_libc_runs() {
    let dir = tempfile::tempdir().unwrap();
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let out = dir.path().join("hello-c.wasm");
    let status = std::process::Command::new("clang")
        .args(["--target=wasm32-wasi", "-O2", "-I"])
        .arg(root.join("guest-sdk/include"))
        .arg("-o")
        .arg(&out)
        .arg(root.join("guest-sdk/examples/c/hello.c"))
        .status()
        .expect("clang is required for the C guest (scripts/test installs clang lld wasi-libc)");
    assert!(status.success(), "clang failed to build the C guest");
    let config = "[[tenant]]\nname = \"c\"\nmodule = \"hello-c.wasm\"\n";
    let s = TestServer::try_start_in(dir, config).await.expect("start");
    let r = s.get("/").await;
    assert_eq!(r.status, StatusCode::OK);
    assert_eq!(r.text(), "Hello from C on Tern!\n");
    assert_eq!(r.header("content-type"), "text/plain");
}
