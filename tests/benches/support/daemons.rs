//! For the scale bench: its controllers as processes: one `gpuctld` (TLS or the old
//! mode), or three on Raft sharing a cluster key, with the leader found.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use gpuctl_proto as pb;
use gpuctl_tests::free_port;

pub struct Daemon {
    pub child: Child,
    pub port: u16,
    pub socket: PathBuf,
    pub metrics: u16,
    pub tls: bool,
}

pub fn start_gpuctld(bin: &Path, dir: &Path, metrics: u16, tls: bool) -> Daemon {
    start_gpuctld_on(bin, dir, metrics, 0, tls)
}

/// Starts gpuctld on `port` (0: any), TLS or the old mode, answers once it said where
/// it listens.
pub fn start_gpuctld_on(bin: &Path, dir: &Path, metrics: u16, port: u16, tls: bool) -> Daemon {
    start_member(bin, dir, metrics, port, tls, None)
}

/// `start_gpuctld_on`, as member `id` of replicated controllers on `peers` when given
/// (its state in `state-ID`, member 1's in `state`, the key shared).
fn start_member(
    bin: &Path,
    dir: &Path,
    metrics: u16,
    port: u16,
    tls: bool,
    raft: Option<(u64, &str)>,
) -> Daemon {
    use std::io::BufRead;
    let (state, socket, log) = match raft {
        None => ("state".into(), "gpuctld.sock".into(), "gpuctld.log".into()),
        Some((id, _)) => (
            if id == 1 {
                "state".into()
            } else {
                format!("state-{id}")
            },
            format!("gpuctld-{id}.sock"),
            format!("gpuctld-{id}.log"),
        ),
    };
    let socket = dir.join::<String>(socket);
    let raft_args: Vec<String> = match raft {
        Some((id, peers)) => vec![
            "--id".into(),
            id.to_string(),
            "--peers".into(),
            peers.into(),
        ],
        None => Vec::new(),
    };
    let _ = std::fs::remove_file(&socket);
    let mut child = Command::new(bin.join("gpuctld"))
        .args(["--listen", &format!("127.0.0.1:{port}"), "--state-dir"])
        .arg(dir.join::<String>(state))
        .arg("--socket")
        .arg(&socket)
        .arg("--config")
        .arg(dir.join("gpuctld.toml"))
        .args(["--metrics-listen", &format!("127.0.0.1:{metrics}")])
        .args(if tls {
            &[][..]
        } else {
            &["--insecure-shared-key", "--insecure"][..]
        })
        .args(&raft_args)
        .env("GPUCTL_LOG", "warn")
        .stdout(Stdio::piped())
        .stderr(
            std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(dir.join::<String>(log))
                .unwrap(),
        )
        .spawn()
        .expect("start gpuctld");
    let mut line = String::new();
    std::io::BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    let port = line
        .trim()
        .rsplit(':')
        .next()
        .and_then(|p| p.parse().ok())
        .unwrap_or_else(|| panic!("gpuctld did not say its port: {line:?}"));
    Daemon {
        child,
        port,
        socket,
        metrics,
        tls,
    }
}

/// Three (`n`) controllers on Raft sharing one cluster key (old mode): every member,
/// and the index of the leader once one is elected.
pub fn start_replicas(bin: &Path, dir: &Path, n: u64) -> (Vec<Daemon>, usize) {
    use std::os::unix::fs::PermissionsExt;
    let key: String = (0..32)
        .map(|i| format!("{:02x}", (i * 53 + 7) as u8))
        .collect();
    for id in 1..=n {
        let state = dir.join(if id == 1 {
            "state".into()
        } else {
            format!("state-{id}")
        });
        std::fs::create_dir_all(&state).unwrap();
        std::fs::set_permissions(&state, std::fs::Permissions::from_mode(0o700)).unwrap();
        let file = state.join("cluster.key");
        std::fs::write(&file, format!("{key}\n")).unwrap();
        std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o600)).unwrap();
    }
    let ports: Vec<u16> = (0..n).map(|_| free_port()).collect();
    let peers = (ports.iter().enumerate())
        .map(|(i, p)| format!("{}=127.0.0.1:{p}", i + 1))
        .collect::<Vec<_>>()
        .join(",");
    let members: Vec<Daemon> = (1..=n)
        .map(|id| {
            let port = ports[id as usize - 1];
            start_member(bin, dir, free_port(), port, false, Some((id, &peers)))
        })
        .collect();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let t = Instant::now();
    loop {
        for (i, m) in members.iter().enumerate() {
            let leads = rt.block_on(async {
                let mut c = super::user_client(&m.socket).await;
                let r = c.controllers(pb::ControllersRequest {}).await.ok()?;
                let r = r.into_inner();
                Some(r.members.iter().any(|x| x.id == r.id && x.leader))
            });
            if leads == Some(true) {
                return (members, i);
            }
        }
        assert!(t.elapsed() < Duration::from_secs(30), "no leader elected");
        std::thread::sleep(Duration::from_millis(200));
    }
}
