//! Messages cut to the size Kubernetes accepts, never inside a UTF-8 character.

/// The longest message idem writes into a condition or an Event note, in bytes (an Event's
/// `note` may hold at most 1024 bytes: events.k8s.io/v1 validation).
pub const MAX_MESSAGE_BYTES: usize = 1024;

/// `message` cut to at most `max` bytes at a character boundary, ending in `…` when cut.
///
/// Never splits a multi-byte UTF-8 character (unlike `String::truncate` at a byte index, which
/// panics there). When `max` is smaller than the ellipsis (3 bytes), the cut has no ellipsis.
pub fn shorten(message: &str, max: usize) -> String {
    if message.len() <= max {
        return message.to_string();
    }
    const ELLIPSIS: &str = "…";
    let (budget, tail) = if max >= ELLIPSIS.len() {
        (max - ELLIPSIS.len(), ELLIPSIS)
    } else {
        (max, "")
    };
    let mut end = budget;
    while !message.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}{tail}", &message[..end])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shorten_never_splits_a_character_and_stays_within_the_limit() {
        assert_eq!(shorten("short", 1024), "short");
        // A two-byte character straddling byte 1024 (and a three- and four-byte one).
        for filler in ["é", "€", "😀"] {
            for pad in 0..4 {
                let message = format!("{}{}", "a".repeat(pad + 1000), filler.repeat(40));
                let cut = shorten(&message, MAX_MESSAGE_BYTES);
                assert!(cut.len() <= MAX_MESSAGE_BYTES, "{} bytes", cut.len());
                assert!(cut.ends_with('…'));
                let kept = cut.trim_end_matches('…');
                assert!(message.starts_with(kept));
                assert!(
                    kept.len() + filler.len() + 3 > MAX_MESSAGE_BYTES,
                    "cut too short"
                );
            }
        }
        assert_eq!(shorten("ééé", 2), "é");
        assert_eq!(shorten("ééé", 1), "");
    }
}
