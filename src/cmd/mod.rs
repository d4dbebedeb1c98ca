//! The commands of the CLI, one module each. They ask the driver
//! ([`smelt::Session`]) for what they need and print it.

pub mod compile;
pub mod fit;
pub mod inspect;
pub mod plan;
pub mod run;
pub mod train;
pub mod tune;

use crate::Open as _;
use crate::PrintArgs;
use anyhow::{Context, Result};
use indicatif::{ProgressBar, ProgressStyle};

/// With `SMELT_TIMINGS` set, prints the time a phase took.
pub fn log_time(what: &str, secs: f64) {
    if std::env::var_os("SMELT_TIMINGS").is_some() {
        errln!("{what}: {secs:.3} s");
    }
}

/// A progress bar with `template`, hidden when `hidden` (JSON output).
pub fn bar(len: usize, template: &str, hidden: bool) -> ProgressBar {
    let bar = ProgressBar::new(len as u64).with_style(ProgressStyle::with_template(template).expect("valid template"));
    if hidden {
        bar.set_draw_target(indicatif::ProgressDrawTarget::hidden());
    }
    bar
}

/// `smelt print`: the model in the text IR, as imported.
pub fn print(a: &PrintArgs) -> Result<bool> {
    let s = smelt_ir::text::print(&a.model.spec()?.session()?.source);
    match &a.output {
        Some(p) => std::fs::write(p, s).with_context(|| format!("cannot write {}", p.display()))?,
        None => out!("{s}"),
    }
    Ok(true)
}
