//! The text IR parser (both levels) and every phase after it.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    for format in [smelt::fuzz::Format::Text, smelt::fuzz::Format::KernelText] {
        if let Err(smelt::fuzz::Verdict::Bug(m)) = smelt::fuzz::exercise(data, format, 16 << 20) {
            panic!("smelt reports its own bug: {m}");
        }
    }
});
