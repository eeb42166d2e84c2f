//! The whole C API (docs/c-api.md) exercised from a real C program: `tests/c/
//! api_test.c` is compiled as C11 with `-Wall -Wextra -Wpedantic -Werror`,
//! linked against the `libsmoe.a` this `cargo test` built (plus the native
//! libraries Rust's std needs), and run on a synthetic vault made here.
//!
//! The compiler is `$CC`, else `cc`; then `clang`, because only clang sees
//! the header's nullability macros (without it that pass is skipped, saying
//! so; under CI, which installs it, that is a failure).

use std::process::Command;

use smoe::ffi::{smoe_config, smoe_stats};
use smoe::vault::synth::SynthSpec;

use smoe_test_support::native;

use native::{c_compilers, manifest_dir, run, WARNINGS};

/// The vault's shape, passed to the program on its command line.
const LAYERS: u32 = 3;
const EXPERTS: u32 = 6;
const DENSE_LAYER: u32 = 0;

#[test]
fn c_program_drives_the_whole_api() {
    let dir = tempfile::tempdir().unwrap();
    let spec = SynthSpec {
        n_layers: LAYERS,
        n_experts: EXPERTS,
        blob_bytes: 20_000,
        dense_layers: vec![DENSE_LAYER],
        seed: 0xc0ffee,
        top_k: 2,
    };
    let vault = spec.write(dir.path().join("vault"), &mut |_| {}).unwrap();
    let args = [
        vault.display().to_string(),
        LAYERS.to_string(),
        EXPERTS.to_string(),
        DENSE_LAYER.to_string(),
    ];
    build_and_run(dir.path(), "api_test", &args);
}

/// Builds `tests/c/NAME.c` as C11 with the warnings as errors, linked
/// against the `libsmoe.a` this `cargo test` built, with each C compiler,
/// and runs it with `args`: it must print "ok".
fn build_and_run(dir: &std::path::Path, name: &str, args: &[String]) {
    let source = manifest_dir().join(format!("tests/c/{name}.c"));
    // A private copy: a concurrent `cargo build` may replace the original
    // between finding it and linking it.
    let library = dir.join(format!("{name}-libsmoe.a"));
    std::fs::copy(native::lib_dir().join("libsmoe.a"), &library).unwrap();
    for compiler in c_compilers() {
        let program = dir.join(format!("{name}_{compiler}"));
        run(Command::new(&compiler)
            .arg("-std=c11")
            .args(WARNINGS)
            .arg("-I")
            .arg(manifest_dir().join("include"))
            .arg(&source)
            .arg(&library)
            .args(native::native_static_libs())
            .arg("-o")
            .arg(&program));
        let output = run(Command::new(&program).args(args));
        assert_eq!(output.trim(), "ok", "{compiler}: {output}");
    }
}

/// The device tier's calls from C (`tests/c/tier_test.c`): a fake device
/// whose copies complete a step late and sometimes fail, every hit's bytes
/// checked, the counters exact, and every error path writing nothing.
#[test]
fn c_program_drives_the_device_tier() {
    let dir = tempfile::tempdir().unwrap();
    build_and_run(dir.path(), "tier_test", &[]);
}

/// A program built against an older header (`tests/c/smoe_v1.h`, smaller
/// structs than the library's) never has a byte past its structs written:
/// `tests/c/old_struct_test.c` puts canaries after each struct and checks
/// them after `smoe_config_init`, `smoe_open` and `smoe_get_stats`. Built
/// once per variant of that header:
/// - v1 structs, `smoe_config_init` the header's sized macro;
/// - v1 structs, `smoe_config_init` the unsized v1 function, as a program
///   built before `smoe_config_init_sized` existed calls it;
/// - a config and stats one field short of v1 (smaller than the library's):
///   refused, nothing written.
#[test]
fn old_structs_are_never_overrun() {
    let dir = tempfile::tempdir().unwrap();
    let spec = SynthSpec {
        n_layers: 2,
        n_experts: 4,
        blob_bytes: 20_000,
        dense_layers: vec![],
        seed: 7,
        top_k: 2,
    };
    let vault = spec.write(dir.path().join("vault"), &mut |_| {}).unwrap();
    let source = manifest_dir().join("tests/c/old_struct_test.c");
    let library = dir.path().join("libsmoe.a");
    std::fs::copy(native::lib_dir().join("libsmoe.a"), &library).unwrap();
    let variants: [(&str, &[&str]); 3] = [
        ("v1_sized", &[]),
        ("v1_unsized", &["-DOLD_UNSIZED_INIT"]),
        (
            "short",
            &[
                "-DOLD_CONFIG_WITHOUT_FREQ_PATH",
                "-DOLD_STATS_WITHOUT_DIRECT_IO",
            ],
        ),
    ];
    for compiler in c_compilers() {
        for (name, defines) in variants {
            let program = dir.path().join(format!("old_struct_{name}_{compiler}"));
            run(Command::new(&compiler)
                .arg("-std=c11")
                .args(WARNINGS)
                .args(defines)
                .arg("-I")
                .arg(manifest_dir().join("tests/c"))
                .arg(&source)
                .arg(&library)
                .args(native::native_static_libs())
                .arg("-o")
                .arg(&program));
            let output = run(Command::new(&program).arg(&vault));
            assert_eq!(output.trim(), "ok", "{compiler} {name}: {output}");
        }
    }
}

/// Every docs/c-api.md prototype, as the header must declare it once the
/// nullability macros and cbindgen's `struct`/`enum` tags (equivalent in C
/// and C++) are taken out.
#[test]
fn header_declares_every_spec_function() {
    let header = read_header();
    let header = header
        .replace("*SMOE_NULLABLE ", "*")
        .replace("*SMOE_NONNULL ", "*")
        .replace("struct ", "")
        .replace("enum ", "");
    let prototypes = [
        "smoe_status smoe_config_init_sized(smoe_config *cfg, uint32_t struct_size);",
        "smoe_status smoe_open(const char *vault_path, const smoe_config *cfg, smoe_streamer **out);",
        "void smoe_close(smoe_streamer *s);",
        "smoe_status smoe_prefetch(smoe_streamer *s, uint32_t layer, uint32_t expert, bool speculative);",
        "smoe_status smoe_claim(smoe_streamer *s, uint32_t layer, uint32_t expert, smoe_slot *out);",
        "smoe_status smoe_claim_wait(smoe_streamer *s, uint32_t layer, uint32_t expert, uint64_t timeout_ns, smoe_slot *out);",
        "smoe_status smoe_release(smoe_streamer *s, const smoe_slot *slot);",
        "void smoe_prewarm_pause(smoe_streamer *s, bool busy);",
        "smoe_status smoe_flush_stats(smoe_streamer *s);",
        "smoe_status smoe_get_stats(const smoe_streamer *s, smoe_stats *out);",
        "smoe_status smoe_ring_region(const smoe_streamer *s, void **base, uint64_t *bytes, uint64_t *slot_bytes);",
        "smoe_status smoe_expert_info(const smoe_streamer *s, uint32_t layer, uint32_t expert, uint64_t *size, uint64_t *padded_size, uint64_t *offset);",
        "const char *smoe_vault_metadata(const smoe_streamer *s);",
        "smoe_status smoe_tier_new(uint32_t slots, uint32_t n_layers, uint32_t n_experts, smoe_tier **out);",
        "void smoe_tier_free(smoe_tier *t);",
        "smoe_status smoe_tier_lookup(const smoe_tier *t, uint32_t layer, uint32_t expert, int32_t *slot);",
        "smoe_status smoe_tier_admit(const smoe_tier *t, uint32_t layer, uint32_t expert, smoe_tier_promotion *out);",
        "smoe_status smoe_tier_loaded(const smoe_tier *t, uint32_t slot, uint64_t bytes);",
        "smoe_status smoe_tier_failed(const smoe_tier *t, uint32_t slot);",
        "smoe_status smoe_tier_step_done(const smoe_tier *t);",
        "smoe_status smoe_tier_get_stats(const smoe_tier *t, smoe_tier_stats *out);",
        "const char *smoe_last_error(void);",
        "const char *smoe_status_str(smoe_status st);",
        "uint32_t smoe_abi_version(void);",
        "const char *smoe_version(void);",
    ];
    for prototype in prototypes {
        assert!(
            header.lines().any(|line| line == prototype),
            "include/smoe.h lacks {prototype:?}"
        );
    }
    // Version 1's `void smoe_config_init(smoe_config *cfg)`: the v1 symbol stays,
    // deprecated, and the name is a macro passing the caller's size.
    assert!(
        header
            .lines()
            .any(|line| line.starts_with("SMOE_DEPRECATED(\"")
                && line.ends_with(") void smoe_config_init(smoe_config *cfg);")),
        "include/smoe.h lacks the v1 smoe_config_init"
    );
    let define = "#define smoe_config_init(cfg) \
                  smoe_config_init_sized((cfg), (uint32_t)sizeof(smoe_config))";
    let declared = header.find(") void smoe_config_init(").unwrap();
    let defined = header.find(define).expect("the smoe_config_init macro");
    assert!(declared < defined, "the macro must follow the declaration");
}

fn read_header() -> String {
    std::fs::read_to_string(manifest_dir().join("include/smoe.h")).unwrap()
}

/// The field declarations of `typedef struct <name> { ... } <name>;`, in
/// order, comments and nullability macros dropped.
fn fields(header: &str, name: &str) -> Vec<String> {
    let start = format!("typedef struct {name} {{");
    let end = format!("}} {name};");
    let body = header
        .split_once(&start)
        .and_then(|(_, rest)| rest.split_once(&end))
        .unwrap_or_else(|| panic!("include/smoe.h does not define struct {name}"))
        .0;
    body.lines()
        .map(str::trim)
        .filter(|line| !line.starts_with('*') && !line.starts_with('/') && line.ends_with(';'))
        .map(|line| line.replace("*SMOE_NULLABLE ", "*"))
        .collect()
}

/// The name a field declaration declares (`"uint32_t ring_slots;"` →
/// `"ring_slots"`).
fn field_name(declaration: &str) -> &str {
    declaration
        .trim_end_matches(';')
        .rsplit(['*', ' '])
        .next()
        .unwrap()
}

/// The opaque handle and the structs, field by field: the v1 fields docs/c-api.md
/// fixes are pinned here in order (ABI); the whole of each versioned struct
/// is the library's schema in order (`FIELD_NAMES`), so a field appended to
/// the schema needs no edit here.
#[test]
fn header_declares_the_spec_structs() {
    let header = read_header();
    assert!(header.contains("\ntypedef struct smoe_streamer smoe_streamer;\n"));
    let config = fields(&header, "smoe_config");
    let config_v1 = [
        "uint32_t struct_size;",
        "uint32_t ring_slots;",
        "uint32_t slot_mb;",
        "uint32_t workers;",
        "uint32_t direct_io;",
        "uint32_t prewarm;",
        "uint32_t prewarm_slots;",
        "uint32_t verify;",
        "uint64_t scout_bytes;",
        "uint64_t engine_overhead_bytes;",
        "const char *freq_path;",
    ];
    assert_eq!(config[..config_v1.len()], config_v1);
    let names: Vec<&str> = config.iter().map(|f| field_name(f)).collect();
    let mut schema = vec!["struct_size"];
    schema.extend(smoe_config::FIELD_NAMES);
    assert_eq!(names, schema);

    assert_eq!(
        fields(&header, "smoe_slot"),
        [
            "const uint8_t *data;",
            "uint64_t size;",
            "uint64_t ticket;",
            "uint32_t slot_index;",
            "uint32_t layer;",
            "uint32_t expert;",
            "bool hit;",
        ]
    );

    let stats = fields(&header, "smoe_stats");
    let stats_v1 = [
        "claims",
        "hits",
        "pending",
        "bytes_read",
        "reads_demand",
        "reads_speculative",
        "reads_prewarm",
        "evictions",
        "io_errors",
        "checksum_errors",
        "resident",
        "ring_slots",
        "slot_bytes",
        "workers",
        "direct_io",
    ]
    .map(|field| format!("uint64_t {field};"));
    assert_eq!(stats[0], "uint32_t struct_size;");
    assert_eq!(stats[1..=stats_v1.len()], stats_v1);
    let mut schema = vec!["uint32_t struct_size;".to_owned()];
    schema.extend(
        smoe_stats::FIELD_NAMES
            .iter()
            .map(|field| format!("uint64_t {field};")),
    );
    assert_eq!(stats, schema);
}
