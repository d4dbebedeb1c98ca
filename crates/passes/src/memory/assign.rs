//! Offsets in one arena: greedy by size with best fit (Pisarchyk and Lee
//! 2020; XLA's GlobalDecreasingSizeBestFitHeap). Several orders are tried
//! and the smallest arena kept.

use super::{Buffer, ALIGN};

fn align(x: usize) -> usize {
    x.div_ceil(ALIGN) * ALIGN
}

/// Places every buffer in the arena; returns the arena size and the name of
/// the order that gave it. With `search`, a local search perturbs the best
/// order while that helps.
pub fn assign(bufs: &mut [Buffer], search: bool) -> (usize, String) {
    // Breadth of a buffer: the most bytes live at any step of its lifetime
    // (Pisarchyk and Lee's greedy by breadth places the crowded steps first).
    let steps = bufs.iter().map(|b| b.end + 1).max().unwrap_or(0);
    let live = super::buffers::live_bytes(bufs, steps);
    let breadth: Vec<i64> = bufs.iter().map(|b| live[b.start..=b.end].iter().copied().max().unwrap_or(0) as i64).collect();
    type Keys = Vec<(i64, i64, i64)>;
    let orders: Vec<(&str, Keys)> = vec![
        ("size", bufs.iter().map(|b| (-(b.size as i64), b.start as i64, b.id as i64)).collect()),
        ("breadth", bufs.iter().map(|b| (-breadth[b.id], -(b.size as i64), b.id as i64)).collect()),
        ("size-x-lifetime", bufs.iter().map(|b| (-((b.size * (b.end - b.start + 1)) as i64), b.start as i64, b.id as i64)).collect()),
        ("lifetime", bufs.iter().map(|b| (-((b.end - b.start) as i64), -(b.size as i64), b.id as i64)).collect()),
        ("start", bufs.iter().map(|b| (b.start as i64, -(b.size as i64), b.id as i64)).collect()),
    ];
    let mut best: Option<(usize, String, Vec<usize>)> = None;
    // The orders are placed on the machine's cores, then compared in order.
    let shared: &[Buffer] = bufs;
    let placed = crate::par_map(&orders, |(_, keys)| {
        let mut idx: Vec<usize> = (0..shared.len()).collect();
        idx.sort_by_key(|&i| keys[i]);
        let offsets = place(shared, &idx);
        (shared.iter().zip(&offsets).map(|(b, &o)| o + align(b.size)).max().unwrap_or(0), offsets)
    });
    for ((name, _), (arena, offsets)) in orders.iter().zip(placed) {
        if best.as_ref().is_none_or(|b| arena < b.0) {
            best = Some((arena, name.to_string(), offsets));
        }
    }
    // Then perturb the best order a little, deterministically, while that helps
    // (a cheap local search that closes most of the gap best fit leaves).
    let lb = live.iter().copied().max().unwrap_or(0);
    if let Some((mut arena, ref mut name, ref mut offsets)) = best.clone().filter(|_| search) {
        let mut order: Vec<usize> = (0..bufs.len()).collect();
        order.sort_by_key(|&i| std::cmp::Reverse(offsets[i] + bufs[i].size)); // re-derive a good order
        let mut rng = smelt_ir::Rng::new(0x5eed);
        let tries = (200_000 / bufs.len().max(1)).clamp(8, 400);
        for _ in 0..tries {
            if arena <= lb.div_ceil(ALIGN) * ALIGN {
                break;
            }
            let mut cand = order.clone();
            let i = rng.below(cand.len().max(1));
            let j = rng.below(cand.len().max(1));
            cand.swap(i, j);
            let offs = place(bufs, &cand);
            let a = bufs.iter().zip(&offs).map(|(b, &o)| o + align(b.size)).max().unwrap_or(0);
            if a <= arena {
                if a < arena {
                    *name = "local-search".into();
                }
                arena = a;
                order = cand;
                *offsets = offs;
            }
        }
        best = Some((arena, name.clone(), offsets.clone()));
    }
    let (arena, name, offsets) = best.unwrap_or((0, "size".into(), vec![]));
    for (b, o) in bufs.iter_mut().zip(offsets) {
        b.offset = o;
    }
    (arena, name)
}

/// Best fit in `order`: each buffer takes the smallest gap, among buffers
/// already placed whose lifetimes intersect its own, that holds it. The
/// placed buffers are kept in order of offset, so each placement is one
/// scan (no sort).
fn place(bufs: &[Buffer], order: &[usize]) -> Vec<usize> {
    let mut offsets = vec![usize::MAX; bufs.len()];
    // (offset, end offset, first step, last step), by offset.
    let mut placed: Vec<(usize, usize, usize, usize)> = Vec::with_capacity(bufs.len());
    for &i in order {
        let b = &bufs[i];
        let size = align(b.size);
        let (mut best, mut best_gap, mut cursor) = (None, usize::MAX, 0);
        for &(s, e, first, last) in &placed {
            if first > b.end || b.start > last {
                continue;
            }
            if s >= cursor + size && s - cursor < best_gap {
                best = Some(cursor);
                best_gap = s - cursor;
            }
            cursor = cursor.max(e);
        }
        let o = best.unwrap_or(cursor);
        offsets[i] = o;
        let at = placed.partition_point(|p| (p.0, p.1) <= (o, o + size));
        placed.insert(at, (o, o + size, b.start, b.end));
    }
    offsets
}
