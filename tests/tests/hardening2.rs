//! Issue "Hardening, second round": what an attacker or a careless user got through,
//! each test failing before its fix (device isolation is in `devices.rs`, the connection
//! flood in `flood.rs`).

use std::time::Duration;

use gpuctl_proto::{self as pb, agent_link_client::AgentLinkClient};
use gpuctl_tests::Cluster;

#[allow(dead_code)]
const T: Duration = Duration::from_secs(30);

/// Attack 3: unauthenticated Challenge calls with a 4 MiB node name wrote one WARN line
/// each with the whole name (1.5 GB of log in 10 s). Now: the name is refused before
/// anything is verified or logged, refusals are logged a line a period, and no line
/// carries more than a bounded piece of what the caller sent.
#[test]
fn unauthenticated_requests_do_not_flood_the_log() {
    let c = Cluster::controller_only();
    let before = c.controller_log().len();
    let rt = tokio::runtime::Runtime::new().unwrap();
    let tcp = c.tcp_url();
    let codes = rt.block_on(async move {
        let mut client = AgentLinkClient::connect(tcp)
            .await
            .unwrap()
            .max_encoding_message_size(8 << 20);
        let mut codes = Vec::new();
        for i in 0..60 {
            let node = if i % 2 == 0 {
                "n".repeat(3 << 20)
            } else {
                format!("node-{i}\n\u{1b}[31mFAKE LOG LINE")
            };
            let e = client
                .challenge(pb::ChallengeRequest {
                    node,
                    ..Default::default()
                })
                .await
                .unwrap_err();
            codes.push(e.code());
        }
        codes
    });
    assert!(codes.contains(&tonic::Code::InvalidArgument), "{codes:?}");
    assert!(codes.contains(&tonic::Code::Unauthenticated), "{codes:?}");
    let log = c.controller_log()[before..].to_string();
    assert!(log.len() < 8 * 1024, "{} bytes of log", log.len());
    let refused = log.lines().filter(|l| l.contains("refused")).count();
    assert!((1..=4).contains(&refused), "{refused} lines:\n{log}");
    assert!(!log.contains("FAKE LOG LINE\n"), "a caller's newline is escaped: {log}");
    assert!(log.lines().all(|l| l.len() < 1024), "{log}");
}
