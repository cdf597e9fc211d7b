//! The HTML report in a real browser: headless Chromium loads the sample report, logs no console
//! message, no script error and no failed load, renders the four charts with their data, and
//! takes a screenshot.
//!
//! Needs a `chromium` (or `chromium-browser`) binary on `PATH` (Debian: `apt-get install
//! chromium`). Without one the test prints a skip notice and passes, unless
//! `QDRIFT_REQUIRE_CHROMIUM=1` (CI), where it fails. The screenshot goes to
//! `$QDRIFT_SCREENSHOT` if set, else into a temporary folder.

mod common;

use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use qdrift_report::render_html;
use qdrift_report::testing::{sample_moe_report, sample_report};

/// The first Chromium binary on `PATH`.
fn chromium() -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .flat_map(|dir| ["chromium", "chromium-browser"].map(|name| dir.join(name)))
        .find(|p| p.is_file())
}

/// Runs `cmd` to completion or kills it after `limit`; returns (success, stdout, stderr).
fn run_with_timeout(mut cmd: Command, limit: Duration) -> (bool, String, String) {
    let mut child = cmd
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("cannot start chromium: {e}"));
    // Drain both pipes on threads so a chatty browser cannot block on a full pipe.
    let mut out = child.stdout.take().expect("piped stdout");
    let mut err = child.stderr.take().expect("piped stderr");
    let out_thread = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = out.read_to_string(&mut s);
        s
    });
    let err_thread = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = err.read_to_string(&mut s);
        s
    });
    let start = Instant::now();
    let status = loop {
        if let Some(status) = child.try_wait().expect("wait for chromium") {
            break status;
        }
        if start.elapsed() > limit {
            let _ = child.kill();
            let _ = child.wait();
            panic!("chromium did not finish within {limit:?}");
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    (status.success(), out_thread.join().unwrap_or_default(), err_thread.join().unwrap_or_default())
}

fn browser(binary: &Path, profile: &Path) -> Command {
    let mut cmd = Command::new(binary);
    cmd.args([
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--enable-logging=stderr",
        "--v=0",
        "--virtual-time-budget=2000",
        "--no-first-run",
        "--hide-scrollbars",
    ])
    .arg(format!("--user-data-dir={}", profile.display()));
    cmd
}

/// Lines of Chromium's log that mean the page did something wrong: a console message (the page
/// has no script, so any is unexpected), an uncaught error, or a failed load.
fn page_problems(stderr: &str) -> Vec<&str> {
    stderr
        .lines()
        .filter(|l| {
            l.contains(":CONSOLE") || l.contains("CONSOLE(") || l.contains("Uncaught") || l.contains("net::ERR_")
        })
        .collect()
}

/// The Chromium binary, or `None` after a skip notice (a failure under
/// `QDRIFT_REQUIRE_CHROMIUM=1`).
fn chromium_or_skip() -> Option<PathBuf> {
    let binary = chromium();
    if binary.is_none() {
        if std::env::var("QDRIFT_REQUIRE_CHROMIUM").is_ok_and(|v| v == "1") {
            panic!("chromium is not on PATH: install chromium: cargo xtask setup");
        }
        eprintln!("skipped: chromium is not on PATH (install chromium: cargo xtask setup)");
    }
    binary
}

#[test]
fn headless_chromium_renders_the_routing_charts_of_a_model_with_experts() {
    let Some(binary) = chromium_or_skip() else { return };
    let dir = common::temp_dir("chromium-moe");
    let page = dir.join("report.html");
    let r = sample_moe_report();
    std::fs::write(&page, render_html(&r).unwrap()).unwrap();
    let mut dump = browser(&binary, &dir.join("profile-dom"));
    dump.args(["--dump-dom", &format!("file://{}", page.display())]);
    let (ok, dom, log) = run_with_timeout(dump, Duration::from_secs(120));
    assert!(ok, "chromium --dump-dom failed:\n{log}");
    let problems = page_problems(&log);
    assert!(problems.is_empty(), "the page logged:\n{}", problems.join("\n"));
    // Six charts: the four of every report, routing flips by layer and by position.
    assert_eq!(dom.matches("<svg").count(), 6, "{dom}");
    assert!(dom.contains("id=\"chart-routing-layers\"") && dom.contains("id=\"chart-routing-position\""));
    for v in &r.variants {
        let lines = dom.matches(&format!("data-series=\"{}\" data-part=\"line\"", v.name)).count();
        assert_eq!(lines, 6, "{}: one line per chart", v.name);
    }
}

#[test]
fn headless_chromium_renders_the_report_without_errors() {
    let Some(binary) = chromium_or_skip() else { return };
    let dir = common::temp_dir("chromium");
    let page = dir.join("report.html");
    let r = sample_report();
    std::fs::write(&page, render_html(&r).unwrap()).unwrap();
    let url = format!("file://{}", page.display());

    let mut dump = browser(&binary, &dir.join("profile-dom"));
    dump.args(["--dump-dom", &url]);
    let (ok, dom, log) = run_with_timeout(dump, Duration::from_secs(120));
    assert!(ok, "chromium --dump-dom failed:\n{log}");
    let problems = page_problems(&log);
    assert!(problems.is_empty(), "the page logged:\n{}", problems.join("\n"));
    // The browser parsed the charts: four inline SVGs, each series' line with its points.
    assert_eq!(dom.matches("<svg").count(), 4, "{dom}");
    for v in &r.variants {
        let lines = dom.matches(&format!("data-series=\"{}\" data-part=\"line\"", v.name)).count();
        assert_eq!(lines, 4, "{}: one line per chart", v.name);
    }
    let longest = dom
        .lines()
        .filter(|l| l.contains("data-part=\"line\""))
        .filter_map(|l| l.split("points=\"").nth(1)?.split('"').next())
        .map(|p| p.split_whitespace().count())
        .max()
        .unwrap_or(0);
    assert_eq!(longest, 1000, "the per-position series lost points");

    let shot = std::env::var_os("QDRIFT_SCREENSHOT").map(PathBuf::from).unwrap_or_else(|| dir.join("report.png"));
    let _ = std::fs::remove_file(&shot);
    let mut screenshot = browser(&binary, &dir.join("profile-shot"));
    screenshot.arg(format!("--screenshot={}", shot.display())).args(["--window-size=1200,2400", &url]);
    let (ok, _, log) = run_with_timeout(screenshot, Duration::from_secs(120));
    assert!(ok, "chromium --screenshot failed:\n{log}");
    let problems = page_problems(&log);
    assert!(problems.is_empty(), "the page logged:\n{}", problems.join("\n"));
    let png = std::fs::read(&shot).unwrap_or_else(|e| panic!("no screenshot at {}: {e}", shot.display()));
    assert!(png.starts_with(b"\x89PNG\r\n\x1a\n"), "not a PNG");
    // 1200 × 2400 of text, tables and charts: far more than a blank page's few kilobytes.
    assert!(png.len() > 50_000, "screenshot of {} bytes looks blank", png.len());
    eprintln!("screenshot: {}", shot.display());
}

/// The widths the page's script measures at a 1300-pixel window: the document's, the window's,
/// and every table box that would scroll sideways (its index, scroll width and client width).
const MEASURE: &str = "<script>\
    const wide = [...document.querySelectorAll('.scroll')].map((e, i) => [i, e.scrollWidth, e.clientWidth])\
        .filter(([, s, c]) => s > c);\
    document.body.setAttribute('data-measured', JSON.stringify({\
        doc: document.documentElement.scrollWidth, win: window.innerWidth, wide }));\
    </script>";

#[test]
fn every_report_fits_1300_pixels_without_sideways_scrolling() {
    let Some(binary) = chromium_or_skip() else { return };
    let dir = common::temp_dir("chromium-width");
    let examples = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../reports");
    let mut pages = vec![
        ("sample", render_html(&sample_report()).unwrap()),
        ("sample-moe", render_html(&sample_moe_report()).unwrap()),
    ];
    for name in ["stories260K", "smollm2-135m", "qwen3-moe-tiny"] {
        pages.push((name, std::fs::read_to_string(examples.join(name).join("report.html")).unwrap()));
    }
    for (name, html) in pages {
        // The report has no script of its own; this copy measures itself once laid out.
        let page = dir.join(format!("{name}.html"));
        std::fs::write(&page, html.replace("</body>", &format!("{MEASURE}</body>"))).unwrap();
        let mut dump = browser(&binary, &dir.join(format!("profile-{name}")));
        dump.args(["--window-size=1300,2000", "--dump-dom", &format!("file://{}", page.display())]);
        let (ok, dom, log) = run_with_timeout(dump, Duration::from_secs(120));
        assert!(ok, "{name}: chromium --dump-dom failed:\n{log}");
        let measured = dom
            .split("data-measured=\"")
            .nth(1)
            .and_then(|r| r.split('"').next())
            .unwrap_or_else(|| panic!("{name}: the page did not measure itself:\n{log}"))
            .replace("&quot;", "\"");
        let m: serde_json::Value = serde_json::from_str(&measured).unwrap();
        assert!(m["win"].as_u64().unwrap() >= 1280, "{name}: window {m}");
        assert!(m["doc"].as_u64() <= m["win"].as_u64(), "{name}: the page scrolls sideways: {m}");
        assert_eq!(
            m["wide"],
            serde_json::json!([]),
            "{name}: tables that scroll sideways (index, scroll, client): {m}"
        );
    }
}
