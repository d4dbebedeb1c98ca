//! Measured tiles: `smelt tune` times each tensor-core conv and GEMM of a
//! program with every candidate tile on a device, and keeps the fastest per
//! kernel in a table that `--tuning` applies to later compiles (kernels the
//! table does not name keep the roofline model's choice).

use crate::Error;
use serde::{Deserialize, Serialize};
use smelt_codegen::tile::Tile;
use smelt_codegen::Program;
use smelt_runtime::exec::KernelTime;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// One kernel's measurements.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct Measured {
    /// Its name without the tile suffix: the table's key.
    pub kernel: String,
    /// Its launches in one run of the program.
    pub launches: usize,
    /// Milliseconds per run (its launches summed; the median over the
    /// runs) with each candidate tile, by `MxN`.
    pub ms: BTreeMap<String, f64>,
    /// The fastest candidate (the first of [`Tile::CANDIDATES`] on a tie).
    pub tuned: String,
    /// The roofline model's choice.
    pub model: String,
}

/// A tuning table: what `smelt tune` writes and `--tuning` reads.
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
pub struct Tuning {
    /// The device measured, as its driver names it.
    pub device: String,
    /// The fastest tile per kernel (its name without the tile suffix), `MxN`.
    pub tiles: BTreeMap<String, String>,
    /// The measurements behind `tiles`.
    #[serde(default)]
    pub kernels: Vec<Measured>,
}

/// `MxN`.
pub fn tile_name(t: Tile) -> String {
    format!("{}x{}", t.m, t.n)
}

/// The candidate `MxN` names.
pub fn parse_tile(s: &str) -> Option<Tile> {
    let (m, n) = s.split_once('x')?;
    Tile::candidate([m.parse().ok()?, n.parse().ok()?])
}

impl Tuning {
    /// Reads a table, checking that every tile is a candidate.
    pub fn read(path: &Path) -> Result<Tuning, Error> {
        let bad = |msg: String| Error::Usage(format!("--tuning {}: {msg}", path.display()));
        let text = crate::read_text(path, 64 << 20).map_err(bad)?;
        let t: Tuning = serde_json::from_str(&text).map_err(|e| bad(format!("not a tuning table written by `smelt tune`: {e}")))?;
        t.table().map_err(bad)?;
        Ok(t)
    }

    /// Writes the table as JSON, making its folder.
    pub fn write(&self, path: &Path) -> Result<(), Error> {
        let io = |e: std::io::Error| Error::Usage(format!("cannot write {}: {e}", path.display()));
        if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
            std::fs::create_dir_all(dir).map_err(io)?;
        }
        std::fs::write(path, serde_json::to_string_pretty(self).expect("a table serializes")).map_err(io)
    }

    /// The tiles as codegen takes them ([`smelt_codegen::TileChoice::Tuned`]).
    pub fn table(&self) -> Result<BTreeMap<String, [usize; 2]>, String> {
        self.tiles
            .iter()
            .map(|(k, v)| match parse_tile(v) {
                Some(t) => Ok((k.clone(), [t.m, t.n])),
                None => {
                    let names: Vec<String> = Tile::CANDIDATES.into_iter().map(tile_name).collect();
                    Err(format!("kernel {k}: tile \"{v}\" is not one of {}", names.join(", ")))
                }
            })
            .collect()
    }

    /// Adds `other`'s kernels, replacing those measured again.
    pub fn merge(&mut self, other: Tuning) {
        self.device = other.device;
        self.kernels.retain(|k| !other.tiles.contains_key(&k.kernel));
        self.tiles.extend(other.tiles);
        self.kernels.extend(other.kernels);
        self.kernels.sort_by(|a, b| a.kernel.cmp(&b.kernel));
    }
}

/// Where `smelt tune` keeps the table of `device`: beside the kernel cache,
/// one file per device.
pub fn default_path(device: &str) -> PathBuf {
    let name: String = device.chars().map(|c| if c.is_ascii_alphanumeric() { c.to_ascii_lowercase() } else { '-' }).collect();
    smelt_codegen::cache::Cache::default_dir().join("tuning").join(format!("{}.json", name.trim_matches('-')))
}

/// The tensor-core conv or GEMM of each step of `program`, by step: its
/// name without the tile suffix, and its tile.
pub fn tiled_steps(program: &Program) -> Vec<Option<(String, Tile)>> {
    program.steps.iter().map(|s| Some((s.kernel.tile_key()?, s.kernel.tile()?))).collect()
}

/// The measurements: `model` is the program as the model tiles it, and
/// `runs[i]` the profiled runs (each launch's time, in step order) of the
/// same program with every tensor-core kernel on candidate `i` of
/// [`Tile::CANDIDATES`].
pub fn measure(model: &Program, runs: &[Vec<Vec<KernelTime>>]) -> Result<Vec<Measured>, Error> {
    let steps = tiled_steps(model);
    let mut out: BTreeMap<String, Measured> = BTreeMap::new();
    for (name, t) in steps.iter().flatten() {
        let m = out.entry(name.clone()).or_insert_with(|| Measured {
            kernel: name.clone(),
            launches: 0,
            ms: BTreeMap::new(),
            tuned: String::new(),
            model: tile_name(*t),
        });
        m.launches += 1;
    }
    for (tile, profiles) in Tile::CANDIDATES.into_iter().zip(runs) {
        let mut per_kernel: BTreeMap<&str, Vec<f64>> = BTreeMap::new();
        for profile in profiles {
            if profile.len() != steps.len() {
                let msg = format!("a profiled run has {} launches, the program {}", profile.len(), steps.len());
                return Err(Error::Runtime(smelt_runtime::RuntimeError::Program(msg)));
            }
            let mut sums: BTreeMap<&str, f64> = BTreeMap::new();
            for (step, k) in steps.iter().zip(profile) {
                if let Some((name, _)) = step {
                    *sums.entry(name.as_str()).or_default() += k.ms;
                }
            }
            for (name, ms) in sums {
                per_kernel.entry(name).or_default().push(ms);
            }
        }
        for (name, mut v) in per_kernel {
            v.sort_by(f64::total_cmp);
            out.get_mut(name).expect("a kernel of the program").ms.insert(tile_name(tile), v[v.len() / 2]);
        }
    }
    for m in out.values_mut() {
        let best = Tile::CANDIDATES
            .into_iter()
            .filter_map(|t| m.ms.get(&tile_name(t)).map(|&ms| (t, ms)))
            .fold(None, |b: Option<(Tile, f64)>, (t, ms)| if b.is_some_and(|b| b.1 <= ms) { b } else { Some((t, ms)) });
        m.tuned = best.map_or_else(|| m.model.clone(), |b| tile_name(b.0));
    }
    Ok(out.into_values().collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tile_names_round_trip_and_refuse_others() {
        for t in Tile::CANDIDATES {
            assert_eq!(parse_tile(&tile_name(t)), Some(t));
        }
        for bad in ["32x32", "64", "x64", "64x64x1", "", "128X64"] {
            assert_eq!(parse_tile(bad), None, "{bad}");
        }
        let t = Tuning { device: "d".into(), tiles: [("k".to_string(), "96x64".to_string())].into(), kernels: vec![] };
        assert!(t.table().unwrap_err().contains("kernel k: tile \"96x64\" is not one of 64x64, 128x64, 64x128, 128x128"));
    }

    #[test]
    fn merging_replaces_kernels_measured_again() {
        let m = |k: &str, tile: &str| Measured {
            kernel: k.into(),
            launches: 1,
            ms: BTreeMap::new(),
            tuned: tile.into(),
            model: "64x64".into(),
        };
        let table = |ks: &[(&str, &str)]| Tuning {
            device: "gpu".into(),
            tiles: ks.iter().map(|(k, t)| (k.to_string(), t.to_string())).collect(),
            kernels: ks.iter().map(|(k, t)| m(k, t)).collect(),
        };
        let mut a = table(&[("a", "64x64"), ("b", "128x64")]);
        a.merge(table(&[("b", "128x128"), ("c", "64x128")]));
        assert_eq!(a, table(&[("a", "64x64"), ("b", "128x128"), ("c", "64x128")]));
    }
}
