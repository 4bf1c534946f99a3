//! Per-QP counters, named after the kernel RXE driver's hw counters where one exists.

burst_wire::counters! {
    /// Counters of one QP.
    #[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
    #[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
    pub struct Counters {
        /// Packets handed to the caller for transmission.
        pub sent_pkts: u64,
        /// Packets received for this QP.
        pub rcvd_pkts: u64,
        /// Payload bytes handed out for transmission (headers excluded).
        pub sent_bytes: u64,
        /// Payload bytes received (headers excluded).
        pub rcvd_bytes: u64,
        /// Duplicate requests seen by the responder.
        pub duplicate_request: u64,
        /// Requests ahead of the expected PSN.
        pub out_of_seq_request: u64,
        /// RNR NAKs received.
        pub rcvd_rnr_err: u64,
        /// RNR NAKs sent.
        pub send_rnr_err: u64,
        /// PSN sequence error NAKs received (and read response gaps seen).
        pub rcvd_seq_err: u64,
        /// Transport retries exhausted.
        pub retry_exceeded_err: u64,
        /// RNR retries exhausted.
        pub retry_rnr_exceeded_err: u64,
        /// Local ACK timeouts.
        pub completer_retry_err: u64,
        /// Error NAKs sent (remote access, invalid request, operational).
        pub send_err: u64,
        /// PSN sequence error NAKs sent (burst's name; RXE counts only
        /// `out_of_seq_request`).
        pub send_seq_nak: u64,
        /// Error NAKs received (remote access, invalid request, operational).
        pub rcvd_err_nak: u64,
        /// Messages received by SEND.
        pub rdma_recvs: u64,
        /// Go-back-N retransmissions started.
        pub retransmits_started: u64,
        /// Rounds of the transport retry count spent (an ACK timeout or a
        /// NAK-sequence error; the one that finds the count spent too).
        pub retry_rounds: u64,
        /// Of those, rounds that followed another with no forward progress
        /// in between: `retry_rounds_repeated / retry_rounds` estimates
        /// the chance a round fails to recover, and so how often a QP
        /// spends its whole count at a given loss (the simulator's sweep
        /// compares the seeds that did with that estimate).
        pub retry_rounds_repeated: u64,
        /// Retransmitted packets.
        pub retransmitted_pkts: u64,
        /// Selective repeat: WRITE packets the responder placed ahead of
        /// the expected PSN (each a packet go-back-N would have resent).
        pub sr_held_pkts: u64,
        /// Selective repeat: probes sent (the oldest unacknowledged packet
        /// resent after four round trips without progress).
        pub sr_probes: u64,
        /// Selective repeat: recoveries that met more holes than it repairs
        /// one by one and went back N.
        pub sr_go_backs: u64,
        /// Packets dropped (wrong state, type, Q_Key, no receive WQE on UC/UD, ghosts).
        pub dropped_pkts: u64,
        /// Duplicate READ or atomic requests not answered: outside the last
        /// `max_dest_rd_atomic` READ/atomic requests the responder keeps.
        pub dup_rd_atomic_dropped: u64,
    }
}
