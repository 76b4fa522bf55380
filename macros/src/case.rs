//! serde's `rename_all` rules, so that diff paths use the field names seen on the wire.

/// Applies serde's `rename_all = "<rule>"` to a Rust field name; `None` for an unknown rule.
pub fn rename(rule: &str, field: &str) -> Option<String> {
    let words: Vec<&str> = field.split('_').filter(|w| !w.is_empty()).collect();
    let cap = |w: &str| {
        let mut c = w.chars();
        c.next()
            .map(|f| f.to_uppercase().chain(c).collect::<String>())
            .unwrap_or_default()
    };
    Some(match rule {
        "lowercase" => field.to_lowercase(),
        "UPPERCASE" => field.to_uppercase(),
        "snake_case" => field.to_owned(),
        "SCREAMING_SNAKE_CASE" => field.to_uppercase(),
        "kebab-case" => field.replace('_', "-"),
        "SCREAMING-KEBAB-CASE" => field.to_uppercase().replace('_', "-"),
        "PascalCase" => words.iter().map(|w| cap(w)).collect(),
        "camelCase" => {
            let mut out = words.first().map(|w| (*w).to_owned()).unwrap_or_default();
            out.extend(words.iter().skip(1).map(|w| cap(w)));
            out
        }
        _ => return None,
    })
}

#[cfg(test)]
mod tests {
    use super::rename;

    #[test]
    fn serde_rules() {
        assert_eq!(
            rename("camelCase", "observed_generation").as_deref(),
            Some("observedGeneration")
        );
        assert_eq!(rename("PascalCase", "a_b").as_deref(), Some("AB"));
        assert_eq!(rename("kebab-case", "a_b").as_deref(), Some("a-b"));
        assert_eq!(rename("nope", "a"), None);
    }
}
