//! A persistent on-disk cache of compiled kernels, keyed by a hash of the
//! source and the compile options. Each entry stores its source too and is
//! only used when that matches exactly, so a hash collision costs a
//! recompile, never a wrong kernel.

use crate::CodegenError;
use std::path::{Path, PathBuf};

/// A cache folder.
#[derive(Clone, Debug)]
pub struct Cache {
    dir: PathBuf,
}

/// FNV-1a, 64 bits: stable across Rust versions and machines.
fn fnv(bytes: &[u8], seed: u64) -> u64 {
    bytes.iter().fold(seed, |h, &b| (h ^ b as u64).wrapping_mul(0x100_0000_01b3))
}

impl Cache {
    /// A cache in `dir` (created on first write).
    pub fn new(dir: impl Into<PathBuf>) -> Cache {
        Cache { dir: dir.into() }
    }

    /// `$SMELT_CACHE_DIR`, else `$XDG_CACHE_HOME/smelt/kernels`, else
    /// `~/.cache/smelt/kernels`, else a folder in the temporary directory.
    pub fn default_dir() -> PathBuf {
        if let Some(d) = std::env::var_os("SMELT_CACHE_DIR") {
            return d.into();
        }
        let base = std::env::var_os("XDG_CACHE_HOME")
            .map(PathBuf::from)
            .or_else(|| std::env::var_os("HOME").map(|h| Path::new(&h).join(".cache")));
        base.unwrap_or_else(std::env::temp_dir).join("smelt").join("kernels")
    }

    /// The key of a source compiled with `options`.
    pub fn key(source: &str, options: &[String]) -> String {
        let mut h = fnv(source.as_bytes(), 0xcbf2_9ce4_8422_2325);
        for o in options {
            h = fnv(o.as_bytes(), h ^ 0xff);
        }
        format!("{h:016x}")
    }

    fn paths(&self, key: &str) -> (PathBuf, PathBuf) {
        (self.dir.join(format!("{key}.cu")), self.dir.join(format!("{key}.ptx")))
    }

    /// The cached PTX of `source` under `key`, if present and for exactly this source.
    pub fn get(&self, key: &str, source: &str) -> Option<String> {
        let (cu, ptx) = self.paths(key);
        let stored = std::fs::read_to_string(cu).ok()?;
        (stored == source).then(|| std::fs::read_to_string(ptx).ok()).flatten()
    }

    /// Stores PTX for `source` under `key` (written to a temporary file and
    /// renamed, so a concurrent reader never sees half an entry).
    pub fn put(&self, key: &str, source: &str, ptx: &str) -> Result<(), CodegenError> {
        let err = |path: &Path| {
            let path = path.display().to_string();
            move |error| CodegenError::Cache { path, error }
        };
        std::fs::create_dir_all(&self.dir).map_err(err(&self.dir))?;
        let (cu, out) = self.paths(key);
        for (path, text) in [(&out, ptx), (&cu, source)] {
            let tmp = path.with_extension(format!("tmp{}", std::process::id()));
            std::fs::write(&tmp, text).map_err(err(&tmp))?;
            std::fs::rename(&tmp, path).map_err(err(path))?;
        }
        Ok(())
    }
}
