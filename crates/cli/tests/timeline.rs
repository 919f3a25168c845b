//! The HTML timeline of a run (`runs show ID --html FILE`), checked in a real headless
//! Chromium: the page lays out a lane per task and a bar per model round, and the browser's
//! screenshot shows each bar, in the model-round colour, where the page says it drew it.
//!
//! Chromium is `$CHROMIUM` or `/usr/bin/chromium` (CI installs Debian's `chromium`). Without
//! one the test says so and passes, unless `PROMPTFORGE_REQUIRE_BROWSER` is set (CI sets it).

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod support;

use std::path::{Path, PathBuf};
use std::process::Command;

use serde_json::Value;
use support::promptforge;

fn chromium() -> Option<PathBuf> {
    let path = std::env::var_os("CHROMIUM")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("/usr/bin/chromium"));
    path.exists().then_some(path)
}

fn browser(chromium: &Path, profile: &Path, args: &[&str]) -> std::process::Output {
    Command::new(chromium)
        .args([
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-quic",
            "--no-first-run",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
            "--hide-scrollbars",
            "--force-device-scale-factor=1",
            "--window-size=1200,500",
        ])
        .arg(format!("--user-data-dir={}", profile.display()))
        .args(args)
        .output()
        .unwrap()
}

#[test]
fn the_timeline_page_draws_a_lane_per_task_and_a_bar_per_round() {
    let Some(chromium) = chromium() else {
        assert!(
            std::env::var_os("PROMPTFORGE_REQUIRE_BROWSER").is_none(),
            "no Chromium at $CHROMIUM or /usr/bin/chromium (apt install chromium)"
        );
        eprintln!("skipped: no Chromium (set CHROMIUM, or apt install chromium)");
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let ran = promptforge(dir.path())
        .args(["run"])
        .arg(root.join("examples/facts.md"))
        .arg("--script")
        .arg(root.join("examples/scripts/facts.json"))
        .output()
        .unwrap();
    assert!(ran.status.success());
    let page = dir.path().join("run.html");
    let shown = promptforge(dir.path())
        .args(["runs", "show", "1", "--html"])
        .arg(&page)
        .output()
        .unwrap();
    assert!(
        shown.status.success(),
        "{}",
        String::from_utf8_lossy(&shown.stderr)
    );
    let url = format!("file://{}", page.display());

    let dom = browser(&chromium, &dir.path().join("p1"), &["--dump-dom", &url]);
    let dom = String::from_utf8_lossy(&dom.stdout).into_owned();
    let body = dom
        .split("<body")
        .nth(1)
        .and_then(|b| b.split('>').next())
        .unwrap_or_else(|| panic!("no body in:\n{dom}"));
    let attr = |name: &str| -> String {
        let start = body
            .find(&format!("{name}=\""))
            .unwrap_or_else(|| panic!("no {name} on <body{body}>"))
            + name.len()
            + 2;
        let end = start + body[start..].find('"').unwrap();
        body[start..end].replace("&quot;", "\"")
    };
    assert_eq!(attr("data-lanes"), "4", "the main walk and three arms");
    assert_eq!(attr("data-bars"), "3");
    assert_eq!(attr("data-drawn"), "3");
    let boxes: Vec<Value> = serde_json::from_str(&attr("data-boxes")).unwrap();
    let mut tasks: Vec<&str> = boxes.iter().map(|b| b["task"].as_str().unwrap()).collect();
    tasks.sort();
    assert_eq!(tasks, ["0.0", "0.1", "0.2"], "one round in each arm's lane");

    let shot = dir.path().join("run.png");
    let out = browser(
        &chromium,
        &dir.path().join("p2"),
        &[&format!("--screenshot={}", shot.display()), &url],
    );
    assert!(shot.exists(), "{}", String::from_utf8_lossy(&out.stderr));
    let decoder = png::Decoder::new(std::io::BufReader::new(std::fs::File::open(&shot).unwrap()));
    let mut reader = decoder.read_info().unwrap();
    let mut pixels = vec![0; reader.output_buffer_size()];
    let info = reader.next_frame(&mut pixels).unwrap();
    let channels = info.color_type.samples();
    let pixel = |x: i64, y: i64| -> [u8; 3] {
        let at = (y as usize * info.width as usize + x as usize) * channels;
        [pixels[at], pixels[at + 1], pixels[at + 2]]
    };
    for b in &boxes {
        let (x, y, w, h) = (
            b["x"].as_i64().unwrap(),
            b["y"].as_i64().unwrap(),
            b["w"].as_i64().unwrap(),
            b["h"].as_i64().unwrap(),
        );
        // The middle of the bar is the model-round blue (#5b8def), give or take rendering.
        let [r, g, bl] = pixel(x + w / 2, y + h / 2);
        let near = |a: u8, want: u8| (i16::from(a) - i16::from(want)).abs() <= 24;
        assert!(
            near(r, 0x5b) && near(g, 0x8d) && near(bl, 0xef),
            "bar {b} is {r},{g},{bl} in the screenshot"
        );
    }
    // Away from the bars, the page is white.
    assert_eq!(pixel(5, 480), [255, 255, 255]);
}
