//! Congestion control in the data plane, on simulated time: flows through a
//! shared bottleneck (`burst_verbs::bottleneck`) share it fairly with a
//! bounded queue under each controller, and do not without one; CNPs and
//! CE marks reach the controllers.

use burst_cc::{Algorithm, DcqcnConfig};
use burst_verbs::bottleneck::{run, Report, Scenario};

fn dcqcn() -> DcqcnConfig {
    DcqcnConfig::with_line_rate(25_000_000_000 / 8)
}

fn scenario(flows: usize, algo: Algorithm) -> Scenario {
    let mut s = Scenario::new(flows, algo);
    s.duration_ns = 30_000_000;
    s
}

fn assert_fair(r: &Report, what: &str) {
    assert!(r.jain >= 0.95, "{what}: Jain {:.3} ({:?})", r.jain, r.flows);
    assert!(r.converged_ns.is_some(), "{what}: never converged");
    assert_eq!(r.dropped, 0, "{what}: the bottleneck queue overflowed");
    assert!(
        r.max_queue < 1024 / 2,
        "{what}: queue peaked at {}",
        r.max_queue
    );
    assert_eq!(r.failed, 0, "{what}: work requests failed");
    // No flow starves: each gets at least half its share over the last half.
    let share = r.total_gbps() / r.flows.len() as f64;
    for (i, f) in r.flows.iter().enumerate() {
        let half = f.len() / 2;
        let mean = f[half..].iter().sum::<f64>() / (f.len() - half) as f64;
        assert!(
            mean >= share / 2.0,
            "{what}: flow {i} at {mean:.2} of {share:.2} Gb/s"
        );
    }
    assert!(
        r.total_gbps() > 8.0,
        "{what}: {:.2} Gb/s of 10",
        r.total_gbps()
    );
}

#[test]
fn loss_window_flows_share_the_bottleneck() {
    for n in [2, 8] {
        let r = run(&scenario(n, Algorithm::LossWindow));
        assert_fair(&r, &format!("loss-window, {n} flows"));
        assert!(r.senders_cc.window_cuts > 0, "the windows were cut");
    }
}

#[test]
fn dcqcn_flows_share_the_bottleneck_through_cnps() {
    let r = run(&scenario(8, Algorithm::Dcqcn(dcqcn())));
    assert!(
        r.receiver_cc.ce_rcvd > 0 && r.receiver_cc.cnp_sent > 0,
        "{:?}",
        r.receiver_cc
    );
    assert_eq!(
        r.senders_cc.cnp_rcvd, r.receiver_cc.cnp_sent,
        "CNPs are not lost here"
    );
    assert!(r.senders_cc.rate_cuts > 0);
    assert!(r.jain >= 0.95, "Jain {:.3}", r.jain);
    assert_eq!(r.dropped, 0);
    assert!(r.max_queue < 512, "queue peaked at {}", r.max_queue);
    // DCQCN gives up some throughput for its short queue (as in the paper).
    assert!(r.total_gbps() > 7.5, "{:.2} Gb/s", r.total_gbps());
}

#[test]
fn dcqcn_inside_a_loss_window_shares_the_bottleneck() {
    let r = run(&scenario(8, Algorithm::DcqcnAndLossWindow(dcqcn())));
    assert_fair(&r, "dcqcn+loss-window, 8 flows");
}

#[test]
fn without_congestion_control_the_queue_overflows() {
    let r = run(&scenario(8, Algorithm::None));
    assert!(r.dropped > 0, "no drops: {r:?}");
    assert_eq!(r.max_queue, 1025, "the queue filled");
    let controlled = run(&scenario(8, Algorithm::LossWindow));
    assert!(
        controlled.total_gbps() > r.total_gbps(),
        "controlled {:.2} vs uncontrolled {:.2} Gb/s",
        controlled.total_gbps(),
        r.total_gbps()
    );
}
