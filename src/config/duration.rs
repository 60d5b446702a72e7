//! Durations as configuration files write them: `250ms`, `1s`, `15m`, `24h`,
//! `7d`, or `forever`.

/// Milliseconds; [`FOREVER`] stands for `forever`. All arithmetic on
/// durations saturates, so `forever` stays forever.
pub type Millis = u64;

/// The duration written `forever`.
pub const FOREVER: Millis = u64::MAX;

/// The longest finite duration accepted (100 years): anything longer is a typo
/// or an overflow waiting to happen; `forever` says it plainly.
pub const MAX_FINITE: Millis = 100 * 365 * 86_400_000;

/// Parses a duration. Errors say what was expected.
pub fn parse(text: &str) -> Result<Millis, String> {
    let text = text.trim();
    if text == "forever" {
        return Ok(FOREVER);
    }
    if text == "0" {
        // Zero is zero in any unit.
        return Ok(0);
    }
    let split = text
        .find(|c: char| !c.is_ascii_digit())
        .ok_or_else(|| format!("duration `{text}` has no unit; write e.g. `250ms`, `1s`, `15m`, `24h`, `7d` or `forever`"))?;
    let (digits, unit) = text.split_at(split);
    if digits.is_empty() {
        return Err(format!(
            "`{text}` is not a duration; write a whole non-negative number and a unit, e.g. `250ms`, `1s`, `15m`, `24h`, `7d`, or `forever`"
        ));
    }
    let per_unit: u64 = match unit {
        "ms" => 1,
        "s" => 1_000,
        "m" => 60_000,
        "h" => 3_600_000,
        "d" => 86_400_000,
        _ => {
            return Err(format!(
                "`{text}` has an unknown unit `{unit}`; use ms, s, m, h, d, or write `forever`"
            ));
        }
    };
    let value: u64 = digits
        .parse()
        .map_err(|_| format!("`{text}` is too large"))?;
    match value.checked_mul(per_unit) {
        Some(ms) if ms <= MAX_FINITE => Ok(ms),
        _ => Err(format!(
            "`{text}` is longer than 100 years; write `forever` if that is what you mean"
        )),
    }
}

/// Formats a duration the way [`parse`] reads it, in the largest exact unit.
pub fn format(ms: Millis) -> String {
    let mut text = String::with_capacity(8);
    write(&mut text, ms);
    text
}

/// Appends [`format()`]'s text to `out` (no formatting machinery: this runs
/// on the request path, in limit names).
pub fn write(out: &mut String, ms: Millis) {
    if ms == FOREVER {
        out.push_str("forever");
        return;
    }
    if ms == 0 {
        out.push_str("0s");
        return;
    }
    let (count, unit) = [
        ("d", 86_400_000),
        ("h", 3_600_000),
        ("m", 60_000),
        ("s", 1_000),
    ]
    .into_iter()
    .find(|(_, size)| ms.is_multiple_of(*size))
    .map_or((ms, "ms"), |(unit, size)| (ms / size, unit));
    out.push_str(itoa::Buffer::new().format(count));
    out.push_str(unit);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_every_unit() {
        assert_eq!(parse("250ms"), Ok(250));
        assert_eq!(parse("1s"), Ok(1_000));
        assert_eq!(parse("15m"), Ok(900_000));
        assert_eq!(parse("24h"), Ok(86_400_000));
        assert_eq!(parse("7d"), Ok(604_800_000));
        assert_eq!(parse("forever"), Ok(FOREVER));
        assert_eq!(parse("0s"), Ok(0));
        assert_eq!(parse("0"), Ok(0));
    }

    #[test]
    fn rejects_nonsense_with_a_reason() {
        for bad in [
            "-1s",
            "1 fortnight",
            "1fortnight",
            "",
            "s",
            "10",
            "1.5s",
            "99999999999999999999d",
            "36501d",
        ] {
            let err = parse(bad).expect_err(bad);
            assert!(!err.is_empty());
        }
    }

    #[test]
    fn formats_round_trip() {
        for ms in [
            0, 1, 250, 1_000, 1_500, 60_000, 3_600_000, 86_400_000, FOREVER,
        ] {
            assert_eq!(parse(&format(ms)), Ok(ms));
        }
    }
}
