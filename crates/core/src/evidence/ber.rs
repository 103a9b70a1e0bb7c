//! BER to DER, as far as signed cloud documents need it: PKCS#7 written by
//! a streaming signer (AWS's `rsa2048` form, `openssl cms -stream`) uses
//! indefinite lengths and content split into constructed OCTET STRINGs,
//! which a DER parser refuses. This rewrites both into their DER form and
//! leaves everything else byte for byte, so what a signature covers (the
//! signed attributes, written in DER by every signer) is unchanged.
//!
//! Input is untrusted: nesting and sizes are bounded, and every length is
//! checked against what is left.

/// Deeper than any certificate or SignedData nests.
const MAX_DEPTH: usize = 32;
/// More elements than any constructed element of a cloud's document holds
/// (a certificate's extensions, a set of signed attributes): the DER
/// decoder sorts each SET OF as it reads it, in time quadratic in its
/// length, so a document with a SET of thousands would cost seconds.
const MAX_CHILDREN: usize = 64;

/// `input`, one BER element, as DER.
pub(super) fn to_der(input: &[u8]) -> Result<Vec<u8>, String> {
    let mut out = Vec::with_capacity(input.len());
    let used = element(input, 0, &mut out)?;
    if used != input.len() {
        return Err(format!(
            "{} bytes after the end of the document",
            input.len() - used
        ));
    }
    Ok(out)
}

/// One element at the start of `input` written to `out`; how many bytes of
/// `input` it took.
fn element(input: &[u8], depth: usize, out: &mut Vec<u8>) -> Result<usize, String> {
    if depth > MAX_DEPTH {
        return Err("nested too deeply".into());
    }
    let (tag, tag_len) = tag(input)?;
    let constructed = input[0] & 0x20 != 0;
    let (length, length_len) = length(&input[tag_len..])?;
    let start = tag_len + length_len;
    let mut content = Vec::new();
    let used = match length {
        Some(n) => {
            let end = start
                .checked_add(n)
                .filter(|e| *e <= input.len())
                .ok_or("a length runs past the end")?;
            if constructed {
                let mut at = start;
                let mut children = 0;
                while at < end {
                    children += 1;
                    if children > MAX_CHILDREN {
                        return Err(format!("an element of more than {MAX_CHILDREN} parts"));
                    }
                    at += element(&input[at..end], depth + 1, &mut content)?;
                }
            } else {
                content.extend_from_slice(&input[start..end]);
            }
            end
        }
        None => {
            if !constructed {
                return Err("an indefinite length on a primitive element".into());
            }
            let mut at = start;
            let mut children = 0;
            loop {
                let rest = input.get(at..).ok_or("no end-of-contents")?;
                if rest.starts_with(&[0, 0]) {
                    break at + 2;
                }
                if rest.is_empty() {
                    return Err("no end-of-contents".into());
                }
                children += 1;
                if children > MAX_CHILDREN {
                    return Err(format!("an element of more than {MAX_CHILDREN} parts"));
                }
                at += element(rest, depth + 1, &mut content)?;
            }
        }
    };
    // A constructed OCTET STRING (universal 4) is its parts' contents,
    // joined, in one primitive one.
    if constructed && tag == [0x24] {
        let joined = octet_parts(&content)?;
        write(&[0x04], &joined, out);
    } else {
        write(&input[..tag_len], &content, out);
    }
    Ok(used)
}

/// The contents of the primitive OCTET STRINGs `parts` holds, joined.
fn octet_parts(mut parts: &[u8]) -> Result<Vec<u8>, String> {
    let mut joined = Vec::new();
    while !parts.is_empty() {
        if parts[0] != 0x04 {
            return Err("a constructed OCTET STRING holds something else".into());
        }
        let (n, len_len) = length(&parts[1..])?;
        let n = n.ok_or("an indefinite length inside an OCTET STRING")?;
        let start = 1 + len_len;
        let end = start
            .checked_add(n)
            .filter(|e| *e <= parts.len())
            .ok_or("a length runs past the end")?;
        joined.extend_from_slice(&parts[start..end]);
        parts = &parts[end..];
    }
    Ok(joined)
}

/// The identifier octets at the start of `input`.
fn tag(input: &[u8]) -> Result<(&[u8], usize), String> {
    let first = *input.first().ok_or("an element is cut short")?;
    if first & 0x1f != 0x1f {
        return Ok((&input[..1], 1));
    }
    // High tag numbers: continuation bytes while bit 8 is set.
    let mut n = 1;
    loop {
        let b = *input.get(n).ok_or("a tag is cut short")?;
        n += 1;
        if b & 0x80 == 0 {
            return Ok((&input[..n], n));
        }
        if n > 5 {
            return Err("a tag number too large".into());
        }
    }
}

/// A length (`None`: indefinite) and how many bytes it took.
fn length(input: &[u8]) -> Result<(Option<usize>, usize), String> {
    let first = *input.first().ok_or("a length is cut short")?;
    if first < 0x80 {
        return Ok((Some(usize::from(first)), 1));
    }
    if first == 0x80 {
        return Ok((None, 1));
    }
    let count = usize::from(first & 0x7f);
    if count > 4 {
        return Err("a length of more than four bytes".into());
    }
    let bytes = input.get(1..1 + count).ok_or("a length is cut short")?;
    let n = bytes.iter().fold(0usize, |n, b| (n << 8) | usize::from(*b));
    Ok((Some(n), 1 + count))
}

fn write(tag: &[u8], content: &[u8], out: &mut Vec<u8>) {
    out.extend_from_slice(tag);
    let n = content.len();
    if n < 0x80 {
        out.push(n as u8);
    } else {
        let bytes: Vec<u8> = n
            .to_be_bytes()
            .into_iter()
            .skip_while(|b| *b == 0)
            .collect();
        out.push(0x80 | bytes.len() as u8);
        out.extend_from_slice(&bytes);
    }
    out.extend_from_slice(content);
}

#[cfg(test)]
mod tests {
    use super::to_der;

    #[test]
    fn indefinite_lengths_and_split_octet_strings_become_der() {
        // SEQUENCE (indefinite) { OCTET STRING constructed (indefinite)
        // { "ab", "c" }, INTEGER 5 }
        let ber = [
            0x30, 0x80, 0x24, 0x80, 0x04, 0x02, b'a', b'b', 0x04, 0x01, b'c', 0x00, 0x00, 0x02,
            0x01, 0x05, 0x00, 0x00,
        ];
        assert_eq!(
            to_der(&ber).unwrap(),
            [0x30, 0x08, 0x04, 0x03, b'a', b'b', b'c', 0x02, 0x01, 0x05]
        );
    }

    #[test]
    fn der_is_left_as_it_is() {
        let der = [0x30, 0x06, 0xa0, 0x04, 0x02, 0x02, 0x01, 0x00];
        assert_eq!(to_der(&der).unwrap(), der);
        // A long form length stays correct.
        let mut long = vec![0x04, 0x81, 0x90];
        long.extend([7u8; 0x90]);
        assert_eq!(to_der(&long).unwrap(), long);
    }

    #[test]
    fn malformed_input_is_an_error_not_a_panic() {
        for bad in [
            &[][..],
            &[0x30],
            &[0x30, 0x05, 0x02],
            &[0x30, 0x80, 0x02, 0x01, 0x05],
            &[0x04, 0x80, 0x00, 0x00],
            &[0x30, 0x85, 1, 1, 1, 1, 1],
            &[0x30, 0x00, 0x00],
            &[0x24, 0x03, 0x02, 0x01, 0x00],
        ] {
            assert!(to_der(bad).is_err(), "{bad:?}");
        }
        let deep: Vec<u8> = std::iter::repeat_n([0x30u8, 0x80], 40).flatten().collect();
        assert!(to_der(&deep).is_err());
    }

    #[test]
    fn a_set_of_thousands_is_refused_before_anything_sorts_it() {
        // A SET OF 15,000 INTEGERs in descending order: the shape that
        // makes sorting it quadratic.
        let mut items = Vec::new();
        for i in (0..15_000u16).rev() {
            items.extend([0x02, 0x02]);
            items.extend(i.to_be_bytes());
        }
        let mut set = vec![0x31, 0x83];
        set.extend((items.len() as u32).to_be_bytes()[1..].iter());
        set.extend(&items);
        let started = std::time::Instant::now();
        let e = to_der(&set).unwrap_err();
        assert!(e.contains("more than 64 parts"), "{e}");
        assert!(started.elapsed() < std::time::Duration::from_secs(1));
        // Indefinite length too.
        let mut set = vec![0x31, 0x80];
        set.extend(&items);
        set.extend([0, 0]);
        assert!(to_der(&set).unwrap_err().contains("more than 64 parts"));
    }
}
