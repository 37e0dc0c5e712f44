/// A stack that holds at most `capacity` items: pushing onto a full stack drops the oldest item.
pub struct RingStack {
    items: Vec<i32>,
    capacity: usize,
}

impl RingStack {
    pub fn new(capacity: usize) -> Self {
        RingStack { items: Vec::new(), capacity }
    }

    pub fn push(&mut self, item: i32) {
        if self.items.len() == self.capacity {
            self.items.remove(0);
        }
        self.items.push(item);
    }

    pub fn pop(&mut self) -> Option<i32> {
        self.items.pop()
    }

    pub fn peek(&self) -> Option<i32> {
        self.items.last().copied()
    }

    pub fn len(&self) -> usize {
        self.items.len()
    }

    pub fn is_empty(&self) -> bool {
        self.items.len() == 0
    }

    /// The sum of the items, the newest `n` of them only.
    pub fn sum_newest(&self, n: usize) -> i32 {
        let start = if n < self.items.len() { self.items.len() - n } else { 0 };
        self.items[start..].iter().sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pops_in_reverse_order() {
        let mut s = RingStack::new(3);
        s.push(1);
        s.push(2);
        assert_eq!(s.pop(), Some(2));
        assert_eq!(s.pop(), Some(1));
        assert_eq!(s.pop(), None);
    }

    #[test]
    fn drops_the_oldest_when_full() {
        let mut s = RingStack::new(2);
        s.push(1);
        s.push(2);
        s.push(3);
        assert_eq!(s.len(), 2);
        assert_eq!(s.sum_newest(5), 5);
    }

    #[test]
    fn peeks_the_newest() {
        let mut s = RingStack::new(2);
        s.push(7);
        assert_eq!(s.peek(), Some(7));
        assert_eq!(s.len(), 1);
    }

    #[test]
    fn new_is_empty() {
        let s = RingStack::new(1);
        assert!(s.is_empty());
    }

    #[test]
    fn sums_the_newest() {
        let mut s = RingStack::new(5);
        for i in 1..=4 {
            s.push(i);
        }
        assert_eq!(s.sum_newest(2), 7);
    }
}
