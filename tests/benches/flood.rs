//! A connection flood against a release `gpuctld` (not a test): `--conns` TCP connections
//! (default 20,000) from `--addresses` loopback source addresses (127.0.1.x, default
//! 100), each sending only the HTTP/2 client preface and then nothing, as in the
//! "Hardening, second round" report. While they are open it measures the controller's
//! open descriptors and memory, and how long `gpuctl queue` and `gpuctl submit` over the
//! Unix socket take (a 20 s timeout says "hung"); then the same after the flood closes.
//! The flood runs in two child processes (a process's descriptor limit would cap one).
//!
//!   cargo bench -p gpuctl-tests --bench flood [-- --conns 20000 --addresses 100]
//!
//! `GPUCTL_BENCH_BIN=DIR` measures the binaries in DIR instead (an older build, for the
//! "before" line of docs/benchmarks.md).

use std::io::Write;
use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use gpuctl_tests::{bench_arg, release_bins, start_bench_controller};

const PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";

/// The child: opens `n` connections to `target` from 127.0.1.(first..first+addrs),
/// writes the preface on each, says how many it holds, and waits to be killed.
fn flood_child(target: SocketAddr, n: usize, first: u8, addrs: u8) {
    let mut held = Vec::with_capacity(n);
    let mut failed_in_a_row = 0;
    for i in 0..n {
        let src = format!("127.0.1.{}", first as usize + i % addrs as usize);
        let sock = socket2_connect(&src, target);
        if let Some(mut s) = sock {
            let _ = s.write_all(PREFACE);
            held.push(s);
            failed_in_a_row = 0;
        } else {
            // A server that accepts nothing more (its backlog full): stop trying.
            failed_in_a_row += 1;
            if failed_in_a_row == 20 {
                break;
            }
        }
    }
    println!("{}", held.len());
    std::io::stdout().flush().unwrap();
    std::thread::sleep(Duration::from_secs(3600));
}

/// A TCP connection from source address `src` (any port), given up after 200 ms (a
/// full backlog must not stall the flood).
fn socket2_connect(src: &str, target: SocketAddr) -> Option<TcpStream> {
    use socket2::{Domain, Socket, Type};
    let s = Socket::new(Domain::IPV4, Type::STREAM, None).ok()?;
    let src: SocketAddr = format!("{src}:0").parse().ok()?;
    s.bind(&src.into()).ok()?;
    s.connect_timeout(&target.into(), Duration::from_secs(1))
        .ok()?;
    Some(s.into())
}

fn fds(pid: u32) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/fd")).map_or(0, |d| d.count())
}

fn rss_mib(pid: u32) -> f64 {
    let s = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    s.lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<f64>().ok())
        .map_or(0.0, |kb| kb / 1024.0)
}

/// Runs the CLI on the Unix socket with a 20 s bound: its time, or `None` (hung/failed).
fn timed_cli(bin: &Path, dir: &Path, args: &[&str]) -> Option<Duration> {
    let t = Instant::now();
    let mut child = Command::new(bin.join("gpuctl"))
        .arg("--controller")
        .arg(format!("unix:{}", dir.join("gpuctld.sock").display()))
        .args(args)
        .current_dir(dir)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .ok()?;
    while t.elapsed() < Duration::from_secs(20) {
        if let Ok(Some(st)) = child.try_wait() {
            return st.success().then(|| t.elapsed());
        }
        std::thread::sleep(Duration::from_millis(2));
    }
    let _ = child.kill();
    let _ = child.wait();
    None
}

fn show(d: Option<Duration>) -> String {
    d.map_or("hung (20 s)".into(), |d| {
        format!("{:.1} ms", d.as_secs_f64() * 1000.0)
    })
}

fn measure(label: &str, pid: u32, bin: &Path, dir: &Path) {
    let queue = timed_cli(bin, dir, &["queue"]);
    let submit = timed_cli(bin, dir, &["submit", "job.toml"]);
    println!(
        "{label:<28} fds {:>6}  rss {:>7.1} MiB  queue (unix) {:>12}  submit (unix) {:>12}",
        fds(pid),
        rss_mib(pid),
        show(queue),
        show(submit)
    );
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    if let Some(i) = args.iter().position(|a| a == "--child") {
        let target: SocketAddr = args[i + 1].parse().unwrap();
        let n: usize = args[i + 2].parse().unwrap();
        let first: u8 = args[i + 3].parse().unwrap();
        let addrs: u8 = args[i + 4].parse().unwrap();
        return flood_child(target, n, first, addrs);
    }
    let conns = bench_arg("--conns", 20_000) as usize;
    let addrs = bench_arg("--addresses", 100).clamp(2, 250) as u8;
    let bin = std::env::var_os("GPUCTL_BENCH_BIN")
        .map(PathBuf::from)
        .unwrap_or_else(|| release_bins(&["gpuctld", "gpuctl"]));
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    std::fs::write(d.join("job.toml"), "command = [\"true\"]\n").unwrap();
    let (mut ctld, addr) = start_bench_controller(&bin, d);
    let pid = ctld.id();
    std::thread::sleep(Duration::from_millis(500));
    println!("binaries: {}", bin.display());
    measure("before the flood", pid, &bin, d);
    let t = Instant::now();
    let half = addrs / 2;
    let kids: Vec<_> = [(1u8, half), (1 + half, addrs - half)]
        .into_iter()
        .map(|(first, n)| {
            Command::new(std::env::current_exe().unwrap())
                .args(["--child", &addr, &(conns / 2).to_string()])
                .args([first.to_string(), n.to_string()])
                .stdout(Stdio::piped())
                .spawn()
                .unwrap()
        })
        .collect();
    let mut held = 0;
    let mut kids: Vec<_> = kids
        .into_iter()
        .map(|mut k| {
            let mut line = String::new();
            std::io::BufRead::read_line(
                &mut std::io::BufReader::new(k.stdout.take().unwrap()),
                &mut line,
            )
            .unwrap();
            held += line.trim().parse::<usize>().unwrap_or(0);
            k
        })
        .collect();
    println!(
        "flood: {held} of {conns} connections made from {addrs} addresses in {:.1} s",
        t.elapsed().as_secs_f64()
    );
    measure("during the flood", pid, &bin, d);
    std::thread::sleep(Duration::from_secs(12));
    measure("flood held 12 s more", pid, &bin, d);
    for k in &mut kids {
        let _ = k.kill();
        let _ = k.wait();
    }
    std::thread::sleep(Duration::from_secs(3));
    measure("after the flood closed", pid, &bin, d);
    let _ = ctld.kill();
    let _ = ctld.wait();
}
