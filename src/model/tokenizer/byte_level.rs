//! GPT-2's byte-level alphabet: every byte maps to a printable character, so BPE can
//! work on strings while any byte sequence stays representable.

use std::sync::OnceLock;

/// `byte -> char` table (the inverse is [`char_to_byte`]).
pub fn byte_to_char() -> &'static [char; 256] {
    static TABLE: OnceLock<[char; 256]> = OnceLock::new();
    TABLE.get_or_init(|| {
        let mut table = ['\0'; 256];
        let mut next = 0u32;
        for b in 0..=255u8 {
            // Printable Latin-1 bytes stand for themselves; the rest are shifted past 255.
            let printable = (b'!'..=b'~').contains(&b)
                || (0xA1..=0xAC).contains(&b)
                || (0xAE..=0xFF).contains(&b);
            table[b as usize] = if printable {
                b as char
            } else {
                let c = char::from_u32(256 + next).unwrap_or('\u{FFFD}');
                next += 1;
                c
            };
        }
        table
    })
}

/// Maps a byte-level character back to its byte; `None` for characters outside the
/// alphabet (which appear only in special tokens' text).
pub fn char_to_byte(c: char) -> Option<u8> {
    let table = byte_to_char();
    let code = c as u32;
    if code < 256 && table[code as usize] == c {
        return Some(code as u8);
    }
    if (256..512).contains(&code) {
        return table.iter().position(|&t| t == c).map(|b| b as u8);
    }
    None
}

/// Encodes raw text into the byte-level alphabet.
pub fn encode_bytes(text: &str) -> String {
    let table = byte_to_char();
    text.bytes().map(|b| table[b as usize]).collect()
}
