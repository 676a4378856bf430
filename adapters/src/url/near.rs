//! Which known parameter an unknown one was probably meant to be.
//!
//! An unknown parameter's name is shown in an error only when it is a near miss of a known one
//! (`prefx`, `Prefix`, `busy_wait_ms`): anything else may be a secret pasted in the wrong place
//! (`?hunter2`) and is not repeated back.

/// The message of [`UrlError::UnknownParameter`](super::UrlError::UnknownParameter).
pub(super) fn unknown_message(store: &str, near_miss: &Option<(String, &'static str)>) -> String {
    match near_miss {
        Some((given, meant)) => format!("{store} has no parameter {given:?}; did you mean {meant}?"),
        None => format!(
            "{store} has a parameter it does not know (its name is not repeated: it may be a secret typed in the wrong place); it takes {}",
            super::parameters_of(store).join(", ")
        ),
    }
}

/// Longest name compared; longer ones are no typo of the short names stores have.
const NAME_MAX_BYTES: usize = 64;

/// The known name `name` nearly spells, if any: equal once case and `_`/`-` are ignored, or
/// within one edit (two for names of six characters or more).
pub(super) fn near_miss(name: &str, known: &[&'static str]) -> Option<&'static str> {
    if name.is_empty() || name.len() > NAME_MAX_BYTES {
        return None;
    }
    let normal: Vec<char> = name
        .chars()
        .map(|c| {
            if c == '_' {
                '-'
            } else {
                c.to_ascii_lowercase()
            }
        })
        .collect();
    let mut best: Option<(usize, &'static str)> = None;
    for candidate in known {
        let candidate_chars: Vec<char> = candidate.chars().collect();
        let allowed = if candidate_chars.len() >= 6 { 2 } else { 1 };
        let distance = edit_distance(&normal, &candidate_chars);
        if distance <= allowed && best.is_none_or(|(shortest, _)| distance < shortest) {
            best = Some((distance, candidate));
        }
    }
    best.map(|(_, candidate)| candidate)
}

/// Levenshtein distance with adjacent transpositions (optimal string alignment).
fn edit_distance(a: &[char], b: &[char]) -> usize {
    // Three rows suffice: the transposition looks two rows back.
    let mut before: Vec<usize> = vec![0; b.len() + 1];
    let mut previous: Vec<usize> = (0..=b.len()).collect();
    let mut current: Vec<usize> = vec![0; b.len() + 1];
    for i in 1..=a.len() {
        current[0] = i;
        for j in 1..=b.len() {
            let cost = usize::from(a[i - 1] != b[j - 1]);
            let mut best = (previous[j] + 1)
                .min(current[j - 1] + 1)
                .min(previous[j - 1] + cost);
            if i > 1 && j > 1 && a[i - 1] == b[j - 2] && a[i - 2] == b[j - 1] {
                best = best.min(before[j - 2] + 1);
            }
            current[j] = best;
        }
        std::mem::swap(&mut before, &mut previous);
        std::mem::swap(&mut previous, &mut current);
    }
    previous[b.len()]
}

#[cfg(test)]
mod tests {
    use super::*;

    const KNOWN: &[&str] = &["prefix", "user", "password-file", "ca", "key"];

    #[test]
    fn typos_are_recognised_and_anything_else_is_not() {
        assert_eq!(near_miss("prefx", KNOWN), Some("prefix"));
        assert_eq!(near_miss("PREFIX", KNOWN), Some("prefix"));
        assert_eq!(near_miss("perfix", KNOWN), Some("prefix"));
        assert_eq!(near_miss("password_file", KNOWN), Some("password-file"));
        assert_eq!(near_miss("passwordfile", KNOWN), Some("password-file"));
        assert_eq!(near_miss("usr", KNOWN), Some("user"));
        for unrelated in ["hunter2", "s3cr3t-t0ken", "tls", "", "x"] {
            assert_eq!(near_miss(unrelated, KNOWN), None, "{unrelated}");
        }
        assert_eq!(near_miss(&"p".repeat(1000), KNOWN), None);
    }

    #[test]
    fn distances() {
        let d = |a: &str, b: &str| {
            edit_distance(
                &a.chars().collect::<Vec<_>>(),
                &b.chars().collect::<Vec<_>>(),
            )
        };
        assert_eq!(d("", ""), 0);
        assert_eq!(d("abc", ""), 3);
        assert_eq!(d("", "ab"), 2);
        assert_eq!(d("kitten", "sitting"), 3);
        assert_eq!(d("ab", "ba"), 1);
        assert_eq!(d("prefix", "prefix"), 0);
    }
}
