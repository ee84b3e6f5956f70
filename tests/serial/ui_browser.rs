//! The admin page in a real headless Chromium (Debian's `chromium`), opened with the admin
//! token in its address: it loads with no console message, shows the rules, the top denied
//! key and a chart per rule, and the chart moves while a load runs (two screenshots a few
//! seconds apart differ in the chart's colours). Screenshots at a laptop and a phone width
//! are left in `target/ui-shots/` for a person to look at.
//!
//! The "why" box, driven over the DevTools protocol: asked about a key over its limit, it
//! shows the very answer of `/why`; its reset button (the page holds the token) unblocks the
//! key; without the token, `/why` and `/counters/reset` answer 401 to the page.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use sluice::config::settings::Settings;
use sluice::testing::TestServer;
use sluice::testing::http;

use crate::{serial_async, support};

const INSTALL: &str = "command -v chromium || (apt-get update && apt-get install -y chromium)";
const TOKEN: &str = "page-t0ken";

const RULES: &str = include_str!("../fixtures/rules/suites/ui.yaml");

/// The Chromium program, or a failure naming the command that installs it.
fn chromium() -> PathBuf {
    let found = std::env::var_os("PATH").and_then(|paths| {
        std::env::split_paths(&paths)
            .map(|p| p.join("chromium"))
            .find(|p| p.is_file())
    });
    found.unwrap_or_else(|| panic!("chromium is not installed; run: {INSTALL}"))
}

/// Runs headless Chromium on `url` with `args`, in a fresh profile.
fn browse(url: &str, args: &[&str]) -> Output {
    let profile = tempfile::tempdir().expect("a profile directory");
    let out = Command::new(chromium())
        .args([
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
            "--no-first-run",
            "--enable-logging=stderr",
            "--v=0",
        ])
        .arg(format!("--user-data-dir={}", profile.path().display()))
        .args(args)
        .arg(url)
        .output()
        .unwrap_or_else(|e| panic!("run chromium ({INSTALL}): {e}"));
    assert!(
        out.status.success(),
        "chromium failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

/// The page's console messages (Chromium logs them as `CONSOLE` lines).
fn console(out: &Output) -> Vec<String> {
    let stderr = String::from_utf8_lossy(&out.stderr);
    stderr
        .lines()
        .filter(|l| l.contains(":CONSOLE"))
        .map(str::to_owned)
        .collect()
}

fn screenshot(url: &str, size: &str, file: &Path) -> Vec<u8> {
    let _ = std::fs::remove_file(file);
    let out = browse(
        url,
        &[
            &format!("--window-size={size}"),
            "--hide-scrollbars",
            "--virtual-time-budget=3000",
            &format!("--screenshot={}", file.display()),
        ],
    );
    assert!(
        console(&out).is_empty(),
        "console messages: {:?}",
        console(&out)
    );
    std::fs::read(file).unwrap_or_else(|e| panic!("no screenshot {}: {e}", file.display()))
}

/// RGB pixels of a PNG, with its width and height.
fn pixels(png_bytes: &[u8]) -> (Vec<[u8; 3]>, u32, u32) {
    let decoder = png::Decoder::new(std::io::Cursor::new(png_bytes));
    let mut reader = decoder.read_info().expect("a PNG");
    let mut buf = vec![0; reader.output_buffer_size().expect("a size")];
    let info = reader.next_frame(&mut buf).expect("a frame");
    let channels = info.color_type.samples();
    let px = buf[..info.buffer_size()]
        .chunks(channels)
        .map(|c| [c[0], c[1], c[2]])
        .collect();
    (px, info.width, info.height)
}

/// Whether a pixel has one of the charts' line colours (requests, denied, near).
fn chart_colour(p: [u8; 3]) -> bool {
    let near = |c: [u8; 3]| p.iter().zip(c).all(|(a, b)| a.abs_diff(b) <= 40);
    near([0x2f, 0x6f, 0xde]) || near([0xd2, 0x3c, 0x3c]) || near([0xe5, 0x9a, 0x1a])
}

/// One `/json` request with the token.
async fn post(addr: SocketAddr, body: &str) {
    let auth = format!("Bearer {TOKEN}");
    let headers = [
        ("authorization", auth.as_str()),
        ("content-type", "application/json"),
    ];
    http::request(addr, "POST", "/json", &headers, body).await;
}

/// A load whose rate changes every second, with one key denied far more than the others.
fn load(addr: SocketAddr, stop: Arc<AtomicBool>) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        let mut i = 0u64;
        while !stop.load(Ordering::Relaxed) {
            let user = format!("u{}", i % 7);
            let blocked = if i.is_multiple_of(10) {
                format!("other{}", i % 3)
            } else {
                "bad-actor".to_owned()
            };
            let body = format!(
                r#"{{"domain":"shop","descriptors":[{{"entries":[{{"key":"user","value":"{user}"}}]}},{{"entries":[{{"key":"blocked","value":"{blocked}"}}]}},{{"entries":[{{"key":"tenant","value":"t"}},{{"key":"route","value":"/api/x"}}]}}]}}"#
            );
            post(addr, &body).await;
            i += 1;
            // Fast for a second, slow for the next, so the rates move.
            let pause = if (i / 40).is_multiple_of(2) { 5 } else { 40 };
            tokio::time::sleep(Duration::from_millis(pause)).await;
        }
    })
}

fn shots_dir() -> PathBuf {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("target/ui-shots");
    std::fs::create_dir_all(&dir).expect("a screenshots directory");
    dir
}

/// History samples taken before the first screenshot.
const MIN_SAMPLES: usize = 8;

/// Waits (at most 60 s) until `/ui/data` holds `samples` history samples.
async fn wait_for_samples(addr: SocketAddr, samples: usize) {
    let auth = format!("Bearer {TOKEN}");
    let start = tokio::time::Instant::now();
    loop {
        let answer = http::get_with(addr, "/ui/data", &[("authorization", &auth)]).await;
        let data: serde_json::Value =
            serde_json::from_str(&answer.body).expect("/ui/data answers JSON");
        let taken = data["series"]["times"].as_array().map_or(0, Vec::len);
        if taken >= samples {
            return;
        }
        assert!(
            start.elapsed() < Duration::from_secs(60),
            "only {taken} history samples after 60 s"
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_page_shows_rules_top_keys_and_moving_charts_with_a_token() {
    let _serial = serial_async().await;
    let mut settings = Settings::default();
    settings.admin.token = Some(TOKEN.to_owned());
    let server = TestServer::start_with(settings, RULES).await;
    let addr = server.admin_addr;
    let stop = Arc::new(AtomicBool::new(false));
    let running = load(addr, stop.clone());
    // Enough samples (one every 2 s) before the page opens that each chart's line is long
    // enough to count: the axis spans 5 minutes, so a few samples make only a few pixels.
    wait_for_samples(addr, MIN_SAMPLES).await;
    let url = format!("http://{addr}/ui?token={TOKEN}");

    // The DOM after the page has polled: rules, top denied key, charts; no console message.
    let dom = tokio::task::spawn_blocking({
        let url = url.clone();
        move || {
            browse(
                &url,
                &[
                    "--window-size=1280,900",
                    "--virtual-time-budget=5000",
                    "--dump-dom",
                ],
            )
        }
    })
    .await
    .expect("chromium ran");
    assert!(
        console(&dom).is_empty(),
        "console messages: {:?}",
        console(&dom)
    );
    let html = String::from_utf8_lossy(&dom.stdout).into_owned();
    for rule in [
        ">user<",
        ">blocked<",
        ">tenant<",
        ">route_/api/*<",
        "20 / second · funnel",
        "100 / minute · sliding_window",
    ] {
        assert!(
            html.contains(rule),
            "the page lacks the rule {rule}:\n{html}"
        );
    }
    assert!(
        html.contains(r#"<td class="top-key">blocked=bad-actor</td>"#),
        "no top denied key:\n{html}"
    );
    let first_row = html.split(r#"class="top-key">"#).nth(1).unwrap_or_default();
    assert!(
        first_row.starts_with("blocked=bad-actor<"),
        "bad-actor is not first:\n{html}"
    );
    assert!(
        html.contains(r#"data-rule="shop.user""#) && html.contains("<polyline"),
        "no chart:\n{html}"
    );
    assert!(
        !html.contains("token required"),
        "the token was refused:\n{html}"
    );

    // Two screenshots a few seconds apart: the charts' lines moved.
    let dir = shots_dir();
    let before = tokio::task::spawn_blocking({
        let (url, file) = (url.clone(), dir.join("laptop-1.png"));
        move || screenshot(&url, "1280,900", &file)
    })
    .await
    .expect("chromium ran");
    tokio::time::sleep(Duration::from_secs(5)).await;
    let after = tokio::task::spawn_blocking({
        let (url, file) = (url.clone(), dir.join("laptop-2.png"));
        move || screenshot(&url, "1280,900", &file)
    })
    .await
    .expect("chromium ran");
    let phone = tokio::task::spawn_blocking({
        let (url, file) = (url.clone(), dir.join("phone.png"));
        move || screenshot(&url, "390,844", &file)
    })
    .await
    .expect("chromium ran");
    stop.store(true, Ordering::Relaxed);
    running.await.expect("the load ran");

    let (a, w, h) = pixels(&before);
    let (b, w2, h2) = pixels(&after);
    assert_eq!((w, h), (w2, h2));
    let coloured = |px: &[[u8; 3]]| px.iter().filter(|p| chart_colour(**p)).count();
    assert!(
        coloured(&a) > 200 && coloured(&b) > 200,
        "no chart lines drawn"
    );
    let moved = a
        .iter()
        .zip(&b)
        .filter(|(x, y)| x != y && (chart_colour(**x) || chart_colour(**y)))
        .count();
    assert!(
        moved > 50,
        "the charts did not move ({moved} pixels of line colour changed)"
    );
    let (_, pw, _) = pixels(&phone);
    assert_eq!(pw, 390);
}

/// `value` with every number as a float.
fn numbers_as_f64(value: serde_json::Value) -> serde_json::Value {
    use serde_json::Value;
    match value {
        Value::Number(n) => n.as_f64().map_or(Value::Null, |f| serde_json::json!(f)),
        Value::Array(a) => a.into_iter().map(numbers_as_f64).collect(),
        Value::Object(o) => o.into_iter().map(|(k, v)| (k, numbers_as_f64(v))).collect(),
        other => other,
    }
}

/// `/why` with the token, as the test sees it.
async fn why_direct(addr: SocketAddr, body: &str) -> serde_json::Value {
    let auth = format!("Bearer {TOKEN}");
    let headers = [
        ("authorization", auth.as_str()),
        ("content-type", "application/json"),
    ];
    let answer = http::request(addr, "POST", "/why", &headers, body).await;
    assert_eq!(answer.status, 200, "{}", answer.body);
    serde_json::from_str(&answer.body).expect("/why answers JSON")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_why_box_shows_the_answer_of_why_and_its_reset_unblocks_the_key() {
    let _serial = serial_async().await;
    let mut settings = Settings::default();
    settings.admin.token = Some(TOKEN.to_owned());
    // The memory backend on a clock that stands still: the key stays over, and the answers
    // of the page and of the test are equal to the nanosecond.
    let server = TestServer::start_with(settings, RULES).await;
    let addr = server.admin_addr;
    let body = r#"{"domain":"shop","descriptors":[{"entries":[{"key":"user","value":"al"}]}]}"#;
    for _ in 0..21 {
        post(addr, body).await;
    }
    let direct = why_direct(addr, body).await;
    assert_eq!(direct["overall_code"], "OVER_LIMIT", "{direct}");

    let dir = shots_dir();
    let url = format!("http://{addr}/ui?token={TOKEN}");
    let mut page = support::cdp::Browser::open(&chromium(), &url, "1280,1000").await;
    page.wait_for("document.querySelector('#status .badge') && document.querySelector('#status .badge').textContent.startsWith('rules')").await;
    // A click on the top denied key asks about it.
    page.wait_for("document.querySelector('td.top-key')").await;
    page.eval("document.querySelector('td.top-key').click()")
        .await;
    page.wait_for("document.getElementById('why-verdict')")
        .await;
    let asked = page
        .eval("document.getElementById('why-domain').value + ' ' + document.getElementById('why-entries').value")
        .await;
    assert_eq!(asked, serde_json::json!("shop user=al"));
    // Typed in the box (the answer above cleared first, so that the next one is awaited).
    page.eval("document.getElementById('why-answer').replaceChildren()")
        .await;
    page.eval(
        "document.getElementById('why-domain').value = 'shop';\
         document.getElementById('why-entries').value = 'user=al';\
         document.getElementById('why-form').requestSubmit();",
    )
    .await;
    page.wait_for("document.getElementById('why-verdict')")
        .await;
    let shown = page
        .eval("document.getElementById('why-raw').textContent")
        .await;
    let shown: serde_json::Value =
        serde_json::from_str(shown.as_str().expect("text")).expect("the page shows JSON");
    // JavaScript writes 1.0 as 1: numbers are compared as numbers.
    assert_eq!(
        numbers_as_f64(shown),
        numbers_as_f64(direct),
        "the page shows another answer than /why"
    );
    let verdict = page
        .eval("document.getElementById('why-verdict').textContent")
        .await;
    assert!(
        verdict.as_str().is_some_and(|v| v.contains("OVER_LIMIT")),
        "{verdict}"
    );
    let cells = page
        .eval("[...document.querySelectorAll('.why-desc td')].map(c => c.textContent).join('|')")
        .await;
    let cells = cells.as_str().unwrap_or_default().to_owned();
    assert!(
        cells.contains("funnel|20 / second · funnel|0|") && cells.contains("denies, retry in"),
        "{cells}"
    );
    page.screenshot(&dir.join("why-over.png")).await;

    // The reset button: the key is admitted again, and the box says so.
    page.eval("document.getElementById('why-reset').click()")
        .await;
    page.wait_for("!document.getElementById('why-reset-result').hidden && document.getElementById('why-verdict').textContent.includes('OK')").await;
    let result = page
        .eval("document.getElementById('why-reset-result').textContent")
        .await;
    assert!(
        result
            .as_str()
            .is_some_and(|r| r.starts_with("Reset 1 key(s) (1 held)")),
        "{result}"
    );
    let auth = format!("Bearer {TOKEN}");
    let headers = [("authorization", auth.as_str())];
    let unblocked = http::request(addr, "POST", "/json", &headers, body).await;
    assert_eq!(unblocked.status, 200, "{}", unblocked.body);
    page.screenshot(&dir.join("why-reset.png")).await;

    // Without the token, the page's own requests are refused.
    let statuses = page
        .eval(&format!(
            "Promise.all(['/why', '/counters/reset'].map(p => fetch(p, {{method: 'POST', \
             headers: {{'Content-Type': 'application/json'}}, body: {body:?}}}).then(r => r.status)))"
        ))
        .await;
    assert_eq!(statuses, serde_json::json!([401, 401]));
    let wrong = page
        .eval(&format!(
            "fetch('/why', {{method: 'POST', headers: {{Authorization: 'Bearer wrong'}}, \
             body: {body:?}}}).then(r => r.status)"
        ))
        .await;
    assert_eq!(wrong, serde_json::json!(401));
}
