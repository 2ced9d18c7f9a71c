//! The cgroup2 device filter: a `BPF_PROG_TYPE_CGROUP_DEVICE` program generated from a
//! job's [`DeviceRules`](crate::devices::DeviceRules), loaded and attached with the
//! `bpf(2)` system call (as runc and crun do; cgroup2 has no devices files).
//!
//! The kernel calls the program with `struct bpf_cgroup_dev_ctx { u32 access_type;
//! u32 major; u32 minor; }` in r1 (`access_type` is `access << 16 | type`, type 2 a
//! character device); r0 = 1 allows, 0 refuses with EPERM.

use std::collections::BTreeSet;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::path::Path;

/// One eBPF instruction (`struct bpf_insn`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(C)]
pub struct Insn {
    code: u8,
    /// dst in the low nibble, src in the high one.
    regs: u8,
    off: i16,
    imm: i32,
}

// Opcodes (linux/bpf_common.h, linux/bpf.h).
const LDX_MEM_W: u8 = 0x61; // BPF_LDX | BPF_MEM | BPF_W
const ALU64_AND_K: u8 = 0x57; // BPF_ALU64 | BPF_AND | BPF_K
const ALU64_MOV_K: u8 = 0xb7; // BPF_ALU64 | BPF_MOV | BPF_K
const JMP_JA: u8 = 0x05;
const JMP_JEQ_K: u8 = 0x15;
const JMP_JNE_K: u8 = 0x55;
const JMP_JGE_K: u8 = 0x35;
const JMP_EXIT: u8 = 0x95;
const DEVCG_DEV_CHAR: i32 = 2;

/// Jump targets, resolved to offsets once the program is laid out.
#[derive(Clone, Copy)]
enum Target {
    Allow,
    Deny,
    Gpu,
    Caps,
}

enum Op {
    Insn(Insn),
    Jump(u8, u8, i32, Target),
    Label(Target),
}

fn insn(code: u8, dst: u8, src: u8, off: i16, imm: i32) -> Insn {
    Insn {
        code,
        regs: dst | (src << 4),
        off,
        imm,
    }
}

/// The program: r2 = type, r4 = major, r5 = minor; non-character devices and other
/// majors are allowed; on the GPU major, control minors and the job's GPUs are; on the
/// capability major, the job's capability minors are; the rest is refused.
pub fn program(
    gpu_major: u32,
    first_control: u32,
    gpus: &BTreeSet<u32>,
    caps: Option<(u32, &BTreeSet<u32>)>,
) -> Vec<Insn> {
    let imm = |v: u32| v as i32;
    let mut ops = vec![
        Op::Insn(insn(LDX_MEM_W, 2, 1, 0, 0)),
        Op::Insn(insn(ALU64_AND_K, 2, 0, 0, 0xffff)),
        Op::Insn(insn(LDX_MEM_W, 4, 1, 4, 0)),
        Op::Insn(insn(LDX_MEM_W, 5, 1, 8, 0)),
        Op::Jump(JMP_JNE_K, 2, DEVCG_DEV_CHAR, Target::Allow),
        Op::Jump(JMP_JEQ_K, 4, imm(gpu_major), Target::Gpu),
    ];
    if let Some((major, _)) = caps {
        ops.push(Op::Jump(JMP_JEQ_K, 4, imm(major), Target::Caps));
    }
    ops.push(Op::Jump(JMP_JA, 0, 0, Target::Allow));
    ops.push(Op::Label(Target::Gpu));
    ops.push(Op::Jump(JMP_JGE_K, 5, imm(first_control), Target::Allow));
    for &m in gpus {
        ops.push(Op::Jump(JMP_JEQ_K, 5, imm(m), Target::Allow));
    }
    ops.push(Op::Jump(JMP_JA, 0, 0, Target::Deny));
    if let Some((_, minors)) = caps {
        ops.push(Op::Label(Target::Caps));
        for &m in minors {
            ops.push(Op::Jump(JMP_JEQ_K, 5, imm(m), Target::Allow));
        }
        ops.push(Op::Jump(JMP_JA, 0, 0, Target::Deny));
    }
    ops.push(Op::Label(Target::Deny));
    ops.push(Op::Insn(insn(ALU64_MOV_K, 0, 0, 0, 0)));
    ops.push(Op::Insn(insn(JMP_EXIT, 0, 0, 0, 0)));
    ops.push(Op::Label(Target::Allow));
    ops.push(Op::Insn(insn(ALU64_MOV_K, 0, 0, 0, 1)));
    ops.push(Op::Insn(insn(JMP_EXIT, 0, 0, 0, 0)));
    layout(&ops)
}

/// Resolves labels: a jump's offset counts instructions after the jump.
fn layout(ops: &[Op]) -> Vec<Insn> {
    let mut at = [0usize; 4];
    let mut pc = 0;
    for op in ops {
        match op {
            Op::Label(t) => at[*t as usize] = pc,
            _ => pc += 1,
        }
    }
    let mut out = Vec::with_capacity(pc);
    for op in ops {
        match op {
            Op::Insn(i) => out.push(*i),
            Op::Jump(code, dst, imm, t) => {
                let off = at[*t as usize] as i64 - out.len() as i64 - 1;
                out.push(insn(*code, *dst, 0, off as i16, *imm));
            }
            Op::Label(_) => {}
        }
    }
    out
}

/// Runs the program as the kernel would on `(type, major, minor)`: the unit tests'
/// check that the encoding means what the rules say.
pub fn interpret(prog: &[Insn], dev_type: u32, major: u32, minor: u32) -> Option<u64> {
    let ctx = [dev_type | (6 << 16), major, minor];
    let mut r = [0u64; 11];
    let mut pc = 0usize;
    for _ in 0..4096 {
        let i = prog.get(pc)?;
        let (dst, src) = ((i.regs & 0xf) as usize, (i.regs >> 4) as usize);
        let k = i64::from(i.imm) as u64;
        let jump = |cond: bool| if cond { i.off as isize } else { 0 };
        let mut next = 1isize;
        match i.code {
            LDX_MEM_W if src == 1 => r[dst] = u64::from(ctx[(i.off / 4) as usize]),
            ALU64_AND_K => r[dst] &= k,
            ALU64_MOV_K => r[dst] = k,
            JMP_JA => next += i.off as isize,
            JMP_JEQ_K => next += jump(r[dst] == k),
            JMP_JNE_K => next += jump(r[dst] != k),
            JMP_JGE_K => next += jump(r[dst] >= k),
            JMP_EXIT => return Some(r[0]),
            _ => return None,
        }
        pc = (pc as isize + next) as usize;
    }
    None
}

const BPF_PROG_LOAD: i64 = 5;
const BPF_PROG_ATTACH: i64 = 8;
const BPF_PROG_TYPE_CGROUP_DEVICE: u32 = 15;
const BPF_CGROUP_DEVICE: u32 = 6;
const BPF_F_ALLOW_MULTI: u32 = 2;

/// `union bpf_attr`, as much of it as the two commands use (the kernel zero-extends).
#[repr(C, align(8))]
struct Attr([u8; 128]);

impl Attr {
    fn put32(&mut self, at: usize, v: u32) {
        self.0[at..at + 4].copy_from_slice(&v.to_ne_bytes());
    }
    fn put64(&mut self, at: usize, v: u64) {
        self.0[at..at + 8].copy_from_slice(&v.to_ne_bytes());
    }
}

fn bpf(cmd: i64, attr: &mut Attr) -> io::Result<i64> {
    // SAFETY: `attr` is a live, initialised buffer of the size passed; every pointer
    // written into it points at memory that outlives the call.
    let rc = unsafe {
        nix::libc::syscall(
            nix::libc::SYS_bpf,
            cmd,
            attr.0.as_mut_ptr(),
            attr.0.len() as u32,
        )
    };
    if rc < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(rc)
    }
}

/// Programs loaded already, by their instructions: a job's program depends only on its
/// GPUs, so the same few come back, and the kernel's verifier checking one again was a
/// measurable part of every launch (docs/benchmarks.md, issue 41). At most [`LOADED_MAX`] are kept (each a descriptor
/// and a few hundred bytes of kernel memory).
static LOADED: std::sync::Mutex<Vec<(Vec<Insn>, std::sync::Arc<OwnedFd>)>> =
    std::sync::Mutex::new(Vec::new());
const LOADED_MAX: usize = 256;

/// `prog`, loaded (or as loaded before).
fn loaded(prog: &[Insn]) -> io::Result<std::sync::Arc<OwnedFd>> {
    let mut cache = LOADED.lock().unwrap_or_else(|p| p.into_inner());
    if let Some((_, fd)) = cache.iter().find(|(p, _)| p == prog) {
        return Ok(fd.clone());
    }
    let fd = std::sync::Arc::new(load(prog)?);
    if cache.len() >= LOADED_MAX {
        cache.remove(0);
    }
    cache.push((prog.to_vec(), fd.clone()));
    Ok(fd)
}

/// Loads `prog` into the kernel: quietly, then once more with the verifier's log to
/// say why when that fails (asking for the log slows every load).
fn load(prog: &[Insn]) -> io::Result<OwnedFd> {
    let license = c"Apache-2.0";
    let attr = |log: &mut [u8]| {
        let mut a = Attr([0; 128]);
        a.put32(0, BPF_PROG_TYPE_CGROUP_DEVICE);
        a.put32(4, prog.len() as u32);
        a.put64(8, prog.as_ptr() as u64);
        a.put64(16, license.as_ptr() as u64);
        if !log.is_empty() {
            a.put32(24, 1); // log_level
            a.put32(28, log.len() as u32);
            a.put64(32, log.as_mut_ptr() as u64);
        }
        a.0[48..48 + 12].copy_from_slice(b"gpuctl_devs\0");
        a.put32(68, BPF_CGROUP_DEVICE); // expected_attach_type
        a
    };
    let fd = match bpf(BPF_PROG_LOAD, &mut attr(&mut [])) {
        Ok(fd) => fd,
        Err(_) => {
            let mut log = vec![0u8; 16 * 1024];
            bpf(BPF_PROG_LOAD, &mut attr(&mut log)).map_err(|e| {
                let end = log.iter().position(|&b| b == 0).unwrap_or(0);
                let why = String::from_utf8_lossy(&log[..end]);
                io::Error::new(
                    e.kind(),
                    format!("loading the GPU device filter: {e} {}", why.trim()),
                )
            })?
        }
    };
    // SAFETY: the kernel just returned this new descriptor; nothing else owns it.
    Ok(unsafe { OwnedFd::from_raw_fd(fd as i32) })
}

/// Attaches `prog` (loaded once: [`loaded`]) to the cgroup2 directory `dir`.
pub fn attach(prog: &[Insn], dir: &Path) -> io::Result<()> {
    let prog_fd = loaded(prog)?;
    let cg = std::fs::File::open(dir)?;
    let mut a = Attr([0; 128]);
    a.put32(0, cg.as_raw_fd() as u32);
    a.put32(4, prog_fd.as_raw_fd() as u32);
    a.put32(8, BPF_CGROUP_DEVICE);
    a.put32(12, BPF_F_ALLOW_MULTI);
    bpf(BPF_PROG_ATTACH, &mut a).map_err(|e| {
        io::Error::new(
            e.kind(),
            format!("attaching the GPU device filter to {}: {e}", dir.display()),
        )
    })?;
    // The cgroup holds the program now; it stays attached whatever becomes of ours.
    Ok(())
}
