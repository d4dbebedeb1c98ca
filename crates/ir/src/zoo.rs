//! Built-in models with deterministic random weights: they run with no
//! files. `zoo:resnet50` is smelt's embedded default.

use crate::builder::{Builder, Res};
use crate::error::IrError;
use crate::graph::{Graph, ValueId};

/// The names of the built-in models.
pub const NAMES: [&str; 2] = ["resnet50", "mobilenet_v2"];

/// The built-in model `name` at batch size `batch`.
pub fn get(name: &str, batch: usize) -> Result<Graph, IrError> {
    match name {
        "resnet50" => resnet50(batch),
        "mobilenet_v2" => mobilenet_v2(batch),
        _ => Err(IrError::UnknownModel { name: name.to_string(), known: NAMES.join(", ") }),
    }
}

/// ResNet-50 v1.5 (stride on the 3x3 conv), ImageNet shapes.
pub fn resnet50(batch: usize) -> Result<Graph, IrError> {
    let mut b = Builder::new(50);
    let x = b.input("data", &[batch, 3, 224, 224])?;
    let mut x = conv_bn(&mut b, x, 64, 7, 2, 3, true)?;
    x = b.max_pool(x, 3, 2, 1)?;
    for (stage, (&blocks, &width)) in [3, 4, 6, 3].iter().zip(&[64, 128, 256, 512]).enumerate() {
        for i in 0..blocks {
            let stride = if stage > 0 && i == 0 { 2 } else { 1 };
            x = bottleneck(&mut b, x, width, stride)?;
        }
    }
    let x = b.pool_flatten(x)?;
    let x = b.linear(x, 1000)?;
    let x = b.softmax(x)?;
    b.finish("prob", x)
}

fn conv_bn(b: &mut Builder, x: ValueId, out: usize, k: usize, stride: usize, pad: usize, relu: bool) -> Res {
    let y = b.conv(x, out, k, stride, pad)?;
    let y = b.batch_norm(y, 1.0)?;
    if relu {
        b.relu(y)
    } else {
        Ok(y)
    }
}

fn bottleneck(b: &mut Builder, x: ValueId, width: usize, stride: usize) -> Res {
    let cin = b.ty(x).shape[1];
    let y = conv_bn(b, x, width, 1, 1, 0, true)?;
    let y = conv_bn(b, y, width, 3, stride, 1, true)?;
    let y = b.conv(y, width * 4, 1, 1, 0)?;
    let y = b.batch_norm(y, 0.2)?;
    let skip = if stride != 1 || cin != width * 4 { conv_bn(b, x, width * 4, 1, stride, 0, false)? } else { x };
    let y = b.add(y, skip)?;
    b.relu(y)
}

/// MobileNetV2 (width 1.0), ImageNet shapes: inverted residuals with
/// depthwise 3x3 convolutions and ReLU6.
pub fn mobilenet_v2(batch: usize) -> Result<Graph, IrError> {
    let mut b = Builder::new(2);
    let x = b.input("data", &[batch, 3, 224, 224])?;
    let y = b.conv(x, 32, 3, 2, 1)?;
    let y = b.batch_norm(y, 1.0)?;
    let mut x = b.relu6(y)?;
    for &(t, c, n, s) in &[(1, 16, 1, 1), (6, 24, 2, 2), (6, 32, 3, 2), (6, 64, 4, 2), (6, 96, 3, 1), (6, 160, 3, 2), (6, 320, 1, 1)] {
        for i in 0..n {
            x = inverted_residual(&mut b, x, t, c, if i == 0 { s } else { 1 })?;
        }
    }
    let y = b.conv(x, 1280, 1, 1, 0)?;
    let y = b.batch_norm(y, 1.0)?;
    let y = b.relu6(y)?;
    let y = b.pool_flatten(y)?;
    let y = b.linear(y, 1000)?;
    let y = b.softmax(y)?;
    b.finish("prob", y)
}

fn inverted_residual(b: &mut Builder, x: ValueId, expand: usize, out: usize, stride: usize) -> Res {
    let cin = b.ty(x).shape[1];
    let hidden = cin * expand;
    let mut y = x;
    if expand != 1 {
        y = b.conv(y, hidden, 1, 1, 0)?;
        y = b.batch_norm(y, 1.0)?;
        y = b.relu6(y)?;
    }
    y = b.conv_g(y, hidden, 3, stride, 1, hidden)?;
    y = b.batch_norm(y, 1.0)?;
    y = b.relu6(y)?;
    y = b.conv(y, out, 1, 1, 0)?;
    let residual = stride == 1 && cin == out;
    y = b.batch_norm(y, if residual { 0.2 } else { 1.0 })?;
    if residual {
        y = b.add(y, x)?;
    }
    Ok(y)
}
