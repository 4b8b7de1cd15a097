//! Unsigned integers in decimal, written on the stack: what the request path writes for every
//! request (`Server-Timing`, `Age`, metric lines) goes without `format!`'s machinery or an
//! allocation.

/// `n`'s decimal digits, written at the end of `buf`.
pub fn digits(mut n: u64, buf: &mut [u8; 20]) -> &str {
    let mut at = buf.len();
    loop {
        at -= 1;
        buf[at] = b'0' + (n % 10) as u8;
        n /= 10;
        if n == 0 {
            break;
        }
    }
    std::str::from_utf8(&buf[at..]).expect("ASCII digits")
}

#[cfg(test)]
mod tests {
    #[test]
    fn digits_from_zero_to_the_largest() {
        let mut buf = [0u8; 20];
        for (n, text) in [(0, "0"), (7, "7"), (10, "10"), (3600, "3600")] {
            assert_eq!(super::digits(n, &mut buf), text);
        }
        assert_eq!(super::digits(u64::MAX, &mut buf), u64::MAX.to_string());
    }
}
