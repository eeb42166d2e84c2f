//! The command line of `smoe bench`, its flags grouped under the headings
//! `--help` shows them in.

use std::path::PathBuf;

use clap::{Args, ValueEnum};
use smoe::streamer::MAX_WORKERS;
use smoe::DirectIo;

use crate::flags::{self, PolicyArg, Size};
use crate::stream::DecodeOptions;

/// `--help` headings.
const TRACE: &str = "Trace replay";
const COMPARISON: &str = "Comparison";
const RING: &str = "Ring";
const OUTPUT: &str = "Output";

/// What to stream.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum Mode {
    /// Synthetic decode: top-k experts per layer per token.
    Decode,
    /// Every blob once, in file order (cold throughput).
    Scan,
}

/// The direct-I/O policy, as on the command line.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum Direct {
    /// Direct I/O where the filesystem allows, else buffered with a warning.
    Auto,
    /// Direct I/O or fail.
    Require,
    /// Buffered I/O.
    Off,
}

impl Direct {
    /// The library's setting.
    pub fn direct_io(self) -> DirectIo {
        match self {
            Direct::Auto => DirectIo::Auto,
            Direct::Require => DirectIo::Require,
            Direct::Off => DirectIo::Off,
        }
    }
    /// The name on the command line.
    pub fn name(self) -> &'static str {
        match self {
            Direct::Auto => "auto",
            Direct::Require => "require",
            Direct::Off => "off",
        }
    }
}

/// The baseline to compare with.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum Baseline {
    /// mmap the vault and let the page cache work.
    Mmap,
}

/// One side of a comparison.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum Side {
    /// The streamer.
    Smoe,
    /// The mmap baseline.
    Mmap,
}

impl Side {
    /// The name on the command line.
    pub fn name(self) -> &'static str {
        match self {
            Side::Smoe => "smoe",
            Side::Mmap => "mmap",
        }
    }
}

/// Arguments of `smoe bench`.
#[derive(Debug, Args)]
pub struct BenchArgs {
    /// The vault (its directory or experts.smoe), or a model opened in
    /// place: a GGUF file (the first part of a split one), a safetensors
    /// file, a model directory or its model.safetensors.index.json.
    pub vault: PathBuf,
    /// Decode or scan.
    #[arg(long, value_enum, default_value_t = Mode::Decode)]
    pub mode: Mode,
    /// Tokens of a synthetic decode, at least 1.
    #[arg(long, value_name = "N", default_value_t = 64, allow_negative_numbers = true,
          value_parser = clap::value_parser!(u32).range(1..))]
    pub tokens: u32,
    /// Experts each token claims per layer, from 1 to the vault's n_experts
    /// and, with --trace, to the most ranks a row of the trace names
    /// [default: the vault's metadata top_k; without one 8, or n_experts
    /// when fewer; with --trace at most the trace's ranks].
    #[arg(long, value_name = "K", allow_negative_numbers = true,
          value_parser = clap::value_parser!(u32).range(1..))]
    pub top_k: Option<u32>,
    /// Probability of keeping each of the previous token's experts, from 0
    /// to 1 (the synthetic router).
    #[arg(long, value_name = "P", default_value_t = 0.45, allow_negative_numbers = true,
          value_parser = flags::probability)]
    pub keep: f64,
    /// Payload seed of a synthetic vault (any whole number; `smoe inspect`
    /// shows it): check every streamed byte.
    #[arg(long, value_name = "SEED", allow_negative_numbers = true, value_parser = flags::whole_u64)]
    pub check_seed: Option<u64>,
    /// Also bet on the next layer: speculatively prefetch the experts the
    /// previous token used there.
    #[arg(long)]
    pub speculate: bool,

    /// Replay a routing trace instead of the synthetic router (decode mode):
    /// the first --top-k ranks of each row are demanded. The CSV format is in
    /// docs/format.md §5, shipped with smoe's source.
    #[arg(long, value_name = "FILE", help_heading = TRACE)]
    pub trace: Option<PathBuf>,
    /// With --trace: replay only its first N tokens (at least 1).
    #[arg(long, value_name = "N", allow_negative_numbers = true, help_heading = TRACE,
          value_parser = clap::value_parser!(u32).range(1..))]
    pub max_tokens: Option<u32>,
    /// Decode mode: record every claim and write it to FILE as a routing
    /// trace (docs/format.md §5.3 in smoe's source) when the run ends, for
    /// --trace replays; replaces only a missing file or an earlier trace
    /// (anything else is a warning on stderr, and nothing is recorded), and
    /// never the --trace input, the vault file, its histogram or the --plot
    /// file (refused before the run).
    #[arg(long, value_name = "FILE", help_heading = TRACE)]
    pub capture: Option<PathBuf>,

    /// With --trace: only simulate exact LRU and Belady over ring sizes (5%
    /// to 100% of the experts, and --ring-slots) and print their hit rates;
    /// streams nothing.
    #[arg(long, help_heading = COMPARISON)]
    pub sweep: bool,
    /// With --trace: replay the trace a second way, on a read-only mmap of
    /// the vault reading every byte of each routed expert (of a model, the
    /// windows the library's read path reads), and compare.
    #[arg(long, value_enum, help_heading = COMPARISON)]
    pub baseline: Option<Baseline>,
    /// With --trace: run each side in its own memory cgroup limited to SIZE
    /// (200M, 1.5G, 1536MiB or bytes), page cache dropped before each (root
    /// only); the ring (--ring-slots, or if 0 the largest that fits the cap
    /// with 10% headroom) must fit. Without it mmap may keep the whole vault
    /// in the page cache.
    #[arg(long, value_name = "SIZE", allow_negative_numbers = true, help_heading = COMPARISON,
          value_parser = flags::positive_size)]
    pub mem_cap: Option<Size>,
    /// With --mem-cap but no rights to isolate: run uncapped and warm instead
    /// of refusing.
    #[arg(long, help_heading = COMPARISON)]
    pub no_isolation: bool,

    /// Ring slots: 0 = the library's choice (`smoe budget` shows it), else
    /// at most the vault's entries and, in decode mode, at least the top-k.
    #[arg(long, value_name = "N", default_value_t = 0, allow_negative_numbers = true,
          help_heading = RING, value_parser = clap::value_parser!(u32))]
    pub ring_slots: u32,
    /// I/O workers: 0 = 16, else 1 to 64.
    #[arg(long, value_name = "N", default_value_t = 0, allow_negative_numbers = true,
          help_heading = RING,
          value_parser = clap::value_parser!(u32).range(0..=i64::from(MAX_WORKERS)))]
    pub workers: u32,
    /// Direct-I/O policy.
    #[arg(long, value_enum, default_value_t = Direct::Auto, help_heading = RING)]
    pub direct: Direct,
    /// Eviction policy of the streamer.
    #[arg(long, value_enum, default_value_t = PolicyArg::Lru, help_heading = RING)]
    pub policy: PolicyArg,

    /// With --trace: draw hit rate against ring size (and, with --baseline,
    /// per-token waits) into this SVG file; replaces only a missing file, an
    /// empty one or a plot smoe wrote, anything else (an SVG drawn by
    /// anything else too) is refused before the run.
    #[arg(long, value_name = "FILE.svg", help_heading = OUTPUT)]
    pub plot: Option<PathBuf>,
    /// Print one JSON object (and no progress bars).
    #[arg(long, help_heading = OUTPUT)]
    pub json: bool,

    /// Internal: run only one side (a child process of a capped run) and
    /// print its measurements as JSON.
    #[arg(long, value_enum, hide = true)]
    pub side: Option<Side>,
    /// Internal: the cgroup directory the side enters before it reads.
    #[arg(long, hide = true)]
    pub cgroup: Option<PathBuf>,
}

impl BenchArgs {
    /// The decode this command line asks for: the streamer's settings from
    /// the flags, the router's from `--keep`, the payload check from
    /// `--check-seed`; `elastic` off for a ring sized to a cap on purpose.
    pub fn decode_options(
        &self,
        tokens: u32,
        ring_slots: u32,
        top_k: u32,
        trace: Option<smoe::internals::trace::TraceTokens>,
        elastic: bool,
    ) -> DecodeOptions {
        DecodeOptions {
            tokens,
            ring_slots,
            workers: self.workers,
            direct_io: self.direct.direct_io(),
            top_k,
            keep: self.keep,
            router_seed: 42,
            speculate: self.speculate,
            payload_seed: self.check_seed,
            trace,
            read_all: true,
            policy: self.policy.policy(),
            capture: self.capture.clone(),
            elastic,
        }
    }
}
