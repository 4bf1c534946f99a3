//! Feeds arbitrary bytes to every entry point of the parser and touches every
//! accessor of whatever parses: none of it may panic.
#![no_main]

use burst_wire::mad::CmMad;
use burst_wire::{IbPacket, IbRepr, RoceFrame};
use libfuzzer_sys::fuzz_target;

fn touch(f: &RoceFrame<'_>) {
    let _ = f.verify_icrc();
    let _ = f.ud_grh();
    if let Ok(r) = f.repr() {
        // What parsed must emit again.
        let mut buf = vec![0u8; r.frame_len()];
        r.emit(&mut buf, f.ib.payload()).expect("re-emit of a parsed frame");
    }
    touch_ib(&f.ib);
}

fn touch_ib(p: &IbPacket<&[u8]>) {
    let _ = p.payload();
    let _ = p.icrc();
    let _ = (p.reth(), p.aeth(), p.deth(), p.atomic_eth(), p.atomic_ack_eth(), p.imm_dt(), p.ieth());
    if let Ok(r) = IbRepr::parse(p) {
        let mut buf = vec![0u8; r.buffer_len()];
        r.emit(&mut buf).expect("re-emit of a parsed packet");
    }
    if p.payload().len() >= 256 {
        let _ = CmMad::parse(p.payload());
    }
}

fuzz_target!(|data: &[u8]| {
    if let Ok(f) = RoceFrame::parse_ethernet(data) {
        touch(&f);
    }
    if let Ok(f) = RoceFrame::parse_ip(data) {
        touch(&f);
    }
    if let Ok(p) = IbPacket::new_checked(data) {
        touch_ib(&p);
    }
    let _ = CmMad::parse(data);
});
