//! Calendar windows (docs/design.md#calendar-windows): a window that starts
//! at midnight of a day, a week (Monday), a month (its first day, or a
//! billing day clamped to the month's end) or a year, in an IANA time zone.
//! Upstream's `unit: month` stays 30 days aligned to the epoch; a calendar
//! window is asked for by name (`calendar:` on the limit).
//!
//! The sidecar computes the boundaries around its own clock and the store
//! picks among them by its own (Redis `TIME` on Redis), so sidecars whose
//! clocks differ agree on when a window rolls over: [`Calendar::bounds`]
//! gives four boundaries, three windows, the one of `now` in the middle.

use jiff::Timestamp;
use jiff::civil::{Date, Time};
use jiff::tz::TimeZone;

/// The unit of a calendar window.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CalendarUnit {
    Day,
    /// From Monday (ISO 8601).
    Week,
    Month,
    Year,
}

impl CalendarUnit {
    /// As `unit:` names it.
    pub fn name(self) -> &'static str {
        match self {
            CalendarUnit::Day => "day",
            CalendarUnit::Week => "week",
            CalendarUnit::Month => "month",
            CalendarUnit::Year => "year",
        }
    }
}

/// A calendar window's rule: its unit, its time zone, and for a month the
/// day it starts on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Calendar {
    pub unit: CalendarUnit,
    /// The IANA name, as configured (`UTC` by default).
    pub time_zone: String,
    zone: TimeZone,
    /// A month's first day, 1 to 31; a month shorter than that starts on
    /// its last day. Always 1 for other units.
    pub starts_on: u8,
}

/// Why a calendar cannot be made.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CalendarError {
    #[error("unknown time zone `{0}`: give an IANA name, such as `Europe/Paris` or `UTC`")]
    UnknownZone(String),
    #[error("starts_on must be a day of the month, 1 to 31, not {0}")]
    StartsOn(i64),
    #[error("starts_on applies only to `unit: month`")]
    StartsOnNotMonth,
}

impl Calendar {
    /// The calendar of `unit` in the zone named `time_zone`, a month's
    /// windows starting on `starts_on` (1 when `None`).
    pub fn new(
        unit: CalendarUnit,
        time_zone: &str,
        starts_on: Option<i64>,
    ) -> Result<Self, CalendarError> {
        let zone =
            TimeZone::get(time_zone).map_err(|_| CalendarError::UnknownZone(time_zone.into()))?;
        let starts_on = match starts_on {
            None => 1,
            Some(_) if unit != CalendarUnit::Month => {
                return Err(CalendarError::StartsOnNotMonth);
            }
            Some(day) => u8::try_from(day)
                .ok()
                .filter(|day| (1..=31).contains(day))
                .ok_or(CalendarError::StartsOn(day))?,
        };
        Ok(Self {
            unit,
            time_zone: time_zone.to_owned(),
            zone,
            starts_on,
        })
    }

    /// Four boundaries in ms since the epoch, ascending: the start of the
    /// window before the one of `now`, the start and end of the window of
    /// `now`, and the end of the window after it. `None` only for instants
    /// the calendar cannot name (beyond the year 9999).
    pub fn bounds(&self, now: u64) -> Option<[u64; 4]> {
        // Straight between instants and civil times: a `Zoned` would clone
        // the zone for each of the five, on every decision.
        let now = Timestamp::from_millisecond(i64::try_from(now).ok()?).ok()?;
        let start = self.start_of(self.zone.to_datetime(now).date())?;
        let end = self.next(start)?;
        let dates = [self.previous(start)?, start, end, self.next(end)?];
        let mut bounds = [0; 4];
        for (bound, date) in bounds.iter_mut().zip(dates) {
            // Midnight, or the first instant of the day if a DST gap skips it.
            let instant = self
                .zone
                .to_timestamp(date.to_datetime(Time::midnight()))
                .ok()?;
            *bound = u64::try_from(instant.as_millisecond()).ok()?;
        }
        Some(bounds)
    }

    /// The first day of the window holding `day`.
    fn start_of(&self, day: Date) -> Option<Date> {
        match self.unit {
            CalendarUnit::Day => Some(day),
            CalendarUnit::Week => {
                let back = i64::from(day.weekday().to_monday_zero_offset());
                day.checked_sub(jiff::Span::new().days(back)).ok()
            }
            CalendarUnit::Month => {
                let this = self.billing_day(day.year(), day.month())?;
                if day >= this {
                    Some(this)
                } else {
                    let (year, month) = shift_month(day.year(), day.month(), -1);
                    self.billing_day(year, month)
                }
            }
            CalendarUnit::Year => Date::new(day.year(), 1, 1).ok(),
        }
    }

    /// The first day of the window after the one starting on `start`.
    fn next(&self, start: Date) -> Option<Date> {
        self.step(start, 1)
    }

    /// The first day of the window before the one starting on `start`.
    fn previous(&self, start: Date) -> Option<Date> {
        self.step(start, -1)
    }

    fn step(&self, start: Date, by: i8) -> Option<Date> {
        match self.unit {
            CalendarUnit::Day => start.checked_add(jiff::Span::new().days(by)).ok(),
            CalendarUnit::Week => start.checked_add(jiff::Span::new().weeks(by)).ok(),
            CalendarUnit::Month => {
                let (year, month) = shift_month(start.year(), start.month(), by);
                self.billing_day(year, month)
            }
            CalendarUnit::Year => Date::new(start.year().checked_add(i16::from(by))?, 1, 1).ok(),
        }
    }

    /// The month's billing day: `starts_on`, or its last day if shorter.
    fn billing_day(&self, year: i16, month: i8) -> Option<Date> {
        let first = Date::new(year, month, 1).ok()?;
        let day = i8::try_from(self.starts_on)
            .ok()?
            .min(first.days_in_month());
        Date::new(year, month, day).ok()
    }
}

/// `(year, month)` moved by `by` months (by is -1 or 1).
fn shift_month(year: i16, month: i8, by: i8) -> (i16, i8) {
    match month + by {
        0 => (year - 1, 12),
        13 => (year + 1, 1),
        month => (year, month),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ms(text: &str) -> u64 {
        let instant: Timestamp = text.parse().expect("an RFC 3339 instant");
        u64::try_from(instant.as_millisecond()).expect("after the epoch")
    }

    fn bounds(unit: CalendarUnit, zone: &str, starts_on: Option<i64>, now: &str) -> [u64; 4] {
        Calendar::new(unit, zone, starts_on)
            .expect("a calendar")
            .bounds(ms(now))
            .expect("bounds")
    }

    #[test]
    fn a_month_is_its_own_length_and_february_knows_leap_years() {
        let b = bounds(CalendarUnit::Month, "UTC", None, "2024-02-29T23:59:59.999Z");
        assert_eq!(
            b,
            [
                ms("2024-01-01T00:00:00Z"),
                ms("2024-02-01T00:00:00Z"),
                ms("2024-03-01T00:00:00Z"),
                ms("2024-04-01T00:00:00Z"),
            ]
        );
        assert_eq!(b[2] - b[1], 29 * 86_400_000);
        let b = bounds(CalendarUnit::Month, "UTC", None, "2023-02-15T00:00:00Z");
        assert_eq!(b[2] - b[1], 28 * 86_400_000);
        // The last millisecond of a month is in it; the next is not.
        let b = bounds(CalendarUnit::Month, "UTC", None, "2024-03-01T00:00:00Z");
        assert_eq!(b[1], ms("2024-03-01T00:00:00Z"));
    }

    #[test]
    fn a_billing_month_starts_on_its_day_clamped_to_the_months_end() {
        let b = bounds(CalendarUnit::Month, "UTC", Some(15), "2025-01-10T12:00:00Z");
        assert_eq!(b[1], ms("2024-12-15T00:00:00Z"));
        assert_eq!(b[2], ms("2025-01-15T00:00:00Z"));
        let b = bounds(CalendarUnit::Month, "UTC", Some(31), "2025-02-28T12:00:00Z");
        assert_eq!(
            b,
            [
                ms("2025-01-31T00:00:00Z"),
                ms("2025-02-28T00:00:00Z"),
                ms("2025-03-31T00:00:00Z"),
                ms("2025-04-30T00:00:00Z"),
            ]
        );
        let b = bounds(CalendarUnit::Month, "UTC", Some(30), "2024-02-29T00:00:00Z");
        assert_eq!(b[1], ms("2024-02-29T00:00:00Z"));
        assert_eq!(b[0], ms("2024-01-30T00:00:00Z"));
    }

    #[test]
    fn a_day_in_a_zone_is_23_or_25_hours_across_a_dst_change() {
        // Europe/Paris: 2025-03-30 has 23 hours, 2025-10-26 has 25.
        let b = bounds(
            CalendarUnit::Day,
            "Europe/Paris",
            None,
            "2025-03-30T12:00:00+02:00",
        );
        assert_eq!(b[1], ms("2025-03-29T23:00:00Z"));
        assert_eq!(b[2] - b[1], 23 * 3_600_000);
        let b = bounds(
            CalendarUnit::Day,
            "Europe/Paris",
            None,
            "2025-10-26T12:00:00+01:00",
        );
        assert_eq!(b[2] - b[1], 25 * 3_600_000);
        // Midnight in the zone, not in UTC.
        let b = bounds(
            CalendarUnit::Day,
            "America/New_York",
            None,
            "2025-01-02T03:00:00Z",
        );
        assert_eq!(b[1], ms("2025-01-01T05:00:00Z"));
    }

    #[test]
    fn weeks_start_on_monday_and_years_on_the_first_of_january() {
        // 2025-01-01 is a Wednesday.
        let b = bounds(CalendarUnit::Week, "UTC", None, "2025-01-01T10:00:00Z");
        assert_eq!(b[1], ms("2024-12-30T00:00:00Z"));
        assert_eq!(b[2], ms("2025-01-06T00:00:00Z"));
        let b = bounds(
            CalendarUnit::Year,
            "Asia/Tokyo",
            None,
            "2024-12-31T16:00:00Z",
        );
        assert_eq!(b[1], ms("2024-12-31T15:00:00Z"));
        assert_eq!(b[2] - b[1], 365 * 86_400_000);
        assert_eq!(b[1] - b[0], 366 * 86_400_000);
    }

    #[test]
    fn a_wrong_zone_or_day_is_refused() {
        assert_eq!(
            Calendar::new(CalendarUnit::Day, "Mars/Olympus", None),
            Err(CalendarError::UnknownZone("Mars/Olympus".into()))
        );
        assert_eq!(
            Calendar::new(CalendarUnit::Month, "UTC", Some(0)),
            Err(CalendarError::StartsOn(0))
        );
        assert_eq!(
            Calendar::new(CalendarUnit::Month, "UTC", Some(32)),
            Err(CalendarError::StartsOn(32))
        );
        assert_eq!(
            Calendar::new(CalendarUnit::Week, "UTC", Some(3)),
            Err(CalendarError::StartsOnNotMonth)
        );
        assert_eq!(
            Calendar::new(CalendarUnit::Day, "", None),
            Err(CalendarError::UnknownZone(String::new()))
        );
    }

    #[test]
    fn every_window_holds_now_and_the_next_starts_where_it_ends() {
        let calendar = Calendar::new(CalendarUnit::Month, "Australia/Lord_Howe", Some(29))
            .expect("a calendar");
        let mut now = ms("2023-12-20T00:00:00Z");
        for _ in 0..500 {
            let b = calendar.bounds(now).expect("bounds");
            assert!(
                b[0] < b[1] && b[1] <= now && now < b[2] && b[2] < b[3],
                "{b:?} {now}"
            );
            now += 86_400_000 + 3_599_999;
        }
    }
}
