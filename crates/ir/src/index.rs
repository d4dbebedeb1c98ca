//! Row-major multi-indices: the one place the loops over a shape's
//! coordinates are written (the last dimension fastest).

/// Steps `idx` to the next multi-index of `shape`; after the last it wraps
/// to all zeros and returns false.
pub fn next_index(idx: &mut [usize], shape: &[usize]) -> bool {
    for d in (0..shape.len()).rev() {
        idx[d] += 1;
        if idx[d] < shape[d] {
            return true;
        }
        idx[d] = 0;
    }
    false
}

/// The multi-index of row-major position `i` of `shape`, written to `idx`
/// (`i` below the shape's element count).
pub fn unravel(mut i: usize, shape: &[usize], idx: &mut [usize]) {
    for d in (0..shape.len()).rev() {
        idx[d] = i % shape[d];
        i /= shape[d];
    }
}

/// The offset of row-major position `i` of `shape` in a layout of element
/// strides `st` (0 where an operand broadcasts).
pub fn offset(mut i: usize, shape: &[usize], st: &[usize]) -> usize {
    let mut off = 0;
    for d in (0..shape.len()).rev() {
        off += (i % shape[d]) * st[d];
        i /= shape[d];
    }
    off
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_three_walks_agree() {
        let shape = [2, 3, 4];
        let st = [12, 4, 1];
        let (mut idx, mut got) = (vec![0; 3], vec![0; 3]);
        for i in 0..24 {
            unravel(i, &shape, &mut got);
            assert_eq!(got, idx, "position {i}");
            assert_eq!(offset(i, &shape, &st), i);
            assert_eq!(offset(i, &shape, &[0, 1, 0]), idx[1]);
            assert_eq!(next_index(&mut idx, &shape), i < 23);
        }
        assert_eq!(idx, [0, 0, 0]);
        assert!(!next_index(&mut [], &[]));
    }
}
