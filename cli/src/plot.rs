//! `smoe bench --plot FILE.svg`: (a) simulated hit rate against ring size
//! for LRU, Belady and the policy in use, with the measured point marked;
//! (b) per-token wait, smoe against mmap, when the baseline ran.
//!
//! The plot never replaces a file that is not one: [`PlotTarget::judge`]
//! accepts only a missing file, an empty one or an SVG (by its first bytes,
//! a regular file; a symbolic link is followed), before the run, and
//! [`write`] checks again just before it renames its temporary file over
//! the target. The judging and the atomic save are the library's, the ones
//! its histogram and trace files follow.

use std::cell::RefCell;
use std::io::Write;
use std::path::{Path, PathBuf};

use plotters::prelude::*;
use smoe::internals::files::{
    examine_file, file_id, judge_target, remove_leftover_temp_files, save_checked, vault_file_key,
    FileId, Found, Target,
};

use crate::output::Failure;

/// Bytes of an existing file read to tell whether it is an SVG.
const HEAD_BYTES: usize = 4096;

/// Where the plot goes, judged before the run.
#[derive(Debug)]
pub struct PlotTarget {
    /// The path as given, for messages.
    given: PathBuf,
    /// The file written (a symbolic link at `given` followed).
    path: PathBuf,
    /// The identity of the SVG found there at judging, if any.
    seen: Option<FileId>,
    /// The vault file, never replaced.
    vault_file: Option<(PathBuf, FileId)>,
}

impl PlotTarget {
    /// Judges `given`: a missing file, an empty regular file or an SVG may
    /// be replaced; anything else (the vault, a trace, a directory, a FIFO,
    /// a device, a link to one of these or a dangling link) is a usage
    /// error naming it (exit 2), and a directory where no file can be
    /// created is an error (exit 1). `vault_file` is the vault's
    /// `experts.smoe`.
    pub fn judge(given: &Path, vault_file: &Path) -> Result<PlotTarget, Failure> {
        let vault_file = vault_file_key(vault_file);
        let examine = |path: &Path| examine_plot(path, vault_file.as_ref());
        match judge_target(given, examine) {
            Target::Writable { path, seen } => {
                remove_leftover_temp_files(&path);
                Ok(PlotTarget {
                    given: given.to_path_buf(),
                    path,
                    seen,
                    vault_file,
                })
            }
            Target::Foreign(what) => Err(Failure::Usage(refused(given, &what))),
            Target::ReadOnly { path, error, .. } => Err(Failure::Message(format!(
                "--plot {}: cannot write there ({error})",
                path.display()
            ))),
        }
    }

    /// The file the plot will replace or create (links followed).
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Whether the file at the target is still one the plot may replace:
    /// the file judged before the run, or again a missing file, an empty
    /// one or an SVG; else what is there.
    fn recheck(&self) -> Result<(), String> {
        if let (Some(seen), Ok(m)) = (self.seen, std::fs::symlink_metadata(&self.path)) {
            if m.file_type().is_file() && file_id(&m) == seen {
                return Ok(());
            }
        }
        match examine_plot(&self.path, self.vault_file.as_ref()) {
            Found::Nothing | Found::Ours(_) => Ok(()),
            Found::Foreign(what) => Err(what),
        }
    }
}

/// Why a plot target that is not an SVG is refused, in one line.
fn refused(given: &Path, what: &str) -> String {
    format!(
        "--plot {}: {what}; the plot replaces only an SVG file or a missing one, so nothing \
         was written",
        given.display()
    )
}

/// What is at `path` for the plot: nothing, a regular file that is empty or
/// an SVG (ours), or anything else (foreign, saying what).
fn examine_plot(path: &Path, vault_file: Option<&(PathBuf, FileId)>) -> Found {
    examine_file(path, vault_file, HEAD_BYTES, |head| {
        if head.is_empty() || is_svg(head) {
            return None;
        }
        let line = head.split(|&b| b == b'\n').next().unwrap_or_default();
        let shown: String = String::from_utf8_lossy(&line[..line.len().min(40)]).into();
        Some(format!("is not an SVG file (it begins {shown:?})"))
    })
}

/// Whether `head`, a file's first bytes, is an SVG's: after an optional
/// UTF-8 byte order mark and white space, an XML declaration, a DOCTYPE or
/// a comment, or the `<svg` element itself; and `<svg` within these bytes.
fn is_svg(head: &[u8]) -> bool {
    let head = head.strip_prefix(b"\xef\xbb\xbf").unwrap_or(head);
    let start = head.trim_ascii_start();
    let prolog = [&b"<?xml"[..], b"<!DOCTYPE svg", b"<!--", b"<svg"]
        .iter()
        .any(|p| start.starts_with(p));
    prolog && head.windows(4).any(|w| w == b"<svg")
}

/// Draws a chart's legend in its upper left corner (the same for both
/// panels).
macro_rules! draw_legend {
    ($chart:expr) => {
        $chart
            .configure_series_labels()
            .position(SeriesLabelPosition::UpperLeft)
            .background_style(WHITE.mix(0.8))
            .border_style(BLACK)
            .draw()
            .map_err(err)?
    };
}

/// What to draw.
pub struct PlotData<'a> {
    /// Experts in the vault (the sweep's 100%).
    pub entries: u32,
    /// Per ring size: (slots, LRU rate, Belady rate), rates in 0..=1.
    pub sweep: &'a [(u32, f64, f64)],
    /// The policy in use; its simulated curve is drawn for LRU only (the
    /// adaptive policy has no simulator: its measured point is shown).
    pub policy: &'a str,
    /// The measured run: (ring slots, coverage in 0..=1).
    pub measured: Option<(u32, f64)>,
    /// Per-token waits in ms: smoe's and mmap's.
    pub waits: Option<(&'a [f64], &'a [f64])>,
}

fn err(e: impl std::fmt::Display) -> Failure {
    Failure::Message(format!("cannot draw the plot: {e}"))
}

/// Draws the plot and writes it to `target` atomically (a temporary file
/// in the same directory, fsync, rename), after checking once more, just
/// before the rename, that the file there may be replaced.
pub fn write(target: &PlotTarget, d: &PlotData) -> Result<(), Failure> {
    let mut svg = String::new();
    draw(&mut svg, d)?;
    let refusal = RefCell::new(None);
    let saved = save_checked(
        &target.path,
        |file| file.write_all(svg.as_bytes()),
        || {
            target.recheck().map_err(|what| {
                let message = refused(&target.given, &format!("{what} (put there during the run)"));
                *refusal.borrow_mut() = Some(message.clone());
                smoe::Error::argument(message)
            })
        },
    );
    match (saved, refusal.into_inner()) {
        (Ok(_), _) => Ok(()),
        (Err(_), Some(message)) => Err(Failure::Usage(message)),
        (Err(e), None) => Err(e.into()),
    }
}

/// Draws the SVG into `svg`.
fn draw(svg: &mut String, d: &PlotData) -> Result<(), Failure> {
    let height = if d.waits.is_some() { 960 } else { 480 };
    let root = SVGBackend::with_string(svg, (900, height)).into_drawing_area();
    root.fill(&WHITE).map_err(err)?;
    let (top, bottom) = if d.waits.is_some() {
        let (a, b) = root.split_vertically(480);
        (a, Some(b))
    } else {
        (root.clone(), None)
    };
    let pct = |slots: u32| 100.0 * f64::from(slots) / f64::from(d.entries.max(1));
    {
        let mut chart = ChartBuilder::on(&top)
            .caption(
                "Hit rate against ring size (simulated, demand claims)",
                ("sans-serif", 20),
            )
            .margin(12)
            .x_label_area_size(40)
            .y_label_area_size(50)
            .build_cartesian_2d(0f64..100f64, 0f64..100f64)
            .map_err(err)?;
        chart
            .configure_mesh()
            .x_desc("ring size, % of the experts")
            .y_desc("hit rate, %")
            .draw()
            .map_err(err)?;
        let lru: Vec<(f64, f64)> = d
            .sweep
            .iter()
            .map(|&(s, l, _)| (pct(s), l * 100.0))
            .collect();
        let bel: Vec<(f64, f64)> = d
            .sweep
            .iter()
            .map(|&(s, _, b)| (pct(s), b * 100.0))
            .collect();
        chart
            .draw_series(LineSeries::new(lru.clone(), BLUE.stroke_width(2)))
            .map_err(err)?
            .label("LRU")
            .legend(|(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], BLUE));
        chart
            .draw_series(LineSeries::new(bel, GREEN.stroke_width(2)))
            .map_err(err)?
            .label("Belady (optimal)")
            .legend(|(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], GREEN));
        if d.policy == "lru" {
            chart
                .draw_series(LineSeries::new(lru, MAGENTA.stroke_width(1)))
                .map_err(err)?
                .label(format!("policy in use ({})", d.policy))
                .legend(|(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], MAGENTA));
        }
        if let Some((slots, coverage)) = d.measured {
            chart
                .draw_series(std::iter::once(Circle::new(
                    (pct(slots), coverage * 100.0),
                    6,
                    RED.filled(),
                )))
                .map_err(err)?
                .label(format!("measured: {slots} slots, {:.1}%", coverage * 100.0))
                .legend(|(x, y)| Circle::new((x + 10, y), 5, RED.filled()));
        }
        draw_legend!(chart);
    }
    if let (Some(area), Some((smoe, mmap))) = (bottom, d.waits) {
        let n = smoe.len().max(mmap.len()).max(1);
        let max = smoe
            .iter()
            .chain(mmap)
            .fold(0f64, |a, &b| a.max(b))
            .max(1e-3)
            * 1.05;
        let mut chart = ChartBuilder::on(&area)
            .caption("Wait per token: smoe against mmap", ("sans-serif", 20))
            .margin(12)
            .x_label_area_size(40)
            .y_label_area_size(60)
            .build_cartesian_2d(0f64..n as f64, 0f64..max)
            .map_err(err)?;
        chart
            .configure_mesh()
            .x_desc("token")
            .y_desc("ms")
            .draw()
            .map_err(err)?;
        for (waits, color, label) in [(smoe, BLUE, "smoe"), (mmap, RED, "mmap")] {
            chart
                .draw_series(LineSeries::new(
                    waits.iter().enumerate().map(|(i, &w)| (i as f64, w)),
                    color.stroke_width(2),
                ))
                .map_err(err)?
                .label(label)
                .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], color));
        }
        draw_legend!(chart);
    }
    root.present().map_err(err)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn data() -> PlotData<'static> {
        PlotData {
            entries: 8,
            sweep: &[(2, 0.25, 0.5), (8, 0.75, 0.75)],
            policy: "lru",
            measured: Some((2, 0.25)),
            waits: None,
        }
    }

    fn names(dir: &Path) -> Vec<String> {
        let mut names: Vec<String> = std::fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        names.sort();
        names
    }

    #[test]
    fn a_file_put_there_during_the_run_is_not_replaced() {
        let dir = tempfile::tempdir().unwrap();
        let vault = dir.path().join("experts.smoe");
        std::fs::write(&vault, b"SMOEVLT1").unwrap();
        let path = dir.path().join("plot.svg");
        let target = PlotTarget::judge(&path, &vault).unwrap();
        std::fs::write(&path, "token,layer,r0\n").unwrap();
        match write(&target, &data()) {
            Err(Failure::Usage(m)) => {
                assert!(m.contains("put there during the run"), "{m}");
                assert!(m.contains("is not an SVG file"), "{m}");
            }
            other => panic!("{other:?}"),
        }
        assert_eq!(std::fs::read_to_string(&path).unwrap(), "token,layer,r0\n");
        assert_eq!(names(dir.path()), ["experts.smoe", "plot.svg"]);
        // An SVG put there meanwhile is replaced, and so is the file judged.
        std::fs::write(&path, "<svg/>").unwrap();
        write(&target, &data()).unwrap();
        let svg = std::fs::read_to_string(&path).unwrap();
        assert!(svg.starts_with("<svg") && svg.contains("Hit rate"));
        let target = PlotTarget::judge(&path, &vault).unwrap();
        write(&target, &data()).unwrap();
        assert_eq!(names(dir.path()), ["experts.smoe", "plot.svg"]);
        // The vault is refused by identity too, whatever its bytes.
        std::fs::write(&vault, "<svg/>").unwrap();
        match PlotTarget::judge(&vault, &vault) {
            Err(Failure::Usage(m)) => assert!(m.contains("is the vault file"), "{m}"),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn svg_is_judged_by_content() {
        for svg in [
            &b"<svg xmlns=\"http://www.w3.org/2000/svg\"/>"[..],
            b"<?xml version=\"1.0\"?>\n<svg>",
            b"\xef\xbb\xbf  \n<?xml version=\"1.0\"?><!DOCTYPE svg PUBLIC \"x\"><svg>",
            b"<!-- drawn by hand -->\n<svg width=\"1\">",
        ] {
            assert!(is_svg(svg), "{}", String::from_utf8_lossy(svg));
        }
        for other in [
            &b"token,layer,r0\n<svg>"[..],
            b"<?xml version=\"1.0\"?><plist>",
            b"<html><svg>",
            b"SMOEVLT1",
            b"",
        ] {
            assert!(!is_svg(other), "{}", String::from_utf8_lossy(other));
        }
    }
}
