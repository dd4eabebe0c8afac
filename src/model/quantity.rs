//! Kubernetes resource quantities (`500m`, `1Gi`, `2`, `1e3`) as exact integers of nano-units.
//!
//! Accelerator checks need exact arithmetic ("is this a whole number?", "is the request equal to
//! the limit?"), so quantities are kept as `i128` nano-units instead of floats. The largest legal
//! quantity (about 9.2e18 units) times 1e9 still fits comfortably in an `i128`.

use std::fmt;

/// A parsed quantity in nano-units (1 unit = 1_000_000_000).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct Quantity(i128);

const NANOS_PER_UNIT: i128 = 1_000_000_000;

/// Why a quantity string was rejected.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid quantity {input:?}: {reason}")]
pub struct QuantityError {
    input: String,
    reason: &'static str,
}

impl Quantity {
    /// Zero units.
    pub const ZERO: Quantity = Quantity(0);

    /// A whole number of units.
    pub fn from_units(units: i64) -> Self {
        Quantity(i128::from(units) * NANOS_PER_UNIT)
    }

    /// A quantity from raw nano-units.
    pub fn from_nanos(nanos: i128) -> Self {
        Quantity(nanos)
    }

    /// The raw value in nano-units.
    pub fn nanos(self) -> i128 {
        self.0
    }

    /// True when the quantity is a whole number of units (`2`, `2000m`), false for `500m`.
    pub fn is_whole(self) -> bool {
        self.0 % NANOS_PER_UNIT == 0
    }

    /// Whole units, rounded up (a pod asking `500m` of a device needs one).
    pub fn ceil_units(self) -> i64 {
        let units = self.0.div_euclid(NANOS_PER_UNIT) + i128::from(self.0.rem_euclid(NANOS_PER_UNIT) != 0);
        i64::try_from(units).unwrap_or(i64::MAX)
    }

    /// Saturating sum.
    pub fn saturating_add(self, other: Quantity) -> Quantity {
        Quantity(self.0.saturating_add(other.0))
    }

    /// Parses a quantity from its canonical string form or from a JSON number.
    pub fn parse(input: &str) -> Result<Quantity, QuantityError> {
        match plain_nanos(input.as_bytes()) {
            Some(nanos) => Ok(Quantity(nanos)),
            None => Quantity::parse_any_form(input),
        }
    }

    /// [`Quantity::parse`] for every form: sign, decimal point, exponent, any suffix.
    fn parse_any_form(input: &str) -> Result<Quantity, QuantityError> {
        let err = |reason| QuantityError { input: input.to_string(), reason };
        let s = input.trim();
        if s.is_empty() {
            return Err(err("empty"));
        }
        let (negative, body) = match s.as_bytes()[0] {
            b'-' => (true, &s[1..]),
            b'+' => (false, &s[1..]),
            _ => (false, s),
        };
        let number_end = body.find(|c: char| !(c.is_ascii_digit() || c == '.')).unwrap_or(body.len());
        let (number, suffix) = body.split_at(number_end);
        if number.is_empty() || number == "." || number.matches('.').count() > 1 {
            return Err(err("no number"));
        }
        let (int_part, frac_part) = number.split_once('.').unwrap_or((number, ""));
        // Scale as (numerator * 10^exp10) * 2^exp2, all in nano-units.
        let (exp10, exp2): (i32, u32) = match suffix_scale(suffix.as_bytes()) {
            Some(scale) => scale,
            None if suffix.starts_with(['e', 'E']) => {
                let exp: i32 = suffix[1..].parse().map_err(|_| err("bad exponent"))?;
                if !(-30..=30).contains(&exp) {
                    return Err(err("exponent out of range"));
                }
                (exp, 0)
            }
            None => return Err(err("unknown suffix")),
        };
        if int_part.len() + frac_part.len() > 30 {
            return Err(err("too many digits"));
        }
        // At most 30 digits (checked above): the mantissa fits in an i128 (10^30 < 2^127).
        let mantissa = int_part.bytes().chain(frac_part.bytes()).fold(0i128, |m, d| m * 10 + i128::from(d - b'0'));
        // value = mantissa * 10^(exp10 - frac_len) * 2^exp2 units = ... * 10^(9 + exp10 - frac_len) nanos
        let scale = 9 + exp10 - frac_part.len() as i32;
        let overflow = || err("too large");
        let mut nanos = mantissa.checked_mul(1i128 << exp2).ok_or_else(overflow)?;
        if scale >= 0 {
            nanos = nanos.checked_mul(10i128.checked_pow(scale as u32).ok_or_else(overflow)?).ok_or_else(overflow)?;
        } else {
            let divisor = 10i128.checked_pow((-scale) as u32).ok_or_else(overflow)?;
            // Kubernetes rounds sub-nano precision up.
            nanos = nanos / divisor + i128::from(nanos % divisor != 0);
        }
        if nanos > i128::from(i64::MAX) * NANOS_PER_UNIT {
            return Err(overflow());
        }
        Ok(Quantity(if negative { -nanos } else { nanos }))
    }

    /// Parses a quantity as it appears in JSON: a string, or a plain number.
    pub fn from_json(value: &serde_json::Value) -> Result<Quantity, QuantityError> {
        match value {
            serde_json::Value::String(s) => Quantity::parse(s),
            serde_json::Value::Number(n) => match n.as_u64().and_then(|units| i64::try_from(units).ok()) {
                Some(units) => Ok(Quantity::from_units(units)),
                None => Quantity::parse(&n.to_string()),
            },
            other => Err(QuantityError { input: other.to_string(), reason: "not a string or number" }),
        }
    }
}

/// A unit suffix's scale, `(exp10, exp2)`: the quantity is its number × 10^exp10 × 2^exp2.
/// `None` for anything else (an exponent such as `e3` is read by the general parser).
fn suffix_scale(suffix: &[u8]) -> Option<(i32, u32)> {
    Some(match suffix {
        b"" => (0, 0),
        b"n" => (-9, 0),
        b"u" => (-6, 0),
        b"m" => (-3, 0),
        b"k" => (3, 0),
        b"M" => (6, 0),
        b"G" => (9, 0),
        b"T" => (12, 0),
        b"P" => (15, 0),
        b"E" => (18, 0),
        b"Ki" => (0, 10),
        b"Mi" => (0, 20),
        b"Gi" => (0, 30),
        b"Ti" => (0, 40),
        b"Pi" => (0, 50),
        b"Ei" => (0, 60),
        _ => return None,
    })
}

/// The nano-units of a quantity in the form nearly every manifest uses (`1`, `500m`, `16Gi`):
/// up to 18 digits and at most a unit suffix, nothing else. `None` for any other form,
/// which [`Quantity::parse_any_form`] then reads (with the same result for these: it is the
/// definition, and a property test holds them equal). A pod's quantities are parsed on every
/// review; the general form costs several times more.
fn plain_nanos(s: &[u8]) -> Option<i128> {
    let digits = s.iter().take_while(|b| b.is_ascii_digit()).count();
    if digits == 0 || digits > 18 {
        return None;
    }
    let mantissa = s[..digits].iter().fold(0i128, |m, d| m * 10 + i128::from(d - b'0'));
    let (exp10, exp2) = suffix_scale(&s[digits..])?;
    // Nano-units per unit of the suffix: 10^(9 + exp10), from 10^0 (`n`) to 10^27 (`E`), or
    // 10^9 × 2^exp2 up to 2^60 (`Ei`): within an i128. The product with the mantissa may not
    // be, so checked; over the largest legal quantity, the general path says why.
    let nanos_per = 10i128.pow((9 + exp10).unsigned_abs()) << exp2;
    let nanos = mantissa.checked_mul(nanos_per)?;
    (nanos <= i128::from(i64::MAX) * NANOS_PER_UNIT).then_some(nanos)
}

impl fmt::Display for Quantity {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.is_whole() {
            write!(f, "{}", self.0 / NANOS_PER_UNIT)
        } else if self.0 % 1_000_000 == 0 {
            write!(f, "{}m", self.0 / 1_000_000)
        } else {
            write!(f, "{}n", self.0)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_common_forms() {
        let cases = [
            ("1", 1_000_000_000),
            ("500m", 500_000_000),
            ("1.5", 1_500_000_000),
            ("2000m", 2_000_000_000),
            ("1Ki", 1024 * 1_000_000_000),
            ("1k", 1_000_000_000_000),
            ("1e3", 1_000_000_000_000),
            ("100n", 100),
            ("0", 0),
            ("-1", -1_000_000_000),
            // Every unit suffix once.
            ("3u", 3_000),
            ("1M", 1_000_000 * 1_000_000_000),
            ("1G", 1_000_000_000 * 1_000_000_000),
            ("1T", 10i128.pow(12) * 1_000_000_000),
            ("1P", 10i128.pow(15) * 1_000_000_000),
            ("1E", 10i128.pow(18) * 1_000_000_000),
            ("1Mi", (1 << 20) * 1_000_000_000),
            ("16Gi", 16 * (1 << 30) * 1_000_000_000),
            ("1Ti", (1 << 40) * 1_000_000_000),
            ("1Pi", (1 << 50) * 1_000_000_000),
            ("1Ei", (1 << 60) * 1_000_000_000),
        ];
        for (input, nanos) in cases {
            assert_eq!(Quantity::parse(input).map(Quantity::nanos), Ok(nanos), "{input}");
        }
    }

    #[test]
    fn whole_and_ceil() {
        assert!(Quantity::parse("2000m").unwrap().is_whole());
        assert!(!Quantity::parse("500m").unwrap().is_whole());
        assert_eq!(Quantity::parse("500m").unwrap().ceil_units(), 1);
        assert_eq!(Quantity::parse("3").unwrap().ceil_units(), 3);
        assert_eq!(Quantity::parse("500m").unwrap().to_string(), "500m");
    }

    #[test]
    fn rejects_garbage() {
        for input in ["", "abc", "1.2.3", "1Zi", "1e99", "99999999999999999999999999999999", ".", "--1"] {
            assert!(Quantity::parse(input).is_err(), "{input}");
        }
    }

    proptest::proptest! {
        #[test]
        fn never_panics(s in ".{0,40}") {
            let _ = Quantity::parse(&s);
        }

        #[test]
        fn the_plain_form_reads_as_every_form_does(
            s in "(\\PC{0,3}|[0-9]{0,21})(|n|u|m|k|M|G|T|P|E|Ki|Mi|Gi|Ti|Pi|Ei|e3|E3|\\.5|\\PC{0,2})",
        ) {
            proptest::prop_assert_eq!(Quantity::parse(&s), Quantity::parse_any_form(&s));
        }

        #[test]
        fn json_numbers_read_as_their_text(n in proptest::prelude::any::<u64>(), f in -1e20f64..1e20) {
            for number in [serde_json::json!(n), serde_json::json!(f)] {
                proptest::prop_assert_eq!(Quantity::from_json(&number), Quantity::parse_any_form(&number.to_string()));
            }
        }

        #[test]
        fn integers_round_trip(n in 0i64..1_000_000_000) {
            let q = Quantity::parse(&n.to_string()).unwrap();
            proptest::prop_assert_eq!(q, Quantity::from_units(n));
            proptest::prop_assert!(q.is_whole());
        }
    }
}
