//! Resource usage of compiled kernels from `ptxas -v` (the PyPI wheel
//! `nvidia-cuda-nvcc-cu12` ships it): registers, spills, shared memory.

use crate::CodegenError;
use std::path::PathBuf;

/// The default `ptxas` target.
pub const DEFAULT_SM: &str = "sm_90";

/// What `ptxas -v` says about one kernel.
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct Stats {
    /// The kernel.
    pub kernel: String,
    /// Registers per thread.
    pub registers: usize,
    /// Bytes of spill stores.
    pub spill_stores: usize,
    /// Bytes of spill loads.
    pub spill_loads: usize,
    /// Bytes of static shared memory.
    pub shared: usize,
    /// Bytes of stack frame.
    pub stack: usize,
}

/// The `ptxas` to run: `$SMELT_PTXAS`, else `ptxas` found on `PATH`.
pub fn find() -> Option<PathBuf> {
    if let Some(p) = std::env::var_os("SMELT_PTXAS") {
        return Some(p.into());
    }
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path).map(|d| d.join("ptxas")).find(|p| p.is_file())
}

/// Assembles `ptx` for `sm` and parses the statistics of each kernel in it.
pub fn stats(ptxas: &std::path::Path, ptx: &str, sm: &str) -> Result<Vec<Stats>, CodegenError> {
    let dir = std::env::temp_dir().join(format!("smelt-ptxas-{}-{:?}", std::process::id(), std::thread::current().id()));
    let io = |path: &std::path::Path| {
        let path = path.display().to_string();
        move |error| CodegenError::Io { path, error }
    };
    std::fs::create_dir_all(&dir).map_err(io(&dir))?;
    let input = dir.join("k.ptx");
    std::fs::write(&input, ptx).map_err(io(&input))?;
    let out = std::process::Command::new(ptxas)
        .arg(format!("-arch={sm}"))
        .arg("-v")
        .arg(&input)
        .arg("-o")
        .arg(dir.join("k.cubin"))
        .output()
        .map_err(|e| CodegenError::Ptxas(format!("cannot run {}: {e}", ptxas.display())))?;
    let _ = std::fs::remove_dir_all(&dir);
    let log = String::from_utf8_lossy(&out.stderr).into_owned() + &String::from_utf8_lossy(&out.stdout);
    if !out.status.success() {
        return Err(CodegenError::Ptxas(log));
    }
    Ok(parse(&log))
}

/// Parses `ptxas -v` output.
pub fn parse(log: &str) -> Vec<Stats> {
    let mut all: Vec<Stats> = Vec::new();
    let num_before = |line: &str, unit: &str| -> usize {
        line.split(',')
            .find_map(|part| {
                let part = part.trim();
                part.strip_suffix(unit).and_then(|n| n.trim().rsplit(' ').next().and_then(|n| n.parse().ok()))
            })
            .unwrap_or(0)
    };
    for line in log.lines() {
        if let Some(rest) = line.split("Compiling entry function '").nth(1) {
            let name = rest.split('\'').next().unwrap_or_default();
            all.push(Stats { kernel: name.to_string(), ..Stats::default() });
            continue;
        }
        let Some(s) = all.last_mut() else { continue };
        if line.contains("spill stores") {
            s.stack = num_before(line, "bytes stack frame");
            s.spill_stores = num_before(line, "bytes spill stores");
            s.spill_loads = num_before(line, "bytes spill loads");
        } else if line.contains("Used") && line.contains("registers") {
            let after = line.split("Used").nth(1).unwrap_or_default();
            s.registers = after.trim().split(' ').next().and_then(|n| n.parse().ok()).unwrap_or(0);
            s.shared = num_before(line, "bytes smem");
        }
    }
    all
}

#[cfg(test)]
mod tests {
    #[test]
    fn parses_ptxas_verbose_output() {
        let log = "ptxas info    : 0 bytes gmem\nptxas info    : Compiling entry function 'conv3x3' for 'sm_90'\nptxas info    : Function properties for conv3x3\n    8 bytes stack frame, 4 bytes spill stores, 12 bytes spill loads\nptxas info    : Used 61 registers, used 1 barriers, 8256 bytes smem\n";
        let s = super::parse(log);
        assert_eq!(s.len(), 1);
        assert_eq!(
            (s[0].kernel.as_str(), s[0].registers, s[0].spill_stores, s[0].spill_loads, s[0].shared, s[0].stack),
            ("conv3x3", 61, 4, 12, 8256, 8)
        );
    }
}
