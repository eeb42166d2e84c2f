//! Progress bars, shown only when stderr is a terminal so that logs and
//! tests see none of their control sequences.

use std::io::IsTerminal;

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};

/// A byte-counting bar of `total` bytes labelled `label`, hidden unless
/// stderr is a terminal.
pub fn bytes_bar(total: u64, label: &str) -> ProgressBar {
    if !std::io::stderr().is_terminal() {
        return ProgressBar::hidden();
    }
    let bar = ProgressBar::with_draw_target(Some(total), ProgressDrawTarget::stderr());
    // The template is a constant; if indicatif ever rejects it, keep its default style.
    if let Ok(style) = ProgressStyle::with_template(
        "{prefix:>8} [{bar:40}] {bytes}/{total_bytes} {binary_bytes_per_sec} eta {eta}",
    ) {
        bar.set_style(style.progress_chars("=> "));
    }
    bar.set_prefix(label.to_owned());
    bar
}

/// A bar counting `total` items (tokens) labelled `label`, hidden unless
/// stderr is a terminal.
pub fn count_bar(total: u64, label: &str) -> ProgressBar {
    if !std::io::stderr().is_terminal() {
        return ProgressBar::hidden();
    }
    let bar = ProgressBar::with_draw_target(Some(total), ProgressDrawTarget::stderr());
    if let Ok(style) =
        ProgressStyle::with_template("{prefix:>8} [{bar:40}] {pos}/{len} {per_sec} eta {eta}")
    {
        bar.set_style(style.progress_chars("=> "));
    }
    bar.set_prefix(label.to_owned());
    bar
}
