//! Lower-case hex, both ways: digests and names are written in it, the W3C trace context is
//! read and written in it (on the request path, so both directions go without branches per
//! digit or allocation).

/// The digits, by value.
const DIGITS: &[u8; 16] = b"0123456789abcdef";

/// Each byte's value as a lower-case hex digit; 16 (bit 4 set) for any other byte.
const VALUES: [u8; 256] = {
    let mut t = [16u8; 256];
    let mut i = 0;
    while i < 16 {
        t[DIGITS[i] as usize] = i as u8;
        i += 1;
    }
    t
};

/// Writes `bytes` as hex into `out`, which is twice as long.
pub fn encode_into(bytes: &[u8], out: &mut [u8]) {
    for (b, pair) in bytes.iter().zip(out.chunks_exact_mut(2)) {
        pair[0] = DIGITS[usize::from(b >> 4)];
        pair[1] = DIGITS[usize::from(b & 15)];
    }
}

/// `N` bytes from the system's secure random source, as hex: ids that must not collide
/// across processes and machines (a change, a probe's scratch directory, a lease holder).
///
/// # Panics
/// If the system's random source fails (the process cannot do anything safely then).
pub fn random_id<const N: usize>() -> String {
    let mut id = [0u8; N];
    aws_lc_rs::rand::fill(&mut id).expect("the system's random source");
    encode(&id)
}

/// `bytes` as hex.
pub fn encode(bytes: &[u8]) -> String {
    let mut out = vec![0u8; bytes.len() * 2];
    encode_into(bytes, &mut out);
    String::from_utf8(out).expect("hex digits are ASCII")
}

/// The `N` bytes whose lower-case hex is `text` (`2 * N` digits); `None` for a shorter text or
/// any other character (upper-case digits included, as the W3C trace context requires).
pub fn decode<const N: usize>(text: &[u8]) -> Option<[u8; N]> {
    let text = text.get(..2 * N)?;
    let mut out = [0u8; N];
    // Bit 4 of `bad` is set by any byte that is not a digit.
    let mut bad = 0u8;
    for (o, pair) in out.iter_mut().zip(text.chunks_exact(2)) {
        let (hi, lo) = (VALUES[usize::from(pair[0])], VALUES[usize::from(pair[1])]);
        bad |= hi | lo;
        *o = hi << 4 | (lo & 15);
    }
    (bad & 16 == 0).then_some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hex_round_trips_and_refuses_anything_but_lower_case_digits() {
        let all: Vec<u8> = (0..=255).collect();
        let text = encode(&all);
        assert!(text.starts_with("000102") && text.ends_with("fdfeff"));
        assert_eq!(
            decode::<256>(text.as_bytes()).map(|b| b.to_vec()),
            Some(all)
        );
        assert_eq!(decode::<2>(b"0aF0"), None);
        assert_eq!(decode::<2>(b"0ag0"), None);
        assert_eq!(decode::<2>(b"0a"), None);
        for byte in 0..=255u8 {
            let ok = byte.is_ascii_digit() || (b'a'..=b'f').contains(&byte);
            assert_eq!(decode::<1>(&[b'0', byte]).is_some(), ok, "{byte}");
        }
    }
}
