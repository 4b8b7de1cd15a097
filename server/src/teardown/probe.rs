//! A component's main memory, reachable before its teardown.
//!
//! wasmtime 48 gives an embedder no handle to the core memories inside a component (upstream
//! request: wasmtime issue #13976), so the sweep before teardown ([`crate::teardown`]) could
//! not reach a component's memory, and a guest that dirties pages in more regions than
//! wasmtime's reset takes (JavaScript, Python) faulted part of its heap in again on every
//! request.
//!
//! So before compiling a component, the server appends a probe to it ([`add`]):
//! - an import [`IMPORT`], a function taking a `list<u8>`, lowered with the component's main
//!   memory (the core memory its canonical functions name most often);
//! - a core module of one function that passes that whole memory (offset 0, `memory.size`
//!   pages) to the lowered import, instantiated with the memory and the import;
//! - an export [`EXPORT`], that function lifted.
//!
//! Before a teardown that sweeps, the server calls [`EXPORT`]; the host function behind
//! [`IMPORT`] receives the list lifted without a copy (`WasmList`), which is the memory's
//! address and length. The probe runs none of the guest's code and writes nothing. Components
//! the probe cannot be added to (no core memory at their top level, a 64-bit or shared memory,
//! custom page sizes, the names already taken) are compiled as they are: only slower.

use std::collections::HashMap;

use wasm_encoder::{
    Alias, CanonicalFunctionSection, CanonicalOption, CodeSection, ComponentAliasSection,
    ComponentExportKind, ComponentExportSection, ComponentImportSection, ComponentSection,
    ComponentTypeRef, ComponentTypeSection, ComponentValType, EntityType, ExportKind,
    ExportSection, Function, FunctionSection, ImportSection, InstanceSection, Instruction,
    MemoryType, Module, ModuleArg, ModuleSection, PrimitiveValType, TypeSection, ValType,
};
use wasmparser::{Parser, Payload, ValidPayload, Validator, WasmFeatures};

/// The probe's import: `func(memory: list<u8>)`.
pub const IMPORT: &str = "tern-memory-probe";

/// The probe's export: `func()`, which calls [`IMPORT`] with the whole main memory.
pub const EXPORT: &str = "tern-memory-probe-run";

/// `component` with the probe appended, or why it cannot have one.
///
/// # Errors
/// Why the probe was not added, in words for a debug log.
pub fn add(component: &[u8]) -> Result<Vec<u8>, String> {
    let mut validator = Validator::new_with_features(WasmFeatures::all());
    // Core memory index at the top level -> how many canonical functions name it.
    let mut named: HashMap<u32, usize> = HashMap::new();
    let mut depth = 0usize;
    let mut top = None;
    for payload in Parser::new(0).parse_all(component) {
        let payload = payload.map_err(|e| e.to_string())?;
        match &payload {
            Payload::Version { .. } => depth += 1,
            Payload::ComponentImportSection(s) if depth == 1 => {
                for import in s.clone() {
                    if import.map_err(|e| e.to_string())?.name.name == IMPORT {
                        return Err(format!("it already imports {IMPORT}"));
                    }
                }
            }
            Payload::ComponentExportSection(s) if depth == 1 => {
                for export in s.clone() {
                    if export.map_err(|e| e.to_string())?.name.name == EXPORT {
                        return Err(format!("it already exports {EXPORT}"));
                    }
                }
            }
            Payload::ComponentCanonicalSection(s) if depth == 1 => {
                for f in s.clone() {
                    for memory in memories_named(&f.map_err(|e| e.to_string())?) {
                        *named.entry(memory).or_default() += 1;
                    }
                }
            }
            _ => {}
        }
        // Function bodies are not validated here: the compiler does that.
        if let ValidPayload::End(types) = validator.payload(&payload).map_err(|e| e.to_string())?
            && depth == 1
        {
            top = Some(types);
        }
        if let Payload::End(_) = payload {
            depth -= 1;
        }
    }
    let types = top.ok_or("not a whole component")?;
    let t = types.as_ref();
    if t.memory_count() == 0 {
        return Err("no core memory at its top level".into());
    }
    // The memory most canonical functions use (the first one if none names any).
    let memory = named
        .iter()
        .max_by_key(|&(index, uses)| (*uses, std::cmp::Reverse(*index)))
        .map_or(0, |(index, _)| *index);
    let ty = t.memory_at(memory);
    if ty.memory64 || ty.shared || ty.page_size_log2.is_some() {
        return Err("its main memory is 64-bit, shared or has custom pages".into());
    }

    // The indices the appended items get: each follows what the component defines already.
    let list_type = t.component_type_count();
    let (import_type, export_type) = (list_type + 1, list_type + 2);
    let import_func = t.component_function_count();
    let lowered = t.function_count();
    let module = t.module_count();
    let args = t.core_instance_count();
    let instance = args + 1;
    let run = lowered + 1;
    let lifted = import_func + 1;

    let mut out = component.to_vec();
    let mut types = ComponentTypeSection::new();
    types
        .defined_type()
        .list(ComponentValType::Primitive(PrimitiveValType::U8));
    types
        .function()
        .params([("memory", ComponentValType::Type(list_type))])
        .result(None);
    types
        .function()
        .params(std::iter::empty::<(&str, ComponentValType)>())
        .result(None);
    types.append_to_component(&mut out);
    let mut imports = ComponentImportSection::new();
    imports.import(IMPORT, ComponentTypeRef::Func(import_type));
    imports.append_to_component(&mut out);
    let mut lower = CanonicalFunctionSection::new();
    lower.lower(import_func, [CanonicalOption::Memory(memory)]);
    lower.append_to_component(&mut out);
    ModuleSection(&probe_module()).append_to_component(&mut out);
    let mut instances = InstanceSection::new();
    instances.export_items([
        ("memory", ExportKind::Memory, memory),
        ("probe", ExportKind::Func, lowered),
    ]);
    instances.instantiate(module, [("", ModuleArg::Instance(args))]);
    instances.append_to_component(&mut out);
    let mut alias = ComponentAliasSection::new();
    alias.alias(Alias::CoreInstanceExport {
        instance,
        kind: ExportKind::Func,
        name: "run",
    });
    alias.append_to_component(&mut out);
    let mut lift = CanonicalFunctionSection::new();
    lift.lift(run, export_type, std::iter::empty::<CanonicalOption>());
    lift.append_to_component(&mut out);
    let mut exports = ComponentExportSection::new();
    exports.export(EXPORT, ComponentExportKind::Func, lifted, None);
    exports.append_to_component(&mut out);
    Ok(out)
}

/// The core memories a canonical function's options name.
fn memories_named(f: &wasmparser::CanonicalFunction) -> Vec<u32> {
    use wasmparser::CanonicalFunction as F;
    let options: &[wasmparser::CanonicalOption] = match f {
        F::Lift { options, .. }
        | F::Lower { options, .. }
        | F::TaskReturn { options, .. }
        | F::StreamRead { options, .. }
        | F::StreamWrite { options, .. }
        | F::FutureRead { options, .. }
        | F::FutureWrite { options, .. }
        | F::ErrorContextNew { options }
        | F::ErrorContextDebugMessage { options } => options,
        _ => &[],
    };
    options
        .iter()
        .filter_map(|o| match o {
            wasmparser::CanonicalOption::Memory(m) => Some(*m),
            _ => None,
        })
        .collect()
}

/// `(module (import "" "memory" (memory 0)) (import "" "probe" (func (param i32 i32)))
///  (func (export "run") (call 1 (i32.const 0) (i32.shl (memory.size) (i32.const 16)))))`
fn probe_module() -> Module {
    let mut module = Module::new();
    let mut types = TypeSection::new();
    types.ty().function([ValType::I32, ValType::I32], []);
    types.ty().function([], []);
    module.section(&types);
    let mut imports = ImportSection::new();
    imports.import(
        "",
        "memory",
        MemoryType {
            minimum: 0,
            maximum: None,
            memory64: false,
            shared: false,
            page_size_log2: None,
        },
    );
    imports.import("", "probe", EntityType::Function(0));
    module.section(&imports);
    let mut functions = FunctionSection::new();
    functions.function(1);
    module.section(&functions);
    let mut exports = ExportSection::new();
    exports.export("run", ExportKind::Func, 1);
    module.section(&exports);
    let mut code = CodeSection::new();
    let mut run = Function::new([]);
    // A memory of 4 GiB would wrap to a length of 0: nothing is swept then.
    run.instruction(&Instruction::I32Const(0))
        .instruction(&Instruction::MemorySize(0))
        .instruction(&Instruction::I32Const(16))
        .instruction(&Instruction::I32Shl)
        .instruction(&Instruction::Call(0))
        .instruction(&Instruction::End);
    code.function(&run);
    module.section(&code);
    module
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A component with one core memory, named by a lowered import, and nothing else.
    const COMPONENT: &str = r#"
        (component
          (import "log" (func $log (param "m" string)))
          (core module $m (memory (export "memory") 1))
          (core instance $i (instantiate $m))
          (alias core export $i "memory" (core memory $mem))
          (core func (canon lower (func $log) (memory $mem)))
        )"#;

    #[test]
    fn the_probe_validates_and_names_the_main_memory() {
        let wasm = wat::parse_str(COMPONENT).unwrap();
        let probed = add(&wasm).unwrap();
        Validator::new_with_features(WasmFeatures::all())
            .validate_all(&probed)
            .unwrap();
        assert!(add(&probed).unwrap_err().contains("already"));
    }

    #[test]
    fn the_probe_reports_the_main_memory_s_address_and_length() {
        use wasmtime::component::{Component, Linker, WasmList};
        let engine = wasmtime::Engine::default();
        let wasm = add(&wat::parse_str(COMPONENT).unwrap()).unwrap();
        let component = Component::new(&engine, &wasm).unwrap();
        let mut linker = Linker::<Option<(usize, usize)>>::new(&engine);
        linker
            .root()
            .func_wrap("log", |_, (_,): (String,)| Ok(()))
            .unwrap();
        linker
            .root()
            .func_wrap(IMPORT, |mut store, (memory,): (WasmList<u8>,)| {
                let bytes = memory.as_le_slice(&store);
                let span = (bytes.as_ptr() as usize, bytes.len());
                *store.data_mut() = Some(span);
                Ok(())
            })
            .unwrap();
        let mut store = wasmtime::Store::new(&engine, None);
        let instance = linker.instantiate(&mut store, &component).unwrap();
        let run = instance
            .get_typed_func::<(), ()>(&mut store, EXPORT)
            .unwrap();
        run.call(&mut store, ()).unwrap();
        let (start, len) = store.data().expect("the probe called its import");
        assert_eq!(len, 65536, "the memory's one page");
        assert_eq!(start % 4096, 0, "a linear memory starts on a page");
    }

    #[test]
    fn a_component_without_a_memory_gets_no_probe() {
        let wasm = wat::parse_str("(component (core module $m))").unwrap();
        assert!(add(&wasm).unwrap_err().contains("no core memory"));
    }
}
