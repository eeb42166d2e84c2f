//! The other side of `smoe bench --baseline mmap`: what engines do today,
//! mmap the model and let the page cache work; and the memory cgroups that
//! `--mem-cap` runs each side in. A model opened in place is mapped file by
//! file and read through the library's one read path for a model.

use std::fs::File;
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use smoe::internals::files::{open_regular, OpenRegularError};
use smoe::internals::router::TraceTokens;
use smoe::internals::sys::{process_exists, ReadError};
use smoe::vault::{InPlace, Scratch, Vault};

use crate::output::Failure;
use crate::replay::sum_bytes;

/// A read-only mapping of a whole file, unmapped on drop.
struct Mapping {
    ptr: *mut libc::c_void,
    len: usize,
}

impl Mapping {
    fn new(file: &File, len: usize, path: &Path) -> Result<Mapping, Failure> {
        if len == 0 {
            return Err(Failure::Message(format!("{} is empty", path.display())));
        }
        // SAFETY: a fresh shared read-only mapping of an open file descriptor;
        // the kernel picks the address, nothing else in the process is
        // affected, and the result is checked against MAP_FAILED below.
        let ptr = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ,
                libc::MAP_SHARED,
                file.as_raw_fd(),
                0,
            )
        };
        if ptr == libc::MAP_FAILED {
            let e = std::io::Error::last_os_error();
            return Err(smoe::Error::io("cannot mmap", path, &e).into());
        }
        Ok(Mapping { ptr, len })
    }

    fn bytes(&self) -> &[u8] {
        // SAFETY: `ptr` maps `len` readable bytes for the life of `self`
        // (unmapped only in drop). The vault is opened read-only and nothing
        // in this process writes it. A page past the file's end faults
        // (SIGBUS) when touched: every reader of these bytes first checks
        // the file still has them ([`Mapping::check_len`], or the model's
        // `check_unchanged`); a truncation in the moment between that
        // check and the touch is not guarded against.
        unsafe { std::slice::from_raw_parts(self.ptr.cast::<u8>(), self.len) }
    }

    /// Whether `file`, the file mapped, still holds every mapped byte (an
    /// `fstat`): a touch of a page past its end would kill the process
    /// with SIGBUS. Else the message naming `path` and both lengths.
    fn check_len(&self, file: &File, path: &Path) -> Result<(), Failure> {
        let now = file
            .metadata()
            .map_err(|e| Failure::from(smoe::Error::io("cannot stat", path, &e)))?
            .len();
        if now < self.len as u64 {
            return Err(Failure::Message(format!(
                "{} changed while the mmap side read it: it was {} bytes, it is {now}",
                path.display(),
                self.len
            )));
        }
        Ok(())
    }
}

impl Drop for Mapping {
    fn drop(&mut self) {
        // SAFETY: `ptr`/`len` are exactly what mmap returned and no slice of
        // the mapping outlives `self` (bytes() borrows it).
        unsafe {
            libc::munmap(self.ptr, self.len);
        }
    }
}

/// What the mmap side measured.
#[derive(Clone, Debug)]
pub struct MmapReport {
    /// Wall time of the replay.
    pub seconds: f64,
    /// Per token: time spent reading (faulting in and summing) the experts.
    pub waits: Vec<Duration>,
}

/// Opens `path` again (so judged again: a file put there since the vault
/// was read, a FIFO say, which would block the open, is refused at once)
/// and maps the whole of it read-only. `what` names what it should be.
fn open_mapped(path: &Path, what: &str) -> Result<(File, Mapping), Failure> {
    let (file, metadata) = open_regular(path).map_err(|e| match e {
        OpenRegularError::NotRegular(kind) => {
            Failure::Message(format!("{}: is {kind}, not {what}", path.display()))
        }
        OpenRegularError::Os(e) => smoe::Error::io("cannot open", path, &e).into(),
    })?;
    let len = usize::try_from(metadata.len())
        .map_err(|_| Failure::Message(format!("{} is too large to map", path.display())))?;
    let map = Mapping::new(&file, len, path)?;
    Ok((file, map))
}

/// Replays `tokens` on a read-only mmap of the vault: per (token, layer),
/// reads every byte of each routed expert, timing per token the time spent
/// getting and reading them. `on_token` is called after each token. A
/// model opened in place is read through [`InPlace::load`], its one read
/// path, with the mappings of its files as the source ([`model_replay`]).
pub fn mmap_replay(
    vault: &Vault,
    tokens: &TraceTokens,
    on_token: &mut dyn FnMut(u32),
) -> Result<MmapReport, Failure> {
    if let Some(model) = vault.model() {
        return model_replay(vault, model, tokens, on_token);
    }
    let path = vault.path();
    let (file, map) = open_mapped(path, "a vault file")?;
    let bytes = map.bytes();
    let mut waits = Vec::with_capacity(tokens.len());
    let start = Instant::now();
    for (t, token) in tokens.iter().enumerate() {
        let mut wait = Duration::ZERO;
        for (layer, experts) in token {
            for &e in experts {
                let entry = vault.entry(*layer, e).ok_or_else(|| {
                    Failure::Message(format!(
                        "trace token {t}: layer {layer} expert {e} is not in the vault"
                    ))
                })?;
                let blob = usize::try_from(entry.offset)
                    .ok()
                    .zip(usize::try_from(entry.size).ok())
                    .and_then(|(o, s)| bytes.get(o..o.checked_add(s)?))
                    .ok_or_else(|| {
                        Failure::Message(format!(
                            "layer {layer} expert {e}: blob lies beyond the end of {}",
                            path.display()
                        ))
                    })?;
                map.check_len(&file, path)?;
                let t0 = Instant::now();
                std::hint::black_box(sum_bytes(blob));
                wait += t0.elapsed();
            }
        }
        waits.push(wait);
        on_token(t as u32);
    }
    Ok(MmapReport {
        seconds: start.elapsed().as_secs_f64(),
        waits,
    })
}

/// [`mmap_replay`] of a model opened in place: each file mapped read-only;
/// each routed expert loaded through [`InPlace::load`], whose "read" of a
/// window reads (sums) the window's bytes straight from the mapping, copying
/// nothing: the pages an engine that maps the model faults in and reads.
/// The load's moves then shuffle a scratch buffer no one reads. A window
/// that runs past the end of its file reads what the file has, as a direct
/// read would.
fn model_replay(
    vault: &Vault,
    model: &InPlace,
    tokens: &TraceTokens,
    on_token: &mut dyn FnMut(u32),
) -> Result<MmapReport, Failure> {
    let mut files = Vec::new();
    let mut maps = Vec::new();
    for path in vault.data_files() {
        let (file, map) = open_mapped(&path, "a model file")?;
        files.push(file);
        maps.push(map);
    }
    let slot = usize::try_from(vault.max_padded_size()).map_err(|_| {
        Failure::Message(format!(
            "a slot of {} bytes does not fit this machine's memory",
            vault.max_padded_size()
        ))
    })?;
    let mut buf: Vec<u8> = Vec::new();
    buf.try_reserve_exact(slot)
        .map_err(|_| Failure::Message(format!("cannot allocate a slot of {slot} bytes")))?;
    buf.resize(slot, 0);
    let mut scratch = Scratch::default();
    let mut waits = Vec::with_capacity(tokens.len());
    let start = Instant::now();
    for (t, token) in tokens.iter().enumerate() {
        let mut wait = Duration::ZERO;
        for (layer, experts) in token {
            for &e in experts {
                let entry = vault.entry(*layer, e).ok_or_else(|| {
                    Failure::Message(format!(
                        "trace token {t}: layer {layer} expert {e} is not in the vault"
                    ))
                })?;
                // padded_size ≤ the largest, which fits `buf`.
                let slot = &mut buf[..entry.padded_size as usize];
                let mut sum = 0u64;
                let t0 = Instant::now();
                model.load(&files, entry, slot, &mut scratch, |file, window, offset| {
                    let at = files.iter().position(|f| std::ptr::eq(f, file));
                    // Before the mapping is touched: a file truncated (or
                    // otherwise changed) since it was mapped fails the
                    // read, and `load` names it, instead of a SIGBUS.
                    if let Some(Err(why)) = at.map(|i| model.files()[i].check_unchanged(file)) {
                        return Err(ReadError {
                            done: 0,
                            wanted: window.len(),
                            offset,
                            error: std::io::Error::other(why),
                        });
                    }
                    let bytes = at.map_or(&[][..], |i| maps[i].bytes());
                    let from = usize::try_from(offset)
                        .unwrap_or(usize::MAX)
                        .min(bytes.len());
                    let there = &bytes[from..(from.saturating_add(window.len())).min(bytes.len())];
                    sum = sum.wrapping_add(sum_bytes(there));
                    if there.len() == window.len() {
                        Ok(())
                    } else {
                        Err(ReadError {
                            done: there.len(),
                            wanted: window.len(),
                            offset,
                            error: std::io::ErrorKind::UnexpectedEof.into(),
                        })
                    }
                })?;
                std::hint::black_box(sum);
                wait += t0.elapsed();
            }
        }
        waits.push(wait);
        on_token(t as u32);
    }
    Ok(MmapReport {
        seconds: start.elapsed().as_secs_f64(),
        waits,
    })
}

/// A memory cgroup made for one side of a capped comparison; removed on drop.
#[derive(Debug)]
pub struct Cgroup {
    /// Its directory.
    pub path: PathBuf,
}

/// Where memory cgroups can be made, and which version.
#[derive(Clone, Debug)]
pub struct CgroupParent {
    /// The directory new cgroups go under.
    pub dir: PathBuf,
    /// cgroup v2 (memory.max) or v1 (memory.limit_in_bytes).
    pub v2: bool,
}

impl CgroupParent {
    /// "cgroup v1" or "cgroup v2".
    pub fn name(&self) -> &'static str {
        if self.v2 {
            "cgroup v2"
        } else {
            "cgroup v1"
        }
    }

    /// Removes the cgroups that capped runs killed before they could remove
    /// them left here: a directory `smoe-bench-<pid>-<side>` whose `pid` is
    /// no live process (`kill(pid, 0)`) and which holds no process
    /// (`cgroup.procs` empty; `rmdir` refuses one that does, too). Nothing
    /// else removes them. Best effort: one that cannot be removed stays.
    pub fn remove_stale(&self) {
        let Ok(entries) = std::fs::read_dir(&self.dir) else {
            return;
        };
        for entry in entries.filter_map(|e| e.ok()) {
            let name = entry.file_name();
            let pid = name
                .to_str()
                .and_then(|n| n.strip_prefix(CGROUP_PREFIX))
                .and_then(|rest| rest.split_once('-'))
                .filter(|(pid, _)| !pid.is_empty() && pid.bytes().all(|b| b.is_ascii_digit()))
                .and_then(|(pid, _)| pid.parse::<u32>().ok());
            let Some(pid) = pid else { continue };
            if pid == std::process::id() || process_exists(pid) {
                continue;
            }
            let path = entry.path();
            let empty = std::fs::read_to_string(path.join("cgroup.procs"))
                .is_ok_and(|procs| procs.trim().is_empty());
            if empty {
                let _ = std::fs::remove_dir(&path);
            }
        }
    }
}

/// Finds where this process may make a memory cgroup: under its own cgroup
/// (from /proc/self/cgroup and the mount table), v1's memory hierarchy
/// first, else v2's with the memory controller. `SMOE_CGROUP_ROOT` names
/// the parent directory instead (for tests). The error is the one-line
/// reason a capped run is refused.
pub fn find_parent() -> Result<CgroupParent, String> {
    // SAFETY: geteuid has no preconditions and cannot fail.
    if unsafe { libc::geteuid() } != 0 {
        return Err("--mem-cap needs root to make a memory cgroup and drop the page cache".into());
    }
    let detect = |dir: PathBuf| -> Result<CgroupParent, String> {
        if dir.join("memory.limit_in_bytes").is_file() {
            Ok(CgroupParent { dir, v2: false })
        } else if dir.join("cgroup.controllers").is_file() {
            let controllers =
                std::fs::read_to_string(dir.join("cgroup.controllers")).unwrap_or_default();
            if !controllers.split_whitespace().any(|c| c == "memory") {
                return Err(format!(
                    "the cgroup v2 at {} has no memory controller",
                    dir.display()
                ));
            }
            let sub = dir.join("cgroup.subtree_control");
            let enabled = std::fs::read_to_string(&sub).unwrap_or_default();
            if !enabled.split_whitespace().any(|c| c == "memory")
                && std::fs::write(&sub, "+memory").is_err()
            {
                return Err(format!(
                    "cannot enable the memory controller for children of {} (a v2 cgroup with processes of its own cannot delegate it)",
                    dir.display()
                ));
            }
            Ok(CgroupParent { dir, v2: true })
        } else {
            Err(format!("no memory cgroup at {}", dir.display()))
        }
    };
    if let Some(root) = std::env::var_os("SMOE_CGROUP_ROOT") {
        return detect(PathBuf::from(root));
    }
    let mounts = std::fs::read_to_string("/proc/self/mounts").unwrap_or_default();
    let own = std::fs::read_to_string("/proc/self/cgroup").unwrap_or_default();
    let mut v1_mount = None;
    let mut v2_mount = None;
    for line in mounts.lines() {
        let f: Vec<&str> = line.split_whitespace().collect();
        if f.len() < 4 {
            continue;
        }
        if f[2] == "cgroup" && f[3].split(',').any(|o| o == "memory") {
            v1_mount = Some(PathBuf::from(f[1]));
        } else if f[2] == "cgroup2" {
            v2_mount = Some(PathBuf::from(f[1]));
        }
    }
    let own_path = |wanted: &dyn Fn(&str, &str) -> bool| -> Option<String> {
        own.lines().find_map(|l| {
            let mut parts = l.splitn(3, ':');
            let (_, ctl, path) = (parts.next()?, parts.next()?, parts.next()?);
            wanted(l, ctl).then(|| path.trim_start_matches('/').to_string())
        })
    };
    let under = |mount: PathBuf, rel: Option<String>| -> PathBuf {
        match rel {
            Some(r) if !r.is_empty() && mount.join(&r).is_dir() => mount.join(r),
            _ => mount,
        }
    };
    if let Some(m) = v1_mount {
        let rel = own_path(&|_, ctl| ctl.split(',').any(|c| c == "memory"));
        return detect(under(m, rel));
    }
    if let Some(m) = v2_mount {
        let rel = own_path(&|l, _| l.starts_with("0::"));
        return detect(under(m, rel));
    }
    Err("no memory cgroup is mounted (neither v1's memory hierarchy nor cgroup v2)".into())
}

/// The names of the cgroups a capped run makes: `smoe-bench-<pid>-<side>`,
/// `pid` the run's (the parent of the sides).
const CGROUP_PREFIX: &str = "smoe-bench-";

impl Cgroup {
    /// Makes the cgroup of one side of this process's capped run,
    /// `<parent>/smoe-bench-<pid>-<side>`, with a memory limit of `cap`
    /// bytes.
    pub fn create(parent: &CgroupParent, side: &str, cap: u64) -> Result<Cgroup, Failure> {
        let path = parent
            .dir
            .join(format!("{CGROUP_PREFIX}{}-{side}", std::process::id()));
        let _ = std::fs::remove_dir(&path);
        std::fs::create_dir(&path)
            .map_err(|e| smoe::Error::io("cannot create cgroup", &path, &e))?;
        let cg = Cgroup { path };
        let file = if parent.v2 {
            "memory.max"
        } else {
            "memory.limit_in_bytes"
        };
        let limit = cg.path.join(file);
        std::fs::write(&limit, cap.to_string())
            .map_err(|e| smoe::Error::io("cannot set the memory limit", &limit, &e))?;
        if parent.v2 {
            // No swapping around the cap either (absent without swap).
            let _ = std::fs::write(cg.path.join("memory.swap.max"), "0");
        } else {
            let _ = std::fs::write(cg.path.join("memory.memsw.limit_in_bytes"), cap.to_string());
        }
        Ok(cg)
    }
}

impl Drop for Cgroup {
    fn drop(&mut self) {
        // The side's process has exited; an emptied cgroup may take a moment
        // to become removable.
        for _ in 0..50 {
            if std::fs::remove_dir(&self.path).is_ok() || !self.path.exists() {
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

/// Moves this process into the cgroup at `dir` (the child side of a capped
/// run does this before it reads anything).
pub fn enter(dir: &Path) -> Result<(), Failure> {
    let procs = dir.join("cgroup.procs");
    std::fs::write(&procs, std::process::id().to_string())
        .map_err(|e| smoe::Error::io("cannot enter cgroup", &procs, &e).into())
}

/// Writes back dirty pages and drops the page cache (root only).
pub fn drop_page_cache() -> Result<(), String> {
    // SAFETY: sync has no preconditions.
    unsafe { libc::sync() };
    std::fs::write("/proc/sys/vm/drop_caches", "3")
        .map_err(|e| format!("cannot drop the page cache: {e}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The environment variable that makes [`truncate_child`] replay a
    /// model (`gguf`) or a vault (`vault`) and truncate it in between.
    const TRUNCATE_CHILD: &str = "SMOE_TEST_TRUNCATE_CHILD";

    /// Runs in a child process of
    /// [`a_model_or_vault_truncated_during_the_mmap_side_is_an_error`]:
    /// replays two tokens on the mmap side, truncating the file (to its
    /// first 4096 bytes) after the first; prints what the replay returned.
    /// A fault on the mapping would kill the process with SIGBUS.
    #[test]
    fn truncate_child() {
        let Ok(which) = std::env::var(TRUNCATE_CHILD) else {
            return;
        };
        let dir = tempfile::tempdir().unwrap();
        let (path, tokens): (PathBuf, TraceTokens) = if which == "gguf" {
            let to = dir.path().join("m.gguf");
            std::fs::copy(
                Path::new(env!("CARGO_MANIFEST_DIR"))
                    .join("../tests/fixtures/models/qwen3moe-q8_0.gguf"),
                &to,
            )
            .unwrap();
            (to, vec![vec![(0, vec![0])], vec![(1, vec![3])]])
        } else {
            let spec = smoe::vault::synth::SynthSpec {
                n_layers: 1,
                n_experts: 4,
                blob_bytes: 1 << 20,
                dense_layers: vec![],
                seed: 1,
                top_k: 1,
            };
            spec.write(dir.path(), &mut |_| {}).unwrap();
            (
                dir.path().to_path_buf(),
                vec![vec![(0, vec![0])], vec![(0, vec![3])]],
            )
        };
        let vault = Vault::open(&path).unwrap();
        let file = vault.data_files()[0].clone();
        let result = mmap_replay(&vault, &tokens, &mut |t| {
            if t == 0 {
                let f = std::fs::OpenOptions::new().write(true).open(&file).unwrap();
                f.set_len(4096).unwrap();
            }
        });
        // After the harness's "test ... " (no newline before the output).
        println!();
        match result {
            Ok(_) => println!("CHILD REPLAYED"),
            Err(Failure::Message(m)) => println!("CHILD REFUSED {m}"),
            Err(other) => println!("CHILD FAILED {other:?}"),
        }
    }

    /// `smoe bench --baseline mmap` on a model (or a vault) truncated while
    /// its mmap side runs: an error naming the file, never SIGBUS (a touch
    /// of the mapping past the file's new end).
    #[test]
    fn a_model_or_vault_truncated_during_the_mmap_side_is_an_error() {
        use std::os::unix::process::ExitStatusExt;
        let mut wrong = Vec::new();
        for which in ["gguf", "vault"] {
            let out = std::process::Command::new(std::env::current_exe().unwrap())
                .args([
                    "--exact",
                    "baseline::tests::truncate_child",
                    "--nocapture",
                    "--test-threads=1",
                ])
                .env(TRUNCATE_CHILD, which)
                .output()
                .unwrap();
            let stdout = String::from_utf8_lossy(&out.stdout);
            let said = stdout
                .lines()
                .find(|l| l.starts_with("CHILD "))
                .unwrap_or_default();
            let named = if which == "gguf" {
                "m.gguf"
            } else {
                "experts.smoe"
            };
            if out.status.signal().is_some()
                || !said.starts_with("CHILD REFUSED")
                || !said.contains(named)
                || !said.contains("changed")
            {
                wrong.push(format!("{which}: {} {said:?}", out.status));
            }
        }
        assert!(wrong.is_empty(), "{wrong:#?}");
    }

    #[test]
    fn a_fifo_put_in_place_of_the_vault_is_refused_at_once() {
        let dir = tempfile::tempdir().unwrap();
        let spec = smoe::vault::synth::SynthSpec {
            n_layers: 1,
            n_experts: 2,
            blob_bytes: 1000,
            dense_layers: vec![],
            seed: 1,
            top_k: 1,
        };
        let file = spec.write(dir.path(), &mut |_| {}).unwrap();
        let vault = Vault::open(dir.path()).unwrap();
        std::fs::remove_file(&file).unwrap();
        let c = std::ffi::CString::new(file.to_str().unwrap()).unwrap();
        // SAFETY: `c` is a NUL-terminated path that outlives the call.
        assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o644) }, 0);
        let (done, wait) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let tokens = vec![vec![(0, vec![1])]];
            let _ = done.send(mmap_replay(&vault, &tokens, &mut |_| {}).map(|_| ()));
        });
        let result = wait
            .recv_timeout(Duration::from_secs(5))
            .expect("mmap_replay blocked on a FIFO");
        match result {
            Err(Failure::Message(m)) => assert!(m.ends_with("is a FIFO, not a vault file"), "{m}"),
            other => panic!("{other:?}"),
        }
    }
}
