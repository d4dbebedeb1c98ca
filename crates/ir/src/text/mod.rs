//! The text format (`.tir`): what the printer writes, the parser reads back
//! identically. It is the format of debug dumps and of tests.
//!
//! ```text
//! graph {
//!   %0 "data" = input : f32[1,3,224,224]
//!   %1 "conv1_w" = const : f32[64,3,7,7]
//!   %2 "alpha" = const : f32[] = [0.5]
//!   %3 "conv1" = conv(%0, %1) {strides=[2,2], pads=[3,3,3,3], dilations=[1,1], group=1} : f32[1,64,112,112]
//!   output "prob" = %3
//! }
//! ```
//!
//! Nodes appear in a deterministic topological order and keep their ids.
//! Weights are referenced by name and type; only constants of at most
//! [`INLINE_LIMIT`] elements print their values.

mod attrs;
mod parse;
mod print;

pub use attrs::{attrs_of, kernel_attrs_of, kernel_op_from, op_from, Attr, Attrs};

/// The op named `name` when it takes no attributes (`relu`, `add`...).
pub fn op_by_name(name: &str) -> Option<crate::Op> {
    attrs::op_from(name, attrs::Attrs(Default::default())).ok()
}
pub use parse::{parse, parse_as, parse_kernel};
pub use print::print;

/// Constants with at most this many elements print their values inline.
pub const INLINE_LIMIT: usize = 16;
