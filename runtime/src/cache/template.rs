//! What cached children have in common, kept once: an object's JSON text with its own values
//! (its name and namespace, its owner's name and uid, its tenant, its times and fingerprints)
//! replaced by one-byte tokens is the same text for every child a reconciler makes alike, so the
//! text and each value are interned and a child holds only pointers to them.
//!
//! A token is a control character, which JSON text never holds raw (it escapes them), and a
//! value is replaced only when it holds no character JSON escapes; so a replaced value never
//! spans a token and restoring the tokens gives back the text exactly.

use std::collections::HashSet;
use std::sync::{Arc, Mutex, PoisonError};

/// The token for the object's name.
const NAME: u8 = 0x01;
/// The token for the object's namespace.
const NAMESPACE: u8 = 0x02;
/// The token for the first of [`Templated::values`]; the next ones follow, up to 0x1e.
const FIRST_VALUE: u8 = 0x03;
/// The token for [`Templated::hex`].
const HEX: u8 = 0x1f;
/// Most values replaced in one object (the tokens between [`FIRST_VALUE`] and [`HEX`]).
const MOST_VALUES: usize = (HEX - FIRST_VALUE) as usize;
/// An interner sweeps out what no child holds once it has grown by this many entries past
/// twice what it held after its last sweep.
const SWEEP_SLACK: usize = 1_024;
/// ... or its texts by this many bytes past twice their size after its last sweep, so texts
/// no child holds any more (a large object's earlier versions) never outweigh those held by
/// more than this.
const SWEEP_SLACK_BYTES: usize = 1 << 20;

/// Text kept once however many children share it; a child's share is one pointer.
#[derive(Debug, Default)]
pub(crate) struct Interner {
    inner: Mutex<Set>,
}

#[derive(Debug, Default)]
struct Set {
    texts: HashSet<Arc<str>>,
    after_sweep: usize,
    /// The bytes of `texts`, and what they were after the last sweep.
    bytes: usize,
    bytes_after_sweep: usize,
    /// Lists of values (of interned texts), kept once likewise: the children of one owner
    /// made alike have the same values.
    lists: HashSet<Arc<[Arc<str>]>>,
    lists_after_sweep: usize,
}

impl Interner {
    /// The shared copy of `text`.
    pub(crate) fn intern(&self, text: &str) -> Arc<str> {
        let mut set = self.inner.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(shared) = set.texts.get(text) {
            return Arc::clone(shared);
        }
        let shared: Arc<str> = Arc::from(text);
        set.texts.insert(Arc::clone(&shared));
        set.bytes += text.len();
        if set.texts.len() > 2 * set.after_sweep + SWEEP_SLACK
            || set.bytes > 2 * set.bytes_after_sweep + SWEEP_SLACK_BYTES
        {
            // Only the set holds these: no child refers to them any more.
            set.texts.retain(|t| Arc::strong_count(t) > 1);
            set.after_sweep = set.texts.len();
            set.bytes = set.texts.iter().map(|t| t.len()).sum();
            set.bytes_after_sweep = set.bytes;
        }
        shared
    }

    /// The shared copy of the list of `values`, each interned.
    fn intern_list(&self, values: &[&str]) -> Arc<[Arc<str>]> {
        let values: Vec<Arc<str>> = values.iter().map(|v| self.intern(v)).collect();
        let mut set = self.inner.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(shared) = set.lists.get(values.as_slice()) {
            return Arc::clone(shared);
        }
        let shared: Arc<[Arc<str>]> = Arc::from(values);
        set.lists.insert(Arc::clone(&shared));
        if set.lists.len() > 2 * set.lists_after_sweep + SWEEP_SLACK {
            set.lists.retain(|l| Arc::strong_count(l) > 1);
            set.lists_after_sweep = set.lists.len();
        }
        shared
    }

    /// Distinct texts held.
    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.inner
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .texts
            .len()
    }
}

/// An object's JSON text as a shared template and the values its tokens stand for.
#[derive(Debug)]
pub(crate) struct Templated {
    /// The text with the name, the namespace and [`Templated::values`] replaced by tokens.
    pub(crate) template: Arc<str>,
    /// The values replaced, in token order (the list shared by the children with the same).
    pub(crate) values: Arc<[Arc<str>]>,
    /// A value of 16 hexadecimal digits the object alone has (a fingerprint), kept as the
    /// number they write; 0: none.
    pub(crate) hex: u64,
}

/// `value` as the number its 16 lower-case hexadecimal digits write, when above 0.
fn hex_number(value: &str) -> Option<u64> {
    let lower = value
        .bytes()
        .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b));
    (value.len() == 16 && lower)
        .then(|| u64::from_str_radix(value, 16).ok())
        .flatten()
        .filter(|n| *n > 0)
}

/// Whether `value` may be replaced: not empty, and written in JSON text as it is.
fn replaceable(value: &str) -> bool {
    !value.is_empty() && !value.bytes().any(|b| b < 0x20 || b == b'"' || b == b'\\')
}

impl Templated {
    /// `text` (JSON text) with `name`, `namespace`, `hex` (when it is 16 hexadecimal digits)
    /// and each distinct replaceable one of `values` replaced (the first [`MOST_VALUES`] of
    /// them, in the order given), interned in `interner`.
    pub(crate) fn new<'a>(
        text: &str,
        name: &str,
        namespace: Option<&str>,
        values: impl IntoIterator<Item = &'a str>,
        hex: Option<&str>,
        interner: &Interner,
    ) -> Self {
        let hex = hex.and_then(|h| Some((h, hex_number(h)?)));
        let mut kept: Vec<&str> = Vec::new();
        for v in values {
            if kept.len() < MOST_VALUES
                && replaceable(v)
                && v != name
                && Some(v) != namespace
                && hex.is_none_or(|(h, _)| v != h)
                && !kept.contains(&v)
            {
                kept.push(v);
            }
        }
        let mut tokens: Vec<(u8, &str)> = kept
            .iter()
            .enumerate()
            .map(|(i, v)| (FIRST_VALUE + i as u8, *v))
            .collect();
        tokens.push((NAME, name));
        if let Some(ns) = namespace {
            tokens.push((NAMESPACE, ns));
        }
        if let Some((h, _)) = hex {
            tokens.push((HEX, h));
        }
        tokens.retain(|(_, v)| replaceable(v));
        // Longest first, so a value inside a longer one (a tenant in its namespace's name)
        // does not split it.
        tokens.sort_by_key(|(_, v)| std::cmp::Reverse(v.len()));
        let mut out = text.to_owned();
        for (token, value) in tokens {
            if out.contains(value) {
                out = out.replace(value, char::from(token).encode_utf8(&mut [0; 1]));
            }
        }
        Self {
            template: interner.intern(&out),
            values: interner.intern_list(&kept),
            hex: hex.map_or(0, |(_, n)| n),
        }
    }

    /// Whether `value` is one of the replaced values.
    pub(crate) fn has_value(&self, value: &str) -> bool {
        self.values.iter().any(|v| **v == *value)
    }

    /// The JSON text back, for an object named `name` in `namespace`.
    pub(crate) fn text(&self, name: &str, namespace: Option<&str>) -> String {
        let t = self.template.as_bytes();
        let mut out = String::with_capacity(t.len() + 64);
        let mut start = 0;
        for (i, &b) in t.iter().enumerate() {
            if b >= 0x20 {
                continue;
            }
            // A byte below 0x20 is a whole character in UTF-8: the slices stay on boundaries.
            out.push_str(&self.template[start..i]);
            match b {
                NAME => out.push_str(name),
                NAMESPACE => out.push_str(namespace.unwrap_or_default()),
                HEX => out.push_str(&format!("{:016x}", self.hex)),
                _ => {
                    if let Some(v) = self.values.get(usize::from(b - FIRST_VALUE)) {
                        out.push_str(v);
                    }
                }
            }
            start = i + 1;
        }
        out.push_str(&self.template[start..]);
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn round_trip(text: &str, name: &str, ns: Option<&str>, values: &[&str]) -> Templated {
        let interner = Interner::default();
        let t = Templated::new(text, name, ns, values.iter().copied(), None, &interner);
        for hex in [
            "00000000000000aa",
            "0000000000000000",
            "ABCDEF0123456789",
            "aa",
        ] {
            let with_hex = format!("{text}{hex}");
            let h = Templated::new(
                &with_hex,
                name,
                ns,
                values.iter().copied(),
                Some(hex),
                &interner,
            );
            assert_eq!(h.text(name, ns), with_hex, "template {:?}", h.template);
        }
        assert_eq!(t.text(name, ns), text, "template {:?}", t.template);
        t
    }

    #[test]
    fn the_text_comes_back_exactly_whatever_the_values_overlap() {
        let text = r#"{"a":"team-1-ns0","b":"team-1","c":"team-1-owner@x","d":["team-1team-1"],"e":true,"team-1":"1"}"#;
        round_trip(text, "team-1-ns0", None, &["team-1", "true", "1", "am-1-o"]);
        round_trip(
            text,
            "owners",
            Some("team-1-ns0"),
            &["team-1", "e", "\"b\""],
        );
        // A value equal to the name, or to another value, or containing a token's neighbour.
        round_trip(text, "team-1", Some("team-1"), &["team-1", "team-1", ":"]);
        // Nothing to replace, or a value JSON escapes.
        round_trip(r#"{"q":"a\"b"}"#, "x", None, &["a\"b", "a\\", ""]);
    }

    #[test]
    fn children_made_alike_share_one_template_and_their_common_values() {
        let interner = Interner::default();
        let child = |t: u32, j: u32| {
            let text = format!(
                r#"{{"labels":{{"tenant":"team-{t}"}},"subjects":[{{"name":"team-{t}-owner"}}],"created":"2026-12-02T18:00:0{j}Z"}}"#
            );
            let created = format!("2026-12-02T18:00:0{j}Z");
            let tenant = format!("team-{t}");
            let print = format!("{:016x}", 1 + u64::from(t * 3 + j));
            let text = format!(r#"{text}{{"fingerprint":"{print}"}}"#);
            let ns = format!("team-{t}-ns{j}");
            let values = [created.as_str(), tenant.as_str()];
            Templated::new(&text, "owners", Some(&ns), values, Some(&print), &interner)
        };
        let all: Vec<Templated> = (0..50)
            .flat_map(|t| (0..3).map(move |j| (t, j)))
            .map(|(t, j)| child(t, j))
            .collect();
        assert!(
            all.iter()
                .all(|c| Arc::ptr_eq(&c.template, &all[0].template))
        );
        // One template, 3 times and 50 tenants.
        assert_eq!(interner.len(), 1 + 3 + 50);
        // Children with the same values share one list of them.
        assert!(Arc::ptr_eq(&all[4].values, &child(1, 1).values));
        assert!(!Arc::ptr_eq(&all[4].values, &all[5].values));
        assert!(all[4].has_value("team-1") && !all[4].has_value("team-2"));
    }

    #[test]
    fn texts_no_child_holds_are_swept_out() {
        let interner = Interner::default();
        let kept = interner.intern("kept");
        for i in 0..10 * SWEEP_SLACK {
            drop(interner.intern(&format!("gone-{i}")));
        }
        assert!(interner.len() <= 2 * SWEEP_SLACK + 2, "{}", interner.len());
        assert!(Arc::ptr_eq(&kept, &interner.intern("kept")));
    }

    #[test]
    fn large_texts_no_child_holds_are_swept_out_by_their_size() {
        // A tenant rewriting a large child again and again: each version's text is interned
        // and then let go. Far fewer of them than the count slack, but their bytes are bounded.
        let interner = Interner::default();
        let held: Vec<Arc<str>> = (0..100)
            .map(|i| interner.intern(&format!("held-{i}")))
            .collect();
        for i in 0..200 {
            drop(interner.intern(&format!("{i:08}{}", "x".repeat(256 * 1024))));
        }
        let bytes = interner.inner.lock().map(|s| s.bytes).unwrap_or_default();
        assert!(
            bytes <= 2 * SWEEP_SLACK_BYTES,
            "{bytes} bytes of texts no child holds"
        );
        assert!(held.iter().all(|h| Arc::ptr_eq(h, &interner.intern(h))));
    }
}
