//! Text a caller gave, made safe to show: which characters are invisible (one
//! definition for names refused at submit, the CLI's tables and log lines), and
//! `shown` for log lines and errors.

/// Characters that print as nothing or reorder what follows (Unicode format characters:
/// zero-width spaces and joiners, direction marks and overrides, the BOM, the soft
/// hyphen, invisible operators): a name holding one looks like another name.
pub fn invisible(c: char) -> bool {
    matches!(
        c,
        '\u{00ad}'
            | '\u{034f}'
            | '\u{061c}'
            | '\u{115f}'
            | '\u{1160}'
            | '\u{17b4}'
            | '\u{17b5}'
            | '\u{180b}'..='\u{180f}'
            | '\u{200b}'..='\u{200f}'
            | '\u{202a}'..='\u{202e}'
            | '\u{2060}'..='\u{206f}'
            | '\u{3164}'
            | '\u{fe00}'..='\u{fe0f}'
            | '\u{feff}'
            | '\u{ffa0}'
            | '\u{fff0}'..='\u{fff8}'
            | '\u{1d173}'..='\u{1d17a}'
            | '\u{e0000}'..='\u{e0fff}'
    )
}

/// `s` as it may appear in a log line or an error: control and invisible characters escaped and at
/// most `max` characters, with the length said when cut (a 4 MiB node name from an
/// unauthenticated caller becomes one short field).
pub fn shown(s: &str, max: usize) -> String {
    let mut out = String::new();
    for (n, c) in s.chars().enumerate() {
        if n == max {
            out.push_str(&format!("... ({} bytes in all)", s.len()));
            break;
        }
        // Line and paragraph separators end a log line as a newline would.
        if c.is_control() || invisible(c) || matches!(c, '\u{2028}' | '\u{2029}') {
            out.extend(c.escape_unicode());
        } else {
            out.push(c);
        }
    }
    out
}

/// A duration as Slurm's tools write it (sacct's Elapsed, its mail subjects):
/// `[D-]HH:MM:SS`.
pub fn hms(ms: i64) -> String {
    let s = ms.max(0) / 1000;
    let (d, h, m, s) = (s / 86_400, s / 3600 % 24, s / 60 % 60, s % 60);
    if d > 0 {
        format!("{d}-{h:02}:{m:02}:{s:02}")
    } else {
        format!("{h:02}:{m:02}:{s:02}")
    }
}

/// `template` with each `%c` replaced by what `value(c)` answers; `%%` is `%`, and a `%c`
/// it answers `None` for, or a `%` at the end, stays as written (output file patterns:
/// the agent's for a job, `srun`'s for its tasks).
pub fn fill_pattern(template: &str, value: impl Fn(char) -> Option<String>) -> String {
    let mut out = String::new();
    let mut chars = template.chars();
    while let Some(c) = chars.next() {
        if c != '%' {
            out.push(c);
            continue;
        }
        match chars.next() {
            Some('%') => out.push('%'),
            Some(p) => match value(p) {
                Some(v) => out.push_str(&v),
                None => {
                    out.push('%');
                    out.push(p);
                }
            },
            None => out.push('%'),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shown_bounds_and_escapes() {
        assert_eq!(shown("node1", 64), "node1");
        let big = "x".repeat(4 << 20);
        let s = shown(&big, 64);
        assert!(
            s.len() < 100 && s.ends_with("(4194304 bytes in all)"),
            "{s}"
        );
        assert_eq!(
            shown("a\nb\u{1b}[31m\u{200b}", 64),
            "a\\u{a}b\\u{1b}[31m\\u{200b}"
        );
    }

    #[test]
    fn patterns_fill_what_is_known_and_keep_the_rest() {
        let v = |c| (c == 'j').then(|| "12".to_string());
        assert_eq!(super::fill_pattern("out-%j-%q-%%-%", v), "out-12-%q-%-%");
        assert_eq!(super::fill_pattern("plain", v), "plain");
    }
}
