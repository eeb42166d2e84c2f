//! Progress bars on stderr, shown only when stderr is a terminal (so that
//! logs, pipes and tests see none of their control sequences) and, for a
//! command that prints JSON, not with `--json`.

use std::io::IsTerminal;

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};

/// What a bar counts.
#[derive(Clone, Copy, Debug)]
pub enum Unit {
    /// Bytes, with a byte rate.
    Bytes,
    /// Items (tokens, ring sizes), with an item rate.
    Items,
}

/// A bar of `total` `unit`s labelled `label`: hidden when `quiet` or when
/// stderr is not a terminal.
pub fn bar(total: u64, label: &str, unit: Unit, quiet: bool) -> ProgressBar {
    if quiet || !std::io::stderr().is_terminal() {
        return ProgressBar::hidden();
    }
    let bar = ProgressBar::with_draw_target(Some(total), ProgressDrawTarget::stderr());
    let template = match unit {
        Unit::Bytes => {
            "{prefix:>8} [{bar:40}] {bytes}/{total_bytes} {binary_bytes_per_sec} eta {eta}"
        }
        Unit::Items => "{prefix:>8} [{bar:40}] {pos}/{len} {per_sec} eta {eta}",
    };
    // The templates are constants; if indicatif ever rejects one, keep its
    // default style.
    if let Ok(style) = ProgressStyle::with_template(template) {
        bar.set_style(style.progress_chars("=> "));
    }
    bar.set_prefix(label.to_owned());
    bar
}

/// A byte-counting bar of `total` bytes labelled `label`, hidden unless
/// stderr is a terminal.
pub fn bytes_bar(total: u64, label: &str) -> ProgressBar {
    bar(total, label, Unit::Bytes, false)
}

/// A bar counting `total` items (tokens) labelled `label`, hidden when
/// `quiet` or unless stderr is a terminal.
pub fn count_bar(total: u64, label: &str, quiet: bool) -> ProgressBar {
    bar(total, label, Unit::Items, quiet)
}
