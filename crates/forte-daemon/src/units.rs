//! Byte sizes as people write them: `16MiB`, `512k`, `1G`, `4096`.

use forte_relay::pace::Timetable;

/// Parses a size; `k`/`M`/`G`/`T` are binary multiples with or without `i`/`B`.
pub fn parse_size(text: &str) -> Result<u64, String> {
    let t = text.trim();
    let digits = t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len());
    let (number, unit) = t.split_at(digits);
    let number: u64 = number
        .parse()
        .map_err(|_| format!("{text:?} is not a size (examples: 16MiB, 512k, 4096)"))?;
    let shift = match unit
        .trim()
        .trim_end_matches(['B', 'b'])
        .trim_end_matches('i')
    {
        "" => 0,
        "k" | "K" => 10,
        "m" | "M" => 20,
        "g" | "G" => 30,
        "t" | "T" => 40,
        _ => return Err(format!("{text:?} has an unknown unit (use k, M, G or T)")),
    };
    number
        .checked_mul(1 << shift)
        .ok_or_else(|| format!("{text:?} is too large"))
}

/// A time left, as a person reads it: `45s`, `3m12s`, `2h05m`.
pub fn duration_text(seconds: f64) -> String {
    let s = seconds.max(0.0).round() as u64;
    match s {
        0..=59 => format!("{s}s"),
        60..=3599 => format!("{}m{:02}s", s / 60, s % 60),
        _ => format!("{}h{:02}m", s / 3600, s % 3600 / 60),
    }
}

/// Parses a duration: a number with `ms`, `s`, `m`, `h` or `d` (`250ms`, `90s`, `30m`, `1h`);
/// a bare number is seconds.
pub fn parse_duration(text: &str) -> Result<std::time::Duration, String> {
    let t = text.trim();
    let digits = t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len());
    let (number, unit) = t.split_at(digits);
    let number: u64 = number
        .parse()
        .map_err(|_| format!("{text:?} is not a duration (examples: 90s, 30m, 1h)"))?;
    let millis = match unit.trim() {
        "ms" => 1,
        "" | "s" => 1000,
        "m" | "min" => 60_000,
        "h" => 3_600_000,
        "d" => 86_400_000,
        _ => {
            return Err(format!(
                "{text:?} has an unknown unit (use ms, s, m, h or d)"
            ))
        }
    };
    Ok(std::time::Duration::from_millis(
        number.saturating_mul(millis),
    ))
}

/// A moment for `--since` and `--until`, in µs since the epoch: an age before now (`1d`,
/// `12h`, `2w`) or a date (`2026-12-01`, local time, or RFC 3339).
pub fn parse_moment(text: &str) -> Result<i64, String> {
    let at = forte_prepare::parse_moment(text, std::time::SystemTime::now())
        .map_err(|e| format!("{e:#}"))?;
    let since = at.duration_since(std::time::UNIX_EPOCH).unwrap_or_default();
    Ok(i64::try_from(since.as_micros()).unwrap_or(i64::MAX))
}

/// A duration that must not be zero (a timeout, an interval): 0 would close everything at
/// once or spin, which is a typo, not a wish.
pub fn parse_period(text: &str) -> Result<std::time::Duration, String> {
    match parse_duration(text)? {
        d if d.is_zero() => Err(format!("{text:?} is zero: give a duration such as 10s")),
        d => Ok(d),
    }
}

/// A size that must not be zero (a quota, a memory budget): 0 would refuse everything.
pub fn parse_nonzero_size(text: &str) -> Result<u64, String> {
    match parse_size(text)? {
        0 => Err(format!("{text:?} is zero: give a size such as 512MiB")),
        n => Ok(n),
    }
}

/// The most threads (connections, writers, a CPU budget) a setting may ask for: far above any
/// machine's use, far below what makes the process fail to start them.
pub const MOST_THREADS: usize = 1024;

/// A number of threads: 1 to [`MOST_THREADS`].
pub fn parse_threads(text: &str) -> Result<usize, String> {
    match parse_count(text)? {
        n if n > MOST_THREADS => Err(format!(
            "{n} is more than the {MOST_THREADS} threads a setting may ask for"
        )),
        n => Ok(n),
    }
}

/// A count that must be 1 or more (connections, writers, rows): 0 silently meant 1, or
/// nothing at all, before.
pub fn parse_count(text: &str) -> Result<usize, String> {
    match text.trim().parse::<usize>() {
        Ok(0) => Err("0 is not allowed here: give 1 or more".to_string()),
        Ok(n) => Ok(n),
        Err(_) => Err(format!("{text:?} is not a number such as 4")),
    }
}

/// Parses a data rate into bytes per second: a decimal number, a unit (`B`, `kB`, `MB`,
/// `GB`, `TB` decimal as links and storage are quoted; `KiB`… binary; `mbit`, `gbit`) and an
/// optional period (`/s` default, `/h`, `/day`): `65MB`, `520mbit`, `3.36TB/day`.
pub fn parse_rate(text: &str) -> Result<f64, String> {
    let t = text.trim();
    let (amount, period) = t.split_once('/').unwrap_or((t, "s"));
    let per_second = match period.trim() {
        "s" | "sec" => 1.0,
        "min" => 60.0,
        "h" => 3600.0,
        "d" | "day" => 86_400.0,
        other => {
            return Err(format!(
                "{text:?}: unknown period {other:?} (use /s, /h or /day)"
            ))
        }
    };
    let digits = amount
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(amount.len());
    let (number, unit) = amount.split_at(digits);
    let number: f64 = number
        .parse()
        .map_err(|_| format!("{text:?} is not a rate (examples: 65MB, 520mbit, 3.36TB/day)"))?;
    let bytes = match unit.trim() {
        "" | "B" => 1.0,
        "k" | "kB" | "KB" => 1e3,
        "M" | "MB" => 1e6,
        "G" | "GB" => 1e9,
        "T" | "TB" => 1e12,
        "KiB" => 1024.0,
        "MiB" => 1024.0 * 1024.0,
        "GiB" => 1024.0 * 1024.0 * 1024.0,
        "kbit" => 1e3 / 8.0,
        "mbit" | "Mbit" => 1e6 / 8.0,
        "gbit" | "Gbit" => 1e9 / 8.0,
        other => {
            return Err(format!(
                "{text:?}: unknown unit {other:?} (use B, kB, MB, GB, TB, MiB or mbit)"
            ))
        }
    };
    Ok(number * bytes / per_second)
}

/// Parses a bandwidth limit as `send --bwlimit` takes it: `off`, a rate as [`parse_rate`]
/// reads it (`20MB`, `160mbit`), or a weekly timetable in rclone's style: entries separated by
/// spaces, each `HH:MM,LIMIT` (every day) or `Day-HH:MM,LIMIT` (Mon … Sun), LIMIT a rate or
/// `off`; each holds until the next ("08:00,2MB 19:00,off"; "Mon-08:00,2MB Sat-00:00,off").
pub fn parse_bwlimit(text: &str) -> Result<Timetable, String> {
    const EXAMPLES: &str =
        "examples: 20MB, off, \"08:00,2MB 19:00,off\", \"Mon-08:00,2MB Sat-00:00,off\"";
    let limit = |text: &str| match text.trim() {
        "off" => Ok(None),
        rate => parse_rate(rate).map(Some),
    };
    if !text.contains([',', ':']) {
        return Timetable::new(vec![(0, limit(text)?)]).map_err(|e| format!("{text:?}: {e}"));
    }
    let days = ["mon", "tue", "wed", "thu", "fri", "sat", "sun"];
    let mut entries = Vec::new();
    let (mut daily, mut weekly) = (false, false);
    for entry in text.split_whitespace() {
        let bad = |why: &str| format!("bandwidth timetable entry {entry:?}: {why} ({EXAMPLES})");
        let (when, rate) = entry.split_once(',').ok_or_else(|| bad("no ,LIMIT"))?;
        let (day, clock) = match when.split_once('-') {
            Some((day, clock)) => {
                let day = days
                    .iter()
                    .position(|d| d.eq_ignore_ascii_case(day))
                    .ok_or_else(|| bad("the day is none of Mon, Tue, Wed, Thu, Fri, Sat, Sun"))?;
                (Some(day as u32), clock)
            }
            None => (None, when),
        };
        let (hour, minute) = clock
            .split_once(':')
            .and_then(|(h, m)| Some((h.parse::<u32>().ok()?, m.parse::<u32>().ok()?)))
            .filter(|&(h, m)| h < 24 && m < 60)
            .ok_or_else(|| bad("the time is not HH:MM"))?;
        let rate = limit(rate).map_err(|e| bad(&e))?;
        let minute = hour * 60 + minute;
        match day {
            Some(day) => {
                weekly = true;
                entries.push((day * 24 * 60 + minute, rate));
            }
            None => {
                daily = true;
                entries.extend((0..7).map(|day| (day * 24 * 60 + minute, rate)));
            }
        }
    }
    if daily && weekly {
        return Err(format!(
            "bandwidth timetable {text:?} mixes daily (HH:MM) and weekly (Day-HH:MM) entries: use one kind"
        ));
    }
    Timetable::new(entries).map_err(|e| format!("bandwidth timetable {text:?}: {e}"))
}

pub use forte_report::human;

/// `n` in MB/s over `seconds`, in decimal megabytes as storage and links are quoted.
pub fn mb_per_s(bytes: u64, seconds: f64) -> f64 {
    if seconds > 0.0 {
        bytes as f64 / 1e6 / seconds
    } else {
        0.0
    }
}

/// Raw bytes per compressed byte.
pub fn ratio(raw: u64, compressed: u64) -> f64 {
    if compressed > 0 {
        raw as f64 / compressed as f64
    } else {
        1.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_bandwidth_limit_is_a_rate_off_or_a_weekly_timetable() {
        assert_eq!(parse_bwlimit("20MB"), Ok(Timetable::fixed(Some(20e6))));
        assert_eq!(parse_bwlimit("off"), Ok(Timetable::fixed(None)));
        let daily = parse_bwlimit("08:00,2MB 19:30,off").unwrap();
        let (mon, sun) = (0, 6 * 24 * 60);
        assert_eq!(daily.at(mon + 7 * 60 + 59), None);
        assert_eq!(daily.at(mon + 8 * 60), Some(2e6));
        assert_eq!(daily.at(sun + 19 * 60 + 29), Some(2e6));
        assert_eq!(daily.at(sun + 19 * 60 + 30), None);
        let weekly = parse_bwlimit("Mon-08:00,1MB sat-00:00,off").unwrap();
        assert_eq!(weekly.at(4 * 24 * 60), Some(1e6), "Friday");
        assert_eq!(weekly.at(5 * 24 * 60 + 1), None, "Saturday");
        for (bad, says) in [
            ("08:00", "no ,LIMIT"),
            ("25:00,1MB", "not HH:MM"),
            ("Mun-08:00,1MB", "none of Mon"),
            ("08:00,fast", "not a rate"),
            ("08:00,1MB Mon-09:00,off", "mixes daily"),
            ("08:00,1MB 08:00,off", "one time twice"),
            ("0MB", "sends nothing"),
        ] {
            let e = parse_bwlimit(bad).unwrap_err();
            assert!(e.contains(says), "{bad}: {e}");
        }
    }

    #[test]
    fn rates_parse() {
        assert_eq!(parse_rate("65MB"), Ok(65e6));
        assert_eq!(parse_rate("520mbit"), Ok(65e6));
        assert_eq!(parse_rate("3.36TB/day"), Ok(3.36e12 / 86_400.0));
        assert!(parse_rate("3 bananas")
            .unwrap_err()
            .contains("unknown unit"));
    }

    #[test]
    fn durations_parse() {
        assert_eq!(
            parse_duration("90s"),
            Ok(std::time::Duration::from_secs(90))
        );
        assert_eq!(
            parse_duration("1h"),
            Ok(std::time::Duration::from_secs(3600))
        );
        assert_eq!(parse_duration("45"), Ok(std::time::Duration::from_secs(45)));
        assert_eq!(
            parse_duration("250ms"),
            Ok(std::time::Duration::from_millis(250))
        );
        assert!(parse_duration("1 week")
            .unwrap_err()
            .contains("unknown unit"));
    }

    #[test]
    fn sizes_parse() {
        assert_eq!(parse_size("16MiB"), Ok(16 << 20));
        assert_eq!(parse_size("512k"), Ok(512 << 10));
        assert_eq!(parse_size("4096"), Ok(4096));
        assert_eq!(parse_size("1G"), Ok(1 << 30));
        assert!(parse_size("12 parsecs").is_err());
        assert!(parse_size("").is_err());
        assert_eq!(human(1536), "1.50 KiB");
    }
}
