//! The receive path of the real data plane under arbitrary frames and
//! mutations of valid ones (resealed, so they pass the ICRC check): a
//! device with live RC, UC and UD QPs and registered memory must not panic
//! (a contained fault would show as a QP or device in error, which the
//! harness's checks do not allow for valid memory), must not write outside
//! registered memory, and must account for every frame.
#![no_main]

use burst_verbs::sim::RxHarness;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let mut h = RxHarness::new();
    h.feed(data);
    if let Err(e) = h.check() {
        panic!("{e}");
    }
});
