//! burst-bench end to end on loopback: every test runs, prints one JSON
//! result with sane figures, and bad arguments are refused.

use std::process::Command;

/// Loopback runs all bind 127.0.90.1/.2 port 4791: one at a time.
static LOOPBACK: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn run(args: &[&str]) -> (bool, String, String) {
    let _one = LOOPBACK.lock().unwrap_or_else(|e| e.into_inner());
    let o = Command::new(env!("CARGO_BIN_EXE_burst-bench"))
        .args(args)
        .output()
        .expect("burst-bench runs");
    (
        o.status.success(),
        String::from_utf8_lossy(&o.stdout).into_owned(),
        String::from_utf8_lossy(&o.stderr).into_owned(),
    )
}

fn field(json: &str, key: &str) -> f64 {
    let at = json
        .find(&format!("\"{key}\":"))
        .unwrap_or_else(|| panic!("{key} in {json}"));
    json[at + key.len() + 3..]
        .split([',', '}'])
        .next()
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("{key} value in {json}"))
}

#[test]
fn every_test_runs_on_loopback_and_reports_json() {
    for (test, extra) in [
        ("write_bw", &["-n", "200"][..]),
        ("read_bw", &["-n", "200"]),
        ("send_bw", &["-n", "200"]),
        ("atomic_bw", &["-n", "200"]),
        ("write_bw", &["-n", "100", "-q", "2", "-b"]),
        ("write_lat", &["-n", "200"]),
        ("read_lat", &["-n", "200"]),
        ("send_lat", &["-n", "200", "-e"]),
        ("atomic_lat", &["-n", "200"]),
    ] {
        let mut args = vec![test, "--json"];
        args.extend(extra);
        let (ok, out, err) = run(&args);
        assert!(ok, "{test} {extra:?} failed: {err}");
        let line = out.lines().last().unwrap_or_default();
        assert!(line.contains(&format!("\"test\":\"{test}\"")), "{line}");
        if test.ends_with("_bw") {
            assert!(field(line, "gbps") > 0.0, "{line}");
            let iters = field(line, "iters");
            let want = if extra.contains(&"-q") { 400.0 } else { 200.0 };
            assert_eq!(iters, want, "every message accounted for: {line}");
        } else {
            let (p50, p99) = (field(line, "p50"), field(line, "p99"));
            assert!(p50 > 0.0 && p99 >= p50, "{line}");
            assert_eq!(field(line, "iters"), 200.0, "{line}");
        }
    }
}

#[test]
fn tcp_and_raw_udp_give_the_alternatives() {
    for t in ["tcp", "raw-udp"] {
        let (ok, out, err) = run(&[
            "write_bw",
            "--transport",
            t,
            "-n",
            "200",
            "-s",
            "16384",
            "--json",
        ]);
        assert!(ok, "{t}: {err}");
        assert!(field(out.lines().last().unwrap_or_default(), "gbps") > 0.0);
        for events in [false, true] {
            let mut args = vec!["send_lat", "--transport", t, "-n", "200", "--json"];
            if events {
                args.push("-e");
            }
            let (ok, out, err) = run(&args);
            assert!(ok, "{t} {args:?}: {err}");
            let line = out.lines().last().unwrap_or_default();
            assert!(field(line, "p50") > 0.0, "{line}");
            assert_eq!(field(line, "iters"), 200.0, "{line}");
            assert!(
                line.contains(&format!("\"events\":{events}")),
                "the mode is recorded: {line}"
            );
        }
    }
}

#[test]
fn bad_arguments_are_refused_with_a_reason() {
    let (ok, _, err) = run(&["read_lat", "-b"]);
    assert!(!ok && err.contains("-b"), "{err}");
    let (ok, _, err) = run(&["read_bw", "--transport", "tcp"]);
    assert!(!ok && err.contains("tcp"), "{err}");
    let (ok, _, err) = run(&["write_bw", "-m", "1500"]);
    assert!(!ok && err.contains("MTU"), "{err}");
    let (ok, _, err) = run(&["write_bw", "--server"]);
    assert!(!ok && err.contains("--local"), "{err}");
}
