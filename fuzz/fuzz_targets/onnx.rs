//! The ONNX loader and every phase after it, on arbitrary bytes.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    if let Err(smelt::fuzz::Verdict::Bug(m)) = smelt::fuzz::exercise(data, smelt::fuzz::Format::Onnx, 16 << 20) {
        panic!("smelt reports its own bug: {m}");
    }
});
