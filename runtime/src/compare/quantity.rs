//! `resource.Quantity` parsed to an exact value so that "1000m" equals "1" and "1Ki" equals "1024".

/// An exact quantity: `mantissa × 10^exp10`, normalised so the mantissa has no trailing zero.
///
/// Grammar (Kubernetes `resource.Quantity`, apimachinery `quantity.go`):
/// `<sign><digits>[.<digits>]<suffix>` where suffix is a binary SI suffix (`Ki Mi Gi Ti Pi Ei`),
/// a decimal SI suffix (`n u m "" k M G T P E`) or a decimal exponent (`e<int>` / `E<int>`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Quantity {
    mantissa: i128,
    exp10: i32,
}

impl Quantity {
    /// Parses a quantity string; `None` when it is not a valid quantity or is too large to hold
    /// exactly (beyond about 10^38 after removing the suffix).
    pub fn parse(s: &str) -> Option<Self> {
        let s = s.trim();
        let (sign, rest) = match s.as_bytes().first()? {
            b'-' => (-1i128, &s[1..]),
            b'+' => (1, &s[1..]),
            _ => (1, s),
        };
        let num_end = rest
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .unwrap_or(rest.len());
        let (number, suffix) = rest.split_at(num_end);
        if number.is_empty() || number == "." || number.matches('.').count() > 1 {
            return None;
        }
        let (int_part, frac_part) = number.split_once('.').unwrap_or((number, ""));
        let mut mantissa: i128 = 0;
        for c in int_part.chars().chain(frac_part.chars()) {
            mantissa = mantissa
                .checked_mul(10)?
                .checked_add(i128::from(c.to_digit(10)?))?;
        }
        let mut exp10 = -i32::try_from(frac_part.len()).ok()?;
        match suffix {
            "" => {}
            "Ki" | "Mi" | "Gi" | "Ti" | "Pi" | "Ei" => {
                let power = match suffix {
                    "Ki" => 1,
                    "Mi" => 2,
                    "Gi" => 3,
                    "Ti" => 4,
                    "Pi" => 5,
                    _ => 6,
                };
                mantissa = mantissa.checked_mul(1024i128.checked_pow(power)?)?;
            }
            "n" => exp10 -= 9,
            "u" => exp10 -= 6,
            "m" => exp10 -= 3,
            "k" => exp10 += 3,
            "M" => exp10 += 6,
            "G" => exp10 += 9,
            "T" => exp10 += 12,
            "P" => exp10 += 15,
            "E" => exp10 += 18,
            _ => {
                let exp = suffix.strip_prefix(['e', 'E'])?;
                if exp.is_empty() || exp == "-" || exp == "+" {
                    return None;
                }
                exp10 = exp10.checked_add(exp.parse::<i32>().ok()?)?;
            }
        }
        Some(Self::normalised(sign * mantissa, exp10))
    }

    /// The value in whole units of `10^scale` (`scale = -3`: milli-units), rounded down, or
    /// up with `round_up`; `None` when it does not fit in an `i128`.
    pub fn units(&self, scale: i32, round_up: bool) -> Option<i128> {
        let shift = self.exp10.checked_sub(scale)?;
        if shift >= 0 {
            return self
                .mantissa
                .checked_mul(10i128.checked_pow(u32::try_from(shift).ok()?)?);
        }
        let Some(divisor) = u32::try_from(-i64::from(shift))
            .ok()
            .and_then(|p| 10i128.checked_pow(p))
        else {
            // Smaller than one unit by more than an i128 can tell.
            return Some(match (round_up, self.mantissa.signum()) {
                (true, 1) => 1,
                (false, -1) => -1,
                _ => 0,
            });
        };
        let (quotient, rest) = (
            self.mantissa.div_euclid(divisor),
            self.mantissa.rem_euclid(divisor),
        );
        Some(if round_up && rest != 0 {
            quotient + 1
        } else {
            quotient
        })
    }

    fn normalised(mut mantissa: i128, mut exp10: i32) -> Self {
        if mantissa == 0 {
            return Self {
                mantissa: 0,
                exp10: 0,
            };
        }
        while mantissa % 10 == 0 {
            mantissa /= 10;
            exp10 += 1;
        }
        Self { mantissa, exp10 }
    }
}

#[cfg(test)]
mod tests {
    use super::Quantity;

    fn q(s: &str) -> Quantity {
        Quantity::parse(s).unwrap_or_else(|| panic!("{s} should parse"))
    }

    #[test]
    fn units_round_as_asked() {
        assert_eq!(q("1500m").units(0, false), Some(1));
        assert_eq!(q("1500m").units(0, true), Some(2));
        assert_eq!(q("1500m").units(-3, false), Some(1500));
        assert_eq!(q("2").units(-3, true), Some(2000));
        assert_eq!(q("1Ki").units(0, false), Some(1024));
        assert_eq!(q("3k").units(3, false), Some(3));
        assert_eq!(q("1n").units(-3, false), Some(0));
        assert_eq!(q("1n").units(-3, true), Some(1));
        assert_eq!(q("-1500m").units(0, false), Some(-2));
        assert_eq!(q("1e-60").units(0, true), Some(1));
        assert_eq!(q("9e30").units(-10, false), None);
    }

    #[test]
    fn equal_by_value() {
        assert_eq!(q("1000m"), q("1"));
        assert_eq!(q("0.5"), q("500m"));
        assert_eq!(q("1Ki"), q("1024"));
        assert_eq!(q("8Gi"), q("8192Mi"));
        assert_eq!(q("1k"), q("1e3"));
        assert_eq!(q("1.5Gi"), q("1536Mi"));
        assert_eq!(q("0"), q("0m"));
        assert_eq!(q("+2"), q("2"));
        assert_eq!(q("100M"), q("1e8"));
    }

    #[test]
    fn different_values() {
        assert_ne!(q("1"), q("1001m"));
        assert_ne!(q("1G"), q("1Gi"));
        assert_ne!(q("-1"), q("1"));
    }

    #[test]
    fn rejects_garbage() {
        for s in ["", "abc", "1x", "1.2.3", ".", "1e", "Gi", "1Gix", "--1"] {
            assert!(Quantity::parse(s).is_none(), "{s:?} must not parse");
        }
    }

    #[test]
    fn too_large_is_none_not_panic() {
        assert!(Quantity::parse("99999999999999999999999999999999999999999Ei").is_none());
    }
}
