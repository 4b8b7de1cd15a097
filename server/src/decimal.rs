//! Unsigned integers in decimal, written on the stack: what the request path writes for every
//! request (`Server-Timing`, `Age`, `Content-Length`, access log lines, metric lines) goes
//! without `format!`'s machinery or an allocation.

use http::HeaderValue;

/// `n`'s decimal digits, written at the end of `buf` (two digits at a time).
pub fn bytes(mut n: u64, buf: &mut [u8; 20]) -> &[u8] {
    const PAIRS: &[u8; 200] = b"0001020304050607080910111213141516171819\
        2021222324252627282930313233343536373839404142434445464748495051525354555657585960616263\
        6465666768697071727374757677787980818283848586878889909192939495969798\
        99";
    let mut i = buf.len();
    while n >= 100 {
        let pair = (n % 100) as usize * 2;
        n /= 100;
        i -= 2;
        buf[i..i + 2].copy_from_slice(&PAIRS[pair..pair + 2]);
    }
    if n >= 10 {
        let pair = n as usize * 2;
        i -= 2;
        buf[i..i + 2].copy_from_slice(&PAIRS[pair..pair + 2]);
    } else {
        i -= 1;
        buf[i] = b'0' + n as u8;
    }
    &buf[i..]
}

/// `n`'s decimal digits as text, written at the end of `buf`.
pub fn digits(n: u64, buf: &mut [u8; 20]) -> &str {
    std::str::from_utf8(bytes(n, buf)).expect("ASCII digits")
}

/// `n` in decimal as a header value (`HeaderValue::from(u64)` makes it in a growing buffer:
/// two allocations; this copies the digits once).
pub fn header_value(n: u64) -> HeaderValue {
    HeaderValue::from_bytes(bytes(n, &mut [0; 20])).expect("digits are a header value")
}

#[cfg(test)]
mod tests {
    #[test]
    fn digits_from_zero_to_the_largest() {
        for n in [
            0,
            7,
            9,
            10,
            42,
            99,
            100,
            101,
            999,
            1000,
            3600,
            12_345,
            65_535,
            u64::MAX,
        ] {
            let mut buf = [0u8; 20];
            assert_eq!(super::digits(n, &mut buf), n.to_string());
            assert_eq!(super::header_value(n), http::HeaderValue::from(n));
        }
    }
}
