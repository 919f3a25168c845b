//! The task id grammar (chapter 15, "Id rules and errors"), shared by the section VM's argument
//! checks and the engine's task registry.

/// Parse a task id: one or more decimal components from 0 to 4294967295 joined by single dots,
/// each written without a sign or leading zeros (the way the engine renders ids, so one id has
/// exactly one spelling). `None` when `text` is not an id.
pub fn parse_task_id(text: &str) -> Option<Vec<u32>> {
    text.split('.')
        .map(|part| {
            let bytes = part.as_bytes();
            let plain = !bytes.is_empty()
                && bytes.iter().all(u8::is_ascii_digit)
                && (bytes.len() == 1 || bytes[0] != b'0');
            if plain {
                part.parse::<u32>().ok()
            } else {
                None
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_parse() {
        assert_eq!(parse_task_id("0"), Some(vec![0]));
        assert_eq!(parse_task_id("0.2.10"), Some(vec![0, 2, 10]));
        assert_eq!(parse_task_id("4294967295"), Some(vec![u32::MAX]));
    }

    #[test]
    fn malformed_ids_are_refused() {
        for bad in [
            "",
            ".",
            "0.",
            ".0",
            "0..1",
            "a",
            "0.x",
            "-1",
            "+1",
            "01",
            "0.01",
            "1 ",
            " 1",
            "4294967296",
            "0.1e3",
            "٣",
        ] {
            assert_eq!(parse_task_id(bad), None, "{bad:?}");
        }
    }
}
