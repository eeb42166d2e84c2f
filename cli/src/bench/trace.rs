//! `smoe bench --trace`: the sweep (simulated only), one side of a capped
//! comparison (a child process), or the replay with its simulation,
//! baseline and plot, each a step of its own.

use std::path::{Path, PathBuf};
use std::time::Duration;

use smoe::internals::trace::TraceTokens;
use smoe::vault::Vault;

use super::args::{BenchArgs, Side};
use super::report::{
    BaselineResult, DecodeResult, MmapSide, RunMode, SideReport, SimRates, SmoeSide, SweepResult,
    SweepRow, TopK, TraceResult,
};
use crate::baseline::{drop_page_cache, find_parent, mmap_replay, Cgroup, CgroupParent};
use crate::interrupt;
use crate::output::{out, warning_line, Failure};
use crate::plot::{self, Measured, PlotData, PlotTarget, Waits};
use crate::progress::{self, Unit};
use crate::replay::{check_trace, mean_p99, waits_ms, WorkingSet};
use crate::sim;
use crate::stream::decode;

/// What every step needs to know about the trace and the vault.
struct Replay<'a> {
    args: &'a BenchArgs,
    tokens: TraceTokens,
    /// The demand claims, as the simulators take them.
    seq: Vec<u32>,
    /// Experts in the vault.
    entries: u32,
    top_k: TopK,
    working_set: WorkingSet,
    /// The streamer's slot for this vault: the largest padded blob rounded
    /// up to the default alignment (docs/c-api.md, "Ring sizing").
    slot_bytes: u64,
    /// The vault file's bytes (a model's files').
    vault_bytes: u64,
    /// What each side opens again: the path as given, so that a model
    /// opened from its directory or index is opened whole again.
    vault_path: PathBuf,
    /// For the plot: the trace's file name and the vault's directory name
    /// (a model's name as given).
    trace_name: String,
    vault_name: String,
}

impl<'a> Replay<'a> {
    fn new(args: &'a BenchArgs, vault: &Vault, top_k: TopK, tokens: TraceTokens) -> Replay<'a> {
        let align = u64::from(smoe::vault::DEFAULT_ALIGNMENT);
        let name = |p: &Path| {
            p.file_name().map_or_else(
                || p.display().to_string(),
                |n| n.to_string_lossy().into_owned(),
            )
        };
        Replay {
            args,
            seq: sim::claims(&tokens),
            working_set: WorkingSet::of_trace(&tokens),
            tokens,
            entries: vault.entries().len() as u32,
            top_k,
            slot_bytes: vault.max_padded_size().next_multiple_of(align).max(align),
            vault_bytes: vault.header().file_bytes,
            vault_path: args.vault.clone(),
            trace_name: args.trace.as_deref().map(name).unwrap_or_default(),
            vault_name: match vault.model() {
                Some(_) => name(&args.vault),
                None => name(vault.dir()),
            },
        }
    }

    /// LRU, Belady and the device tier at each ring size of a sweep (and `extra`), with a
    /// progress bar.
    fn sweep_rows(&self, extra: u32) -> Vec<SweepRow> {
        let sizes = sim::sweep_sizes(self.entries, extra);
        let bar = progress::bar(sizes.len() as u64, "sweep", Unit::Items, self.args.json);
        let rows = sizes
            .into_iter()
            .map(|n| {
                let row = SweepRow {
                    ring_slots: n,
                    lru: sim::lru(&self.seq, n as usize).rate(),
                    belady: sim::belady(&self.seq, n as usize).rate(),
                    device_tier: sim::tier(&self.tokens, n as usize).rate(),
                };
                bar.inc(1);
                row
            })
            .collect();
        bar.finish_and_clear();
        rows
    }

    /// The plot's data: the sweep, this run's measured points, the waits.
    fn plot_data<'b>(
        &'b self,
        rows: &'b [SweepRow],
        measured: Vec<Measured>,
        slot_bytes: u64,
        waits: Option<Waits<'b>>,
    ) -> PlotData<'b> {
        PlotData {
            trace_name: &self.trace_name,
            vault_name: &self.vault_name,
            tokens: self.tokens.len() as u64,
            claims: self.seq.len() as u64,
            entries: self.entries,
            slot_bytes,
            top_k: self.top_k.text(),
            working_set: self.working_set,
            sweep: rows
                .iter()
                .map(|r| (r.ring_slots, r.lru, r.belady))
                .collect(),
            measured,
            waits,
        }
    }
}

/// `smoe bench --trace`: the sweep, one side (a child of a capped run), or
/// the replay with its simulation, baseline and plot.
pub fn run_trace(
    args: &BenchArgs,
    vault: Vault,
    top_k: TopK,
    tokens: TraceTokens,
    plot: Option<&PlotTarget>,
) -> Result<(), Failure> {
    check_trace(&vault, &tokens)?;
    let replay = Replay::new(args, &vault, top_k, tokens);
    if args.sweep {
        return sweep(&replay, plot);
    }
    if let Some(side) = args.side {
        drop(vault);
        let report = side_here(side, &replay, args.ring_slots)?;
        return print_json(&report);
    }
    let ring_slots = ring_for_cap(&replay)?;
    drop(vault);
    let isolation = isolation(args)?;
    let (smoe, mmap) = run_sides(&replay, isolation.as_ref(), ring_slots)?;
    if isolation.is_some() && interrupt::requested() {
        return Err(Failure::Message(
            "interrupted after the capped sides ran; nothing printed".into(),
        ));
    }
    let result = measure(&replay, isolation.as_ref(), &smoe, mmap.as_ref());
    if let Some(plot) = plot {
        let rows = replay.sweep_rows(smoe.ring_slots as u32);
        let measured = vec![Measured {
            policy: args.policy.name().to_owned(),
            slots: smoe.ring_slots as u32,
            rate: result.decode.coverage,
        }];
        let memory = match (&result.mem_cap_bytes, result.isolation.as_str()) {
            (Some(_), "none") | (None, _) => {
                "uncapped: mmap may keep the whole vault in the page cache".to_owned()
            }
            (Some(cap), name) => format!(
                "each side capped at {} ({name})",
                crate::output::human_bytes(*cap)
            ),
        };
        let waits = mmap.as_ref().map(|m| Waits {
            smoe: &smoe.waits_ms,
            mmap: &m.waits_ms,
            memory,
        });
        plot::write(
            plot,
            &replay.plot_data(&rows, measured, smoe.slot_bytes, waits),
        )?;
    }
    if args.json {
        print_json(&result)
    } else {
        let cap = args.mem_cap.as_ref().map(|c| c.text.as_str());
        out(&result.text(cap))
    }
}

fn print_json(value: &impl serde::Serialize) -> Result<(), Failure> {
    let line = serde_json::to_string(value)
        .map_err(|e| Failure::Message(format!("cannot encode the result as JSON: {e}")))?;
    out(&(line + "\n"))
}

/// `--sweep`: simulated hit rates over ring sizes; streams nothing.
fn sweep(replay: &Replay, plot: Option<&PlotTarget>) -> Result<(), Failure> {
    let args = replay.args;
    let rows = replay.sweep_rows(args.ring_slots);
    if let Some(plot) = plot {
        plot::write(
            plot,
            &replay.plot_data(&rows, Vec::new(), replay.slot_bytes, None),
        )?;
    }
    let result = SweepResult {
        mode: RunMode::Sweep,
        tokens: replay.tokens.len() as u64,
        claims: replay.seq.len() as u64,
        experts: replay.entries,
        policy: args.policy.name().to_owned(),
        top_k: replay.top_k.value,
        top_k_from: replay.top_k.from,
        working_set: replay.working_set,
        rows,
    };
    if args.json {
        print_json(&result)
    } else {
        out(&result.text())
    }
}

/// The ring of a run: `--ring-slots`, or with `--mem-cap` and 0 slots the
/// largest that fits the cap with 10% headroom; a ring that does not fit
/// the cap is refused.
fn ring_for_cap(replay: &Replay) -> Result<u32, Failure> {
    let args = replay.args;
    let ring_slots = args.ring_slots;
    let Some(cap) = &args.mem_cap else {
        return Ok(ring_slots);
    };
    let slot = replay.slot_bytes;
    let room = cap.bytes / 10 * 9;
    let top_k = replay.top_k.value;
    if ring_slots == 0 {
        let fits = (room / slot).min(u64::from(replay.entries)) as u32;
        if fits < top_k {
            return Err(Failure::Message(format!(
                "--mem-cap {cap}: with 10% headroom it holds {fits} slots of {slot} bytes, fewer than the top-k {top_k}"
            )));
        }
        Ok(fits)
    } else if u64::from(ring_slots) * slot > room {
        Err(Failure::Message(format!(
            "--ring-slots {ring_slots} × {slot} bytes does not fit --mem-cap {cap} with 10% headroom ({room} bytes)"
        )))
    } else {
        Ok(ring_slots)
    }
}

/// Where the capped sides run: a memory cgroup parent, or none (no
/// `--mem-cap`, or `--no-isolation` where none can be made, with a warning).
/// With a parent, the cgroups killed runs left there are removed first, and
/// from then on SIGINT and SIGTERM stop the run and remove its cgroup
/// ([`side_capped`]).
fn isolation(args: &BenchArgs) -> Result<Option<CgroupParent>, Failure> {
    let Some(cap) = &args.mem_cap else {
        return Ok(None);
    };
    match find_parent() {
        Ok(p) => {
            interrupt::catch();
            p.remove_stale();
            Ok(Some(p))
        }
        Err(why) if args.no_isolation => {
            // With --json, `"isolation": "none"` says it.
            if !args.json {
                warning_line(&format!(
                    "--mem-cap {cap} is not enforced: {why}; running uncapped with a warm page cache (--no-isolation)"
                ));
            }
            Ok(None)
        }
        Err(why) => Err(Failure::Message(format!(
            "cannot cap memory: {why} (--no-isolation runs uncapped and warm)"
        ))),
    }
}

/// Runs the smoe side, then (with `--baseline mmap`) the mmap side on the
/// ring smoe got: in capped child processes when isolated, else here.
fn run_sides(
    replay: &Replay,
    isolation: Option<&CgroupParent>,
    ring_slots: u32,
) -> Result<(SmoeSide, Option<MmapSide>), Failure> {
    let args = replay.args;
    let run_side = |side: Side, ring: u32| -> Result<SideReport, Failure> {
        match (isolation, &args.mem_cap) {
            (Some(parent), Some(cap)) => side_capped(side, replay, ring, parent, cap.bytes),
            _ => side_here(side, replay, ring),
        }
    };
    let smoe = match run_side(Side::Smoe, ring_slots)? {
        SideReport::Smoe(s) => s,
        SideReport::Mmap(_) => return Err(wrong_side("smoe")),
    };
    let mmap = match args.baseline {
        Some(super::args::Baseline::Mmap) => match run_side(Side::Mmap, smoe.ring_slots as u32)? {
            SideReport::Mmap(m) => Some(m),
            SideReport::Smoe(_) => return Err(wrong_side("mmap")),
        },
        None => None,
    };
    Ok((smoe, mmap))
}

fn wrong_side(wanted: &str) -> Failure {
    Failure::Message(format!(
        "the {wanted} side of the comparison reported the other side"
    ))
}

/// Runs one side in this process.
fn side_here(side: Side, replay: &Replay, ring_slots: u32) -> Result<SideReport, Failure> {
    let args = replay.args;
    let vault = Vault::open(&replay.vault_path)?;
    let tokens = replay.tokens.len() as u64;
    match side {
        Side::Smoe => {
            // A capped side's ring fills 90% of the cap on purpose: a fixed
            // ring, or the elastic one would shrink it and the comparison
            // with mmap would measure a smaller ring.
            let opts = args.decode_options(
                tokens as u32,
                ring_slots,
                replay.top_k.value,
                Some(replay.tokens.clone()),
                args.cgroup.is_none(),
            );
            let bar = progress::count_bar(tokens, "replay", args.json);
            let r = decode(vault, &opts, &mut warning_line, &mut |_| bar.inc(1));
            bar.finish_and_clear();
            Ok(SideReport::Smoe(SmoeSide::of_decode(&r?)))
        }
        Side::Mmap => {
            let bar = progress::count_bar(tokens, "mmap", args.json);
            let r = mmap_replay(&vault, &replay.tokens, &mut |_| bar.inc(1));
            bar.finish_and_clear();
            let r = r?;
            Ok(SideReport::Mmap(MmapSide {
                seconds: r.seconds,
                waits_ms: waits_ms(&r.waits),
            }))
        }
    }
}

/// Runs one side as a child process inside a fresh memory cgroup of `cap`
/// bytes, the page cache dropped first. A SIGINT or SIGTERM stops the
/// child, and the cgroup is removed before the error returns.
fn side_capped(
    side: Side,
    replay: &Replay,
    ring_slots: u32,
    parent: &CgroupParent,
    cap: u64,
) -> Result<SideReport, Failure> {
    let args = replay.args;
    let cg = Cgroup::create(parent, side.name(), cap)?;
    drop_page_cache().map_err(Failure::Message)?;
    let exe = std::env::current_exe()
        .map_err(|e| Failure::Message(format!("cannot find this program to run a side: {e}")))?;
    let mut cmd = std::process::Command::new(exe);
    cmd.arg("bench")
        .arg(&args.vault)
        .arg("--trace")
        .arg(args.trace.as_deref().unwrap_or(Path::new("")))
        .args(["--top-k", &replay.top_k.value.to_string()])
        .args(["--ring-slots", &ring_slots.to_string()])
        .args(["--workers", &args.workers.to_string()])
        .args(["--direct", args.direct.name()])
        .args(["--keep", &args.keep.to_string()])
        .args(["--policy", args.policy.name()])
        .args(["--side", side.name()])
        .arg("--cgroup")
        .arg(&cg.path);
    if let Some(n) = args.max_tokens {
        cmd.args(["--max-tokens", &n.to_string()]);
    }
    if args.speculate {
        cmd.arg("--speculate");
    }
    if args.json {
        // The child prints JSON either way; this hides its progress bar too.
        cmd.arg("--json");
    }
    if let (Side::Smoe, Some(capture)) = (side, &args.capture) {
        cmd.arg("--capture").arg(capture);
    }
    if let Some(seed) = args.check_seed {
        cmd.args(["--check-seed", &seed.to_string()]);
    }
    let ran = run_child(&mut cmd);
    let path = cg.path.clone();
    drop(cg);
    let (status, stdout) = match ran {
        Ok(Some(ran)) => ran,
        Ok(None) => {
            let removed = if path.exists() {
                "could not be removed"
            } else {
                "is removed"
            };
            return Err(Failure::Message(format!(
                "interrupted: the capped {} side stopped, and its memory cgroup {} {removed}",
                side.name(),
                path.display()
            )));
        }
        Err(e) => {
            return Err(Failure::Message(format!(
                "cannot run a side of the comparison: {e}"
            )))
        }
    };
    if !status.success() {
        return Err(Failure::Message(format!(
            "the capped {} side failed ({status})",
            side.name(),
        )));
    }
    serde_json::from_slice(&stdout).map_err(|e| {
        Failure::Message(format!(
            "the {} side of the comparison printed no report: {e}",
            side.name()
        ))
    })
}

/// Runs `cmd` (stderr inherited) to its end and returns its status and
/// stdout; or, once a SIGINT or SIGTERM has come ([`interrupt::catch`]),
/// kills it, waits for it and returns `None`, so that its cgroup can go.
fn run_child(
    cmd: &mut std::process::Command,
) -> std::io::Result<Option<(std::process::ExitStatus, Vec<u8>)>> {
    use std::io::Read;
    use std::process::Stdio;
    if interrupt::requested() {
        return Ok(None);
    }
    let mut child = cmd
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()?;
    // Read on a thread of its own, so that a long report never fills the
    // pipe while this one polls.
    let reader = child.stdout.take().map(|mut stdout| {
        std::thread::spawn(move || {
            let mut bytes = Vec::new();
            stdout.read_to_end(&mut bytes).map(|_| bytes)
        })
    });
    let status = loop {
        if interrupt::requested() {
            let _ = child.kill();
            child.wait()?;
            return Ok(None);
        }
        match child.try_wait()? {
            Some(status) => break status,
            None => std::thread::sleep(Duration::from_millis(10)),
        }
    };
    // A Ctrl-C reaches the child too, which may end first.
    if !status.success() && interrupt::requested() {
        return Ok(None);
    }
    let stdout = match reader.map(std::thread::JoinHandle::join) {
        Some(Ok(read)) => read?,
        Some(Err(_)) => {
            return Err(std::io::Error::other(
                "the thread reading its output failed",
            ))
        }
        None => Vec::new(),
    };
    Ok(Some((status, stdout)))
}

/// The replay's result: the smoe side's measurements, the simulated
/// policies at its ring size, the baseline's, and the notes.
fn measure(
    replay: &Replay,
    isolation: Option<&CgroupParent>,
    smoe: &SmoeSide,
    mmap: Option<&MmapSide>,
) -> TraceResult {
    let args = replay.args;
    let ring = smoe.ring_slots as usize;
    let sim = SimRates {
        lru: sim::lru(&replay.seq, ring).rate(),
        belady: sim::belady(&replay.seq, ring).rate(),
    };
    let experts = u64::from(replay.entries);
    let policy = args.policy.name();
    let report = DecodeResult::of_side(smoe, experts, policy, replay.top_k, replay.working_set);
    let isolated = isolation.is_some() && args.mem_cap.is_some();
    let baseline = mmap.map(|m| {
        let (mean, p99) = mean_p99(&m.waits_ms);
        BaselineResult {
            kind: "mmap".to_owned(),
            wait_mean_ms: mean,
            wait_p99_ms: p99,
            seconds: m.seconds,
            vault_bytes: replay.vault_bytes,
            like_for_like: isolated,
        }
    });
    let ratio = baseline
        .as_ref()
        .map(|b| report.wait_mean_ms / b.wait_mean_ms.max(1e-9));
    TraceResult {
        decode: report,
        mem_cap_bytes: args.mem_cap.as_ref().map(|c| c.bytes),
        isolation: match isolation {
            Some(p) if isolated => p.name().to_owned(),
            _ => "none".to_owned(),
        },
        sim,
        baseline,
        ratio,
    }
}
