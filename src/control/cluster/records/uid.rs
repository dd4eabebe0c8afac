//! A pod's uid in 16 bytes and no allocation when it is one the API server makes (a UUID in
//! its canonical lowercase form), as given otherwise. Every replica keeps one per Pod of the
//! cluster: as a string it was 52 heap bytes a pod, 8.6 MiB at 174,000 Pods (issue 49).

use std::fmt;
use std::sync::Arc;

/// `metadata.uid`, compared and printed exactly as the API server wrote it.
#[derive(Clone, PartialEq, Eq, Hash)]
pub enum PodUid {
    /// A UUID written `xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx` in lowercase hex: printed back
    /// the same, so no other string can equal it.
    Uuid([u8; 16]),
    /// Anything else (a test's `uid-1`, an upper-case UUID), kept as it is.
    Other(Arc<str>),
}

/// Where the hyphens of a canonical UUID are.
const HYPHENS: [usize; 4] = [8, 13, 18, 23];

impl PodUid {
    pub fn new(uid: &str) -> PodUid {
        parse_canonical(uid).map_or_else(|| PodUid::Other(Arc::from(uid)), PodUid::Uuid)
    }

    /// Whether it is `uid`, exactly.
    pub fn is(&self, uid: &str) -> bool {
        match self {
            PodUid::Uuid(bytes) => parse_canonical(uid).is_some_and(|b| &b == bytes),
            PodUid::Other(s) => &**s == uid,
        }
    }

    /// As a shared string, for what keeps the uid beside other strings (an action, a member).
    pub fn to_arc(&self) -> Arc<str> {
        match self {
            PodUid::Uuid(_) => Arc::from(self.to_string()),
            PodUid::Other(s) => s.clone(),
        }
    }

    /// The heap bytes it holds (an [`Arc<str>`]'s counts and text; none for a UUID).
    pub fn heap_bytes(&self) -> usize {
        match self {
            PodUid::Uuid(_) => 0,
            PodUid::Other(s) => super::arc_str(s),
        }
    }
}

impl From<&str> for PodUid {
    fn from(uid: &str) -> PodUid {
        PodUid::new(uid)
    }
}

impl From<String> for PodUid {
    fn from(uid: String) -> PodUid {
        PodUid::new(&uid)
    }
}

/// The 16 bytes of `uid` when it is a UUID in canonical lowercase form.
fn parse_canonical(uid: &str) -> Option<[u8; 16]> {
    let text = uid.as_bytes();
    if text.len() != 36 || HYPHENS.iter().any(|&i| text[i] != b'-') {
        return None;
    }
    let mut digits = text.iter().enumerate().filter(|(i, _)| !HYPHENS.contains(i)).map(|(_, &c)| c);
    let mut bytes = [0u8; 16];
    for byte in &mut bytes {
        let (high, low) = (lower_hex(digits.next()?)?, lower_hex(digits.next()?)?);
        *byte = high << 4 | low;
    }
    Some(bytes)
}

fn lower_hex(c: u8) -> Option<u8> {
    match c {
        b'0'..=b'9' => Some(c - b'0'),
        b'a'..=b'f' => Some(c - b'a' + 10),
        _ => None,
    }
}

impl fmt::Display for PodUid {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            PodUid::Uuid(bytes) => {
                for (i, byte) in bytes.iter().enumerate() {
                    if matches!(i, 4 | 6 | 8 | 10) {
                        f.write_str("-")?;
                    }
                    write!(f, "{byte:02x}")?;
                }
                Ok(())
            }
            PodUid::Other(s) => f.write_str(s),
        }
    }
}

/// As the string it stands for (the records' `Debug` compares in tests read it so).
impl fmt::Debug for PodUid {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(&self.to_string(), f)
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::PodUid;

    #[test]
    fn the_api_servers_uids_take_no_heap_and_print_back_exactly() {
        let uid = "0f8b6d3e-2c41-4a9b-9e7d-5c3a1b2f4e6d";
        let kept = PodUid::new(uid);
        assert!(matches!(kept, PodUid::Uuid(_)));
        assert_eq!(kept.heap_bytes(), 0);
        assert_eq!(kept.to_string(), uid);
        assert_eq!(&*kept.to_arc(), uid);
        assert!(kept.is(uid));
        assert!(!kept.is("0F8B6D3E-2C41-4A9B-9E7D-5C3A1B2F4E6D"), "compared as written, not as a UUID");
        assert!(!kept.is("0f8b6d3e-2c41-4a9b-9e7d-5c3a1b2f4e6e"));
        assert_eq!(std::mem::size_of::<Option<PodUid>>(), 24);
    }

    #[test]
    fn any_other_uid_is_kept_as_written() {
        for uid in [
            "uid-1",
            "",
            "0F8B6D3E-2C41-4A9B-9E7D-5C3A1B2F4E6D",
            "0f8b6d3e2c414a9b9e7d5c3a1b2f4e6d",
            "0f8b6d3e-2c41-4a9b-9e7d-5c3a1b2f4e6g",
        ] {
            let kept = PodUid::new(uid);
            assert!(matches!(kept, PodUid::Other(_)), "{uid}");
            assert_eq!(kept.to_string(), uid);
            assert!(kept.is(uid));
            assert_eq!(kept, PodUid::new(uid));
        }
    }

    proptest! {
        /// Two uids are equal as kept exactly when they are equal as written, and each prints
        /// back as written.
        #[test]
        fn kept_uids_compare_and_print_as_written(
            a in "[0-9a-fA-F]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}|[a-z0-9-]{0,40}",
            b in "[0-9a-fA-F]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}|[a-z0-9-]{0,40}",
        ) {
            let (ka, kb) = (PodUid::new(&a), PodUid::new(&b));
            prop_assert_eq!(ka.to_string(), a.clone());
            prop_assert_eq!(ka == kb, a == b);
            prop_assert_eq!(ka.is(&b), a == b);
            prop_assert_eq!(&*ka.to_arc(), a.as_str());
            // The same UUID in upper case is another uid (the canonical form is lower case).
            let upper = a.to_uppercase();
            prop_assert_eq!(ka == PodUid::new(&upper), a == upper);
        }
    }
}
