//! The daemons' state directories: absolute paths (so that nothing built from them
//! depends on where the daemon was started), created private whatever the umask, and a
//! warning when an existing one is open wider than it should be.

use std::io;
use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
use std::path::{Path, PathBuf};

/// Creates `dir` (and its parents) with `mode` if it is missing, and answers its
/// absolute path and, when it existed with more permissions than `mode`, a warning.
pub fn prepare(dir: &Path, mode: u32) -> io::Result<(PathBuf, Option<String>)> {
    let abs = std::path::absolute(dir)?;
    let existed = abs.is_dir();
    if !existed {
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(mode)
            .create(&abs)?;
        // The umask may have taken bits off `mode`, never added: set it exactly.
        std::fs::set_permissions(&abs, std::fs::Permissions::from_mode(mode))?;
    }
    let have = std::fs::metadata(&abs)?.permissions().mode() & 0o777;
    let warning = (have & !mode != 0).then(|| {
        format!(
            "state dir {} is mode {have:03o}, wider than {mode:03o}: other local users may read job specs, env and keys (chmod {mode:03o} {})",
            abs.display(),
            abs.display()
        )
    });
    Ok((abs, warning))
}

/// Writes a file whole, with `mode`, synced: a temporary file beside it, renamed over
/// it (a reader sees the old file or the new one, never part of one).
pub fn write_whole(path: &Path, bytes: &[u8], mode: u32) -> io::Result<()> {
    use std::io::Write as _;
    use std::os::unix::fs::OpenOptionsExt;
    let tmp = path.with_extension("tmp");
    let _ = std::fs::remove_file(&tmp);
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(mode)
        .open(&tmp)?;
    // The mode asked for, whatever the umask: a public file (the CA certificate) made
    // under a unit's `UMask=0077` would otherwise be 0600 and unreadable to users.
    f.set_permissions(std::os::unix::fs::PermissionsExt::from_mode(mode))?;
    f.write_all(bytes)?;
    f.sync_all()?;
    std::fs::rename(&tmp, path)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn whole_files_get_their_mode_whatever_the_umask() {
        let t = tempfile::tempdir().unwrap();
        let old = unsafe_umask(0o077);
        write_whole(&t.path().join("ca.pem"), b"public", 0o644).unwrap();
        write_whole(&t.path().join("ca.key"), b"secret", 0o600).unwrap();
        unsafe_umask(old);
        let mode = |f: &str| {
            std::fs::metadata(t.path().join(f))
                .unwrap()
                .permissions()
                .mode()
                & 0o777
        };
        assert_eq!(mode("ca.pem"), 0o644, "a public file made under umask 077");
        assert_eq!(mode("ca.key"), 0o600);
    }

    #[test]
    fn created_private_whatever_the_umask_and_wider_ones_are_named() {
        let t = tempfile::tempdir().unwrap();
        let old = unsafe_umask(0o000);
        let (p, w) = prepare(&t.path().join("a/b"), 0o700).unwrap();
        unsafe_umask(old);
        assert!(p.is_absolute());
        assert_eq!(
            std::fs::metadata(&p).unwrap().permissions().mode() & 0o777,
            0o700
        );
        assert_eq!(w, None);
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o755)).unwrap();
        let (_, w) = prepare(&p, 0o700).unwrap();
        assert!(w.unwrap().contains("mode 755, wider than 700"));
        // A relative path comes back absolute.
        let (rel, _) = prepare(Path::new("."), 0o777).unwrap();
        assert!(rel.is_absolute());
    }

    fn unsafe_umask(m: u32) -> u32 {
        // SAFETY: umask(2) only swaps the process's mask.
        unsafe { libc::umask(m as libc::mode_t) as u32 }
    }
}
