//! An agent's session as the controller checks it: what a verified request says
//! (`Signed`, from `gpuctl_proto::auth`) and which of its numbers were seen
//! (`ReplayWindow`), so that a request is taken once.

/// What a verified request says about its session.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Signed {
    /// The session (the Attach nonce); empty for Challenge and Attach themselves.
    pub session: Vec<u8>,
    pub seq: u64,
}

/// Which sequence numbers of one session were seen: the highest, and a bitmap of the 64
/// below it (the anti-replay window of IPsec, RFC 4303). Requests of one session may
/// arrive slightly out of order (a heartbeat and a report in flight together), so a
/// number below the highest is accepted once, if it is within the window.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ReplayWindow {
    top: u64,
    seen: u64,
}

impl ReplayWindow {
    /// Records `seq`; false when it was seen before or is too old to tell (a replay).
    /// Sequence numbers start at 1.
    pub fn accept(&mut self, seq: u64) -> bool {
        if seq == 0 {
            return false;
        }
        if seq > self.top {
            let shift = seq - self.top;
            self.seen = if shift >= 64 { 0 } else { self.seen << shift };
            self.seen |= 1;
            self.top = seq;
            return true;
        }
        let back = self.top - seq;
        if back >= 64 {
            return false;
        }
        let bit = 1u64 << back;
        if self.seen & bit != 0 {
            return false;
        }
        self.seen |= bit;
        true
    }
}
