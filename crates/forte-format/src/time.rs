//! The UTC calendar of a Unix time, for names and timestamps people read (batch layouts,
//! ingested file names), without a date library.

/// UTC year, month, day and hour of a Unix time (the days-from-civil algorithm in reverse).
pub fn civil_time(secs: u64) -> (i64, u32, u32, u32) {
    let days = (secs / 86_400) as i64;
    let hour = ((secs % 86_400) / 3600) as u32;
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let month = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    let year = yoe + era * 400 + i64::from(month <= 2);
    (year, month, day, hour)
}

/// A Unix time in milliseconds as `YYYYMMDDTHHMMSS.mmmZ`: sortable, and safe in file names.
pub fn compact_utc(millis: u64) -> String {
    let secs = millis / 1000;
    let (y, m, d, h) = civil_time(secs);
    let (min, s, ms) = ((secs % 3600) / 60, secs % 60, millis % 1000);
    format!("{y:04}{m:02}{d:02}T{h:02}{min:02}{s:02}.{ms:03}Z")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn calendar_dates() {
        assert_eq!(civil_time(0), (1970, 1, 1, 0));
        assert_eq!(civil_time(951_782_400), (2000, 2, 29, 0));
        assert_eq!(compact_utc(1_795_305_600_123), "20261122T000000.123Z");
    }
}
