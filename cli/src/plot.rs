//! `smoe bench --plot FILE.svg`: (a) simulated hit rate against ring size
//! for LRU, Belady and the policy in use, with the measured point marked;
//! (b) per-token wait, smoe against mmap, when the baseline ran.

use std::path::Path;

use plotters::prelude::*;

use crate::output::Failure;

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

/// Writes the SVG to `path`.
pub fn write(path: &Path, d: &PlotData) -> Result<(), Failure> {
    let height = if d.waits.is_some() { 960 } else { 480 };
    let root = SVGBackend::new(path, (900, height)).into_drawing_area();
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
