//! Inline SVG charts, drawn with plotters' SVG backend: a line chart and an interval chart, each
//! with a log-scaled x axis and a linear or log-scaled y axis. What a report's charts show is in
//! `figures`; this module knows nothing of reports.
//!
//! plotters writes one SVG element per drawing call and offers no way to group them, so the
//! backend is wrapped in [`Tagged`], which notes for every element it forwards which data series
//! (if any) was being drawn. Afterwards every element of series `NAME` gets
//! `class="series" data-series="NAME" data-part="PART"`: a test (or a reader's script) finds a
//! series' line as `polyline[data-series="NAME"][data-part="line"]` and counts its points in the
//! `points` attribute; the PPL chart adds its markers (`circle[data-part="mean"]`, one per
//! horizon) and error bars (`polyline[data-part="interval"]`, three per horizon: the bar and
//! its two caps). The legend's swatches are drawn
//! outside any series and carry no tag.
//!
//! No font is loaded: without plotters' `ttf` feature text sizes are estimated and the SVG says
//! `font-family="sans-serif"`, which the browser lays out. The `xmlns` attribute is dropped (an
//! `<svg>` inside HTML needs none), so the page holds no URL at all.

use std::cell::RefCell;
use std::rc::Rc;

use plotters::coord::Shift;
use plotters::coord::ranged1d::ValueFormatter;
use plotters::coord::types::RangedCoordf64;
use plotters::prelude::*;
use plotters_backend::{BackendColor, BackendCoord, BackendTextStyle, DrawingErrorKind};
// `BackendStyle` is named by path only: in scope, its `stroke_width` would clash with `Color`'s.

use crate::ReportError;
use crate::format::{escape_html as escape, plain};

/// Series colours (Tableau 10), in variant order; they repeat after ten variants.
const PALETTE: [RGBColor; 10] = [
    RGBColor(0x4E, 0x79, 0xA7),
    RGBColor(0xF2, 0x8E, 0x2B),
    RGBColor(0xE1, 0x57, 0x59),
    RGBColor(0x59, 0xA1, 0x4F),
    RGBColor(0xB0, 0x7A, 0xA1),
    RGBColor(0x76, 0xB7, 0xB2),
    RGBColor(0xED, 0xC9, 0x48),
    RGBColor(0xFF, 0x9D, 0xA7),
    RGBColor(0x9C, 0x75, 0x5F),
    RGBColor(0xBA, 0xB0, 0xAC),
];

pub(crate) fn color(i: usize) -> RGBColor {
    PALETTE[i % PALETTE.len()]
}

/// Chart size in pixels.
const SIZE: (u32, u32) = (900, 420);

/// Which series each emitted element belongs to, in emission order.
#[derive(Default)]
struct Log {
    current: Option<(usize, &'static str)>,
    elements: Vec<Option<(usize, &'static str)>>,
}

/// plotters' SVG backend, noting the current series of every element it writes.
struct Tagged<'a> {
    inner: SVGBackend<'a>,
    log: Rc<RefCell<Log>>,
}

impl Tagged<'_> {
    /// Notes one element unless the inner backend skips it (it writes nothing for a fully
    /// transparent colour).
    fn note(&self, color: BackendColor) {
        if color.alpha != 0.0 {
            let mut log = self.log.borrow_mut();
            let current = log.current;
            log.elements.push(current);
        }
    }
}

type Result2<E> = Result<(), DrawingErrorKind<E>>;

impl DrawingBackend for Tagged<'_> {
    type ErrorType = std::io::Error;

    fn get_size(&self) -> (u32, u32) {
        self.inner.get_size()
    }
    fn ensure_prepared(&mut self) -> Result2<Self::ErrorType> {
        self.inner.ensure_prepared()
    }
    fn present(&mut self) -> Result2<Self::ErrorType> {
        self.inner.present()
    }
    fn draw_pixel(&mut self, point: BackendCoord, color: BackendColor) -> Result2<Self::ErrorType> {
        self.note(color);
        self.inner.draw_pixel(point, color)
    }
    fn draw_line<S: plotters_backend::BackendStyle>(
        &mut self,
        from: BackendCoord,
        to: BackendCoord,
        style: &S,
    ) -> Result2<Self::ErrorType> {
        self.note(style.color());
        self.inner.draw_line(from, to, style)
    }
    fn draw_rect<S: plotters_backend::BackendStyle>(
        &mut self,
        upper_left: BackendCoord,
        bottom_right: BackendCoord,
        style: &S,
        fill: bool,
    ) -> Result2<Self::ErrorType> {
        self.note(style.color());
        self.inner.draw_rect(upper_left, bottom_right, style, fill)
    }
    fn draw_path<S: plotters_backend::BackendStyle, I: IntoIterator<Item = BackendCoord>>(
        &mut self,
        path: I,
        style: &S,
    ) -> Result2<Self::ErrorType> {
        self.note(style.color());
        self.inner.draw_path(path, style)
    }
    fn draw_circle<S: plotters_backend::BackendStyle>(
        &mut self,
        center: BackendCoord,
        radius: u32,
        style: &S,
        fill: bool,
    ) -> Result2<Self::ErrorType> {
        self.note(style.color());
        self.inner.draw_circle(center, radius, style, fill)
    }
    fn fill_polygon<S: plotters_backend::BackendStyle, I: IntoIterator<Item = BackendCoord>>(
        &mut self,
        vert: I,
        style: &S,
    ) -> Result2<Self::ErrorType> {
        self.note(style.color());
        self.inner.fill_polygon(vert, style)
    }
    fn draw_text<S: BackendTextStyle>(&mut self, text: &str, style: &S, pos: BackendCoord) -> Result2<Self::ErrorType> {
        self.note(style.color());
        self.inner.draw_text(text, style, pos)
    }
    fn estimate_text_size<S: BackendTextStyle>(
        &self,
        text: &str,
        style: &S,
    ) -> Result<(u32, u32), DrawingErrorKind<Self::ErrorType>> {
        self.inner.estimate_text_size(text, style)
    }
}

/// One data series: a name (the variant) and its points (`(x, y)` pairs for a line chart,
/// [`Interval`]s for an interval chart).
pub(crate) struct Series<'a, P> {
    pub name: &'a str,
    pub points: Vec<P>,
}

/// A point estimate with its interval, at `x`.
pub(crate) struct Interval {
    pub x: f64,
    pub mean: f64,
    pub lo: f64,
    pub hi: f64,
}

/// Where the legend goes.
#[derive(Clone, Copy)]
pub(crate) enum Legend {
    UpperLeft,
    UpperRight,
    LowerLeft,
}

impl Legend {
    fn position(self) -> SeriesLabelPosition {
        match self {
            Legend::UpperLeft => SeriesLabelPosition::UpperLeft,
            Legend::UpperRight => SeriesLabelPosition::UpperRight,
            Legend::LowerLeft => SeriesLabelPosition::LowerLeft,
        }
    }
}

/// How the y axis maps values to heights.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) enum Scale {
    Linear,
    /// Logarithmic: every value drawn must be `> 0`, and the range's lower end too.
    Log,
}

/// Axes, labels and title of a chart; every chart has a log-scaled x axis.
pub(crate) struct Spec<'a> {
    /// The chart's `id` in the page.
    pub id: &'a str,
    pub title: &'a str,
    pub x_label: &'a str,
    pub y_label: &'a str,
    pub x_range: (f64, f64),
    pub y_range: (f64, f64),
    pub y_scale: Scale,
    pub y_format: fn(f64) -> String,
    pub legend: Legend,
}

fn chart_error<E: std::error::Error>(title: &str, e: E) -> ReportError {
    ReportError::Chart(format!("{title}: {e}"))
}

/// Draws with `draw` on a fresh tagged SVG backend and returns the tagged SVG.
fn render(
    spec: &Spec,
    names: &[&str],
    draw: impl FnOnce(&DrawingArea<Tagged, Shift>, &Rc<RefCell<Log>>) -> Result<(), ReportError>,
) -> Result<String, ReportError> {
    let log = Rc::new(RefCell::new(Log::default()));
    let mut svg = String::new();
    {
        let backend = Tagged { inner: SVGBackend::with_string(&mut svg, SIZE), log: Rc::clone(&log) };
        let area = backend.into_drawing_area();
        area.fill(&WHITE).map_err(|e| chart_error(spec.title, e))?;
        draw(&area, &log)?;
        area.present().map_err(|e| chart_error(spec.title, e))?;
    }
    let log = log.borrow();
    tag(&svg, &log.elements, names, spec)
}

/// Adds `class="series" data-series="NAME" data-part="PART"` to the elements drawn for a series, drops the
/// `xmlns` URL and labels the `<svg>` for screen readers.
fn tag(
    svg: &str,
    elements: &[Option<(usize, &'static str)>],
    names: &[&str],
    spec: &Spec,
) -> Result<String, ReportError> {
    let mut out = String::with_capacity(svg.len() + elements.len() * 32);
    let mut next = elements.iter();
    for line in svg.lines() {
        if line.starts_with("<svg ") {
            let line = line.replace(" xmlns=\"http://www.w3.org/2000/svg\"", "");
            out.push_str(&line.replacen(
                "<svg ",
                &format!(
                    "<svg id=\"{}\" class=\"chart\" role=\"img\" aria-label=\"{}\" ",
                    escape(spec.id),
                    escape(spec.title)
                ),
                1,
            ));
        } else if line.starts_with('<') && !line.starts_with("</") {
            let Some(series) = next.next() else {
                return Err(ReportError::Chart(format!("{}: more SVG elements than drawing calls", spec.title)));
            };
            match (series, line.find(' ')) {
                (Some((i, part)), Some(at)) => {
                    let name = names.get(*i).copied().unwrap_or("");
                    out.push_str(&line[..at]);
                    out.push_str(&format!(" class=\"series\" data-series=\"{}\" data-part=\"{part}\"", escape(name)));
                    out.push_str(&line[at..]);
                }
                _ => out.push_str(line),
            }
        } else {
            out.push_str(line);
        }
        out.push('\n');
    }
    if next.next().is_some() {
        return Err(ReportError::Chart(format!("{}: fewer SVG elements than drawing calls", spec.title)));
    }
    Ok(out)
}

/// Runs `f` with the log's current series set to `i`, drawing its `part` (`line`, `interval`
/// or `mean`).
fn in_series<T>(log: &Rc<RefCell<Log>>, i: usize, part: &'static str, f: impl FnOnce() -> T) -> T {
    log.borrow_mut().current = Some((i, part));
    let out = f();
    log.borrow_mut().current = None;
    out
}

/// Keeps the legend's text free of control characters (plotters escapes the rest).
fn legend_name(name: &str) -> String {
    plain(name)
}

/// The spec's ranges, made drawable: a log axis needs a positive start, every axis a nonempty
/// range.
fn ranges(spec: &Spec) -> (std::ops::Range<f64>, std::ops::Range<f64>) {
    let (x0, x1) = spec.x_range;
    let x0 = if x0 > 0.0 { x0 } else { 1.0 };
    let x1 = if x1 > x0 { x1 } else { x0 * 10.0 };
    let (y0, y1) = spec.y_range;
    let (y0, y1) = match spec.y_scale {
        Scale::Linear => (y0, if y1 > y0 { y1 } else { y0 + 1.0 }),
        Scale::Log => {
            let y0 = if y0 > 0.0 { y0 } else { 1e-6 };
            (y0, if y1 > y0 { y1 } else { y0 * 10.0 })
        }
    };
    (x0..x1, y0..y1)
}

/// A chart with a log-scaled x axis and a `Y` axis on `area`.
type Chart<'a, 'b, Y> = ChartContext<'a, Tagged<'b>, Cartesian2d<LogCoord<f64>, Y>>;

/// What a y axis must be for [`axes`]: linear (`RangedCoordf64`) or log (`LogCoord<f64>`).
trait YAxis: Ranged<ValueType = f64> + ValueFormatter<f64> {}
impl<Y: Ranged<ValueType = f64> + ValueFormatter<f64>> YAxis for Y {}

/// Draws on `area` with the y axis the spec's [`Scale`] asks for.
fn on_y_axis<T>(
    spec: &Spec,
    linear: impl FnOnce(RangedCoordf64) -> Result<T, ReportError>,
    log: impl FnOnce(LogCoord<f64>) -> Result<T, ReportError>,
) -> Result<T, ReportError> {
    let (_, yr) = ranges(spec);
    match spec.y_scale {
        Scale::Linear => linear(yr.into()),
        Scale::Log => log(yr.log_scale().into()),
    }
}

/// The caption, log-x and `y` axes, grid and axis labels every chart shares.
fn axes<'a, 'b, Y: YAxis>(
    area: &'a DrawingArea<Tagged<'b>, Shift>,
    spec: &Spec,
    y: Y,
) -> Result<Chart<'a, 'b, Y>, ReportError> {
    let err = |e| chart_error(spec.title, e);
    let (xr, _) = ranges(spec);
    let mut chart = ChartBuilder::on(area)
        .caption(spec.title, ("sans-serif", 20))
        .margin(12)
        .x_label_area_size(48)
        .y_label_area_size(72)
        .build_cartesian_2d(xr.log_scale(), y)
        .map_err(err)?;
    let y_format = spec.y_format;
    chart
        .configure_mesh()
        .x_desc(spec.x_label)
        .y_desc(spec.y_label)
        .x_label_formatter(&|x| format!("{x:.0}"))
        .y_label_formatter(&|y| y_format(*y))
        .light_line_style(BLACK.mix(0.05))
        .label_style(("sans-serif", 14))
        .axis_desc_style(("sans-serif", 15))
        .draw()
        .map_err(err)?;
    Ok(chart)
}

/// The legend box every chart shares.
fn legend<'a, 'b: 'a, Y: YAxis>(chart: &mut Chart<'a, 'b, Y>, spec: &Spec) -> Result<(), ReportError> {
    chart
        .configure_series_labels()
        .position(spec.legend.position())
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK.mix(0.4))
        .label_font(("sans-serif", 15))
        .draw()
        .map_err(|e| chart_error(spec.title, e))
}

/// One polyline per series against a log-scaled x axis.
pub(crate) fn line_chart(spec: &Spec, series: &[Series<(f64, f64)>]) -> Result<String, ReportError> {
    let names: Vec<&str> = series.iter().map(|s| s.name).collect();
    render(spec, &names, |area, log| {
        on_y_axis(spec, |y| draw_lines(area, log, spec, series, y), |y| draw_lines(area, log, spec, series, y))
    })
}

fn draw_lines<Y: YAxis>(
    area: &DrawingArea<Tagged, Shift>,
    log: &Rc<RefCell<Log>>,
    spec: &Spec,
    series: &[Series<(f64, f64)>],
    y: Y,
) -> Result<(), ReportError> {
    let err = |e| chart_error(spec.title, e);
    let mut chart = axes(area, spec, y)?;
    for (i, s) in series.iter().enumerate() {
        let c = color(i);
        let points = s.points.clone();
        in_series(log, i, "line", || {
            chart.draw_series(LineSeries::new(points, c.stroke_width(2))).map(|a| {
                a.label(legend_name(s.name))
                    .legend(move |(x, y)| Rectangle::new([(x, y - 5), (x + 16, y + 5)], c.filled()));
            })
        })
        .map_err(err)?;
    }
    legend(&mut chart, spec)
}

/// Per series, a marker at each mean with its interval as an error bar, joined by a thin line;
/// the series are offset a little along x so their bars do not overlap.
pub(crate) fn interval_chart(spec: &Spec, series: &[Series<Interval>]) -> Result<String, ReportError> {
    let names: Vec<&str> = series.iter().map(|s| s.name).collect();
    render(spec, &names, |area, log| {
        on_y_axis(spec, |y| draw_intervals(area, log, spec, series, y), |y| draw_intervals(area, log, spec, series, y))
    })
}

fn draw_intervals<Y: YAxis>(
    area: &DrawingArea<Tagged, Shift>,
    log: &Rc<RefCell<Log>>,
    spec: &Spec,
    series: &[Series<Interval>],
    y: Y,
) -> Result<(), ReportError> {
    let err = |e| chart_error(spec.title, e);
    let mut chart = axes(area, spec, y)?;
    let n = series.len().max(1) as f64;
    for (i, s) in series.iter().enumerate() {
        let c = color(i);
        // Spread the series over ±6% of x (a constant width on the log axis).
        let shift = 1.0 + 0.12 * ((i as f64 + 0.5) / n - 0.5);
        let at: Vec<(f64, &Interval)> = s.points.iter().map(|iv| (iv.x * shift, iv)).collect();
        let line: Vec<(f64, f64)> = at.iter().map(|(x, iv)| (*x, iv.mean)).collect();
        in_series(log, i, "line", || {
            chart.draw_series(LineSeries::new(line, c.mix(0.5).stroke_width(1))).map(|a| {
                a.label(legend_name(s.name))
                    .legend(move |(x, y)| Rectangle::new([(x, y - 5), (x + 16, y + 5)], c.filled()));
            })
        })
        .map_err(err)?;
        // A vertical bar from lo to hi with a cap at each end.
        let bars = at.iter().flat_map(|&(x, iv)| {
            let cap = |y| PathElement::new(vec![(x / 1.012, y), (x * 1.012, y)], c.stroke_width(2));
            [PathElement::new(vec![(x, iv.lo), (x, iv.hi)], c.stroke_width(2)), cap(iv.lo), cap(iv.hi)]
        });
        in_series(log, i, "interval", || chart.draw_series(bars)).map_err(err)?;
        let means = at.iter().map(|&(x, iv)| Circle::new((x, iv.mean), 4, c.filled()));
        in_series(log, i, "mean", || chart.draw_series(means)).map_err(err)?;
    }
    legend(&mut chart, spec)
}
