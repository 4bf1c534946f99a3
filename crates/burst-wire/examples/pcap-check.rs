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

use std::fmt::Write as _;
use std::path::PathBuf;
use std::process::ExitCode;

use burst_wire::{Error, RoceFrame, Syndrome};

#[path = "../tests/support/capture.rs"]
mod capture;

fn describe(f: &RoceFrame<'_>) -> String {
    let ib = &f.ib;
    let bth = ib.bth();
    let mut s = format!(
        "{:<36} qp={:#08x} psn={:#08x}",
        ib.opcode().name(),
        bth.dest_qp().value(),
        bth.psn().value()
    );
    if bth.ack_req() {
        s.push_str(" A");
    }
    if bth.solicited() {
        s.push_str(" SE");
    }
    if bth.fecn() || bth.becn() {
        let _ = write!(
            s,
            " FECN={} BECN={}",
            u8::from(bth.fecn()),
            u8::from(bth.becn())
        );
    }
    if let Some(d) = ib.deth() {
        let _ = write!(
            s,
            " DETH[qkey={:#x} src_qp={:#x}]",
            d.qkey(),
            d.src_qp().value()
        );
    }
    if let Some(r) = ib.reth() {
        let _ = write!(
            s,
            " RETH[va={:#x} rkey={:#x} len={}]",
            r.virtual_address(),
            r.rkey(),
            r.dma_length()
        );
    }
    if let Some(a) = ib.atomic_eth() {
        let _ = write!(
            s,
            " AtomicETH[va={:#x} rkey={:#x} swap_add={:#x} cmp={:#x}]",
            a.virtual_address(),
            a.rkey(),
            a.swap_add(),
            a.compare()
        );
    }
    if let Some(a) = ib.aeth() {
        let syn = match Syndrome::from_byte(a.syndrome()) {
            Syndrome::Ack(c) => format!("ACK credits={}", c.0),
            Syndrome::RnrNak(t) => format!("RNR-NAK timer={}({}us)", t.0, t.micros()),
            Syndrome::Nak(n) => format!("NAK {n:?}"),
            Syndrome::Reserved(b) => format!("reserved {b:#x}"),
        };
        let _ = write!(s, " AETH[{syn} msn={}]", a.msn());
    }
    if let Some(a) = ib.atomic_ack_eth() {
        let _ = write!(s, " AtomicAckETH[orig={:#x}]", a.original());
    }
    if let Some(i) = ib.imm_dt() {
        let _ = write!(s, " ImmDt[{:#010x}]", i.imm());
    }
    if let Some(i) = ib.ieth() {
        let _ = write!(s, " IETH[rkey={:#x}]", i.rkey());
    }
    let _ = write!(s, " payload={}", ib.payload_len());
    s
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
