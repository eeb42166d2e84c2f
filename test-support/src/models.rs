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

/// A tensor of a GGUF file [`write_gguf`] writes.
#[derive(Clone, Debug)]
pub struct GgufTensor {
    /// Its name.
    pub name: String,
    /// Its dimensions, `ne[0]` (innermost) first, as GGUF stores them.
    pub ne: Vec<u64>,
    /// Its GGML type: 0 F32, 8 Q8_0, 12 Q4_K.
    pub ggml_type: u32,
    /// Its data bytes.
    pub bytes: u64,
}

impl GgufTensor {
    /// A tensor of `ne` elements of `ggml_type`, sized by the type's block:
    /// F32 4 bytes an element, Q8_0 34 bytes for 32, Q4_K 144 for 256.
    pub fn new(name: impl Into<String>, ne: &[u64], ggml_type: u32) -> GgufTensor {
        let n: u64 = ne.iter().product();
        let bytes = match ggml_type {
            0 => n * 4,
            8 => n / 32 * 34,
            12 => n / 256 * 144,
            t => panic!("GGML type {t} is not one this writer sizes"),
        };
        GgufTensor {
            name: name.into(),
            ne: ne.to_vec(),
            ggml_type,
            bytes,
        }
    }
}

/// What fills a GGUF file's data section.
#[derive(Clone, Copy, Debug)]
pub enum GgufData {
    /// A hole (`set_len`): nothing written, for tests of headers alone.
    Hole,
    /// Bytes of an xorshift64* generator from this seed: random enough
    /// that no layer of storage compresses them.
    Random(u64),
}

/// Writes a GGUF v3 file: `general.architecture` = `arch`, the `u32`
/// key/values `kvs`, the `tensors` (32-byte aligned, in order), the data as
/// `data` says. Returns the data section's offset in the file. The header
/// is written byte by byte here, not by smoe's code.
pub fn write_gguf(
    path: &Path,
    arch: &str,
    kvs: &[(&str, u32)],
    tensors: &[GgufTensor],
    data: GgufData,
) -> u64 {
    use std::io::{BufWriter, Seek, Write};
    let mut w = BufWriter::with_capacity(8 << 20, std::fs::File::create(path).unwrap());
    let string = |w: &mut BufWriter<std::fs::File>, s: &str| {
        w.write_all(&(s.len() as u64).to_le_bytes()).unwrap();
        w.write_all(s.as_bytes()).unwrap();
    };
    w.write_all(b"GGUF").unwrap();
    w.write_all(&3u32.to_le_bytes()).unwrap();
    w.write_all(&(tensors.len() as u64).to_le_bytes()).unwrap();
    w.write_all(&(kvs.len() as u64 + 1).to_le_bytes()).unwrap();
    string(&mut w, "general.architecture");
    w.write_all(&8u32.to_le_bytes()).unwrap(); // GGUF_TYPE_STRING
    string(&mut w, arch);
    for (k, v) in kvs {
        string(&mut w, k);
        w.write_all(&4u32.to_le_bytes()).unwrap(); // GGUF_TYPE_UINT32
        w.write_all(&v.to_le_bytes()).unwrap();
    }
    let mut offset = 0u64;
    for t in tensors {
        string(&mut w, &t.name);
        w.write_all(&(t.ne.len() as u32).to_le_bytes()).unwrap();
        for d in &t.ne {
            w.write_all(&d.to_le_bytes()).unwrap();
        }
        w.write_all(&t.ggml_type.to_le_bytes()).unwrap();
        w.write_all(&offset.to_le_bytes()).unwrap();
        offset += t.bytes.next_multiple_of(32);
    }
    let header = w.stream_position().unwrap();
    let data_at = header.next_multiple_of(32);
    w.write_all(&vec![0u8; (data_at - header) as usize])
        .unwrap();
    match data {
        GgufData::Hole => {
            let file = w.into_inner().unwrap();
            file.set_len(data_at + offset).unwrap();
        }
        GgufData::Random(seed) => {
            let mut x = seed | 1;
            let mut block = vec![0u8; 1 << 20];
            let mut left = offset;
            while left > 0 {
                for c in block.chunks_exact_mut(8) {
                    x ^= x >> 12;
                    x ^= x << 25;
                    x ^= x >> 27;
                    c.copy_from_slice(&x.wrapping_mul(0x2545_F491_4F6C_DD1D).to_le_bytes());
                }
                let n = left.min(block.len() as u64) as usize;
                w.write_all(&block[..n]).unwrap();
                left -= n as u64;
            }
            w.flush().unwrap();
        }
    }
    data_at
}
