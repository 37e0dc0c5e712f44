/// Clamp `x` into `[lo, hi]`.
pub fn clamp(x: i64, lo: i64, hi: i64) -> i64 {
    if x < lo {
        lo
    } else if x > hi {
        hi
    } else {
        x
    }
}

/// The sum of `a` and `b`.
pub fn add(a: i64, b: i64) -> i64 {
    a + b
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn clamp_below() {
        assert_eq!(clamp(-5, 0, 10), 0);
    }

    #[test]
    fn clamp_above() {
        assert_eq!(clamp(15, 0, 10), 10);
    }

    #[test]
    fn clamp_inside() {
        assert_eq!(clamp(5, 0, 10), 5);
    }

    #[test]
    fn add_two() {
        assert_eq!(add(2, 3), 5);
    }
}
