//! The Swift package at the repository root (`Package.swift`, the wrapper
//! `swift/SMoE/Streamer.swift`) keeps up with the header: the wrapper calls
//! every function `include/smoe.h` declares and sets every `smoe_config`
//! field, so a new C function or config field without a Swift counterpart
//! fails here, on any machine; and the manifest stays one that another
//! package can depend on by URL. Building and running the Swift package needs
//! a Swift toolchain: `scripts/swift-chroot.sh` (run by `.ci/run`).

use std::fs;
use std::path::Path;

fn read(relative: &str) -> String {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join(relative);
    fs::read_to_string(&path).unwrap_or_else(|e| panic!("read {}: {e}", path.display()))
}

/// Functions the header declares that Swift must not call, and why.
/// The device tier's reason: a VRAM tier is for a discrete GPU's memory; on
/// Apple silicon the ring already is the GPU's memory (docs/cuda.md, "Not
/// planned"), so the Swift wrapper has no use for it.
const TIER: &str = "the device tier is for a discrete GPU's memory; on Apple silicon \
                    the ring already is the GPU's (docs/cuda.md)";

const NOT_FOR_SWIFT: [(&str, &str); 9] = [
    (
        "smoe_config_init",
        "ABI v1's unsized initializer, kept for programs built before \
         smoe_config_init_sized; Swift calls smoe_config_init_sized with \
         MemoryLayout<smoe_config>.size, as the C macro does",
    ),
    ("smoe_tier_new", TIER),
    ("smoe_tier_free", TIER),
    ("smoe_tier_lookup", TIER),
    ("smoe_tier_admit", TIER),
    ("smoe_tier_loaded", TIER),
    ("smoe_tier_failed", TIER),
    ("smoe_tier_step_done", TIER),
    ("smoe_tier_get_stats", TIER),
];

/// The names of the functions the header declares: `smoe_name(` at the
/// start of a declaration's name, after its return type (and after an
/// attribute macro such as `SMOE_DEPRECATED("...")`).
fn header_functions(header: &str) -> Vec<String> {
    let mut names: Vec<String> = header
        .lines()
        .filter(|line| !line.starts_with(' ') && !line.starts_with('#') && line.ends_with(");"))
        .map(|line| match line.strip_prefix("SMOE_DEPRECATED(\"") {
            Some(rest) => rest
                .split_once("\") ")
                .map_or(line, |(_, declaration)| declaration),
            None => line,
        })
        .filter_map(|line| {
            let open = line.find('(')?;
            let start = line[..open].rfind(|c: char| !(c.is_alphanumeric() || c == '_'))? + 1;
            let name = &line[start..open];
            name.starts_with("smoe_").then(|| name.to_owned())
        })
        .collect();
    names.sort();
    names.dedup();
    names
}

/// The field names of `typedef struct smoe_config { ... } smoe_config;`.
fn config_fields(header: &str) -> Vec<String> {
    let body = header
        .split("typedef struct smoe_config {")
        .nth(1)
        .and_then(|rest| rest.split("} smoe_config;").next())
        .expect("smoe_config in smoe.h");
    body.lines()
        .map(str::trim)
        .filter(|line| line.ends_with(';') && !line.starts_with('*') && !line.starts_with("/"))
        .filter_map(|line| line.trim_end_matches(';').rsplit(' ').next())
        .map(str::to_owned)
        .collect()
}

#[test]
fn swift_wrapper_calls_every_header_function() {
    let header = read("include/smoe.h");
    let swift = read("swift/SMoE/Streamer.swift");
    let functions = header_functions(&header);
    assert!(
        functions.len() >= 18,
        "parsed too few functions: {functions:?}"
    );
    for (name, why) in NOT_FOR_SWIFT {
        assert!(functions.iter().any(|f| f == name), "{name} is gone: {why}");
        assert!(
            !swift.contains(&format!("{name}(&")),
            "Streamer.swift calls {name}: {why}"
        );
    }
    let missing: Vec<&String> = functions
        .iter()
        .filter(|name| NOT_FOR_SWIFT.iter().all(|(skip, _)| skip != name))
        .filter(|name| !swift.contains(&format!("{name}(")))
        .collect();
    assert!(
        missing.is_empty(),
        "Streamer.swift does not call {missing:?}"
    );
}

#[test]
fn swift_wrapper_sets_every_config_field() {
    let header = read("include/smoe.h");
    let swift = read("swift/SMoE/Streamer.swift");
    let fields = config_fields(&header);
    assert!(
        fields.contains(&"freq_path".to_owned()),
        "parsed {fields:?}"
    );
    let missing: Vec<&String> = fields
        .iter()
        .filter(|field| *field != "struct_size" && !swift.contains(&format!("cfg.{field} ")))
        .collect();
    assert!(
        missing.is_empty(),
        "Streamer.swift does not set smoe_config {missing:?}"
    );
}

/// The module map's header is the installed `smoe.h`, reached through the
/// include path pkg-config gives.
#[test]
fn swift_module_map_names_the_header() {
    let module_map = read("swift/CSMoE/module.modulemap");
    assert!(module_map.contains("module CSMoE"));
    let header = module_map
        .lines()
        .find_map(|line| line.trim().strip_prefix("header \""))
        .and_then(|rest| rest.split('"').next())
        .expect("a header line");
    let shim = read(&format!("swift/CSMoE/{header}"));
    assert!(shim.contains("#include <smoe.h>"), "{shim}");
}

/// SwiftPM refuses `unsafeFlags` in a package depended on by URL, and the
/// C library must come from pkg-config (`smoe.pc`, which scripts/install.sh
/// writes).
#[test]
fn swift_package_can_be_a_dependency() {
    let manifest = read("Package.swift");
    let code: String = manifest
        .lines()
        .filter(|line| !line.trim_start().starts_with("//"))
        .collect::<Vec<_>>()
        .join("\n");
    assert!(
        !code.contains("unsafeFlags"),
        "Package.swift uses unsafeFlags"
    );
    assert!(
        code.contains(r#".systemLibrary(name: "CSMoE", path: "swift/CSMoE", pkgConfig: "smoe")"#),
        "{code}"
    );
    assert!(
        code.contains(r#".library(name: "SMoE", targets: ["SMoE"])"#),
        "{code}"
    );
    // The example package uses it as a dependency, by path.
    let example = read("examples-swift/Package.swift");
    assert!(
        example.contains(r#".package(name: "smoe", path: "..")"#),
        "{example}"
    );
    assert!(!example.contains("unsafeFlags("), "{example}");
}
