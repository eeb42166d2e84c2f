//! Hand-made model files for the packer's tests (the library crate's and the
//! tool's): headers written byte by byte, the data a hole.

use std::path::Path;

/// A safetensors file of `n` F32 `[1]` tensors named `t.{i}`, none an
/// expert, 4 bytes each, the data a hole.
pub fn write_many_tensor_safetensors(path: &Path, n: usize) {
    let mut header = String::from("{");
    for i in 0..n {
        if i > 0 {
            header.push(',');
        }
        header.push_str(&format!(
            "\"t.{i}\":{{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[{},{}]}}",
            4 * i,
            4 * i + 4
        ));
    }
    header.push('}');
    let mut b = (header.len() as u64).to_le_bytes().to_vec();
    b.extend_from_slice(header.as_bytes());
    std::fs::write(path, &b).unwrap();
    let f = std::fs::OpenOptions::new().write(true).open(path).unwrap();
    f.set_len(b.len() as u64 + 4 * n as u64).unwrap();
}
