//! Compiling CUDA C to PTX with NVRTC (through cudarc, loaded at run time:
//! no CUDA toolkit at build time, no GPU needed to compile).

use crate::{Cache, CodegenError};

/// The default target: PTX for compute capability 8.0, which the driver
/// JIT-compiles for any newer GPU (Ampere, Hopper).
pub const DEFAULT_ARCH: &str = "compute_80";

/// Compiles kernels, with an optional cache.
#[derive(Clone, Debug)]
pub struct Compiler {
    /// The `--gpu-architecture` target.
    pub arch: String,
    /// Folders searched for headers (`cuda_fp16.h`).
    pub include_paths: Vec<String>,
    /// The cache, if any.
    pub cache: Option<Cache>,
}

/// A compiled kernel.
#[derive(Clone, Debug)]
pub struct Compiled {
    /// Its PTX.
    pub ptx: String,
    /// Whether it came from the cache.
    pub cached: bool,
}

impl Default for Compiler {
    fn default() -> Self {
        let include_paths = std::env::var("SMELT_CUDA_INCLUDE")
            .map(|p| std::env::split_paths(&p).map(|p| p.display().to_string()).collect())
            .unwrap_or_default();
        Compiler { arch: DEFAULT_ARCH.to_string(), include_paths, cache: Some(Cache::new(Cache::default_dir())) }
    }
}

impl Compiler {
    fn options(&self) -> Vec<String> {
        let mut o = vec![format!("--gpu-architecture={}", self.arch), "--std=c++17".to_string()];
        o.extend(self.include_paths.iter().map(|p| format!("--include-path={p}")));
        o
    }

    /// Compiles `source` (whose kernels are named after `name`) to PTX.
    pub fn compile(&self, name: &str, source: &str) -> Result<Compiled, CodegenError> {
        let options = self.options();
        // Header folders differ between machines but not the PTX: leave
        // them out of the key, so a cache filled here serves a GPU machine.
        let keyed: Vec<String> = options.iter().filter(|o| !o.starts_with("--include-path=")).cloned().collect();
        let key = Cache::key(source, &keyed);
        if let Some(ptx) = self.cache.as_ref().and_then(|c| c.get(&key, source)) {
            return Ok(Compiled { ptx, cached: true });
        }
        if !crate::nvrtc_available() {
            return Err(CodegenError::NvrtcUnavailable);
        }
        if source.contains('\0') {
            return Err(CodegenError::Nvrtc { kernel: name.into(), msg: "the source contains a NUL byte".into() });
        }
        let opts = cudarc::nvrtc::CompileOptions { options: options.clone(), name: Some(format!("{name}.cu")), ..Default::default() };
        let ptx = match cudarc::nvrtc::compile_ptx_with_opts(source, opts) {
            Ok(p) => p.to_src(),
            Err(cudarc::nvrtc::CompileError::CompileError { log, .. }) => {
                let log = log.to_string_lossy().into_owned();
                return Err(CodegenError::Compile { kernel: name.into(), line: offending_line(&log, name, source), log });
            }
            Err(e) => return Err(CodegenError::Nvrtc { kernel: name.into(), msg: format!("{e:?}") }),
        };
        if let Some(c) = &self.cache {
            c.put(&key, source, &ptx)?;
        }
        Ok(Compiled { ptx, cached: false })
    }
}

/// The first `name.cu(LINE)` the log mentions, with that line of `source`.
fn offending_line(log: &str, name: &str, source: &str) -> Option<(usize, String)> {
    let tag = format!("{name}.cu(");
    let at = log.find(&tag)? + tag.len();
    let n: usize = log[at..].split(')').next()?.parse().ok()?;
    Some((n, source.lines().nth(n.checked_sub(1)?)?.trim().to_string()))
}

#[cfg(test)]
mod tests {
    #[test]
    fn offending_line_is_found_in_the_log() {
        let log = "k.cu(3): error: identifier \"y\" is undefined\n\n1 error detected";
        assert_eq!(super::offending_line(log, "k", "a\nb\n  x = y;\n"), Some((3, "x = y;".to_string())));
        assert_eq!(super::offending_line("nothing", "k", "a"), None);
    }
}
