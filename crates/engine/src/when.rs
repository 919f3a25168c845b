//! Rendering the start instant as `sys.when`.

use chrono::{DateTime, Timelike, Utc};

/// `YYYY-MM-DDTHH:MM:SS[.fff]Z` in UTC: at most millisecond precision, trailing zeros of the
/// fraction dropped, no fraction for a whole second.
pub fn render_when(start_ms: i64) -> String {
    let Some(instant) = DateTime::<Utc>::from_timestamp_millis(start_ms) else {
        // Outside chrono's range: clamp to the epoch rather than fail the run.
        return "1970-01-01T00:00:00Z".to_owned();
    };
    let mut text = instant.format("%Y-%m-%dT%H:%M:%S").to_string();
    let millis = instant.nanosecond() / 1_000_000;
    if millis > 0 {
        let fraction = format!("{millis:03}");
        text.push('.');
        text.push_str(fraction.trim_end_matches('0'));
    }
    text.push('Z');
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn spec_examples() {
        assert_eq!(render_when(0), "1970-01-01T00:00:00Z");
        assert_eq!(render_when(1_700_000_000_000), "2023-11-14T22:13:20Z");
        assert_eq!(render_when(1_709_210_096_789), "2024-02-29T12:34:56.789Z");
        assert_eq!(render_when(1_709_210_096_780), "2024-02-29T12:34:56.78Z");
        assert_eq!(render_when(1_709_210_096_700), "2024-02-29T12:34:56.7Z");
        assert_eq!(render_when(-1), "1969-12-31T23:59:59.999Z");
    }

    #[test]
    fn century_leap_rules() {
        // 2000-02-29 exists; 1900 and 2100 have no Feb 29.
        assert_eq!(render_when(951_782_400_000), "2000-02-29T00:00:00Z");
        assert_eq!(render_when(-2_203_891_200_000), "1900-03-01T00:00:00Z");
    }
}
