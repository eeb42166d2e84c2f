//! Helpers shared by smoe's tests and benchmarks: the library's test
//! binaries (`tests/library`, `tests/alone`), the tool's (`cli/tests/tool`),
//! the packer's (`pack/tests/models.rs`) and `benches/`. A dev-dependency of
//! each, never published.
//!
//! The crate root holds synthetic vaults and process measurements;
//! [`forge`] makes hand-edited and hostile vaults; [`models`] hand-made
//! model files for the packer; [`native`] builds and runs
//! C and C++ programs against the libraries `cargo test` built; [`skip`]
//! is the rule of a test that cannot run here (skip, or fail under CI).
//!
//! Empty under `--cfg loom`: the loom models are unit tests of the library
//! alone, and the streamer these helpers open is not compiled there.
#![cfg(not(loom))]

pub mod forge;
pub mod models;
pub mod native;
pub mod skip;

pub use skip::{root_or_skip, skip_or_fail, skip_or_fail_root};

use std::path::PathBuf;

use smoe::vault::synth::{first_mismatch, SynthSpec};

/// A synthetic vault in a fresh temporary directory.
pub struct TestVault {
    pub dir: tempfile::TempDir,
    pub spec: SynthSpec,
    pub file: PathBuf,
}

pub fn vault(layers: u32, experts: u32, blob_bytes: u64, dense: &[u32]) -> TestVault {
    let dir = tempfile::tempdir().unwrap();
    vault_in(dir, layers, experts, blob_bytes, dense)
}

pub fn vault_in(
    dir: tempfile::TempDir,
    layers: u32,
    experts: u32,
    blob_bytes: u64,
    dense: &[u32],
) -> TestVault {
    let spec = SynthSpec {
        n_layers: layers,
        n_experts: experts,
        blob_bytes,
        dense_layers: dense.to_vec(),
        seed: 0x5eed ^ (u64::from(layers) << 8) ^ u64::from(experts),
        top_k: 2,
    };
    let file = spec.write(dir.path(), &mut |_| {}).unwrap();
    TestVault { dir, spec, file }
}

impl TestVault {
    /// Demand-prefetches experts `experts` of `layer`, then claims each
    /// (waiting up to `wait`), checks every byte and releases it: the ring
    /// ends up holding them, as a decode step leaves it. Returns how many
    /// were checked.
    #[track_caller]
    pub fn stream(
        &self,
        s: &smoe::Streamer,
        layer: u32,
        experts: std::ops::Range<u32>,
        wait: std::time::Duration,
    ) -> u64 {
        for e in experts.clone() {
            s.prefetch(layer, e, smoe::Priority::Demand).unwrap();
        }
        for e in experts.clone() {
            let c = s.claim_wait(layer, e, wait).unwrap().unwrap();
            self.check(layer, e, &c);
        }
        u64::from(experts.end - experts.start)
    }

    /// Asserts `data` is exactly the payload of (layer, expert).
    #[track_caller]
    pub fn check(&self, layer: u32, expert: u32, data: &[u8]) {
        assert_eq!(
            data.len() as u64,
            self.spec.blob_size(layer, expert),
            "layer {layer} expert {expert}: wrong size"
        );
        if let Some(at) = first_mismatch(self.spec.seed, layer, expert, data) {
            panic!("layer {layer} expert {expert}: wrong byte at {at}");
        }
    }
}

/// User + system CPU time of the whole process.
pub fn process_cpu() -> std::time::Duration {
    // SAFETY: getrusage writes one `rusage` into the zeroed struct we own.
    let usage = unsafe {
        let mut u: libc::rusage = std::mem::zeroed();
        assert_eq!(libc::getrusage(libc::RUSAGE_SELF, &mut u), 0);
        u
    };
    let tv = |t: libc::timeval| std::time::Duration::new(t.tv_sec as u64, t.tv_usec as u32 * 1000);
    tv(usage.ru_utime) + tv(usage.ru_stime)
}

/// Makes a FIFO at `path`.
pub fn mkfifo(path: &std::path::Path) {
    use std::os::unix::ffi::OsStrExt;
    let c = std::ffi::CString::new(path.as_os_str().as_bytes()).unwrap();
    // SAFETY: `c` is a valid NUL-terminated path for the duration of the call.
    let rc = unsafe { libc::mkfifo(c.as_ptr(), 0o644) };
    assert_eq!(
        rc,
        0,
        "mkfifo {}: {}",
        path.display(),
        std::io::Error::last_os_error()
    );
}

/// The process's resident set size, in bytes (Linux `/proc/self/statm`).
pub fn rss_bytes() -> u64 {
    let statm = std::fs::read_to_string("/proc/self/statm").unwrap();
    let pages: u64 = statm.split_whitespace().nth(1).unwrap().parse().unwrap();
    // SAFETY: sysconf has no preconditions.
    pages * unsafe { libc::sysconf(libc::_SC_PAGESIZE) } as u64
}

/// A streamer config of `ring_slots` slots and `workers` workers, with no
/// pre-warm and no histogram file, for tests that count reads exactly.
pub fn quiet_config(ring_slots: u32, workers: u32) -> smoe::Config {
    smoe::Config {
        ring_slots,
        workers,
        prewarm: false,
        freq_path: Some("".into()),
        ..smoe::Config::default()
    }
}
