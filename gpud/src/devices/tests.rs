use super::*;
use crate::devices_bpf::interpret;
use crate::gpu::MigInfo;

fn node() -> Vec<GpuInfo> {
    (0..4)
        .map(|i| {
            let mut g = GpuInfo::a100_for_tests(&format!("GPU-{i}"));
            g.index = i;
            g.minor = i;
            if i == 3 {
                g.mig = (1..=3)
                    .map(|gi| MigInfo {
                        uuid: format!("MIG-3-{gi}"),
                        profile: "2g.20gb".into(),
                        memory_mib: 20480,
                        gi_id: gi,
                    })
                    .collect();
            }
            g
        })
        .collect()
}

#[test]
fn a_job_opens_its_gpus_and_the_control_nodes_only() {
    let r = DeviceRules::for_slots(&node(), ["GPU-1", "GPU-2"], None);
    assert_eq!(r.gpu_minors, BTreeSet::from([1, 2]));
    for (minor, ok) in [(0, false), (1, true), (2, true), (3, false), (77, false)] {
        assert_eq!(r.allows(NVIDIA_MAJOR, minor), ok, "195:{minor}");
    }
    // nvidiactl, nvidia-modeset, and other majors (nvidia-uvm, /dev/null) stay open.
    assert!(r.allows(NVIDIA_MAJOR, 255) && r.allows(NVIDIA_MAJOR, 254));
    assert!(r.allows(1, 3) && r.allows(511, 0));
    // A job without GPUs opens none.
    let none = DeviceRules::for_slots(&node(), [], None);
    assert!(!(0..254).any(|m| none.allows(NVIDIA_MAJOR, m)));
}

#[test]
fn a_mig_slot_opens_its_parent_and_its_own_capabilities() {
    let caps = Caps::numbered(4);
    let r = DeviceRules::for_slots(&node(), ["MIG-3-2"], Some(&caps));
    assert_eq!(r.gpu_minors, BTreeSet::from([3]));
    // gpu3/gi2/access = 3 + (3*15 + 2)*9 = 426, its CIs 427..=434.
    let (major, minors) = r.caps.clone().unwrap();
    assert_eq!(major, FAKE_CAPS_MAJOR);
    assert_eq!(minors, (426..=434).collect::<BTreeSet<u32>>());
    assert!(r.allows(major, 426) && r.allows(major, 427));
    // Another instance of the same GPU, config and monitor are refused.
    assert!(!r.allows(major, 417) && !r.allows(major, 1) && !r.allows(major, 2));
}

#[test]
fn the_driver_table_is_read() {
    let devices = "Character devices:\n  1 mem\n195 nvidia-frontend\n234 nvidia-caps\n\nBlock devices:\n234 nvidia-caps\n";
    let minors = "config 1\nmonitor 2\ngpu0/gi1/access 12\ngpu0/gi1/ci0/access 13\n";
    let caps = Caps::parse(devices, minors).unwrap();
    assert_eq!(caps.major, 234);
    assert_eq!(caps.instance(0, 1).collect::<Vec<_>>(), [12, 13]);
    assert_eq!(Caps::parse("Character devices:\n  1 mem\n", minors), None);
    // The formula agrees with the driver's own numbering.
    assert_eq!(Caps::numbered(1).instance(0, 1).next(), Some(12));
}

#[test]
fn the_bpf_program_means_the_rules() {
    let caps = Caps::numbered(4);
    for slots in [
        vec![],
        vec!["GPU-0"],
        vec!["GPU-1", "GPU-2"],
        vec!["MIG-3-1"],
        vec!["GPU-0", "MIG-3-3"],
    ] {
        let r = DeviceRules::for_slots(&node(), slots.iter().copied(), Some(&caps));
        let prog = r.program();
        for major in [1, NVIDIA_MAJOR, FAKE_CAPS_MAJOR, 234] {
            for minor in (0..600).step_by(7).chain([0, 1, 2, 3, 254, 255, 426, 427]) {
                let want = u64::from(r.allows(major, minor));
                assert_eq!(
                    interpret(&prog, 2, major, minor),
                    Some(want),
                    "{slots:?} c {major}:{minor}"
                );
            }
            // Block devices are never the GPUs'.
            assert_eq!(interpret(&prog, 1, major, 0), Some(1));
        }
    }
}

#[test]
fn v1_entries_deny_the_others() {
    let r = DeviceRules::for_slots(&node(), ["GPU-2"], Some(&Caps::numbered(4)));
    let deny = r.v1_entries();
    assert!(deny.contains(&"c 195:0 rwm".to_string()));
    assert!(!deny.contains(&"c 195:2 rwm".to_string()));
    assert!(
        !deny
            .iter()
            .any(|d| d == "c 195:255 rwm" || d == "c 195:254 rwm")
    );
    // Config, monitor and the node's three instances (none is this job's), not the
    // driver's whole table (4 GPUs x 15 instances x 9 would be 540 writes a launch).
    assert!(deny.contains(&"c 511:1 rwm".to_string()));
    assert_eq!(deny.len(), 253 + 2 + 3 * 9);
    let mig = DeviceRules::for_slots(&node(), ["MIG-3-2"], Some(&Caps::numbered(4)));
    let deny = mig.v1_entries();
    assert!(!deny.contains(&"c 195:3 rwm".to_string()));
    assert!(!deny.contains(&"c 511:426 rwm".to_string()));
    assert!(deny.contains(&"c 511:417 rwm".to_string()));
}

/// Runs `sh` in cgroup `cg` (entered as jobs enter theirs) trying to open character
/// devices 195:`minors` (nodes made here); one line a minor: "not permitted" or
/// "M:open" (the cgroup let it through; no driver answers, ENXIO).
fn opens_in_cgroup(cg: &std::path::Path, minors: &[u64]) -> String {
    use std::os::unix::process::CommandExt;
    let dir = tempfile::tempdir().unwrap();
    for &m in minors {
        nix::sys::stat::mknod(
            &dir.path().join(m.to_string()),
            nix::sys::stat::SFlag::S_IFCHR,
            nix::sys::stat::Mode::from_bits_truncate(0o666),
            nix::sys::stat::makedev(195, m),
        )
        .unwrap();
    }
    let procs = [std::fs::OpenOptions::new()
        .write(true)
        .open(cg.join("cgroup.procs"))
        .map(std::os::fd::OwnedFd::from)
        .unwrap()];
    let fds = crate::cgroup::raw_fds(&procs);
    let list: Vec<String> = minors.iter().map(u64::to_string).collect();
    let mut cmd = std::process::Command::new("/bin/sh");
    cmd.arg("-c").arg(format!(
        "for m in {}; do dd if={}/$m of=/dev/null count=1 2>&1 | grep -o 'not permitted' || echo $m:open; done",
        list.join(" "),
        dir.path().display()
    ));
    // SAFETY: only write(2) on descriptors opened before the fork.
    unsafe {
        cmd.pre_exec(move || crate::cgroup::enter(&fds));
    }
    let out = String::from_utf8(cmd.output().unwrap().stdout).unwrap();
    drop(procs);
    out
}

/// The cgroup2 program alone (no v1 controller) on this kernel: a process in the cgroup
/// opens its GPU's node (ENXIO: no driver behind it) and not another's (EPERM). Needs
/// root and a writable cgroup2 mount; says so and returns where there is none.
#[test]
fn the_bpf_program_confines_a_process_in_its_cgroup() {
    let mounts = std::fs::read_to_string("/proc/mounts").unwrap_or_default();
    let Some(root) = mounts
        .lines()
        .map(|l| l.split_whitespace().collect::<Vec<_>>())
        .find(|f| f.len() > 2 && f[2] == "cgroup2")
        .map(|f| std::path::PathBuf::from(f[1]))
        .filter(|p| nix::unistd::access(p, nix::unistd::AccessFlags::W_OK).is_ok())
    else {
        eprintln!("skipped: no writable cgroup2 mount");
        return;
    };
    // Twice: the second job's cgroup gets the program loaded for the first.
    for n in 0..2 {
        let cg = root.join(format!("gpuctl-bpf-test-{}-{n}", std::process::id()));
        std::fs::create_dir(&cg).unwrap();
        let rules = DeviceRules::for_slots(&node(), ["GPU-1"], None);
        let out = rules
            .apply_bpf(&cg)
            .map(|()| opens_in_cgroup(&cg, &[0, 1, 255]));
        let _ = std::fs::remove_dir(&cg);
        let out = out.unwrap_or_else(|e| panic!("attach: {e}"));
        assert_eq!(
            out.lines().collect::<Vec<_>>(),
            ["not permitted", "1:open", "255:open"],
            "{out}"
        );
    }
}

/// The v1 devices controller alone: a process in a job's v1 devices cgroup opens its
/// GPU's node and not another's. Needs root and a writable v1 devices hierarchy; says
/// so and returns where there is none.
#[test]
fn v1_entries_confine_a_process_in_its_cgroup() {
    let root = std::path::Path::new("/sys/fs/cgroup/devices");
    if !root.join("devices.deny").exists()
        || nix::unistd::access(root, nix::unistd::AccessFlags::W_OK).is_err()
    {
        eprintln!("skipped: no writable v1 devices hierarchy");
        return;
    }
    let cg = root.join(format!("gpuctl-v1-test-{}", std::process::id()));
    std::fs::create_dir(&cg).unwrap();
    let rules = DeviceRules::for_slots(&node(), ["GPU-1"], None);
    let out = rules
        .apply_v1(&cg)
        .map(|()| opens_in_cgroup(&cg, &[0, 1, 255]));
    let _ = std::fs::remove_dir(&cg);
    let out = out.unwrap_or_else(|e| panic!("apply: {e}"));
    assert_eq!(
        out.lines().collect::<Vec<_>>(),
        ["not permitted", "1:open", "255:open"],
        "{out}"
    );
}
