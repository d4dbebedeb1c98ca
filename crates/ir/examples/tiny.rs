use smelt_ir::{builder::Builder, text};

fn main() -> Result<(), smelt_ir::IrError> {
    // A convolution, batch norm and ReLU, then a classifier.
    let mut b = Builder::new(7);
    let x = b.input("image", &[1, 3, 8, 8])?;
    let y = b.conv(x, 4, 3, 1, 1)?;
    let y = b.batch_norm(y, 1.0)?;
    let y = b.relu(y)?;
    let y = b.pool_flatten(y)?;
    let y = b.linear(y, 10)?;
    let g = b.finish("logits", y)?;

    // The text format round-trips exactly.
    let printed = text::print(&g);
    assert_eq!(text::print(&text::parse(&printed)?), printed);
    assert_eq!(g.ty(g.outputs()[0].1).shape, vec![1, 10]);
    Ok(())
}
