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
            .map(|p| with_nvcc_headers(std::env::split_paths(&p).map(|p| p.display().to_string()).collect()))
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
        // bf16 fragments of `wmma` exist from compute_80 (A100) on.
        let arch: usize = self.arch.trim_start_matches("compute_").trim_start_matches("sm_").parse().unwrap_or(usize::MAX);
        if arch < 80 && source.contains("#include <mma.h>") && source.contains("__nv_bfloat16, wmma::") {
            return Err(CodegenError::Unsupported {
                node: name.into(),
                op: "bf16 on tensor cores".into(),
                detail: format!("{} has no bf16 tensor cores: use --arch compute_80 or newer, or --precision mixed-f16", self.arch),
            });
        }
        // So do TF32 fragments.
        if arch < 80 && source.contains("wmma::precision::tf32") {
            return Err(CodegenError::Unsupported {
                node: name.into(),
                op: "TF32 on tensor cores".into(),
                detail: format!("{} has no TF32 tensor cores: use --arch compute_80 or newer, or --tf32 off", self.arch),
            });
        }
        let options = self.options();
        // Header folders differ between machines but not the PTX: leave
        // them out of the key, so a cache filled here serves a GPU machine.
        let keyed: Vec<String> = options.iter().filter(|o| !o.starts_with("--include-path=")).cloned().collect();
        let key = Cache::key(source, &keyed);
        // PTX made by a newer NVRTC than the one loaded is compiled again
        // (a newer NVRTC's PTX does not load on an older driver, and an
        // older NVRTC is loaded to match one); with no NVRTC at all, the
        // cached PTX is all there is.
        let nvrtc = crate::nvrtc_version();
        if let Some(ptx) = self.cache.as_ref().and_then(|c| c.get(&key, source)) {
            let made_by = crate::ptx_release(&ptx);
            if nvrtc.is_none() || made_by.is_some_and(|m| Some(m) <= nvrtc) {
                return Ok(Compiled { ptx, cached: true });
            }
        }
        if !crate::nvrtc_available() {
            return Err(CodegenError::NvrtcUnavailable);
        }
        // The tensor-core kernels' `mma.h` includes `crt/mma.h`, which the
        // runtime wheel lacks: say which wheel has it.
        if source.contains("#include <mma.h>") && !self.include_paths.iter().any(|p| std::path::Path::new(p).join("crt/mma.h").is_file()) {
            return Err(CodegenError::MissingHeader {
                kernel: name.into(),
                header: "crt/mma.h".into(),
                hint: "the tensor-core kernels need it: install the PyPI wheel nvidia-cuda-nvcc-cu12 and add its include folder to SMELT_CUDA_INCLUDE".into(),
            });
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

/// `paths`, and beside a PyPI runtime wheel's include folder
/// (`nvidia/cuda_runtime/include`), the nvcc wheel's (`nvidia/cuda_nvcc/include`,
/// which holds `crt/mma.h`) when it is installed and not already listed.
fn with_nvcc_headers(mut paths: Vec<String>) -> Vec<String> {
    let has_crt = |p: &str| std::path::Path::new(p).join("crt/mma.h").is_file();
    if paths.iter().any(|p| has_crt(p)) {
        return paths;
    }
    let extra: Vec<String> = paths
        .iter()
        .map(std::path::Path::new)
        .filter(|p| p.ends_with("cuda_runtime/include"))
        .filter_map(|p| Some(p.parent()?.parent()?.join("cuda_nvcc/include").to_str()?.to_string()))
        .filter(|p| has_crt(p))
        .collect();
    paths.extend(extra);
    paths
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
    fn ptx_release_is_read_from_the_header() {
        let ptx = "//\n// Generated by NVIDIA NVVM Compiler\n//\n// Compiler Build ID: CL-36037853\n// Cuda compilation tools, release 12.9, V12.9.86\n// Based on NVVM 7.0.1\n//\n\n.version 8.8\n";
        assert_eq!(crate::ptx_release(ptx), Some((12, 9)));
        assert_eq!(crate::ptx_release(".version 8.8\n"), None);
    }

    #[test]
    fn offending_line_is_found_in_the_log() {
        let log = "k.cu(3): error: identifier \"y\" is undefined\n\n1 error detected";
        assert_eq!(super::offending_line(log, "k", "a\nb\n  x = y;\n"), Some((3, "x = y;".to_string())));
        assert_eq!(super::offending_line("nothing", "k", "a"), None);
    }
}
