//! Node features and a job's constraint on them (Slurm's `--constraint`): a node offers
//! features (`gpud --features nvlink,a100`); a job's constraint is an OR of AND terms,
//! written `a&b|c` (`&` binds closer than `|`, as in Slurm), held as the terms.

/// The most features a node offers, and the most a constraint names.
pub const MAX_FEATURES: usize = 32;
/// The longest feature name.
pub const MAX_FEATURE_LEN: usize = 64;

/// A feature name: letters, digits and `_ . : + -`, at most [`MAX_FEATURE_LEN`] bytes.
pub fn check_feature(f: &str) -> Result<(), String> {
    if f.is_empty() {
        return Err("an empty feature name".into());
    }
    if f.len() > MAX_FEATURE_LEN {
        return Err(format!(
            "a feature name is at most {MAX_FEATURE_LEN} bytes (one has {})",
            f.len()
        ));
    }
    if let Some(c) = f
        .chars()
        .find(|c| !(c.is_ascii_alphanumeric() || "_.:+-".contains(*c)))
    {
        return Err(format!(
            "feature {:?} holds {c:?}: names are letters, digits and _ . : + -",
            f.escape_debug().to_string()
        ));
    }
    Ok(())
}

/// What a node offers (`gpud --features`, checked by the agent at start and by the
/// controller at attach): at most [`MAX_FEATURES`], each a valid name.
pub fn check_offered(features: &[String]) -> Result<(), String> {
    if features.len() > MAX_FEATURES {
        return Err(format!(
            "a node offers at most {MAX_FEATURES} features ({} given)",
            features.len()
        ));
    }
    features.iter().try_for_each(|f| check_feature(f))
}

/// A constraint as a job keeps it: checked by `parse`, then trimmed (the job file,
/// `#SBATCH -C` and `gpuctl submit -C` all take it so).
pub fn checked(text: &str) -> Result<String, String> {
    parse(text)?;
    Ok(text.trim().to_string())
}

/// Parses a constraint: `a`, `a&b`, `a|b`, `a&b|c&d`; empty text is no constraint (no
/// terms). Slurm's matching OR (`[a|b]`), counts (`a*2`) and parentheses are refused,
/// never read differently.
pub fn parse(text: &str) -> Result<Vec<Vec<String>>, String> {
    let text = text.trim();
    if text.is_empty() {
        return Ok(Vec::new());
    }
    if let Some(c) = text.chars().find(|c| "[]()*".contains(*c)) {
        return Err(format!(
            "constraint {text:?}: {c:?} is not supported (features joined by & and |; no matching OR, counts or parentheses)"
        ));
    }
    let mut terms = Vec::new();
    let mut named = 0;
    for alt in text.split('|') {
        let mut term: Vec<String> = Vec::new();
        for f in alt.split('&') {
            let f = f.trim();
            check_feature(f).map_err(|e| format!("constraint {text:?}: {e}"))?;
            if !term.iter().any(|t| t == f) {
                term.push(f.to_string());
            }
            named += 1;
        }
        terms.push(term);
    }
    if named > MAX_FEATURES {
        return Err(format!(
            "constraint {text:?} names {named} features; at most {MAX_FEATURES}"
        ));
    }
    Ok(terms)
}

/// The constraint as text again (`a&b|c`).
pub fn render(terms: &[Vec<String>]) -> String {
    terms
        .iter()
        .map(|t| t.join("&"))
        .collect::<Vec<_>>()
        .join("|")
}

/// Whether a node with `features` meets `terms` (no terms: any node does). Names
/// compare exactly.
pub fn met(terms: &[Vec<String>], features: &[String]) -> bool {
    terms.is_empty()
        || terms
            .iter()
            .any(|t| t.iter().all(|f| features.iter().any(|g| g == f)))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn v(s: &[&str]) -> Vec<String> {
        s.iter().map(|x| x.to_string()).collect()
    }

    #[test]
    fn and_binds_closer_than_or() {
        let t = parse("a100 & nvlink | h100").unwrap();
        assert_eq!(t, vec![v(&["a100", "nvlink"]), v(&["h100"])]);
        assert_eq!(render(&t), "a100&nvlink|h100");
        assert!(met(&t, &v(&["nvlink", "a100"])));
        assert!(met(&t, &v(&["h100"])));
        assert!(!met(&t, &v(&["a100"])));
        assert!(!met(&t, &[]));
        assert!(met(&parse("").unwrap(), &[]));
    }

    #[test]
    fn what_slurm_has_and_we_do_not_is_refused() {
        for bad in ["[a|b]", "a*2", "(a|b)&c", "a&&b", "a|", "a b", "é", "a;b"] {
            assert!(parse(bad).is_err(), "{bad}");
        }
        let many = vec!["f"; MAX_FEATURES + 1].join("|");
        assert!(parse(&many).unwrap_err().contains("at most"));
        assert!(check_feature(&"x".repeat(MAX_FEATURE_LEN + 1)).is_err());
        assert!(check_feature("gpu-mem:80g_v1.2+x").is_ok());
        assert!(check_offered(&v(&["a100", "nvlink"])).is_ok());
        assert!(check_offered(&vec!["f".to_string(); MAX_FEATURES + 1]).is_err());
        assert!(check_offered(&v(&["a100", "has space"])).is_err());
        assert_eq!(checked(" a100&nvlink ").unwrap(), "a100&nvlink");
        assert!(checked("a*2").is_err());
    }
}
