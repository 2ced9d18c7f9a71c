//! `sinfo`: partitions and nodes in Slurm's formats: `-o '%P %a %l %D %t %N %G'`, `-h`,
//! `-N` (a line per node), `-p`. Without `-N`, a line per partition and node state, as
//! sinfo groups them.

use std::collections::BTreeMap;
use std::ffi::OsString;

use gpuctl_proto as pb;

use super::{clap_failure, pieces, render};
use crate::cli::{Failure, exit, print};

#[derive(clap::Parser, Debug)]
#[command(name = "sinfo", disable_help_flag = true)]
pub(super) struct Args {
    /// No header.
    #[arg(short = 'h', long = "noheader")]
    noheader: bool,
    /// Output format: `%P %a %l %D %t %T %N %G %c %m %E %f %R`.
    #[arg(short = 'o', long = "format")]
    format: Option<String>,
    /// A line per node.
    #[arg(short = 'N', long = "Node")]
    node: bool,
    /// Only these partitions.
    #[arg(short = 'p', long = "partition", value_delimiter = ',')]
    partitions: Vec<String>,
    /// Only these nodes.
    #[arg(short = 'n', long = "nodes", value_delimiter = ',')]
    nodes: Vec<String>,
    /// Accepted: the default format.
    #[arg(short = 'l', long = "long")]
    _long: bool,
    /// Accepted: every partition is shown.
    #[arg(short = 'a', long = "all")]
    _all: bool,
    #[arg(long, action = clap::ArgAction::Help)]
    help: Option<bool>,
}

const DEFAULT: &str = "%9P %.5a %.10l %.6D %.6t %N";
const DEFAULT_NODES: &str = "%N %.6D %9P %6t";

/// One line: a partition and the nodes of one state in it (or one node, with `-N`).
struct Line<'a> {
    partition: &'a pb::PartitionRow,
    nodes: Vec<&'a pb::Node>,
}

pub async fn run(args: Vec<OsString>) -> Result<u8, Failure> {
    use clap::Parser as _;
    let a = Args::try_parse_from(args).map_err(clap_failure)?;
    let mut client = super::client().await?;
    let nodes = client
        .list_nodes(pb::ListNodesRequest::default())
        .await?
        .into_inner()
        .nodes;
    let mut parts = client
        .partitions(pb::PartitionsRequest {})
        .await?
        .into_inner()
        .partitions;
    if parts.is_empty() {
        // No partitions configured: the cluster is one, as Slurm's default partition.
        parts.push(pb::PartitionRow {
            name: "gpu".into(),
            is_default: true,
            state: "up".into(),
            nodes: nodes.iter().map(|n| n.name.clone()).collect(),
            ..Default::default()
        });
    }
    print(&output(&a, &nodes, &parts));
    Ok(exit::OK)
}

/// What sinfo prints for `nodes` in `parts`, as `a` asks.
pub(super) fn output(a: &Args, nodes: &[pb::Node], parts: &[pb::PartitionRow]) -> String {
    let parts: Vec<&pb::PartitionRow> = parts
        .iter()
        .filter(|p| a.partitions.is_empty() || a.partitions.contains(&p.name))
        .collect();
    let mut lines = Vec::new();
    for p in &parts {
        let mine: Vec<&pb::Node> = nodes
            .iter()
            .filter(|n| p.nodes.contains(&n.name))
            .filter(|n| a.nodes.is_empty() || a.nodes.contains(&n.name))
            .collect();
        if a.node {
            lines.extend(mine.into_iter().map(|n| Line {
                partition: p,
                nodes: vec![n],
            }));
            continue;
        }
        let mut by_state: BTreeMap<&str, Vec<&pb::Node>> = BTreeMap::new();
        for n in mine {
            by_state.entry(state_short(n)).or_default().push(n);
        }
        if by_state.is_empty() {
            lines.push(Line {
                partition: p,
                nodes: Vec::new(),
            });
        }
        lines.extend(by_state.into_values().map(|nodes| Line {
            partition: p,
            nodes,
        }));
    }
    let format = a
        .format
        .as_deref()
        .unwrap_or(if a.node { DEFAULT_NODES } else { DEFAULT });
    let ps = pieces(format);
    let mut out = String::new();
    if !a.noheader {
        out.push_str(&render(&ps, |c| title(c).to_string()));
        out.push('\n');
    }
    for l in &lines {
        out.push_str(&render(&ps, |c| value(l, c)));
        out.push('\n');
    }
    out
}

fn title(c: char) -> &'static str {
    match c {
        'P' | 'R' => "PARTITION",
        'a' => "AVAIL",
        'l' => "TIMELIMIT",
        'D' => "NODES",
        't' | 'T' => "STATE",
        'N' => "NODELIST",
        'n' => "HOSTNAMES",
        'G' => "GRES",
        'c' => "CPUS",
        'm' => "MEMORY",
        'E' => "REASON",
        'f' => "AVAIL_FEATURES",
        _ => "",
    }
}

fn value(l: &Line<'_>, c: char) -> String {
    let p = l.partition;
    match c {
        'P' if p.is_default => format!("{}*", p.name),
        'P' | 'R' => p.name.clone(),
        'a' => match p.state.as_str() {
            "" => "up".into(),
            s => s.to_string(),
        },
        'l' if p.max_time_secs == 0 => "infinite".into(),
        'l' => crate::format::slurm_duration(
            i64::try_from(p.max_time_secs.min(1 << 40)).unwrap_or(0) * 1000,
        ),
        'D' => l.nodes.len().to_string(),
        't' => l
            .nodes
            .first()
            .map_or("n/a", |n| state_short(n))
            .to_string(),
        'T' => l.nodes.first().map_or("n/a", |n| state_long(n)).to_string(),
        'N' | 'n' => hostlist(l.nodes.iter().map(|n| n.name.as_str())),
        'G' => gres(&l.nodes),
        'c' => l
            .nodes
            .iter()
            .map(|n| n.cpus)
            .max()
            .unwrap_or(0)
            .to_string(),
        'm' => l
            .nodes
            .iter()
            .map(|n| n.memory_bytes >> 20)
            .max()
            .unwrap_or(0)
            .to_string(),
        'E' => l
            .nodes
            .first()
            .map_or("none", |n| {
                if n.reason.is_empty() {
                    "none"
                } else {
                    &n.reason
                }
            })
            .to_string(),
        'f' => {
            let mut f: Vec<&str> = l
                .nodes
                .iter()
                .flat_map(|n| n.features.iter().map(String::as_str))
                .collect();
            f.sort_unstable();
            f.dedup();
            if f.is_empty() {
                "(null)".into()
            } else {
                f.join(",")
            }
        }
        _ => String::new(),
    }
}

/// sinfo's compact node state.
fn state_short(n: &pb::Node) -> &'static str {
    use pb::NodeState as S;
    match n.state() {
        S::Idle => "idle",
        S::Mixed => "mix",
        S::Allocated => "alloc",
        S::Draining => "drng",
        S::Drained => "drain",
        S::Down | S::Unspecified => "down",
    }
}

fn state_long(n: &pb::Node) -> &'static str {
    use pb::NodeState as S;
    match n.state() {
        S::Idle => "idle",
        S::Mixed => "mixed",
        S::Allocated => "allocated",
        S::Draining => "draining",
        S::Drained => "drained",
        S::Down | S::Unspecified => "down",
    }
}

/// The GPUs of the nodes as Slurm's GRES: `gpu:MODEL:N` per model (most per node).
fn gres(nodes: &[&pb::Node]) -> String {
    let mut most: BTreeMap<String, usize> = BTreeMap::new();
    for n in nodes {
        let mut here: BTreeMap<String, usize> = BTreeMap::new();
        for g in &n.gpus {
            *here.entry(g.model.clone()).or_default() += 1;
        }
        for (m, k) in here {
            let e = most.entry(m).or_default();
            *e = (*e).max(k);
        }
    }
    if most.is_empty() {
        return "(null)".into();
    }
    most.into_iter()
        .map(|(m, k)| format!("gpu:{m}:{k}"))
        .collect::<Vec<_>>()
        .join(",")
}

/// Names folded as a Slurm hostlist: `gpu[01-03,07],login`.
pub fn hostlist<'a>(names: impl Iterator<Item = &'a str>) -> String {
    // (prefix, digits' width) -> numbers; names without a number stay as they are.
    let mut groups: BTreeMap<(String, usize), Vec<u64>> = BTreeMap::new();
    let mut plain = Vec::new();
    for name in names {
        let digits = name.len() - name.trim_end_matches(|c: char| c.is_ascii_digit()).len();
        match name[name.len() - digits..].parse::<u64>() {
            Ok(n) if digits > 0 => groups
                .entry((name[..name.len() - digits].to_string(), digits))
                .or_default()
                .push(n),
            _ => plain.push(name.to_string()),
        }
    }
    let mut out = Vec::new();
    for ((prefix, width), mut nums) in groups {
        nums.sort_unstable();
        nums.dedup();
        if nums.len() == 1 {
            out.push(format!("{prefix}{:0width$}", nums[0]));
            continue;
        }
        let mut ranges = Vec::new();
        let mut i = 0;
        while i < nums.len() {
            let mut k = i;
            while k + 1 < nums.len() && nums[k + 1] == nums[k] + 1 {
                k += 1;
            }
            if k == i {
                ranges.push(format!("{:0width$}", nums[i]));
            } else {
                ranges.push(format!("{:0width$}-{:0width$}", nums[i], nums[k]));
            }
            i = k + 1;
        }
        out.push(format!("{prefix}[{}]", ranges.join(",")));
    }
    out.extend(plain);
    out.join(",")
}
