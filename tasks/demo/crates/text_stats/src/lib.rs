/// The number of words (runs of non-whitespace) in `text`.
pub fn word_count(text: &str) -> usize {
    text.split_whitespace().count()
}

/// The longest word of `text`; the first one when several are as long.
pub fn longest_word(text: &str) -> Option<&str> {
    let mut best: Option<&str> = None;
    for word in text.split_whitespace() {
        match best {
            Some(b) if word.len() <= b.len() => {}
            _ => best = Some(word),
        }
    }
    best
}

/// How many times `needle` occurs in `haystack`, without overlaps.
pub fn occurrences(haystack: &str, needle: &str) -> usize {
    if needle.is_empty() {
        return 0;
    }
    haystack.matches(needle).count()
}

/// `text` cut to at most `max` characters, with "..." appended when it was cut.
pub fn truncate(text: &str, max: usize) -> String {
    if text.chars().count() > max {
        let kept: String = text.chars().take(max).collect();
        format!("{}...", kept)
    } else {
        text.to_string()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_words() {
        assert_eq!(word_count("the quick  brown fox"), 4);
    }

    #[test]
    fn counts_no_words() {
        assert_eq!(word_count("   "), 0);
    }

    #[test]
    fn longest_is_first_of_equals() {
        assert_eq!(longest_word("ab cd e"), Some("ab"));
    }

    #[test]
    fn longest_of_nothing() {
        assert_eq!(longest_word(""), None);
    }

    #[test]
    fn counts_occurrences() {
        assert_eq!(occurrences("abcabcab", "ab"), 3);
    }

    #[test]
    fn empty_needle_occurs_never() {
        assert_eq!(occurrences("abc", ""), 0);
    }

    #[test]
    fn truncates_long_text() {
        assert_eq!(truncate("abcdef", 3), "abc...");
    }

    #[test]
    fn keeps_short_text() {
        assert_eq!(truncate("abc", 3), "abc");
    }
}
