//! A flood of idle connections must not stop the controller (issue "Hardening, second
//! round", attack 2): caps per address and in all, a handshake deadline, a descriptor
//! reserve; the Unix socket and connected agents keep working, refusals are counted in
//! metrics and logged as summaries. The full-size flood (20,000 connections) is
//! `cargo bench --bench flood`; this is the same attack scaled to a test.

use std::io::Write;
use std::net::{SocketAddr, TcpStream};
use std::time::{Duration, Instant};

use gpuctl_tests::{Cluster, free_port, wait_for};

const T: Duration = Duration::from_secs(30);
const PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";

fn connect_from(src: &str, target: SocketAddr) -> Option<TcpStream> {
    use socket2::{Domain, Socket, Type};
    let s = Socket::new(Domain::IPV4, Type::STREAM, None).ok()?;
    s.bind(&format!("{src}:0").parse::<SocketAddr>().ok()?.into())
        .ok()?;
    s.connect_timeout(&target.into(), Duration::from_secs(1))
        .ok()?;
    let mut s: TcpStream = s.into();
    s.write_all(PREFACE).ok()?;
    Some(s)
}

fn scrape(port: u16) -> String {
    let mut s = TcpStream::connect(("127.0.0.1", port)).unwrap();
    s.write_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        .unwrap();
    let mut out = String::new();
    std::io::Read::read_to_string(&mut s, &mut out).unwrap();
    out
}

fn metric(text: &str, prefix: &str) -> f64 {
    text.lines()
        .find(|l| l.starts_with(prefix))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse().ok())
        .unwrap_or(0.0)
}

fn fds(pid: i32) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/fd"))
        .unwrap()
        .count()
}

#[test]
fn an_idle_connection_flood_is_bounded_and_the_socket_keeps_answering() {
    let port = free_port();
    let mut c = Cluster::controller_with_config(
        "[limits]\nmax_connections = 300\nmax_connections_per_address = 20\nhandshake_timeout = \"2s\"\n",
    );
    c.kill9_controller();
    c.ctld_args = vec!["--metrics-listen".into(), format!("127.0.0.1:{port}")];
    c.start_controller();
    c.add_agent("fl1", "1xA100-80GB", &[]);
    c.wait_nodes_up(1);
    let pid = c.controller_pid().as_raw();
    let before = fds(pid);
    let target: SocketAddr = format!("127.0.0.1:{}", c.port).parse().unwrap();
    // 1,200 connections from 12 addresses: 100 each, 20 of them under the per-address
    // cap (240, under the total cap of 300).
    let t0 = Instant::now();
    let mut held = Vec::new();
    for i in 0..1200 {
        held.extend(connect_from(&format!("127.0.2.{}", 1 + i % 12), target));
    }
    // While the flood is open: the socket answers, a submit runs on the attached agent,
    // and the controller holds no more descriptors than its cap allows.
    let q = Instant::now();
    c.gpuctl_ok(&["queue"]);
    assert!(
        q.elapsed() < Duration::from_secs(5),
        "queue took {:?}",
        q.elapsed()
    );
    let id = c.submit("ok.toml", "command = [\"true\"]\n[resources]\ngpus = 1\n");
    c.wait_state(id, "COMPLETED", T);
    let during = fds(pid);
    assert!(
        during <= before + 300 + 10,
        "{during} descriptors during the flood, {before} before"
    );
    // Every connection made is accounted for: open, refused at its address's cap, or
    // closed at the handshake deadline (the agent's own is open too).
    let grpc = |m: &str, what: &str| {
        metric(m, &format!("gpuctl_connections_{what}{{listener=\"grpc\"")) as usize
    };
    let refused = |m: &str, why: &str| {
        metric(
            m,
            &format!("gpuctl_connections_refused_total{{listener=\"grpc\",reason=\"{why}\"}}"),
        ) as usize
    };
    assert!(wait_for(T, || {
        let m = scrape(port);
        grpc(&m, "open") + refused(&m, "per_address_cap") + refused(&m, "handshake_timeout")
            > held.len()
    }));
    let m = scrape(port);
    assert!(refused(&m, "per_address_cap") > 0, "{m}");
    assert!(grpc(&m, "open") <= 12 * 20 + 1, "{m}");
    // The handshake deadline closes what is left of the flood.
    assert!(wait_for(T, || {
        let m = scrape(port);
        metric(&m, "gpuctl_connections_open{listener=\"grpc\"}") <= 2.0
            && metric(
                &m,
                "gpuctl_connections_refused_total{listener=\"grpc\",reason=\"handshake_timeout\"}",
            ) >= 230.0
    }));
    assert!(fds(pid) <= before + 10, "descriptors are given back");
    assert!(t0.elapsed() > Duration::from_secs(2));
    drop(held);
    // Hundreds of refusals, a handful of log lines.
    let log = c.controller_log();
    let lines = log
        .lines()
        .filter(|l| l.contains("connection(s) refused"))
        .count();
    assert!((1..=10).contains(&lines), "{lines} lines:\n{log}");
    // The agent's stream lived through it all.
    assert_eq!(c.node_state("fl1"), "IDLE");
}
