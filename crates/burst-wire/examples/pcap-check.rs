//! pcap-check: decode every RoCEv2 packet of pcap/pcapng files with
//! burst-wire and verify its ICRC.
//!
//! ```text
//! cargo run --release -p burst-wire --example pcap-check -- FILE...
//! ```
//!
//! With no FILE it checks the golden captures bundled with the crate
//! (`tests/fixtures/rxe/*.pcapng`, recorded from kernel RXE). Prints one line
//! per RoCEv2 packet and ends with `N passed, M failed`; a packet fails when
//! it is UDP to port 4791 but does not parse or its ICRC is wrong. Exits 1 if
//! any failed, 2 if a file cannot be read.

use std::path::PathBuf;
use std::process::ExitCode;

use burst_wire::{Error, IbRepr, RoceFrame};

#[path = "../tests/support/capture.rs"]
mod capture;

/// The packet as burst-wire prints it (`Display` for `IbRepr`), or why it
/// does not decode.
fn describe(f: &RoceFrame<'_>) -> String {
    match IbRepr::parse(&f.ib) {
        Ok(r) => r.to_string(),
        Err(e) => format!("{} (undecodable: {e})", f.ib.opcode()),
    }
}

fn main() -> ExitCode {
    let mut files: Vec<PathBuf> = std::env::args_os().skip(1).map(PathBuf::from).collect();
    if files.is_empty() {
        let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/rxe");
        let mut found: Vec<PathBuf> = std::fs::read_dir(&dir)
            .map(|d| d.filter_map(|e| e.ok().map(|e| e.path())).collect())
            .unwrap_or_default();
        found.retain(|p| p.extension().is_some_and(|e| e == "pcapng" || e == "pcap"));
        found.sort();
        eprintln!(
            "pcap-check: no FILE given; checking the {} bundled RXE captures in {}",
            found.len(),
            dir.display()
        );
        files = found;
    }
    let (mut passed, mut failed, mut unreadable) = (0usize, 0usize, 0usize);
    for path in &files {
        let frames = match capture::read_capture(path) {
            Ok(f) => f,
            Err(e) => {
                eprintln!("pcap-check: cannot read {e}");
                unreadable += 1;
                continue;
            }
        };
        println!("== {}", path.display());
        for (i, c) in frames.iter().enumerate() {
            let n = i + 1;
            match c.parse() {
                Ok(f) => match f.verify_icrc() {
                    Ok(()) => {
                        passed += 1;
                        println!("{n:6} ok   {} icrc=ok", describe(&f));
                    }
                    Err(e) => {
                        failed += 1;
                        println!("{n:6} FAIL {} icrc=bad ({e})", describe(&f));
                    }
                },
                // Not RoCEv2: ARP, other UDP ports, other protocols.
                Err(Error::NotIp(_) | Error::NotUdp(_) | Error::WrongUdpPort(_)) => {}
                Err(e) => {
                    failed += 1;
                    println!("{n:6} FAIL {e}");
                }
            }
        }
    }
    println!("{passed} passed, {failed} failed");
    if unreadable > 0 {
        ExitCode::from(2)
    } else if failed > 0 || passed == 0 {
        ExitCode::from(1)
    } else {
        ExitCode::SUCCESS
    }
}
