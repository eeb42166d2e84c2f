//! The elastic ring under a neighbour (issue 13): a 3 GiB memory cgroup, a
//! streamer with a full 2.4 GiB ring (200 × 12 MiB), and a neighbouring
//! process in the same cgroup that allocates 1.5 GiB, 100 MiB every 0.5 s.
//! Before the elastic ring, the OOM killer killed both.
//!
//! Root only: creating a cgroup needs it. Without root it is skipped with a
//! message; CI runs as root with SMOE_ROOT_TESTS=1, where it must run. Works
//! on cgroup v2 and on a v1 memory hierarchy (what the process's
//! /proc/self/cgroup names, as the library's probe reads it). The vault is
//! written to /var/tmp (disk: tmpfs pages would count in the cgroup) before
//! the test enters the cgroup, and read with direct I/O, so its page cache
//! is not the cgroup's.
//!
//! In the `alone` binary: it moves its whole process into the cgroup.

use smoe_test_support as common;

use std::fs;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use smoe::{Config, Streamer};

const MIB: u64 = 1 << 20;
const GIB: u64 = 1 << 30;

/// The neighbour: allocates 15 × 100 MiB, one step every 0.5 s, touching
/// every page, holds it 2 s, and says how much it got. Runs only as the
/// child of `elastic_ring_gives_way_to_a_neighbour` (`SMOE_NEIGHBOUR`).
#[test]
fn neighbour() {
    let _alone = crate::alone();
    if std::env::var_os("SMOE_NEIGHBOUR").is_none() {
        return;
    }
    let mut held: Vec<Vec<u8>> = Vec::new();
    for _ in 0..15 {
        let mut step = vec![0u8; 100 * MIB as usize];
        for page in step.chunks_mut(4096) {
            page[0] = 1;
        }
        held.push(step);
        std::thread::sleep(Duration::from_millis(500));
    }
    let total: usize = held
        .iter()
        .map(|s| s.iter().step_by(4096).filter(|&&b| b == 1).count())
        .sum();
    println!("NEIGHBOUR GOT {} MiB", total * 4096 / MIB as usize);
    std::io::stdout().flush().unwrap();
    std::thread::sleep(Duration::from_secs(2));
}

/// A memory cgroup this test made; leaving it moves the process back and
/// removes it.
pub(crate) struct Cgroup {
    pub(crate) dir: PathBuf,
    v2: bool,
    /// The cgroup the process came from (its `cgroup.procs`).
    home: PathBuf,
}

impl Cgroup {
    /// A new cgroup limited to `limit` bytes, on the hierarchy that has the
    /// memory controller for this process.
    pub(crate) fn create(limit: u64) -> Result<Cgroup, String> {
        let text = fs::read_to_string("/proc/self/cgroup").map_err(|e| e.to_string())?;
        let mut v1 = None;
        let mut v2 = None;
        for line in text.lines() {
            let mut f = line.splitn(3, ':');
            let (Some(id), Some(ctl), Some(path)) = (f.next(), f.next(), f.next()) else {
                continue;
            };
            if ctl.split(',').any(|c| c == "memory") {
                v1 = Some(path.to_owned());
            } else if id == "0" && ctl.is_empty() {
                v2 = Some(path.to_owned());
            }
        }
        let name = format!("smoe-elastic-{}", std::process::id());
        let write = |p: &Path, s: &str| {
            fs::write(p, s).map_err(|e| format!("writing {s:?} to {}: {e}", p.display()))
        };
        let (dir, home, is_v2) = if let Some(path) = v1 {
            let mount = Path::new("/sys/fs/cgroup/memory");
            let home = mount.join(path.trim_start_matches('/'));
            let dir = home.join(&name);
            fs::create_dir(&dir).map_err(|e| format!("mkdir {}: {e}", dir.display()))?;
            write(&dir.join("memory.limit_in_bytes"), &limit.to_string())?;
            (dir, home, false)
        } else if let Some(path) = v2 {
            // Under the nearest ancestor of the process's cgroup, from the
            // hierarchy's root down, that has the memory controller enabled
            // for its children or lets it be enabled (the root is exempt
            // from the no-internal-process rule; the process's own cgroup,
            // holding this process, could not delegate it).
            let mount = Path::new("/sys/fs/cgroup");
            if !mount.join("cgroup.controllers").exists() {
                return Err("no cgroup v2 hierarchy at /sys/fs/cgroup".into());
            }
            let own: Vec<&str> = path.split('/').filter(|p| !p.is_empty()).collect();
            let parent = (0..own.len().max(1))
                .map(|depth| {
                    own[..depth]
                        .iter()
                        .fold(mount.to_path_buf(), |p, c| p.join(c))
                })
                .find(|dir| {
                    let sub = dir.join("cgroup.subtree_control");
                    let on = fs::read_to_string(&sub).unwrap_or_default();
                    on.split_whitespace().any(|c| c == "memory")
                        || fs::write(&sub, "+memory").is_ok()
                })
                .ok_or_else(|| {
                    format!("no ancestor of cgroup {path} can delegate the memory controller")
                })?;
            let dir = parent.join(&name);
            fs::create_dir(&dir).map_err(|e| format!("mkdir {}: {e}", dir.display()))?;
            write(&dir.join("memory.max"), &limit.to_string())?;
            let _ = fs::write(dir.join("memory.swap.max"), "0");
            (dir, mount.join(path.trim_start_matches('/')), true)
        } else {
            return Err("no memory cgroup in /proc/self/cgroup".into());
        };
        Ok(Cgroup {
            dir,
            v2: is_v2,
            home,
        })
    }

    /// Moves this whole process (every thread) into the cgroup.
    fn enter(&self) -> Result<(), String> {
        fs::write(
            self.dir.join("cgroup.procs"),
            std::process::id().to_string(),
        )
        .map_err(|e| format!("entering {}: {e}", self.dir.display()))
    }

    /// OOM kills in the cgroup so far.
    pub(crate) fn oom_kills(&self) -> u64 {
        let file = if self.v2 {
            "memory.events"
        } else {
            "memory.oom_control"
        };
        let text = fs::read_to_string(self.dir.join(file)).unwrap();
        text.lines()
            .find_map(|l| l.strip_prefix("oom_kill "))
            .map_or(0, |n| n.trim().parse().unwrap())
    }

    fn usage(&self) -> u64 {
        let file = if self.v2 {
            "memory.current"
        } else {
            "memory.usage_in_bytes"
        };
        fs::read_to_string(self.dir.join(file))
            .unwrap()
            .trim()
            .parse()
            .unwrap()
    }
}

impl Drop for Cgroup {
    fn drop(&mut self) {
        let _ = fs::write(
            self.home.join("cgroup.procs"),
            std::process::id().to_string(),
        );
        // The neighbour has exited; the kernel may take a moment to let go.
        for _ in 0..50 {
            if fs::remove_dir(&self.dir).is_ok() {
                return;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        eprintln!("warning: could not remove {}", self.dir.display());
    }
}

#[test]
fn elastic_ring_gives_way_to_a_neighbour() {
    let _alone = crate::alone();
    if !common::root_or_skip("a memory cgroup") {
        return;
    }
    // 220 experts of 12 MiB (padded to exactly 12 MiB) on the disk.
    let t_start = Instant::now();
    let dir = tempfile::Builder::new()
        .prefix("smoe-elastic-")
        .tempdir_in("/var/tmp")
        .unwrap();
    let v = common::vault_in(dir, 1, 220, 12 * MIB - 16384, &[]);
    let written = t_start.elapsed();
    let cg = match Cgroup::create(3 * GIB) {
        Ok(cg) => cg,
        Err(e) => {
            common::skip_or_fail_root(&format!("cannot make a memory cgroup: {e}"));
            return;
        }
    };
    cg.enter().unwrap();
    let s = Streamer::open(
        &v.file,
        Config {
            slot_mb: 12,
            ..common::quiet_config(200, 4)
        },
    )
    .unwrap();
    assert!(s.warnings().is_empty(), "{:?}", s.warnings());
    assert_eq!(s.ring_region().1, 200 * 12 * MIB);
    // Fill the ring: every slot holds an expert.
    let mut checked = v.stream(&s, 0, 0..200, Duration::from_secs(20));
    let st = s.stats();
    assert_eq!((st.resident, st.slots_active), (200, 200));
    eprintln!(
        "vault written in {written:?}; ring full after {:?}, cgroup usage {} MiB",
        t_start.elapsed(),
        cg.usage() / MIB
    );

    let mut neighbour = Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "elastic::neighbour",
            "--nocapture",
            "--test-threads=1",
        ])
        .env("SMOE_NEIGHBOUR", "1")
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let t0 = Instant::now();
    let mut timeline: Vec<(f64, u64, u64, u64)> = Vec::new();
    let mut last_sample = Instant::now() - Duration::from_secs(1);
    let mut status = None;
    let mut exited_at = None;
    let mut rng = 0x9e37_79b9_7f4a_7c15u64;
    let deadline = t0 + Duration::from_secs(45);
    loop {
        // Keep claiming: a random expert of the 220, every byte checked.
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        let e = (rng % 220) as u32;
        let c = s
            .claim_wait(0, e, Duration::from_secs(20))
            .unwrap()
            .expect("claim in time");
        v.check(0, e, &c);
        drop(c);
        checked += 1;
        if last_sample.elapsed() >= Duration::from_millis(250) {
            last_sample = Instant::now();
            let st = s.stats();
            timeline.push((
                t0.elapsed().as_secs_f64(),
                st.slots_active,
                st.resident,
                cg.usage() / MIB,
            ));
        }
        if status.is_none() {
            if let Some(st) = neighbour.try_wait().unwrap() {
                status = Some(st);
                exited_at = Some(t0.elapsed());
            }
        }
        if status.is_some() && s.stats().slots_active == 200 {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "no recovery in 45 s: {timeline:?}"
        );
    }
    let recovered_at = t0.elapsed();
    let out = neighbour.wait_with_output().unwrap();
    let said = String::from_utf8_lossy(&out.stdout);
    let st = s.stats();
    let oom = cg.oom_kills();
    eprintln!("t(s) slots_active resident cgroup_MiB");
    for (t, active, resident, usage) in &timeline {
        eprintln!("{t:5.2} {active:4} {resident:4} {usage:5}");
    }
    eprintln!(
        "neighbour exited at {exited_at:?} ({}), ring back to 200 at {recovered_at:?}; \
         shrinks {}, grows {}, {checked} claims checked, oom_kill {oom}, total {:?}",
        said.lines()
            .find(|l| l.contains("NEIGHBOUR"))
            .unwrap_or("silent"),
        st.shrinks,
        st.grows,
        t_start.elapsed()
    );
    drop(s);
    drop(cg);
    assert!(
        status.unwrap().success(),
        "the neighbour failed: {status:?}"
    );
    assert!(said.contains("NEIGHBOUR GOT 1500 MiB"), "{said}");
    assert_eq!(oom, 0, "someone was OOM-killed");
    let least = timeline.iter().map(|t| t.1).min().unwrap();
    assert!(
        least < 200 - 50,
        "slots_active fell only to {least}: {timeline:?}"
    );
    assert_eq!(st.slots_active, 200);
    assert!(st.shrinks >= 1 && st.grows >= 1, "{st:?}");
}
