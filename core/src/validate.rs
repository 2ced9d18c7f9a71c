//! What the controller checks of a job before it is queued: the spec's shape, paths,
//! names and sizes, dependencies, and whether any node could ever run it.

use crate::record::{DependencyKind, JobSpec, JobState, Resources, state_name};

use crate::error::{Actor, Refusal};
use crate::state::Cluster;

use crate::config::Config;
use gpuctl_sched::{self as sched, ClusterView, GpuRequest};

/// A user name a job may run as: POSIX's portable set (letters, digits, `.`, `_`, `-`,
/// not leading), at most 32 bytes.
pub fn valid_user_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 32
        && !name.starts_with('-')
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'))
}

/// Whose a submitted job is. An empty `user`, or the caller's own: the caller's, with
/// `creds` (their uid and gid, where the controller knows them: its Unix socket; else
/// the node resolves the name). Another user: only for an admin (like `sbatch --uid`),
/// a valid name, resolved on the node; anyone else is refused for trying.
pub fn set_owner(
    actor: &Actor,
    creds: Option<(u32, u32)>,
    spec: &mut JobSpec,
) -> Result<(), Refusal> {
    if spec.user.is_empty() || spec.user == actor.user {
        spec.user = actor.user.clone();
        (spec.uid, spec.gid) = creds.unwrap_or((0, 0));
        return Ok(());
    }
    let named = crate::text::shown(&spec.user, 64);
    if !actor.admin {
        return Err(actor.deny(&format!(
            "cannot submit a job as user {named:?} (only admins submit for others)"
        )));
    }
    if !valid_user_name(&spec.user) {
        return Err(Refusal::invalid_argument(format!(
            "user {named:?} is not a valid user name"
        )));
    }
    (spec.uid, spec.gid) = (0, 0);
    Ok(())
}

/// The most restarts after a failure a job may ask for (`max_restarts`).
pub const MAX_RESTARTS: u32 = 100;

/// Longest job name, QoS name, env key.
const MAX_NAME: usize = 256;
/// Slurm's `--mail-type` values, as a job keeps them (upper case).
pub const MAIL_TYPES: &[&str] = &[
    "NONE",
    "BEGIN",
    "END",
    "FAIL",
    "REQUEUE",
    "ALL",
    "INVALID_DEPEND",
    "STAGE_OUT",
    "TIME_LIMIT",
    "TIME_LIMIT_90",
    "TIME_LIMIT_80",
    "TIME_LIMIT_50",
    "ARRAY_TASKS",
];
/// Longest comment (`sbatch --comment`).
const MAX_COMMENT: usize = 1024;
/// Longest env value and command argument.
const MAX_VALUE: usize = 32 * 1024;

/// Text other users may see (names, QoS) or that reaches a process (env, argv): no
/// control characters in names, env keys shell-like, nothing over its size.
pub(crate) fn check_text(spec: &JobSpec) -> Result<(), Refusal> {
    let bad = |m: String| Err(Refusal::invalid_argument(m));
    let shown = |v: &str| {
        let mut s: String = v.chars().take(40).flat_map(char::escape_default).collect();
        if v.chars().count() > 40 {
            s.push_str("...");
        }
        s
    };
    for (what, v) in [
        ("name", &spec.name),
        ("qos", &spec.qos),
        ("account", &spec.account),
        ("partition", &spec.partition),
        ("wckey", &spec.wckey),
        ("mail_user", &spec.mail_user),
    ] {
        if v.len() > MAX_NAME {
            return bad(format!("`{what}` is {} bytes, over {MAX_NAME}", v.len()));
        }
        if v.chars().any(|c| c.is_control()) {
            return bad(format!(
                "`{what}` \"{}\" holds control characters (newline, escape, NUL...)",
                shown(v)
            ));
        }
        if let Some(c) = v.chars().find(|&c| crate::text::invisible(c)) {
            return bad(format!(
                "`{what}` \"{}\" holds an invisible character (U+{:04X}): names are seen by other users and must read as they are",
                shown(v),
                c as u32
            ));
        }
    }
    if spec.comment.len() > MAX_COMMENT {
        return bad(format!(
            "`comment` is {} bytes, over {MAX_COMMENT}",
            spec.comment.len()
        ));
    }
    if spec
        .comment
        .chars()
        .any(|c| c.is_control() || crate::text::invisible(c))
    {
        return bad(format!(
            "`comment` \"{}\" holds a control or invisible character: it is shown to other users as it is",
            shown(&spec.comment)
        ));
    }
    if !spec.mail_user.is_empty() && !crate::mail::valid_recipient(&spec.mail_user) {
        return bad(format!(
            "mail user \"{}\" is not a user name or an address (letters, digits and . _ % + - @, not starting with -)",
            shown(&spec.mail_user)
        ));
    }
    if let Some(bad_type) =
        (spec.mail_type.split(',').filter(|t| !t.is_empty())).find(|t| !MAIL_TYPES.contains(t))
    {
        return bad(format!(
            "mail type \"{}\" is not one of Slurm's: {}",
            shown(bad_type),
            MAIL_TYPES.join(", ")
        ));
    }
    for (k, v) in &spec.env {
        let shell_name = k
            .chars()
            .next()
            .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
            && k.chars().all(|c| c.is_ascii_alphanumeric() || c == '_');
        if !shell_name || k.len() > MAX_NAME {
            return bad(format!(
                "env key \"{}\" is not a variable name (letters, digits and _, not starting with a digit, at most {MAX_NAME})",
                shown(k)
            ));
        }
        if v.len() > MAX_VALUE || v.contains('\0') {
            return bad(format!(
                "env {k}: the value is over {MAX_VALUE} bytes or holds a NUL byte"
            ));
        }
    }
    for a in &spec.command {
        if a.len() > MAX_VALUE || a.contains('\0') {
            return bad(format!(
                "command argument \"{}\" is over {MAX_VALUE} bytes or holds a NUL byte",
                shown(a)
            ));
        }
    }
    if spec.script.contains('\0') {
        return bad("the script holds a NUL byte".into());
    }
    Ok(())
}

/// What only admins decide: raising a job's priority (users may lower it, like
/// Slurm's `nice`), the QoS a user may choose, and time limits past the cap.
pub(crate) fn check_policy(
    cfg: &Config,
    caller: &Actor,
    spec: &JobSpec,
    qos_given: bool,
) -> Result<(), Refusal> {
    if spec.priority > 0 && !caller.admin {
        return Err(Refusal::permission_denied(format!(
            "only admins raise a job's priority ({} asked); a negative priority lowers it",
            spec.priority
        )));
    }
    if spec.priority.unsigned_abs() > crate::request::MAX_PRIORITY_ADJUST {
        return Err(Refusal::invalid_argument(format!(
            "priority {} is out of range: a job's priority adjustment (nice) is -{max} to {max}",
            spec.priority,
            max = crate::request::MAX_PRIORITY_ADJUST
        )));
    }
    if !spec.qos.is_empty() {
        let names = || cfg.qos.keys().cloned().collect::<Vec<_>>().join(", ");
        let Some(q) = cfg.qos.get(&spec.qos) else {
            return Err(Refusal::invalid_argument(format!(
                "unknown qos {:?}; this cluster has: {}",
                spec.qos,
                names()
            )));
        };
        if !qos_given && !q.allows(&caller.user, caller.admin) {
            return Err(Refusal::permission_denied(format!(
                "user {} may not use qos {:?} (ask an admin; qos.{}.allowed_users)",
                caller.user, spec.qos, spec.qos
            )));
        }
        if !qos_given && !caller.admin && !q.allows_account(&spec.account) {
            return Err(Refusal::permission_denied(format!(
                "account {:?} may not use qos {:?} (qos.{}.allowed_accounts)",
                spec.account, spec.qos, spec.qos
            )));
        }
        let limit = spec.resources.time_limit_secs;
        if let Some(max) = q.max_time
            && limit > max.as_secs()
        {
            return Err(Refusal::invalid_argument(format!(
                "time limit {} is over qos {:?}'s maximum of {} (qos.{}.max_time)",
                humantime::format_duration(std::time::Duration::from_secs(limit.min(1 << 40))),
                spec.qos,
                humantime::format_duration(max),
                spec.qos
            )));
        }
    }
    if let Err(why) = crate::request::parse_signal_spec(&spec.signal) {
        return Err(Refusal::invalid_argument(why));
    }
    if spec.max_restarts > MAX_RESTARTS {
        return Err(Refusal::invalid_argument(format!(
            "max_restarts = {}: at most {MAX_RESTARTS}",
            spec.max_restarts
        )));
    }
    if !cfg.may_charge(&spec.user, &spec.account, caller.admin) {
        let mine: Vec<&str> = cfg
            .accounts
            .iter()
            .filter(|(_, a)| a.users.contains(&spec.user))
            .map(|(n, _)| n.as_str())
            .collect();
        return Err(Refusal::permission_denied(format!(
            "user {} may not charge account {:?}; theirs: {} (accounts.NAME.users in the controller's config)",
            spec.user,
            spec.account,
            if mine.is_empty() {
                spec.user.clone()
            } else {
                mine.join(", ")
            }
        )));
    }
    let limit = spec.resources.time_limit_secs;
    let max = cfg.limits.max_time_limit;
    if limit > max.as_secs() {
        return Err(Refusal::invalid_argument(format!(
            "time limit {} is over the cluster's maximum of {} (limits.max_time_limit)",
            humantime::format_duration(std::time::Duration::from_secs(limit.min(1 << 40))),
            humantime::format_duration(max)
        )));
    }
    Ok(())
}

/// Refuses `%` patterns in an output path that are not expanded.
fn check_patterns(what: &str, p: &str) -> Result<(), String> {
    let mut chars = p.chars();
    while let Some(c) = chars.next() {
        if c != '%' {
            continue;
        }
        match chars.next() {
            Some('j' | 'J' | 'x' | 'u' | 'N' | 'n' | 't' | 's' | 'A' | 'a' | '%') => {}
            other => {
                return Err(format!(
                    "{what} {p:?}: unknown pattern %{}; output paths may use %j and %J (job id), %x (job name), %u (user), %N (node), %n and %t (rank), %s (step: batch), %A (array id), %a (array task) and %% (a %)",
                    other.map(String::from).unwrap_or_default()
                ));
            }
        }
    }
    Ok(())
}

pub(crate) fn validate_spec(spec: &JobSpec, max_list_len: usize) -> Result<(), Refusal> {
    let bad = |m: &str| Err(Refusal::invalid_argument(m.to_string()));
    if spec.interactive {
        if !spec.command.is_empty() || !spec.script.is_empty() {
            return bad(
                "an interactive allocation runs no `command` or `script` of its own: its steps come from `gpuctl run`",
            );
        }
        if !spec.array.is_empty() {
            return bad("an interactive allocation cannot be an array");
        }
    } else if spec.command.is_empty() == spec.script.is_empty() {
        return bad("a job needs exactly one of `command` or `script`");
    }
    if spec.command.first().is_some_and(String::is_empty) {
        return bad("`command` needs a program name");
    }
    let models = spec.resources.gpu_models.len();
    for (what, n) in [
        ("command", spec.command.len()),
        ("env", spec.env.len()),
        ("dependency", spec.dependencies.len()),
        ("gpu_model", models),
    ] {
        if n > max_list_len {
            return Err(Refusal::invalid_argument(format!(
                "`{what}` has {n} entries, over the limit of {max_list_len} (limits.max_list_len)"
            )));
        }
    }
    check_paths(spec).map_err(Refusal::invalid_argument)?;
    if spec.user.is_empty() {
        return bad("the job has no user");
    }
    let r = spec.resources.clone();
    crate::request::checked_request(&r)
        .map(drop)
        .map_err(|e| Refusal::invalid_argument(e.0))
}

/// Path rules: workdir is absolute and plain; stdout/stderr are absolute, or relative
/// paths that stay inside the workdir (no `..`). No path holds a NUL byte. The agent
/// opens output files as the job's user, so the kernel decides where they may go.
pub fn check_paths(spec: &JobSpec) -> Result<(), String> {
    use std::path::{Component, Path};
    let wd = Path::new(&spec.workdir);
    if !wd.is_absolute() {
        return Err("workdir must be an absolute path".into());
    }
    for (what, p) in [
        ("workdir", &spec.workdir),
        ("stdout", &spec.stdout),
        ("stderr", &spec.stderr),
    ] {
        if p.contains('\0') {
            return Err(format!("{what} contains a NUL byte"));
        }
        if p.chars().any(|c| c.is_control()) {
            return Err(format!("{what} contains control characters"));
        }
        if what != "workdir" {
            check_patterns(what, p)?;
        }
        if p.len() > 4096 {
            return Err(format!("{what} is longer than 4096 bytes"));
        }
        let path = Path::new(p.as_str());
        let dotdot = path.components().any(|c| c == Component::ParentDir);
        if what == "workdir" && dotdot {
            return Err("workdir must not contain `..`".into());
        }
        if !path.is_absolute() && dotdot {
            return Err(format!(
                "{what} {p:?} leaves the workdir: relative paths resolve inside the workdir and may not use `..`"
            ));
        }
    }
    Ok(())
}

/// Refuses dependencies on unknown jobs, and ones that can already never be met.
pub(crate) fn check_dependencies(c: &Cluster, spec: &JobSpec) -> Result<(), Refusal> {
    for d in &spec.dependencies {
        if d.kind == DependencyKind::Singleton {
            if d.job_id != 0 {
                return Err(Refusal::invalid_argument(
                    "a singleton dependency names no job (job_id 0)",
                ));
            }
            continue;
        }
        let Some(s) = c.jobs.get(d.job_id) else {
            return Err(Refusal::invalid_argument(format!(
                "dependency on job {}, which does not exist",
                d.job_id
            )));
        };
        let state = s.job.state;
        let kind = d.kind;
        let never = state.is_final()
            && match kind {
                DependencyKind::AfterOk => state != JobState::Completed,
                DependencyKind::AfterNotOk => state == JobState::Completed,
                _ => false,
            };
        if never {
            return Err(Refusal::invalid_argument(format!(
                "dependency {} on job {} can never be met: it ended {}",
                kind.slurm_name(),
                d.job_id,
                state_name(state)
            )));
        }
    }
    Ok(())
}

/// Refuses a job that no known node could ever run. With no node known yet, the job waits.
/// Nodes are looked at one by one until enough could run it (at a submit, usually the
/// first), so that a submit costs the same on 10 nodes as on 10,000; only a refusal
/// looks at them all, to say why.
pub(crate) fn check_feasible(
    c: &crate::state::Cluster,
    r: &Resources,
    partition: Option<String>,
) -> Result<(), Refusal> {
    if c.fleet.nodes.is_empty() {
        return Ok(());
    }
    let mut req = sched::Request::from(r);
    req.partition = partition;
    let partitions = c.config.all_partitions();
    let mut fitting = 0;
    for n in c.fleet.nodes.values() {
        let mut v = c.node_view(n, &partitions);
        if n.mig_dynamic && !matches!(req.gpu, GpuRequest::None) {
            // A dynamic-MIG node's GPUs may take any layout (`crate::mig`).
            let whole: Vec<sched::SlotView> =
                n.gpus.iter().map(crate::node::Gpu::whole_slot).collect();
            v.slots = sched::mig::dynamic_slots(&whole, &req.gpu);
        }
        if v.admits(&req) && sched::fits_empty(&v, &req) {
            fitting += 1;
            if fitting >= req.nodes as usize {
                return Ok(());
            }
        }
    }
    refusal(&c.node_views(), req)
}

/// Why no node, or too few, could ever run `req`.
fn refusal(view: &ClusterView, req: sched::Request) -> Result<(), Refusal> {
    // The nodes of its partition (every node when it has none).
    let own: Vec<&sched::NodeView> = view.nodes.iter().filter(|n| n.admits(&req)).collect();
    // The nodes it could use but for its constraint (looked for only when it has one
    // and no node is left): what they offer.
    let others: Vec<&sched::NodeView> = if own.is_empty() && !req.constraint.is_empty() {
        let unconstrained = sched::Request {
            constraint: Vec::new(),
            ..req.clone()
        };
        view.nodes
            .iter()
            .filter(|n| n.admits(&unconstrained))
            .collect()
    } else {
        Vec::new()
    };
    if !others.is_empty() {
        let mut offered: Vec<&str> = others
            .iter()
            .flat_map(|n| n.features.iter().map(String::as_str))
            .collect();
        offered.sort_unstable();
        offered.dedup();
        return Err(Refusal::failed_precondition(format!(
            "no node the job may use has the features its constraint {:?} asks for (they offer: {}); gpud --features names a node's",
            sched::features::render(&req.constraint),
            if offered.is_empty() {
                "none".to_string()
            } else {
                offered.join(", ")
            }
        )));
    }
    if own.is_empty() && (!req.nodelist.is_empty() || !req.exclude.is_empty()) {
        return Err(Refusal::failed_precondition(format!(
            "no node of this cluster's {} that the job may use matches its nodelist {:?} and exclude {:?}",
            view.nodes
                .iter()
                .filter(|n| n.admits(&sched::Request {
                    nodelist: Vec::new(),
                    exclude: Vec::new(),
                    ..req.clone()
                }))
                .count(),
            req.nodelist,
            req.exclude
        )));
    }
    if let Some(p) = &req.partition
        && own.is_empty()
    {
        return Err(Refusal::failed_precondition(format!(
            "partition {p:?} holds none of this cluster's {} nodes (partitions.{p}.nodes)",
            view.nodes.len()
        )));
    }
    let fitting = own.iter().filter(|n| sched::fits_empty(n, &req)).count();
    if fitting >= req.nodes as usize {
        return Ok(());
    }
    let max_gpus = own
        .iter()
        .map(|n| n.slots.iter().filter(|s| !s.is_mig()).count())
        .max()
        .unwrap_or(0);
    let max_cpus = own.iter().map(|n| n.cpu_milli / 1000).max().unwrap_or(0);
    let max_mem = own.iter().map(|n| n.memory_bytes).max().unwrap_or(0);
    let part = req
        .partition
        .as_ref()
        .map_or(String::new(), |p| format!(" of partition {p}"));
    let what = match &req.gpu {
        GpuRequest::None => "no GPU".to_string(),
        GpuRequest::Whole { count } => format!("{count} GPUs"),
        GpuRequest::Share {
            compute_milli,
            memory_mib,
        } => format!(
            "a GPU share ({}{})",
            compute_milli.map_or(String::new(), |c| format!("{}% compute ", c / 10)),
            memory_mib.map_or(String::new(), |m| format!("{m} MiB"))
        ),
        GpuRequest::Mig { profile, count } => format!("{count} MIG {profile} instances"),
    };
    let models = if req.models.is_empty() {
        String::new()
    } else {
        format!(" of model {}", req.models.join("|"))
    };
    Err(Refusal::invalid_argument(format!(
        "impossible request: no node{part} can ever run it (asked {what}{models}, {} CPUs, {} memory on each of {} node(s); {fitting} node(s) could; the largest node has {max_gpus} GPUs, {max_cpus} CPUs, {})",
        req.cpu_milli / 1000,
        bytesize::ByteSize(req.memory_bytes),
        req.nodes,
        bytesize::ByteSize(max_mem),
    )))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_job_is_its_submitters_unless_an_admin_names_another_user() {
        let alice = Actor {
            user: "alice".into(),
            admin: false,
        };
        let root = Actor {
            user: "root".into(),
            admin: true,
        };
        let mut own = JobSpec::default();
        set_owner(&alice, Some((1000, 100)), &mut own).unwrap();
        assert_eq!((own.user.as_str(), own.uid, own.gid), ("alice", 1000, 100));
        // Over TCP the node resolves the name.
        let mut named = JobSpec {
            user: "alice".into(),
            uid: 7,
            ..JobSpec::default()
        };
        set_owner(&alice, None, &mut named).unwrap();
        assert_eq!((named.uid, named.gid), (0, 0));
        let mut bobs = JobSpec {
            user: "bob".into(),
            ..JobSpec::default()
        };
        let e = set_owner(&alice, Some((1000, 100)), &mut bobs).unwrap_err();
        assert_eq!(e.kind, crate::error::Kind::PermissionDenied);
        assert!(
            e.message.contains("only admins submit for others"),
            "{}",
            e.message
        );
        set_owner(&root, Some((0, 0)), &mut bobs).unwrap();
        assert_eq!((bobs.user.as_str(), bobs.uid), ("bob", 0));
        let mut bad = JobSpec {
            user: "-rf".into(),
            ..JobSpec::default()
        };
        let e = set_owner(&root, None, &mut bad).unwrap_err();
        assert!(e.message.contains("not a valid user name"), "{}", e.message);
        assert!(valid_user_name("alice.b-c_1") && !valid_user_name("a b"));
    }

    #[test]
    fn wckeys_and_mail_options_are_checked_like_names() {
        let with = |wckey: &str, mail_type: &str, mail_user: &str| JobSpec {
            wckey: wckey.into(),
            mail_type: mail_type.into(),
            mail_user: mail_user.into(),
            ..JobSpec::default()
        };
        check_text(&with("proj", "BEGIN,END,TIME_LIMIT_90", "a@example.com")).unwrap();
        for bad in [
            with("p\u{1b}[2J", "", ""),
            with("", "END,SOMETIMES", ""),
            with("", "end", ""),
            with("", "", "a\nb"),
            with(&"w".repeat(MAX_NAME + 1), "", ""),
        ] {
            assert!(check_text(&bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn a_comment_is_one_line_of_at_most_1024_visible_bytes() {
        let with = |comment: &str| JobSpec {
            comment: comment.into(),
            ..JobSpec::default()
        };
        check_text(&with("sweep 3 of 8: lr=3e-4")).unwrap();
        check_text(&with(&"x".repeat(MAX_COMMENT))).unwrap();
        let e = check_text(&with(&"x".repeat(MAX_COMMENT + 1))).unwrap_err();
        assert!(e.message.contains("over 1024"), "{}", e.message);
        for bad in [
            "two\nlines",
            "bell\u{7}",
            "hidden\u{200b}text",
            "\u{1b}[31mred",
        ] {
            let e = check_text(&with(bad)).unwrap_err();
            assert!(e.message.contains("`comment`"), "{bad:?}: {}", e.message);
        }
    }
}
