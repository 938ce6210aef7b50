//! Inputs the fuzz targets (`fuzz/`, `scripts/fuzz.sh`) found failing, kept as tests so
//! the fix stays fixed. Each builds its input by hand and names what it once did.

use std::path::Path;

use treegrpo::model::gguf_file::read_content_from_bytes;
use treegrpo::model::ModelError;

/// A GGUF v3 header with no metadata and one tensor of `dims` and ggml type `tag`.
fn header_with_tensor(dims: &[u64], tag: u32) -> Vec<u8> {
    let mut b = Vec::new();
    b.extend_from_slice(b"GGUF");
    b.extend_from_slice(&3u32.to_le_bytes());
    b.extend_from_slice(&1u64.to_le_bytes()); // tensors
    b.extend_from_slice(&0u64.to_le_bytes()); // metadata entries
    let name = b"w";
    b.extend_from_slice(&(name.len() as u64).to_le_bytes());
    b.extend_from_slice(name);
    b.extend_from_slice(&(dims.len() as u32).to_le_bytes());
    for d in dims {
        b.extend_from_slice(&d.to_le_bytes());
    }
    b.extend_from_slice(&tag.to_le_bytes());
    b.extend_from_slice(&0u64.to_le_bytes()); // offset
    b
}

/// `gguf_header`: a tensor of 2^32 × (2^32 − 32) Q8_0 elements has about 2^59
/// blocks of 34 bytes, a byte count past u64 (the element count itself fits). The size was multiplied unchecked: it panicked with overflow checks
/// on, and without them wrapped to a small number that passed the file-size check.
#[test]
fn a_tensor_whose_byte_size_overflows_is_a_corrupt_file() {
    let bytes = header_with_tensor(&[1 << 32, (1 << 32) - 32], 8);
    let err = read_content_from_bytes(&bytes, Path::new("crafted.gguf")).unwrap_err();
    match err {
        ModelError::CorruptGguf { msg, .. } => assert!(msg.contains("size overflow"), "{msg}"),
        other => panic!("expected a corrupt-file error, got {other}"),
    }
    // The same tensor at a size that fits is reported as truncated, not as overflow.
    let small = header_with_tensor(&[32, 4], 8);
    let err = read_content_from_bytes(&small, Path::new("small.gguf")).unwrap_err();
    assert!(err.to_string().contains("truncated"), "{err}");
}
