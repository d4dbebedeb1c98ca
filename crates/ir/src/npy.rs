//! NumPy's `.npz` archives: a zip of `.npy` files, one array each (what
//! `numpy.savez` and `numpy.savez_compressed` write). `smelt train` reads
//! its data from them and writes its checkpoints as them, so numpy reads a
//! checkpoint with `numpy.load`.
//!
//! Only what is unambiguous is read: little-endian (or byte-sized) `f4`,
//! `f8` (converted to f32), `f2`, `i8`, `i4`, `u1`/`b1`, C order. Anything
//! else is an error naming the array, never a guess. Sizes are checked
//! against the header, and memory grows only as the bytes arrive; every zip
//! entry's CRC-32 is checked.

use crate::{DType, IrError, Tensor, TensorData, MAX_TENSOR_BYTES};
use std::io::{Read, Seek, Write};
use std::path::Path;

/// The arrays of an `.npz` file, in archive order, `.npy` stripped from
/// their names.
pub fn read_npz(path: &Path) -> Result<Vec<(String, Tensor)>, IrError> {
    let file = std::fs::File::open(path).map_err(|error| IrError::Io { path: path.display().to_string(), error })?;
    read_npz_from(std::io::BufReader::new(file)).map_err(|e| match e {
        IrError::Array(m) => IrError::Array(format!("{}: {m}", path.display())),
        e => e,
    })
}

/// As [`read_npz`], from any seekable reader.
pub fn read_npz_from<R: Read + Seek>(reader: R) -> Result<Vec<(String, Tensor)>, IrError> {
    let bad = |m: String| IrError::Array(format!("not a NumPy .npz archive: {m}"));
    let mut zip = zip::ZipArchive::new(reader).map_err(|e| bad(e.to_string()))?;
    let mut out = Vec::with_capacity(zip.len());
    for i in 0..zip.len() {
        let mut f = zip.by_index(i).map_err(|e| bad(e.to_string()))?;
        if f.is_dir() {
            continue;
        }
        let full = f.name().map_err(|e| bad(e.to_string()))?.to_string();
        let name = full.strip_suffix(".npy").unwrap_or(&full).to_string();
        let declared = f.size();
        let t = parse_npy(&mut f, declared).map_err(|m| IrError::Array(format!("array {name:?}: {m}")))?;
        // Reading to the entry's end is what checks its CRC-32.
        let mut rest = [0u8; 1];
        match f.read(&mut rest) {
            Ok(0) => {}
            Ok(_) => return Err(IrError::Array(format!("array {name:?}: bytes after the array"))),
            Err(e) => return Err(IrError::Array(format!("array {name:?}: {e} (the archive is damaged)"))),
        }
        out.push((name, t));
    }
    Ok(out)
}

/// The array of a `.npy` file (as `numpy.save` writes it).
pub fn read_npy(path: &Path) -> Result<Tensor, IrError> {
    let bytes = std::fs::read(path).map_err(|error| IrError::Io { path: path.display().to_string(), error })?;
    parse_npy(&mut bytes.as_slice(), bytes.len() as u64).map_err(|m| IrError::Array(format!("{}: {m}", path.display())))
}

/// One `.npy` stream of `declared` bytes (the zip entry's size).
fn parse_npy(r: &mut impl Read, declared: u64) -> Result<Tensor, String> {
    let mut magic = [0u8; 8];
    r.read_exact(&mut magic).map_err(|e| format!("no .npy header: {e}"))?;
    if &magic[..6] != b"\x93NUMPY" {
        return Err("not a .npy array (no \\x93NUMPY magic)".into());
    }
    let header_len = match magic[6] {
        1 => {
            let mut b = [0u8; 2];
            r.read_exact(&mut b).map_err(|e| e.to_string())?;
            u16::from_le_bytes(b) as usize
        }
        2 | 3 => {
            let mut b = [0u8; 4];
            r.read_exact(&mut b).map_err(|e| e.to_string())?;
            u32::from_le_bytes(b) as usize
        }
        v => return Err(format!(".npy format version {v} is not known")),
    };
    if header_len > 1 << 20 {
        return Err(format!("a header of {header_len} bytes"));
    }
    let mut header = vec![0u8; header_len];
    r.read_exact(&mut header).map_err(|e| format!("truncated header: {e}"))?;
    let header = String::from_utf8_lossy(&header);
    let descr = field(&header, "descr").ok_or("the header has no 'descr'")?;
    let descr = descr.trim().trim_matches(|c| c == '\'' || c == '"');
    if field(&header, "fortran_order").is_some_and(|v| v.trim() == "True") {
        return Err("stored in Fortran order: save it C-contiguous (numpy.ascontiguousarray)".into());
    }
    let shape_text = field(&header, "shape").ok_or("the header has no 'shape'")?;
    let shape: Vec<usize> = shape_text
        .trim()
        .trim_start_matches('(')
        .trim_end_matches(')')
        .split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(|s| s.trim_end_matches('L').parse::<usize>().map_err(|_| format!("shape {shape_text} is not a tuple of sizes")))
        .collect::<Result<_, _>>()?;
    let (kind, size) = match descr {
        "<f4" => ("f32", 4),
        "<f8" => ("f64", 8),
        "<f2" => ("f16", 2),
        "<i8" => ("i64", 8),
        "<i4" => ("i32", 4),
        "|u1" => ("u8", 1),
        "|b1" => ("bool", 1),
        d => {
            return Err(format!("dtype {d:?} is not supported: give float32, float64, float16, int64, int32, uint8 or bool, little-endian"))
        }
    };
    let numel = shape.iter().try_fold(1usize, |n, &d| n.checked_mul(d)).ok_or_else(|| format!("shape {shape:?} overflows"))?;
    let bytes =
        numel.checked_mul(size).filter(|&b| b as u128 <= MAX_TENSOR_BYTES).ok_or_else(|| format!("shape {shape:?} is too large"))?;
    let header_total = 8 + if magic[6] == 1 { 2 } else { 4 } + header_len;
    if declared != (header_total + bytes) as u64 {
        return Err(format!(
            "shape {shape:?} of {descr} needs {bytes} bytes but the entry holds {}",
            declared as i128 - header_total as i128
        ));
    }
    // Grown as the bytes arrive, never from the declared size alone: an
    // entry that claims a terabyte and holds a kilobyte fails at its end.
    let mut raw = Vec::new();
    let got = r.take(bytes as u64).read_to_end(&mut raw).map_err(|e| format!("{e} (the archive is damaged)"))?;
    if got != bytes {
        return Err(format!("truncated data: shape {shape:?} of {descr} needs {bytes} bytes, the entry holds {got}"));
    }
    let data = match kind {
        "f32" => TensorData::F32(raw.chunks_exact(4).map(|c| f32::from_le_bytes(c.try_into().expect("4 bytes"))).collect()),
        "f64" => TensorData::F32(raw.chunks_exact(8).map(|c| f64::from_le_bytes(c.try_into().expect("8 bytes")) as f32).collect()),
        "f16" => TensorData::F16(raw.chunks_exact(2).map(|c| half::f16::from_le_bytes([c[0], c[1]])).collect()),
        "i64" => TensorData::I64(raw.chunks_exact(8).map(|c| i64::from_le_bytes(c.try_into().expect("8 bytes"))).collect()),
        "i32" => TensorData::I32(raw.chunks_exact(4).map(|c| i32::from_le_bytes(c.try_into().expect("4 bytes"))).collect()),
        "u8" => TensorData::U8(raw),
        _ => TensorData::Bool(raw.iter().map(|&b| b != 0).collect()),
    };
    Ok(Tensor::new(shape, data).expect("element count checked"))
}

/// The text after `'key':` in a header dict, up to the next top-level comma.
fn field<'a>(header: &'a str, key: &str) -> Option<&'a str> {
    let at = header.find(&format!("'{key}'")).or_else(|| header.find(&format!("\"{key}\"")))?;
    let rest = &header[at + key.len() + 2..];
    let rest = rest.trim_start().strip_prefix(':')?;
    let mut depth = 0i32;
    for (i, c) in rest.char_indices() {
        match c {
            '(' | '[' => depth += 1,
            ')' | ']' => depth -= 1,
            ',' | '}' if depth == 0 => return Some(&rest[..i]),
            _ => {}
        }
    }
    Some(rest)
}

/// The `.npy` bytes of `t` (version 1, C order; bf16 stored as f32, which
/// NumPy has no dtype for).
pub fn npy_bytes(t: &Tensor) -> Vec<u8> {
    let (descr, data) = match t.data() {
        TensorData::F32(_) => ("<f4", t.data().to_le_bytes()),
        TensorData::BF16(_) => ("<f4", t.cast(DType::F32).data().to_le_bytes()),
        TensorData::F16(_) => ("<f2", t.data().to_le_bytes()),
        TensorData::I64(_) => ("<i8", t.data().to_le_bytes()),
        TensorData::I32(_) => ("<i4", t.data().to_le_bytes()),
        TensorData::Bool(_) => ("|b1", t.data().to_le_bytes()),
        TensorData::I8(_) => ("|i1", t.data().to_le_bytes()),
        TensorData::U8(_) => ("|u1", t.data().to_le_bytes()),
        TensorData::I16(_) => ("<i2", t.data().to_le_bytes()),
        TensorData::U16(_) => ("<u2", t.data().to_le_bytes()),
        TensorData::U32(_) => ("<u4", t.data().to_le_bytes()),
    };
    let shape = match t.shape() {
        [] => "()".to_string(),
        [d] => format!("({d},)"),
        s => format!("({})", s.iter().map(|d| d.to_string()).collect::<Vec<_>>().join(", ")),
    };
    let mut header = format!("{{'descr': '{descr}', 'fortran_order': False, 'shape': {shape}, }}");
    // Data aligned to 64 bytes, header ended by a newline.
    while (10 + header.len() + 1) % 64 != 0 {
        header.push(' ');
    }
    header.push('\n');
    let mut out = Vec::with_capacity(10 + header.len() + data.len());
    out.extend_from_slice(b"\x93NUMPY\x01\x00");
    out.extend_from_slice(&(header.len() as u16).to_le_bytes());
    out.extend_from_slice(header.as_bytes());
    out.extend_from_slice(&data);
    out
}

/// Writes `arrays` as an uncompressed `.npz` (as `numpy.savez`), through a
/// temporary file synced to the disk and renamed into place, so a reader
/// never sees half a file.
pub fn write_npz(path: &Path, arrays: &[(String, Tensor)]) -> Result<(), IrError> {
    let io = |error: std::io::Error| IrError::Io { path: path.display().to_string(), error };
    let tmp = path.with_extension("npz.tmp");
    let file = std::fs::File::create(&tmp).map_err(io)?;
    let mut zip = zip::ZipWriter::new(std::io::BufWriter::new(file));
    let opts = zip::write::SimpleFileOptions::default().compression_method(zip::CompressionMethod::Stored).large_file(true);
    for (name, t) in arrays {
        zip.start_file(format!("{name}.npy"), opts).map_err(|e| io(std::io::Error::other(e)))?;
        zip.write_all(&npy_bytes(t)).map_err(io)?;
    }
    let w = zip.finish().map_err(|e| io(std::io::Error::other(e)))?;
    let file = w.into_inner().map_err(|e| io(e.into_error()))?;
    file.sync_all().map_err(io)?;
    drop(file);
    std::fs::rename(&tmp, path).map_err(io)
}

/// An uncompressed `.npz` of raw entries (names as given, bytes as they
/// are, each with its right CRC-32), in memory: for tests and the fuzzer,
/// which build archives whose `.npy` headers lie. Names the zip format
/// refuses (twice the same) are refused.
pub fn zip_entries(entries: &[(String, Vec<u8>)]) -> Result<Vec<u8>, String> {
    let mut zip = zip::ZipWriter::new(std::io::Cursor::new(Vec::new()));
    let opts = zip::write::SimpleFileOptions::default().compression_method(zip::CompressionMethod::Stored).large_file(true);
    for (name, bytes) in entries {
        zip.start_file(name.as_str(), opts).map_err(|e| e.to_string())?;
        zip.write_all(bytes).map_err(|e| e.to_string())?;
    }
    Ok(zip.finish().map_err(|e| e.to_string())?.into_inner())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A header and an entry that both declare a terabyte, over a
    /// kilobyte: refused when the bytes run out, nothing allocated up front.
    #[test]
    fn a_declared_size_is_not_trusted() {
        let mut header = "{'descr': '<f4', 'fortran_order': False, 'shape': (274877906944,), }".to_string();
        while !(10 + header.len() + 1).is_multiple_of(64) {
            header.push(' ');
        }
        header.push('\n');
        let mut bytes = b"\x93NUMPY\x01\x00".to_vec();
        bytes.extend_from_slice(&(header.len() as u16).to_le_bytes());
        bytes.extend_from_slice(header.as_bytes());
        let declared = (bytes.len() + (1 << 40)) as u64;
        bytes.extend_from_slice(&[0u8; 1024]);
        let e = parse_npy(&mut bytes.as_slice(), declared).unwrap_err();
        assert!(e.contains("truncated data") && e.contains("the entry holds 1024"), "{e}");
    }

    /// One flipped bit in an array's data: the zip entry's CRC-32 says so.
    #[test]
    fn a_flipped_bit_is_found() {
        let dir = std::env::temp_dir().join(format!("smelt-npz-crc-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("a.npz");
        write_npz(&path, &[("y".into(), Tensor::from_i64(vec![64], (0..64).collect()))]).unwrap();
        let mut bytes = std::fs::read(&path).unwrap();
        let at = bytes.windows(8).position(|w| w == 5i64.to_le_bytes()).unwrap();
        bytes[at] ^= 1;
        std::fs::write(&path, &bytes).unwrap();
        let e = read_npz(&path).unwrap_err().to_string();
        assert!(e.contains("array \"y\"") && e.contains("the archive is damaged"), "{e}");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn round_trip() {
        let dir = std::env::temp_dir().join(format!("smelt-npz-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("a.npz");
        let arrays = vec![
            ("x".to_string(), Tensor::from_f32(vec![2, 3], vec![1.0, -2.0, 3.5, 0.0, 5.0, 6.0])),
            ("y".to_string(), Tensor::from_i64(vec![2], vec![0, 7])),
            ("step".to_string(), Tensor::from_f32(vec![], vec![4.0])),
        ];
        write_npz(&path, &arrays).unwrap();
        assert_eq!(read_npz(&path).unwrap(), arrays);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn refuses_what_it_cannot_read() {
        let mut npy = npy_bytes(&Tensor::from_f32(vec![2], vec![1.0, 2.0]));
        let at = npy.windows(3).position(|w| w == b"<f4").unwrap();
        npy[at] = b'>';
        let n = npy.len() as u64;
        let e = parse_npy(&mut npy.as_slice(), n).unwrap_err();
        assert!(e.contains("\">f4\" is not supported"), "{e}");
        // A header claiming more data than the entry holds: no allocation.
        let npy = npy_bytes(&Tensor::from_f32(vec![2], vec![1.0, 2.0]));
        let e = parse_npy(&mut npy.as_slice(), n - 4).unwrap_err();
        assert!(e.contains("needs 8 bytes but the entry holds 4"), "{e}");
    }
}
