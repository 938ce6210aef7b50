//! Reward curves as one SVG (`treegrpo plot`, and `reward.svg` after `treegrpo train`):
//! training reward and eval reward against cumulative computed tokens, one colour per
//! run, with a legend. Plain data in, a string out; drawn with `plotters`.

use plotters::coord::types::RangedCoordf64;
use plotters::drawing::DrawingAreaErrorKind;
use plotters::prelude::*;

/// One run's curves. Points are (cumulative computed tokens, reward).
#[derive(Debug, Clone, PartialEq)]
pub struct RewardSeries {
    /// The run's name in the legend.
    pub label: String,
    /// Mean reward of each step's rollouts.
    pub reward: Vec<(f64, f64)>,
    /// Greedy eval reward where evaluated.
    pub eval: Vec<(f64, f64)>,
}

/// A chart that could not be drawn; plotters' error (of the SVG backend, which writes
/// through `std::io`) is the source.
#[derive(Debug, thiserror::Error)]
#[error("cannot draw the chart")]
pub struct PlotError(#[from] pub DrawingAreaErrorKind<std::io::Error>);

/// The run colours, in order (plotters' palette, readable on white).
fn colour(i: usize) -> RGBColor {
    let p = Palette99::pick(i).to_rgba();
    RGBColor(p.0, p.1, p.2)
}

/// Width of the legend column right of the chart, in pixels.
const LEGEND_W: u32 = 240;

/// The chart of `series`, `width` × `height` pixels: the curves on the left, a legend
/// column on the right (so it never hides a curve, however many runs there are).
pub fn reward_svg(series: &[RewardSeries], width: u32, height: u32) -> Result<String, PlotError> {
    let all = series.iter().flat_map(|s| s.reward.iter().chain(&s.eval));
    let x_max = all.clone().map(|p| p.0).fold(0.0f64, f64::max).max(1.0);
    let y_max = all.map(|p| p.1).fold(0.0f64, f64::max).max(0.05) * 1.1;
    let mut svg = String::new();
    {
        let root = SVGBackend::with_string(&mut svg, (width, height)).into_drawing_area();
        root.fill(&WHITE)?;
        let (plot_area, legend_area) = root.split_horizontally(width.saturating_sub(LEGEND_W));
        let title = ("reward vs tokens computed", 20);
        let mut chart = token_axes(&plot_area, title, "mean reward", x_max, y_max)?;
        for (i, s) in series.iter().enumerate() {
            let c = colour(i);
            chart.draw_series(LineSeries::new(s.reward.iter().copied(), c.stroke_width(2)))?;
            chart.draw_series(LineSeries::new(s.eval.iter().copied(), c.stroke_width(1)))?;
            chart.draw_series(s.eval.iter().map(|&p| Circle::new(p, 4, c.filled())))?;
        }
        draw_legend(&legend_area, series)?;
        root.present()?;
    }
    Ok(svg)
}

/// The axes every chart here shares: cumulative computed tokens (in thousands)
/// across, `y_desc` up from 0 to `y_max`, `title` (text, font size) above.
fn token_axes<'a, 'b>(
    area: &'a DrawingArea<SVGBackend<'b>, plotters::coord::Shift>,
    title: (&str, u32),
    y_desc: &str,
    x_max: f64,
    y_max: f64,
) -> Result<ChartContext<'a, SVGBackend<'b>, Cartesian2d<RangedCoordf64, RangedCoordf64>>, PlotError>
{
    let mut chart = ChartBuilder::on(area)
        .caption(title.0, ("sans-serif", title.1))
        .margin(12)
        .x_label_area_size(40)
        .y_label_area_size(52)
        .build_cartesian_2d(0.0..x_max * 1.02, 0.0..y_max)?;
    chart
        .configure_mesh()
        .x_desc("cumulative tokens computed (rollouts)")
        .y_desc(y_desc)
        .x_label_formatter(&|x| format!("{:.0}k", x / 1000.0))
        .draw()?;
    Ok(chart)
}

/// One legend row per run: its colour as the rollout line and the eval dot, its label.
fn draw_legend<DB: DrawingBackend<ErrorType = std::io::Error>>(
    area: &DrawingArea<DB, plotters::coord::Shift>,
    series: &[RewardSeries],
) -> Result<(), PlotError> {
    let text = ("sans-serif", 13).into_font();
    area.draw(&Text::new(
        "line: rollouts (T as sampled)",
        (8, 44),
        text.clone(),
    ))?;
    area.draw(&Text::new("dot: eval (greedy)", (8, 62), text.clone()))?;
    for (i, s) in series.iter().enumerate() {
        let c = colour(i);
        let y = 92 + 22 * i as i32;
        area.draw(&PathElement::new(vec![(8, y), (30, y)], c.stroke_width(2)))?;
        area.draw(&Circle::new((19, y), 4, c.filled()))?;
        area.draw(&Text::new(s.label.clone(), (38, y - 7), text.clone()))?;
    }
    Ok(())
}

/// One arm of a comparison: its mean curve over seeds and the band from the lowest to
/// the highest seed. Points are (cumulative computed tokens, reward).
#[derive(Debug, Clone, PartialEq)]
pub struct Band {
    /// The arm's name in the legend.
    pub label: String,
    /// Mean over seeds.
    pub mean: Vec<(f64, f64)>,
    /// Lowest seed at each point.
    pub low: Vec<(f64, f64)>,
    /// Highest seed at each point.
    pub high: Vec<(f64, f64)>,
}

/// The chart of a comparison (`treegrpo compare`'s `eval.svg`): each band's mean as a
/// line with dots, its min–max spread shaded, a legend on the right.
pub fn bands_svg(
    title: &str,
    bands: &[Band],
    width: u32,
    height: u32,
) -> Result<String, PlotError> {
    let all = bands.iter().flat_map(|b| b.mean.iter().chain(&b.high));
    let x_max = all.clone().map(|p| p.0).fold(0.0f64, f64::max).max(1.0);
    let y_max = all.map(|p| p.1).fold(0.0f64, f64::max).max(0.05) * 1.1;
    let mut svg = String::new();
    {
        let root = SVGBackend::with_string(&mut svg, (width, height)).into_drawing_area();
        root.fill(&WHITE)?;
        let (plot_area, legend_area) = root.split_horizontally(width.saturating_sub(LEGEND_W));
        let y_desc = "eval reward (mean over seeds)";
        let mut chart = token_axes(&plot_area, (title, 18), y_desc, x_max, y_max)?;
        for (i, b) in bands.iter().enumerate() {
            let c = colour(i);
            // The band: the high edge forward, the low edge back.
            let outline: Vec<(f64, f64)> = b
                .high
                .iter()
                .copied()
                .chain(b.low.iter().rev().copied())
                .collect();
            if b.high != b.low {
                chart.draw_series(std::iter::once(Polygon::new(outline, c.mix(0.15).filled())))?;
            }
            chart.draw_series(LineSeries::new(b.mean.iter().copied(), c.stroke_width(2)))?;
            chart.draw_series(b.mean.iter().map(|&p| Circle::new(p, 3, c.filled())))?;
        }
        let text = ("sans-serif", 13).into_font();
        legend_area.draw(&Text::new("line: mean over seeds", (8, 44), text.clone()))?;
        legend_area.draw(&Text::new("shade: min–max of seeds", (8, 62), text.clone()))?;
        for (i, b) in bands.iter().enumerate() {
            let c = colour(i);
            let y = 92 + 22 * i as i32;
            legend_area.draw(&PathElement::new(vec![(8, y), (30, y)], c.stroke_width(2)))?;
            legend_area.draw(&Text::new(b.label.clone(), (38, y - 7), text.clone()))?;
        }
        root.present()?;
    }
    Ok(svg)
}
