//! Inline SVG charts, drawn with plotters' SVG backend: a line chart and an interval chart, each
//! axis linear or log-scaled ([`Scale`]). What a report's charts show is in `figures`; this
//! module knows nothing of reports.
//!
//! plotters writes one SVG element per drawing call and offers no way to group them, so the
//! backend is wrapped in [`Tagged`], which notes for every element it forwards which data series
//! (if any) was being drawn. Afterwards every element of series `NAME` gets
//! `class="series" data-series="NAME" data-part="PART"`: a test (or a reader's script) finds a
//! series' line as `polyline[data-series="NAME"][data-part="line"]` and counts its points in the
//! `points` attribute; an interval chart adds its markers (`circle[data-part="mean"]`, one per
//! point) and error bars (`polyline[data-part="interval"]`, three per point: the bar and its two
//! caps). The legend sits in a strip right of the plot, so it never covers data; its swatches
//! are drawn outside any series and carry no tag.
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

/// Chart size in pixels, the legend's strip on the right included.
const SIZE: (u32, u32) = (1000, 420);

/// Width of the strip right of the plot that holds the legend: the legend never covers data.
const LEGEND_WIDTH: u32 = 200;

/// Characters of a variant's name the legend shows (longer names are elided in the middle).
const LEGEND_CHARS: usize = 24;

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

/// How an axis maps values to positions.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) enum Scale {
    Linear,
    /// Logarithmic: every value drawn must be `> 0`, and the range's lower end too.
    Log,
}

/// Axes, labels and title of a chart.
pub(crate) struct Spec<'a> {
    /// The chart's `id` in the page.
    pub id: &'a str,
    pub title: &'a str,
    pub x_label: &'a str,
    pub y_label: &'a str,
    pub x_range: (f64, f64),
    pub y_range: (f64, f64),
    pub x_scale: Scale,
    pub y_scale: Scale,
    pub y_format: fn(f64) -> String,
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
        let (plot, side) = area.split_horizontally(SIZE.0 - LEGEND_WIDTH);
        draw(&plot, &log)?;
        legend(&side, names).map_err(|e| chart_error(spec.title, e))?;
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

/// Keeps the legend's text free of control characters (plotters escapes the rest) and at most
/// [`LEGEND_CHARS`] characters long, eliding the middle of a longer name.
fn legend_name(name: &str) -> String {
    let name = plain(name);
    let chars: Vec<char> = name.chars().collect();
    if chars.len() <= LEGEND_CHARS {
        return name;
    }
    let half = (LEGEND_CHARS - 1) / 2;
    let head: String = chars[..half].iter().collect();
    let tail: String = chars[chars.len() - half..].iter().collect();
    format!("{head}…{tail}")
}

/// The legend, in the strip `side` right of the plot: per series a swatch of its colour and its
/// name, top to bottom, outside every series (untagged).
fn legend(side: &DrawingArea<Tagged, Shift>, names: &[&str]) -> Result<(), DrawingAreaErrorKind<std::io::Error>> {
    let style = ("sans-serif", 14).into_font().color(&BLACK);
    for (i, name) in names.iter().enumerate() {
        let y = 48 + 22 * i as i32;
        side.draw(&Rectangle::new([(6, y - 5), (22, y + 5)], color(i).filled()))?;
        side.draw(&Text::new(legend_name(name), (28, y - 8), style.clone()))?;
    }
    Ok(())
}

/// `(lo, hi)` on an axis of `scale`, made drawable: a log axis needs a positive start (`log_lo`
/// when it has none), every axis a nonempty range.
fn drawable((lo, hi): (f64, f64), scale: Scale, log_lo: f64) -> std::ops::Range<f64> {
    match scale {
        Scale::Linear => lo..if hi > lo { hi } else { lo + 1.0 },
        Scale::Log => {
            let lo = if lo > 0.0 { lo } else { log_lo };
            lo..if hi > lo { hi } else { lo * 10.0 }
        }
    }
}

/// The spec's ranges, made drawable ([`drawable`]; a log x axis starts at 1 at the latest, a log
/// y axis at `1e-6`).
fn ranges(spec: &Spec) -> (std::ops::Range<f64>, std::ops::Range<f64>) {
    (drawable(spec.x_range, spec.x_scale, 1.0), drawable(spec.y_range, spec.y_scale, 1e-6))
}

/// A chart with an `X` and a `Y` axis on `area`.
type Chart<'a, 'b, X, Y> = ChartContext<'a, Tagged<'b>, Cartesian2d<X, Y>>;

/// What an axis must be for [`axes`]: linear (`RangedCoordf64`) or log (`LogCoord<f64>`).
trait Axis: Ranged<ValueType = f64> + ValueFormatter<f64> {}
impl<A: Ranged<ValueType = f64> + ValueFormatter<f64>> Axis for A {}

/// Something drawn on a chart whose axes' types are chosen at run time, from the spec's scales
/// ([`on_axes`]): the lines of [`line_chart`], the intervals of [`interval_chart`].
trait Drawing {
    /// Draws the axes ([`axes`]), the data and the legend on `area`, noting each series' elements
    /// in `log`.
    fn draw<X: Axis, Y: Axis>(
        &self,
        area: &DrawingArea<Tagged, Shift>,
        log: &Rc<RefCell<Log>>,
        spec: &Spec,
        x: X,
        y: Y,
    ) -> Result<(), ReportError>;
}

/// Draws `drawing` on `area` with the x and y axes the spec's [`Scale`]s ask for.
fn on_axes(
    area: &DrawingArea<Tagged, Shift>,
    log: &Rc<RefCell<Log>>,
    spec: &Spec,
    drawing: &impl Drawing,
) -> Result<(), ReportError> {
    let (xr, yr) = ranges(spec);
    let linear = |r: std::ops::Range<f64>| -> RangedCoordf64 { r.into() };
    let log_scaled = |r: std::ops::Range<f64>| -> LogCoord<f64> { r.log_scale().into() };
    match (spec.x_scale, spec.y_scale) {
        (Scale::Linear, Scale::Linear) => drawing.draw(area, log, spec, linear(xr), linear(yr)),
        (Scale::Linear, Scale::Log) => drawing.draw(area, log, spec, linear(xr), log_scaled(yr)),
        (Scale::Log, Scale::Linear) => drawing.draw(area, log, spec, log_scaled(xr), linear(yr)),
        (Scale::Log, Scale::Log) => drawing.draw(area, log, spec, log_scaled(xr), log_scaled(yr)),
    }
}

/// The caption, `x` and `y` axes, grid and axis labels every chart shares.
fn axes<'a, 'b, X: Axis, Y: Axis>(
    area: &'a DrawingArea<Tagged<'b>, Shift>,
    spec: &Spec,
    x: X,
    y: Y,
) -> Result<Chart<'a, 'b, X, Y>, ReportError> {
    let err = |e| chart_error(spec.title, e);
    let mut chart = ChartBuilder::on(area)
        .caption(spec.title, ("sans-serif", 20))
        .margin(12)
        .x_label_area_size(48)
        .y_label_area_size(72)
        .build_cartesian_2d(x, y)
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

/// One polyline per series.
pub(crate) fn line_chart(spec: &Spec, series: &[Series<(f64, f64)>]) -> Result<String, ReportError> {
    let names: Vec<&str> = series.iter().map(|s| s.name).collect();
    render(spec, &names, |area, log| on_axes(area, log, spec, &Lines(series)))
}

/// Series `i`'s line through `points` in `style` (tagged `line`); its legend entry is drawn
/// beside the plot ([`legend`]).
fn series_line<X: Axis, Y: Axis>(
    chart: &mut Chart<'_, '_, X, Y>,
    log: &Rc<RefCell<Log>>,
    i: usize,
    points: Vec<(f64, f64)>,
    style: ShapeStyle,
) -> Result<(), DrawingAreaErrorKind<std::io::Error>> {
    in_series(log, i, "line", || chart.draw_series(LineSeries::new(points, style)).map(|_| ()))
}

/// The series of a [`line_chart`].
struct Lines<'s, 'a>(&'s [Series<'a, (f64, f64)>]);

impl Drawing for Lines<'_, '_> {
    /// A 2-pixel polyline per series, in its colour.
    fn draw<X: Axis, Y: Axis>(
        &self,
        area: &DrawingArea<Tagged, Shift>,
        log: &Rc<RefCell<Log>>,
        spec: &Spec,
        x: X,
        y: Y,
    ) -> Result<(), ReportError> {
        let err = |e| chart_error(spec.title, e);
        let mut chart = axes(area, spec, x, y)?;
        for (i, s) in self.0.iter().enumerate() {
            let style = color(i).stroke_width(2);
            series_line(&mut chart, log, i, s.points.clone(), style).map_err(err)?;
        }
        Ok(())
    }
}

/// Per series, a marker at each mean with its interval as an error bar, joined by a thin line;
/// the series are offset a little along x so their bars do not overlap.
pub(crate) fn interval_chart(spec: &Spec, series: &[Series<Interval>]) -> Result<String, ReportError> {
    let names: Vec<&str> = series.iter().map(|s| s.name).collect();
    let spread = Spread::new(spec, series);
    render(spec, &names, |area, log| on_axes(area, log, spec, &Intervals { series, spread }))
}

/// Where an interval chart's markers sit along x: the series side by side around each `x`, and
/// the caps of each bar a few pixels wide.
struct Spread {
    scale: Scale,
    /// On a linear axis: how far apart the first and the last series sit, at most.
    width: f64,
    /// On a linear axis: half a cap's width.
    cap: f64,
}

impl Spread {
    /// The spread for `series` on the spec's x axis.
    fn new(spec: &Spec, series: &[Series<Interval>]) -> Spread {
        let (lo, hi) = spec.x_range;
        let mut xs: Vec<f64> = series.iter().flat_map(|s| s.points.iter().map(|iv| iv.x)).collect();
        xs.sort_by(f64::total_cmp);
        let gap = xs.windows(2).map(|w| w[1] - w[0]).filter(|&d| d > 0.0).fold(f64::INFINITY, f64::min);
        let span = (hi - lo).abs();
        let width = (0.04 * span).min(if gap.is_finite() { 0.5 * gap } else { f64::INFINITY });
        Spread { scale: spec.x_scale, width, cap: span * 0.003 }
    }

    /// Where series `i` of `n` draws its point at `x`: over ±6% of x on a log axis (a constant
    /// width), over ±2% of the axis on a linear one (±¼ of the smallest gap between points at
    /// most, so series never reach the next point).
    fn shift(&self, x: f64, i: usize, n: f64) -> f64 {
        let u = (i as f64 + 0.5) / n - 0.5;
        match self.scale {
            Scale::Log => x * (1.0 + 0.12 * u),
            Scale::Linear => x + self.width * u,
        }
    }

    /// The two ends of a cap at `x`.
    fn caps(&self, x: f64) -> (f64, f64) {
        match self.scale {
            Scale::Log => (x / 1.012, x * 1.012),
            Scale::Linear => (x - self.cap, x + self.cap),
        }
    }
}

/// The series of an [`interval_chart`] and where their markers sit.
struct Intervals<'s, 'a> {
    series: &'s [Series<'a, Interval>],
    spread: Spread,
}

impl Drawing for Intervals<'_, '_> {
    /// Per series, in its colour: a thin line through the means, a bar
    /// with two caps per interval, a filled circle per mean.
    fn draw<X: Axis, Y: Axis>(
        &self,
        area: &DrawingArea<Tagged, Shift>,
        log: &Rc<RefCell<Log>>,
        spec: &Spec,
        x: X,
        y: Y,
    ) -> Result<(), ReportError> {
        let err = |e| chart_error(spec.title, e);
        let mut chart = axes(area, spec, x, y)?;
        let n = self.series.len().max(1) as f64;
        for (i, s) in self.series.iter().enumerate() {
            let c = color(i);
            let at: Vec<(f64, &Interval)> = s.points.iter().map(|iv| (self.spread.shift(iv.x, i, n), iv)).collect();
            let line: Vec<(f64, f64)> = at.iter().map(|(x, iv)| (*x, iv.mean)).collect();
            series_line(&mut chart, log, i, line, c.mix(0.5).stroke_width(1)).map_err(err)?;
            // A vertical bar from lo to hi with a cap at each end.
            let bars = at.iter().flat_map(|&(x, iv)| {
                let (left, right) = self.spread.caps(x);
                let cap = |y| PathElement::new(vec![(left, y), (right, y)], c.stroke_width(2));
                [PathElement::new(vec![(x, iv.lo), (x, iv.hi)], c.stroke_width(2)), cap(iv.lo), cap(iv.hi)]
            });
            in_series(log, i, "interval", || chart.draw_series(bars)).map_err(err)?;
            let means = at.iter().map(|&(x, iv)| Circle::new((x, iv.mean), 4, c.filled()));
            in_series(log, i, "mean", || chart.draw_series(means)).map_err(err)?;
        }
        Ok(())
    }
}
