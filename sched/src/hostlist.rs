//! Node patterns as Slurm writes them: names, hostlists (`gpu[01-08,12]`, zero-padded
//! ranges match only at their width), `*` globs and `ALL`. Used for partitions' nodes
//! and for a job's `nodelist` and `exclude`.

/// A character of a node name.
pub fn is_name_char(c: char) -> bool {
    c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.')
}

/// One piece of a node pattern.
#[derive(Debug, PartialEq)]
enum Piece<'a> {
    Text(&'a str),
    /// `*`: any run of characters.
    Any,
    /// `[01-08,12]`: one number of these ranges, as (low, high, digits when zero-padded).
    Ranges(Vec<(u64, u64, usize)>),
}

fn pieces(pattern: &str) -> Result<Vec<Piece<'_>>, String> {
    let mut out = Vec::new();
    let mut rest = pattern;
    while !rest.is_empty() {
        let cut = rest.find(['[', '*']).unwrap_or(rest.len());
        if cut > 0 {
            out.push(Piece::Text(&rest[..cut]));
            rest = &rest[cut..];
            continue;
        }
        if let Some(r) = rest.strip_prefix('*') {
            out.push(Piece::Any);
            rest = r;
            continue;
        }
        let close = rest
            .find(']')
            .ok_or_else(|| format!("{pattern:?}: '[' without ']'"))?;
        let mut ranges = Vec::new();
        for part in rest[1..close].split(',') {
            let (a, b) = part.split_once('-').unwrap_or((part, part));
            let num = |s: &str| {
                s.parse::<u64>()
                    .ok()
                    .filter(|_| {
                        !s.is_empty() && s.len() <= 18 && s.bytes().all(|c| c.is_ascii_digit())
                    })
                    .ok_or_else(|| {
                        format!("{pattern:?}: {part:?} is not a number or a range like 01-08")
                    })
            };
            let (lo, hi) = (num(a)?, num(b)?);
            if lo > hi {
                return Err(format!("{pattern:?}: range {part:?} runs backwards"));
            }
            let width = if a.len() > 1 && a.starts_with('0') {
                a.len()
            } else {
                0
            };
            ranges.push((lo, hi, width));
        }
        out.push(Piece::Ranges(ranges));
        rest = &rest[close + 1..];
    }
    Ok(out)
}

/// Whether `pattern` is a valid node pattern.
pub fn check_hostlist(pattern: &str) -> Result<(), String> {
    if pattern.is_empty() {
        return Err("an empty node pattern".into());
    }
    pieces(pattern).map(|_| ())
}

/// Whether node `name` matches `pattern`: a name, a Slurm hostlist (`gpu[01-04,07]`,
/// zero-padded ranges match only at their width), `*` globs, or `ALL`.
pub fn hostlist_match(pattern: &str, name: &str) -> bool {
    if pattern == "ALL" {
        return true;
    }
    match pieces(pattern) {
        Ok(p) => matches_from(&p, name),
        Err(_) => false,
    }
}

fn matches_from(pieces: &[Piece<'_>], name: &str) -> bool {
    let Some((first, rest)) = pieces.split_first() else {
        return name.is_empty();
    };
    match first {
        Piece::Text(t) => name
            .strip_prefix(t)
            .is_some_and(|tail| matches_from(rest, tail)),
        Piece::Any => name
            .char_indices()
            .map(|(i, _)| i)
            .chain([name.len()])
            .any(|i| matches_from(rest, &name[i..])),
        Piece::Ranges(ranges) => {
            let digits = name.bytes().take_while(u8::is_ascii_digit).count();
            (1..=digits).any(|len| {
                let (num, tail) = name.split_at(len);
                let Ok(n) = num.parse::<u64>() else {
                    return false;
                };
                ranges.iter().any(|&(lo, hi, width)| {
                    (lo..=hi).contains(&n)
                        && (width == 0 && (len == 1 || !num.starts_with('0')) || len == width)
                }) && matches_from(rest, tail)
            })
        }
    }
}

/// Splits a Slurm node list (`n[1-3],m5`) at its top-level commas (not those inside
/// brackets).
pub fn split_list(list: &str) -> Vec<String> {
    let mut out = Vec::new();
    let (mut depth, mut start) = (0usize, 0);
    for (i, c) in list.char_indices() {
        match c {
            '[' => depth += 1,
            ']' => depth = depth.saturating_sub(1),
            ',' if depth == 0 => {
                out.push(list[start..i].trim().to_string());
                start = i + 1;
            }
            _ => {}
        }
    }
    out.push(list[start..].trim().to_string());
    out.retain(|p| !p.is_empty());
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hostlists_match_like_slurm() {
        for (p, yes, no) in [
            (
                "gpu[01-04,07]",
                &["gpu01", "gpu04", "gpu07"][..],
                &["gpu1", "gpu05", "gpu007", "gpu01x"][..],
            ),
            ("gpu[1-10]", &["gpu1", "gpu10"], &["gpu01", "gpu11", "gpu0"]),
            (
                "rack[1-2]-n[1-3]",
                &["rack1-n3", "rack2-n1"],
                &["rack3-n1", "rack1-n4"],
            ),
            ("a100-*", &["a100-x", "a100-"], &["h100-x"]),
            ("node7", &["node7"], &["node70", "node"]),
            ("ALL", &["anything"], &[]),
        ] {
            for n in yes {
                assert!(hostlist_match(p, n), "{p} should match {n}");
            }
            for n in no {
                assert!(!hostlist_match(p, n), "{p} should not match {n}");
            }
        }
        for bad in ["gpu[01-", "gpu[a-b]", "gpu[5-1]", ""] {
            assert!(check_hostlist(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn a_list_splits_at_its_top_level_commas() {
        assert_eq!(split_list("n[1-3,5],m5, x"), vec!["n[1-3,5]", "m5", "x"]);
        assert!(split_list("").is_empty());
    }
}
