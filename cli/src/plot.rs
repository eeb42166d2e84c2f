//! `smoe bench --plot FILE.svg`: (a) simulated hit rate against ring size,
//! exact LRU and Belady's optimum (the limit no policy passes), with one
//! token's working set marked and this run's measured points labelled;
//! (b) per-token wait, smoe against mmap, when the baseline ran.
//!
//! The plot never replaces a file that is not an earlier plot of its own:
//! every SVG it writes begins with its mark ([`MARK`]), and
//! [`PlotTarget::judge`] accepts only a missing file, an empty one or a
//! regular file that begins with that mark (a symbolic link is followed),
//! before the run; [`write`] checks again just before it renames its
//! temporary file over the target. An SVG drawn by anything else, or a web
//! page holding one inline, is the user's. The judging and the atomic save
//! are the library's, the ones its histogram and trace files follow.

use std::cell::RefCell;
use std::io::Write;
use std::path::{Path, PathBuf};

use plotters::prelude::*;
use smoe::internals::files::{
    examine_file, file_id, judge_target, remove_leftover_temp_files, save_checked, vault_file_key,
    FileId, Found, Target,
};

use crate::output::{human_bytes, Failure};
use crate::replay::WorkingSet;

/// How every plot smoe writes begins: its root element carries
/// `data-generator="smoe bench"` first. Only a file that begins so is
/// replaced.
const MARK: &str = "<svg data-generator=\"smoe bench\" ";

/// Bytes of an existing file read to judge it: the mark, and the start of
/// the line a refusal quotes.
const HEAD_BYTES: usize = 256;

/// Where the plot goes, judged before the run.
#[derive(Debug)]
pub struct PlotTarget {
    /// The path as given, for messages.
    given: PathBuf,
    /// The file written (a symbolic link at `given` followed).
    path: PathBuf,
    /// The identity of the earlier plot found there at judging, if any.
    seen: Option<FileId>,
    /// The vault file, never replaced.
    vault_file: Option<(PathBuf, FileId)>,
}

impl PlotTarget {
    /// Judges `given`: a missing file, an empty regular file or a plot smoe
    /// wrote (it begins with [`MARK`]) may be replaced; anything else (the
    /// vault, a trace, an SVG drawn by anything else, a web page, a
    /// directory, a FIFO, a device, a link to one of these or a dangling
    /// link) is a usage error naming it (exit 2), and a directory where no
    /// file can be created is an error (exit 1). `vault_file` is the vault's
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

    /// Whether the file at the target is still one the plot may replace:
    /// the file judged before the run, or again a missing file, an empty
    /// one or a plot smoe wrote; else what is there.
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

/// Why a plot target that is not an earlier plot is refused, in one line.
fn refused(given: &Path, what: &str) -> String {
    format!(
        "--plot {}: {what}; the plot replaces only a plot smoe wrote, an empty file or a \
         missing one, so nothing was written",
        given.display()
    )
}

/// What is at `path` for the plot: nothing, a regular file that is empty or
/// begins with [`MARK`] (ours), or anything else (foreign, saying what).
fn examine_plot(path: &Path, vault_file: Option<&(PathBuf, FileId)>) -> Found {
    examine_file(path, vault_file, HEAD_BYTES, |head| {
        if head.is_empty() || head.starts_with(MARK.as_bytes()) {
            return None;
        }
        let line = head.split(|&b| b == b'\n').next().unwrap_or_default();
        let shown: String = String::from_utf8_lossy(&line[..line.len().min(40)]).into();
        Some(format!("is not a plot smoe wrote (it begins {shown:?})"))
    })
}

/// `svg`, as plotters draws it (`<svg width=...`), with [`MARK`] in place
/// of its first `<svg `.
fn mark(svg: &str) -> Result<String, Failure> {
    match svg.strip_prefix("<svg ") {
        Some(rest) => Ok(format!("{MARK}{rest}")),
        None => Err(err("the drawing does not begin with `<svg `")),
    }
}

/// One point measured by this run: a policy's coverage at a ring size.
#[derive(Clone, Debug)]
pub struct Measured {
    /// The policy's name.
    pub policy: String,
    /// Ring slots.
    pub slots: u32,
    /// Coverage, 0..=1.
    pub rate: f64,
}

/// Per-token waits of a comparison, in ms.
pub struct Waits<'a> {
    /// smoe's.
    pub smoe: &'a [f64],
    /// mmap's.
    pub mmap: &'a [f64],
    /// What memory each side had, in words.
    pub memory: String,
}

/// What to draw.
pub struct PlotData<'a> {
    /// The trace's file name.
    pub trace_name: &'a str,
    /// The vault's directory name.
    pub vault_name: &'a str,
    /// Tokens of the trace.
    pub tokens: u64,
    /// Demand claims simulated.
    pub claims: u64,
    /// Experts in the vault (the sweep's 100%).
    pub entries: u32,
    /// Bytes per ring slot (the second axis' unit).
    pub slot_bytes: u64,
    /// The top-k and where it came from, in words.
    pub top_k: String,
    /// One token's working set: where LRU falls off its cliff.
    pub working_set: WorkingSet,
    /// Per ring size: (slots, LRU rate, Belady rate), rates in 0..=1.
    pub sweep: Vec<(u32, f64, f64)>,
    /// This run's measured points (none for a sweep).
    pub measured: Vec<Measured>,
    /// Per-token waits, when the baseline ran.
    pub waits: Option<Waits<'a>>,
}

fn err(e: impl std::fmt::Display) -> Failure {
    Failure::Message(format!("cannot draw the plot: {e}"))
}

/// Draws the plot, marks it as smoe's ([`MARK`]) and writes it to `target`
/// atomically (a temporary file in the same directory, fsync, rename),
/// after checking once more, just before the rename, that the file there
/// may be replaced.
pub fn write(target: &PlotTarget, d: &PlotData) -> Result<(), Failure> {
    let mut drawn = String::new();
    draw(&mut drawn, d)?;
    let svg = mark(&drawn)?;
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

/// The colours: muted, distinguishable, printable in grey.
const LRU_COLOUR: RGBColor = RGBColor(76, 114, 176);
const BELADY_COLOUR: RGBColor = RGBColor(64, 64, 64);
const MEASURED_COLOUR: RGBColor = RGBColor(196, 78, 82);
const WORKING_SET_COLOUR: RGBColor = RGBColor(85, 168, 104);
const MMAP_COLOUR: RGBColor = RGBColor(221, 132, 82);
/// The font of every text.
const FONT: &str = "sans-serif";

/// A tick label as people write numbers: `100`, not `100.0`; `0.25`, not
/// `0.250`.
pub fn tick(v: f64) -> String {
    if (v - v.round()).abs() < 1e-9 * v.abs().max(1.0) {
        return format!("{:.0}", v.round());
    }
    let fixed = if v.abs() >= 1.0 {
        format!("{v:.2}")
    } else {
        format!("{v:.4}")
    };
    fixed.trim_end_matches('0').trim_end_matches('.').to_owned()
}

/// A legend label, padded with an em space: plotters sizes the legend box
/// from a crude estimate of the text's width (the SVG backend cannot know
/// the viewer's font), which a wide sans face such as DejaVu Sans passes,
/// so the box would clip the label's last letters.
fn legend_label(text: impl std::fmt::Display) -> String {
    format!("{text}\u{2003}")
}

/// A legend's line sample.
fn line_sample(colour: RGBColor, width: u32) -> impl Fn((i32, i32)) -> PathElement<(i32, i32)> {
    move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], colour.stroke_width(width))
}

/// The hit-rate panel's legend and the waits panel's: a white box where
/// the curves leave room.
macro_rules! draw_legend {
    ($chart:expr, $position:expr) => {
        $chart
            .configure_series_labels()
            .position($position)
            .label_font((FONT, 14))
            .background_style(WHITE.mix(0.9))
            .border_style(BLACK.mix(0.3))
            .draw()
            .map_err(err)?
    };
}

/// Draws the SVG into `svg`: the hit rate against ring size (titled with
/// the trace and the vault), and below it, when the baseline ran, the wait
/// per token of both sides.
fn draw(svg: &mut String, d: &PlotData) -> Result<(), Failure> {
    let (width, top_height) = (960u32, 560u32);
    let height = if d.waits.is_some() {
        top_height + 420
    } else {
        top_height
    };
    let root = SVGBackend::with_string(svg, (width, height)).into_drawing_area();
    root.fill(&WHITE).map_err(err)?;
    let (top, bottom) = if d.waits.is_some() {
        let (a, b) = root.split_vertically(top_height);
        (a, Some(b))
    } else {
        (root.clone(), None)
    };
    let (header, body) = top.split_vertically(58);
    header
        .draw(&Text::new(
            format!(
                "Hit rate against ring size: trace {}, vault {}",
                d.trace_name, d.vault_name
            ),
            (16, 10),
            (FONT, 20).into_font().style(FontStyle::Bold),
        ))
        .map_err(err)?;
    header
        .draw(&Text::new(
            format!(
                "{} tokens, {} demand claims, {}; curves simulated over one ring shared by all {} experts",
                d.tokens, d.claims, d.top_k, d.entries
            ),
            (16, 36),
            (FONT, 14).into_font().color(&BLACK.mix(0.7)),
        ))
        .map_err(err)?;
    draw_hit_rates(&body, d)?;
    if let (Some(area), Some(waits)) = (bottom, &d.waits) {
        let slots = d.measured.first().map_or(0, |m| m.slots);
        draw_waits(&area, waits, slots)?;
    }
    root.present().map_err(err)?;
    Ok(())
}

/// The hit-rate panel: x in % of the experts (slots on the top axis), LRU
/// and Belady's curves, the region above Belady shaded as out of reach, a
/// dashed line at one token's working set, the measured points labelled.
fn draw_hit_rates<DB: DrawingBackend>(
    area: &DrawingArea<DB, plotters::coord::Shift>,
    d: &PlotData,
) -> Result<(), Failure>
where
    DB::ErrorType: 'static,
{
    let entries = f64::from(d.entries.max(1));
    let pct = |slots: u32| 100.0 * f64::from(slots) / entries;
    let mut chart = ChartBuilder::on(area)
        .margin_left(12)
        .margin_right(28)
        .margin_bottom(8)
        .x_label_area_size(44)
        .top_x_label_area_size(44)
        .y_label_area_size(56)
        .build_cartesian_2d(0f64..100f64, 0f64..100f64)
        .map_err(err)?
        .set_secondary_coord(0f64..entries, 0f64..100f64);
    chart
        .configure_mesh()
        .light_line_style(TRANSPARENT)
        .bold_line_style(BLACK.mix(0.08))
        .axis_style(BLACK.mix(0.5))
        .label_style((FONT, 13))
        .axis_desc_style((FONT, 14))
        .x_labels(11)
        .y_labels(11)
        .x_label_formatter(&|v| tick(*v))
        .y_label_formatter(&|v| tick(*v))
        .x_desc(format!("ring size, % of the vault's {} experts", d.entries))
        .y_desc("hit rate, % of demand claims")
        .draw()
        .map_err(err)?;
    chart
        .configure_secondary_axes()
        .axis_style(BLACK.mix(0.5))
        .label_style((FONT, 13))
        .axis_desc_style((FONT, 14))
        .x_labels(9)
        .x_label_formatter(&|v| tick(*v))
        .x_desc(format!(
            "ring slots of {} ({} for all {})",
            human_bytes(d.slot_bytes),
            human_bytes(d.slot_bytes * u64::from(d.entries)),
            d.entries
        ))
        .draw()
        .map_err(err)?;
    // Both curves start at the origin: a ring of no slots hits nothing.
    let curve = |rate: fn(&(u32, f64, f64)) -> f64| -> Vec<(f64, f64)> {
        std::iter::once((0.0, 0.0))
            .chain(d.sweep.iter().map(|p| (pct(p.0), rate(p) * 100.0)))
            .collect()
    };
    let belady = curve(|p| p.2);
    let lru = curve(|p| p.1);
    // Out of reach: above Belady's optimum.
    if let Some(last) = belady.last() {
        let mut region = vec![(0.0, 100.0), (last.0, 100.0)];
        region.extend(belady.iter().rev().copied());
        let shade = BLACK.mix(0.06);
        chart
            .draw_series(std::iter::once(Polygon::new(region, shade.filled())))
            .map_err(err)?
            .label(legend_label("above Belady: out of any policy's reach"))
            .legend(move |(x, y)| Rectangle::new([(x, y - 6), (x + 20, y + 6)], shade.filled()));
    }
    chart
        .draw_series(LineSeries::new(belady, BELADY_COLOUR.stroke_width(2)))
        .map_err(err)?
        .label(legend_label("Belady's optimum (the limit)"))
        .legend(line_sample(BELADY_COLOUR, 2));
    chart
        .draw_series(LineSeries::new(lru, LRU_COLOUR.stroke_width(2)))
        .map_err(err)?
        .label(legend_label("LRU"))
        .legend(line_sample(LRU_COLOUR, 2));
    let ws = d.working_set.experts();
    if ws > 0 && ws <= u64::from(d.entries) {
        let x = pct(ws as u32);
        let style = WORKING_SET_COLOUR.stroke_width(2);
        chart
            .draw_series(DashedLineSeries::new([(x, 0.0), (x, 100.0)], 6, 4, style))
            .map_err(err)?
            .label(legend_label(format_args!(
                "one token's working set: {}",
                d.working_set
            )))
            .legend(move |(x, y)| {
                plotters::element::DashedPathElement::new(vec![(x, y), (x + 20, y)], 6, 4, style)
            });
    }
    if !d.measured.is_empty() {
        let policies: Vec<&str> = d.measured.iter().map(|m| m.policy.as_str()).collect();
        chart
            .draw_series(d.measured.iter().map(|m| {
                let at = (pct(m.slots), m.rate * 100.0);
                EmptyElement::at(at)
                    + Circle::new((0, 0), 6, MEASURED_COLOUR.filled())
                    + Text::new(
                        format!("{} slots: {:.1}%", m.slots, m.rate * 100.0),
                        (14, -24),
                        (FONT, 14).into_font().color(&MEASURED_COLOUR),
                    )
            }))
            .map_err(err)?
            .label(legend_label(format_args!(
                "measured by this run ({})",
                policies.join(", ")
            )))
            .legend(|(x, y)| Circle::new((x + 10, y), 5, MEASURED_COLOUR.filled()));
    }
    draw_legend!(chart, SeriesLabelPosition::LowerRight);
    Ok(())
}

/// The waits panel: per token, smoe's wait and mmap's, on a log scale (an
/// uncapped mmap waits microseconds, a cold one hundreds of ms).
fn draw_waits<DB: DrawingBackend>(
    area: &DrawingArea<DB, plotters::coord::Shift>,
    w: &Waits,
    slots: u32,
) -> Result<(), Failure>
where
    DB::ErrorType: 'static,
{
    let n = w.smoe.len().max(w.mmap.len()).max(1);
    let positive = w.smoe.iter().chain(w.mmap).copied().filter(|&x| x > 0.0);
    let lo = positive.clone().fold(f64::INFINITY, f64::min);
    let hi = positive.fold(0f64, f64::max);
    let (lo, hi) = if lo.is_finite() && hi > lo {
        (lo / 1.5, hi * 1.5)
    } else {
        (1e-3, 1.0)
    };
    let mut chart = ChartBuilder::on(area)
        .caption(
            format!(
                "Wait per token: smoe ({slots} slots) against mmap ({})",
                w.memory
            ),
            (FONT, 18),
        )
        .margin_left(12)
        .margin_right(28)
        .margin_bottom(8)
        .x_label_area_size(44)
        .y_label_area_size(64)
        .build_cartesian_2d(0f64..n as f64, (lo..hi).log_scale())
        .map_err(err)?;
    chart
        .configure_mesh()
        .light_line_style(TRANSPARENT)
        .bold_line_style(BLACK.mix(0.08))
        .axis_style(BLACK.mix(0.5))
        .label_style((FONT, 13))
        .axis_desc_style((FONT, 14))
        .x_label_formatter(&|v| tick(*v))
        .y_label_formatter(&|v| tick(*v))
        .x_desc("token")
        .y_desc("wait, ms (log scale)")
        .draw()
        .map_err(err)?;
    let smoe_label = format!("smoe, {slots} slots");
    let mmap_label = "mmap, page cache".to_owned();
    for (waits, colour, label) in [
        (w.smoe, LRU_COLOUR, smoe_label),
        (w.mmap, MMAP_COLOUR, mmap_label),
    ] {
        chart
            .draw_series(LineSeries::new(
                waits
                    .iter()
                    .enumerate()
                    .map(|(i, &ms)| (i as f64, ms.max(lo))),
                colour.stroke_width(1),
            ))
            .map_err(err)?
            .label(legend_label(label))
            .legend(line_sample(colour, 2));
    }
    draw_legend!(chart, SeriesLabelPosition::UpperRight);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn data() -> PlotData<'static> {
        PlotData {
            trace_name: "t.csv",
            vault_name: "v",
            tokens: 2,
            claims: 8,
            entries: 8,
            slot_bytes: 16384,
            top_k: "top-2 (from --top-k)".to_owned(),
            working_set: WorkingSet {
                layers: 2,
                top_k: 2,
            },
            sweep: vec![(2, 0.25, 0.5), (8, 0.75, 0.75)],
            measured: vec![Measured {
                policy: "lru".to_owned(),
                slots: 2,
                rate: 0.25,
            }],
            waits: None,
        }
    }

    #[test]
    fn ticks_have_no_pointless_decimals() {
        assert_eq!(tick(100.0), "100");
        assert_eq!(tick(0.0), "0");
        assert_eq!(tick(300.0), "300");
        assert_eq!(tick(12.5), "12.5");
        assert_eq!(tick(0.25), "0.25");
        assert_eq!(tick(0.001), "0.001");
        assert_eq!(tick(1e-5), "0");
        assert_eq!(tick(2.999999999999), "3");
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
                assert!(m.contains("is not a plot smoe wrote"), "{m}");
            }
            other => panic!("{other:?}"),
        }
        assert_eq!(std::fs::read_to_string(&path).unwrap(), "token,layer,r0\n");
        assert_eq!(names(dir.path()), ["experts.smoe", "plot.svg"]);
        // So is an SVG drawn by anything else.
        std::fs::write(&path, "<svg/>").unwrap();
        assert!(matches!(write(&target, &data()), Err(Failure::Usage(_))));
        assert_eq!(std::fs::read_to_string(&path).unwrap(), "<svg/>");
        // An earlier plot put there meanwhile is replaced, and so is the
        // file judged.
        std::fs::write(&path, format!("{MARK}/>")).unwrap();
        write(&target, &data()).unwrap();
        let svg = std::fs::read_to_string(&path).unwrap();
        assert!(svg.starts_with(MARK) && svg.contains("Hit rate"));
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
    fn only_a_plot_smoe_wrote_is_ours() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("plot.svg");
        let ours = mark("<svg width=\"1\" height=\"1\"/>").unwrap();
        assert_eq!(ours, format!("{MARK}width=\"1\" height=\"1\"/>"));
        for content in [ours.as_str(), ""] {
            std::fs::write(&path, content).unwrap();
            assert!(
                matches!(examine_plot(&path, None), Found::Ours(_)),
                "{content}"
            );
        }
        for other in [
            "<svg xmlns=\"http://www.w3.org/2000/svg\"/>",
            "<?xml version=\"1.0\"?>\n<svg data-generator=\"smoe bench\" />",
            " <svg data-generator=\"smoe bench\" />",
            "<!-- saved from url=(0014)about:internet -->\n<html><svg/></html>",
            "<html><body><svg data-generator=\"smoe bench\" /></body></html>",
            "token,layer,r0\n",
        ] {
            std::fs::write(&path, other).unwrap();
            match examine_plot(&path, None) {
                Found::Foreign(what) => {
                    assert!(what.contains("is not a plot smoe wrote"), "{what}")
                }
                found => panic!("{other}: {found:?}"),
            }
        }
        assert!(mark("<?xml version=\"1.0\"?>").is_err());
    }
}
