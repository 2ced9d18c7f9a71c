//! A step's record rules that the agent (which reads a job's steps) and the controller
//! (which keeps them) must agree on.

/// The most steps a job's record keeps, and an agent reads from a job: the first
/// ones (a record stays small whatever a script does).
pub const MAX_PER_JOB: usize = 128;
/// The longest step name kept, in bytes.
pub const MAX_NAME: usize = 128;

/// A step's name as the user's `srun` wrote it, made safe to keep and show: control
/// and invisible characters become spaces, and it is cut to [`MAX_NAME`] bytes at a
/// character boundary.
pub fn clean_name(name: &str) -> String {
    let mut out = String::new();
    for c in name.chars() {
        let c = if c.is_control() || crate::text::invisible(c) {
            ' '
        } else {
            c
        };
        if out.len() + c.len_utf8() > MAX_NAME {
            break;
        }
        out.push(c);
    }
    out
}
